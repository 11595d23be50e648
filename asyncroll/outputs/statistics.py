"""Descriptive statistics of a run's samples, as summary.json writes them: distributions, a
correlation, ratios — each missing (None), never 0, where there is nothing to compute it over."""

from __future__ import annotations

import math
from collections.abc import Sequence

from asyncroll.floats import left_to_right_sum


def distribution(samples: Sequence[float]) -> dict[str, float | int | None]:
    """count, mean, min, p50, p95, max (linear interpolation between ranks); nulls when empty."""
    if not samples:
        return {"count": 0, "mean": None, "min": None, "p50": None, "p95": None, "max": None}
    xs = sorted(samples)

    def q(p: float) -> float:
        pos = p * (len(xs) - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return {
        "count": len(xs),
        "mean": round(left_to_right_sum(xs) / len(xs), 6),
        "min": xs[0],
        "p50": round(q(0.5), 6),
        "p95": round(q(0.95), 6),
        "max": xs[-1],
    }


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson correlation; None with fewer than 3 pairs or no variance."""
    n = len(xs)
    if n < 3 or min(xs) == max(xs) or min(ys) == max(ys):
        return None  # equal values: the float error of their mean would otherwise pass for variance
    mx, my = left_to_right_sum(xs) / n, left_to_right_sum(ys) / n
    sxy = left_to_right_sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx = left_to_right_sum((x - mx) ** 2 for x in xs)
    syy = left_to_right_sum((y - my) ** 2 for y in ys)
    if sxx <= 0 or syy <= 0:
        return None
    return round(sxy / math.sqrt(sxx * syy), 4) + 0.0  # never -0.0


def pearson_missing(xs: Sequence[float], ys: Sequence[float]) -> str | None:
    """Why :func:`pearson` is None over these pairs (None when it is not): a null states its reason."""
    if len(xs) < 3:
        return f"fewer than 3 pairs ({len(xs)})"
    if min(xs) == max(xs):
        return "no variance: every predicted time is the same"
    if min(ys) == max(ys):
        return "no variance: every actual time is the same"
    return "no variance" if pearson(xs, ys) is None else None


def ratio(num: float, den: float) -> float | None:
    """``num ÷ den`` to 6 decimals; None over 0 (a ratio over nothing is missing, never 0)."""
    return None if den == 0 else round(num / den, 6)
