def circle_radius_from_standard_coeffs(D: float, E: float, F: float) -> float:
    return math.sqrt(D * D / 4 + E * E / 4 - F)  # noqa: F821 - the worker provides math
