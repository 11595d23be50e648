def absolute_value_b(number: int) -> int:
    return abs(number)
