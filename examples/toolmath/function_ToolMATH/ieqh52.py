def circle_center_from_standard_coeffs_a(D: float, E: float) -> tuple:
    return (-D / 2, -E / 2)
