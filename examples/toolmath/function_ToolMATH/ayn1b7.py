def solve_linear_equation(A: float, B: float) -> float:
    return -B / A
