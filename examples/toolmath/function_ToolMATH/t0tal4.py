def total_from_counts(counts: dict[int, int]) -> list:
    return [sum(face * n for face, n in counts.items()), sum(counts.values())]
