def shifted_square_to_linear_coeffs(shift: float) -> tuple:
    return (2 * shift, shift**2)
