"""Paired statistics for the report: ratios, mean % change, mean difference, t and bootstrap intervals.

The t quantile is SciPy's (``scipy.stats.t``; SciPy comes with scikit-learn). The bootstrap
resamples pairs with replacement from ``numpy.random.default_rng(seed)``: the same data and seed give the
same interval on every machine. At a few pairs it covers less than its nominal level (75% at 3 normal
pairs for a "95%" interval: :func:`percentile_bootstrap_coverage`), and its note says so.

No pair leaves a statistic silently: every interval carries ``n`` (the pairs it rests on), and a note
when pairs were left out (a value not measured) and why. A pair whose baseline is 0 has no ratio: its %
change is *undefined* (not unknown: both values were measured), and so is the mean % change over the
pairs, since leaving the pair out would bias it; the mean difference (treatment − baseline) covers it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

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
    distinct = distinct_resamples(n)
    notes = [f"{n} pairs: only {distinct} distinct resamples"] if distinct < resamples else []
    coverage = percentile_bootstrap_coverage(n, confidence)
    if coverage < confidence - 0.05:
        notes.append(
            f"at n={n} a percentile bootstrap's {100 * confidence:g}% interval covers the mean about"
            f" {100 * coverage:.0f}% of the time (normal pairs): read the t interval"
        )
    return Interval(n, mean, float(low), float(high), "; ".join(notes) or None)


def percentile_bootstrap_coverage(n: int, confidence: float = 0.95) -> float:
    """How often a percentile bootstrap interval of the mean at ``confidence`` covers the true mean of
    ``n`` normal pairs, in the limit of many resamples: the resampled means spread as the plug-in standard
    deviation s·√((n − 1)/n)/√n and the interval takes the normal quantile z, not t(n − 1), so it covers
    P(|T(n − 1)| ≤ z·√((n − 1)/n)): 75% at 3 pairs, 85% at 5, 90% at 10 for a nominal 95%. Where the
    resample that draws the smallest pair n times (probability n⁻ⁿ) holds more than the tail (2 and 3 pairs
    at 95%), the interval's ends are the smallest and the largest pair, which straddle the mean of n
    pairs from a symmetric distribution with probability 1 − 2¹⁻ⁿ: 50% at 2 pairs (the limit above, 60%,
    does not hold there), 75% at 3. No interval covers more often than that (it never leaves those ends):
    the limit, which would at a high confidence (89% at 4 pairs for 99%), is capped there."""
    if n < 2:
        raise ValueError(f"a bootstrap interval needs at least 2 pairs, got {n}")
    straddle = 1.0 - 2.0 ** (1 - n)
    if float(n) ** -n > (1.0 - confidence) / 2.0:
        return straddle
    from scipy.stats import norm, t

    z = float(norm.ppf(0.5 + confidence / 2.0))
    return min(straddle, float(2.0 * t.cdf(z * math.sqrt((n - 1) / n), n - 1) - 1.0))


def distinct_resamples(n: int) -> int:
    """How many different resamples (multisets of n of n pairs) a bootstrap can draw: C(2n − 1, n).

    The mean does not depend on the order of the draws, so n**n ordered draws collapse to these."""
    return math.comb(2 * n - 1, n)


def _pairs(numbers: list[int]) -> str:
    return ("pair " if len(numbers) == 1 else "pairs ") + ", ".join(map(str, numbers))


def paired_ratios(baseline: Sequence[float | None], treatment: Sequence[float | None]) -> list[float | None]:
    """treatment / baseline per pair; None where either is unknown or the baseline is not positive."""
    out: list[float | None] = []
    for b, t in zip(baseline, treatment, strict=True):
        out.append(None if b is None or t is None or b <= 0 else t / b)
    return out


def pair_notes(
    baseline: Sequence[float | None],
    treatment: Sequence[float | None],
    undefined: Sequence[str | None] | None = None,
) -> list[str | None]:
    """Why a pair has no ratio: a value not measured, a value that is itself undefined (``undefined``:
    per pair, why an arm's null value is a ratio over a measured 0, e.g. ``eligible_decisions = 0``), or
    a baseline of 0 (None: it has one)."""
    notes: list[str | None] = []
    for i, (b, t) in enumerate(zip(baseline, treatment, strict=True)):
        if (b is None or t is None) and undefined is not None and undefined[i] is not None:
            notes.append(f"undefined ({undefined[i]})")
        elif b is None or t is None:
            notes.append("unknown (not measured)")
        elif b <= 0:
            notes.append(f"undefined (baseline {b:g}, treatment {t:g})")
        else:
            notes.append(None)
    return notes


def _left_out(interval: Interval, note: str | None) -> Interval:
    if note is None or interval.n == 0:
        return interval
    return replace(interval, note="; ".join(x for x in (note, interval.note) if x))


def paired_change(
    baseline: Sequence[float | None],
    treatment: Sequence[float | None],
    *,
    seed: int,
    resamples: int = 10_000,
    undefined_values: Sequence[str | None] | None = None,
    numbers: Sequence[int] | None = None,
) -> dict[str, object]:
    """Per pair the ratio and % change (100·(t/b − 1)); over the pairs, the mean % change with a t and a
    bootstrap interval, and the mean difference (t − b) with a t interval.

    Pairs with a value not measured are left out of all three, and each says so. A measured baseline of 0
    makes that pair's ratio, and the mean % change, undefined; the mean difference still includes it.
    ``undefined_values`` (per pair) names why a null value is undefined rather than unmeasured: such a
    pair is left out of all three as undefined, never called unknown.

    ``numbers``: each pair's number as the report names it (default 1, 2, …). The pairs given are the
    complete ones, so once a pair with a failed arm is excluded their positions are not their numbers:
    a note must name the pair it means, not its position among those left."""
    ratios = paired_ratios(baseline, treatment)
    notes = pair_notes(baseline, treatment, undefined_values)
    number = list(range(1, len(ratios) + 1)) if numbers is None else list(numbers)
    if len(number) != len(ratios):
        raise ValueError(f"{len(number)} pair numbers for {len(ratios)} pairs")
    unknown_at = [i for i, n in enumerate(notes) if n is not None and n.startswith("unknown")]
    valueless_at = [
        i
        for i, (b, t) in enumerate(zip(baseline, treatment, strict=True))
        if (b is None or t is None) and undefined_values is not None and undefined_values[i] is not None
    ]
    undefined_at = [
        i
        for i, n in enumerate(notes)
        if n is not None and n.startswith("undefined") and i not in valueless_at
    ]
    unknown = [number[i] for i in unknown_at]
    valueless = [number[i] for i in valueless_at]
    undefined = [number[i] for i in undefined_at]
    reasons = []
    if unknown:
        reasons.append(f"{_pairs(unknown)}: a value not measured")
    if valueless:
        reasons.append(f"{_pairs(valueless)}: a value {notes[valueless_at[0]]}")
    out = len(unknown) + len(valueless)
    left_out = f"{out} of {len(ratios)} pairs left out ({'; '.join(reasons)})" if out else None
    changes = [100.0 * (r - 1.0) for r in ratios if r is not None]
    diffs = [t - b for b, t in zip(baseline, treatment, strict=True) if b is not None and t is not None]
    difference = _left_out(t_interval(diffs), left_out)
    if valueless and len(valueless) == len(ratios):
        t95 = boot95 = difference = Interval(
            0, None, None, None, f"undefined in every pair: a value {notes[0]}"
        )
    elif undefined:
        zero = "0" if all(baseline[i] == 0 for i in undefined_at) else "≤ 0"
        why = f"undefined: baseline {zero} in {_pairs(undefined)} (no ratio); see the mean difference"
        t95 = boot95 = Interval(0, None, None, None, why)
    else:
        t95 = _left_out(t_interval(changes), left_out)
        boot95 = _left_out(bootstrap_interval(changes, seed=seed, resamples=resamples), left_out)
    return {
        "pairs": len(ratios),
        "pair_numbers": number,
        "ratios": ratios,
        "pair_notes": notes,
        "unknown_pairs": len(unknown),
        "undefined_pairs": len(undefined) + len(valueless),
        "percent_change": [None if r is None else 100.0 * (r - 1.0) for r in ratios],
        "mean_percent_change_t95": t95.to_dict(),
        "mean_percent_change_bootstrap95": boot95.to_dict(),
        "mean_difference_t95": difference.to_dict(),
    }


def median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None
