def absolute_value_a(x: int) -> int:
    return x if x >= 0 else -x
