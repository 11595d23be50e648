def min_and_max(values: list[int]) -> tuple:
    return (min(values), max(values))
