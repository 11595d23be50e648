def sum_three_numbers_a(a: float, b: float, c: float) -> float:
    return a + b + c
