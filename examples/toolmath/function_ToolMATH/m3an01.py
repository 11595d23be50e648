def mean_of_values(values: list[float]) -> float:
    return math.fsum(values) / len(values)  # noqa: F821 - the worker provides math
