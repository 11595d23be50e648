"""Paired statistics for the report: ratios, mean % change, a Student t interval and a seeded bootstrap.

The t quantile is SciPy's (``scipy.stats.t``; SciPy comes with scikit-learn). The bootstrap
resamples pairs with replacement from ``numpy.random.default_rng(seed)``: the same data and seed give the
same interval on every machine.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


def t_ppf(q: float, df: float) -> float:
    """Student t quantile (inverse CDF) for 0 < q < 1: SciPy's (a dependency of scikit-learn, always
    installed), imported here only, so that ``asyncroll --help`` never loads it."""
    if not 0.0 < q < 1.0 or df <= 0:
        raise ValueError(f"t_ppf needs 0 < q < 1 and df > 0, got q={q}, df={df}")
    from scipy.stats import t

    return float(t.ppf(q, df))


@dataclass(frozen=True, slots=True)
class Interval:
    """A mean with its interval; ``low``/``high`` None when it cannot be computed (and ``note`` says why)."""

    n: int
    mean: float | None
    low: float | None
    high: float | None
    note: str | None = None

    def to_dict(self) -> dict[str, float | int | str | None]:
        return asdict(self)


def t_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Mean ± t(1 − α/2, n − 1) · s / √n; needs at least two values."""
    n = len(values)
    if n == 0:
        return Interval(0, None, None, None, "no pair with a known value")
    mean = statistics.fmean(values)
    if n < 2:
        return Interval(n, mean, None, None, "an interval needs at least 2 pairs")
    half = t_ppf(0.5 + confidence / 2.0, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return Interval(n, mean, mean - half, mean + half)


def bootstrap_interval(
    values: Sequence[float], *, seed: int, resamples: int = 10_000, confidence: float = 0.95
) -> Interval:
    """Percentile bootstrap of the mean: ``resamples`` resamples of the pairs, seeded."""
    n = len(values)
    if n == 0:
        return Interval(0, None, None, None, "no pair with a known value")
    data = np.asarray(values, dtype=float)
    mean = float(data.mean())
    if n < 2:
        return Interval(n, mean, None, None, "an interval needs at least 2 pairs")
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, n, size=(resamples, n))].mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    note = f"{n} pairs: only {n**n} distinct resamples" if n**n < resamples else None
    return Interval(n, mean, float(low), float(high), note)


def paired_ratios(baseline: Sequence[float | None], treatment: Sequence[float | None]) -> list[float | None]:
    """treatment / baseline per pair; None where either is unknown or the baseline is not positive."""
    out: list[float | None] = []
    for b, t in zip(baseline, treatment, strict=True):
        out.append(None if b is None or t is None or b <= 0 else t / b)
    return out


def paired_change(
    baseline: Sequence[float | None],
    treatment: Sequence[float | None],
    *,
    seed: int,
    resamples: int = 10_000,
) -> dict[str, object]:
    """Paired % change (100·(t/b − 1)) per pair, its mean with a t and a bootstrap interval."""
    ratios = paired_ratios(baseline, treatment)
    changes = [100.0 * (r - 1.0) for r in ratios if r is not None]
    diffs = [t - b for b, t in zip(baseline, treatment, strict=True) if b is not None and t is not None]
    return {
        "ratios": ratios,
        "unknown_pairs": sum(r is None for r in ratios),
        "percent_change": [None if r is None else 100.0 * (r - 1.0) for r in ratios],
        "mean_percent_change_t95": t_interval(changes).to_dict(),
        "mean_percent_change_bootstrap95": bootstrap_interval(
            changes, seed=seed, resamples=resamples
        ).to_dict(),
        "mean_difference_t95": t_interval(diffs).to_dict(),
    }


def median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None
