def absolute_difference(x: int, y: int) -> int:
    return abs(x - y)
