"""A run's samples for summary.json's distributions and correlations, in memory that stops growing.

Up to :data:`EXACT_SAMPLES` values a metric keeps every one (packed doubles, 8 bytes each) and summary.json
gives its exact distribution: every run measured in this repository keeps far fewer. Past that, values go into
a logarithmic-bucket quantile sketch (the DDSketch construction, relative accuracy :data:`RELATIVE_ACCURACY`),
a batch of :data:`EXACT_SAMPLES` at a time: count, mean, min and max stay exact, p50 and p95 are within that
relative accuracy of the exact ones (each rank's value is), and the distribution says ``approximate``. The
sketch's memory is bounded by the values' range (a bucket per 1% step of value: about 2,500 buckets from 1 µs
to a day), not by their number. Batches are bucketed with numpy in one step: the ``ddsketch`` package adds one
value at a time in Python (≈ 1.6 µs each here, about thirty per trajectory).

Pairs for a correlation keep exact arrays up to the same count, and running co-moments (Welford's online
update) that give the correlation past it: the same but for float rounding (it is written to 4 decimals).
"""

from __future__ import annotations

import itertools
import math
from array import array
from collections import Counter
from typing import Any, Final

from asyncroll.floats import left_to_right_sum
from asyncroll.outputs.statistics import distribution, pearson, pearson_missing

#: How many values a metric (or a correlation's pairs) keeps exactly before its sketch takes them.
EXACT_SAMPLES: Final = 1 << 16
#: The sketch's relative accuracy: a quantile it gives is within this fraction of the exact one.
RELATIVE_ACCURACY: Final = 0.005
_GAMMA: Final = (1 + RELATIVE_ACCURACY) / (1 - RELATIVE_ACCURACY)
_LOG_GAMMA: Final = math.log(_GAMMA)


def _bucket_value(key: int) -> float:
    """``2γ^k/(γ+1)``: within α of every magnitude in bucket ``k``; infinite where γ^k is past the largest
    float (a value within 1% of it: clamped to the max)."""
    try:
        return _GAMMA**key * (2 / (_GAMMA + 1))  # 2γ^k alone overflows from half the largest float
    except OverflowError:
        return math.inf


class QuantileSketch:
    """Finite values in buckets ``(γ^(k-1), γ^k]`` of their magnitude (γ = (1+α)/(1-α)), negative ones,
    zeros and positive ones apart. A bucket's value is ``±2γ^k/(γ+1)``, within α of every value in it."""

    def __init__(self) -> None:
        self.buckets: Counter[int] = Counter()  # positive values
        self.negative: Counter[int] = Counter()  # negative values by magnitude (a duration has none)
        self.zeros = 0
        self.count = 0
        self.total = 0.0  # added left to right in arrival order, as the exact sum would be
        self.min = math.inf
        self.max = -math.inf

    def add(self, values: array[float]) -> None:
        import numpy as np  # only a run past EXACT_SAMPLES values gets here: not on the CLI's start-up path

        xs = np.frombuffer(values, dtype=np.float64)
        for store, magnitudes in ((self.buckets, xs[xs > 0]), (self.negative, -xs[xs < 0])):
            keys, counts = np.unique(np.ceil(np.log(magnitudes) / _LOG_GAMMA), return_counts=True)
            store.update(dict(zip(keys.astype(int).tolist(), counts.tolist(), strict=True)))
        self.zeros += int(np.count_nonzero(xs == 0))
        self.count += len(xs)
        self.total = left_to_right_sum([self.total, *values])
        self.min = min(self.min, float(xs.min()))
        self.max = max(self.max, float(xs.max()))

    def value_at(self, rank: int) -> float:
        """The estimated value of the ``rank``-th smallest sample (0-based), clamped to [min, max]."""
        ranked = itertools.chain(
            ((-_bucket_value(key), self.negative[key]) for key in sorted(self.negative, reverse=True)),
            [(0.0, self.zeros)],
            ((_bucket_value(key), self.buckets[key]) for key in sorted(self.buckets)),
        )
        seen = 0
        for value, count in ranked:
            seen += count
            if rank < seen:
                return min(self.max, max(self.min, value))
        return self.max

    def distribution(self) -> dict[str, Any]:
        """As :func:`~asyncroll.outputs.statistics.distribution` gives it (linear interpolation between
        ranks), from the buckets, marked ``approximate``."""

        def q(p: float) -> float:
            pos = p * (self.count - 1)
            lo, hi = self.value_at(math.floor(pos)), self.value_at(math.ceil(pos))
            return lo + (hi - lo) * (pos - math.floor(pos))

        return {
            "count": self.count,
            "mean": round(self.total / self.count, 6),
            "min": self.min,
            "p50": round(q(0.5), 6),
            "p95": round(q(0.95), 6),
            "max": self.max,
            "approximate": {"relative_accuracy": RELATIVE_ACCURACY, "exact_up_to": EXACT_SAMPLES},
        }


class Samples:
    """One metric's values: every one while at most :data:`EXACT_SAMPLES`, then a :class:`QuantileSketch`
    fed in batches of that many."""

    __slots__ = ("_sketch", "_values")

    def __init__(self) -> None:
        self._values: array[float] = array("d")
        self._sketch: QuantileSketch | None = None

    def append(self, value: float) -> None:
        if len(self._values) >= EXACT_SAMPLES:  # full: exact up to and with the limit, sketched past it
            self._fold()
        self._values.append(value)

    def _fold(self) -> None:
        if self._sketch is None:
            self._sketch = QuantileSketch()
        self._sketch.add(self._values)
        self._values = array("d")

    def __len__(self) -> int:
        return len(self._values) + (0 if self._sketch is None else self._sketch.count)

    def total(self) -> float:
        """The values' sum, added left to right in arrival order."""
        if self._sketch is None:
            return left_to_right_sum(self._values)
        return left_to_right_sum([self._sketch.total, *self._values])

    def distribution(self) -> dict[str, Any]:
        if self._sketch is None:
            return distribution(self._values)
        if self._values:
            self._fold()
        return self._sketch.distribution()


class Pairs:
    """(x, y) pairs for a Pearson correlation: every one while at most :data:`EXACT_SAMPLES` (the exact
    correlation, as :func:`~asyncroll.outputs.statistics.pearson` gives it), and running co-moments of all of
    them (Welford's online update, ≈ 1 µs a pair), which give it past the limit: no batch to fold, so no pause
    of the event loop (a pure-Python pass over 65,536 pairs took ≈ 60 ms)."""

    __slots__ = ("_cxy", "_m2x", "_m2y", "_mx", "_my", "_n", "xs", "ys")

    def __init__(self) -> None:
        self.xs: array[float] | None = array("d")  # None once past the limit
        self.ys: array[float] | None = array("d")
        self._n = 0
        self._mx = self._my = 0.0
        self._m2x = self._m2y = self._cxy = 0.0  # sums of squared deviations, and of their products

    def append(self, x: float, y: float) -> None:
        n = self._n = self._n + 1
        dx, dy = x - self._mx, y - self._my
        self._mx += dx / n
        self._my += dy / n
        self._m2x += dx * (x - self._mx)
        self._m2y += dy * (y - self._my)
        self._cxy += dx * (y - self._my)
        if self.xs is None or self.ys is None:
            return
        if len(self.xs) < EXACT_SAMPLES:
            self.xs.append(x)
            self.ys.append(y)
        else:  # past the limit: the moments alone
            self.xs = self.ys = None

    def __len__(self) -> int:
        return self._n

    def pearson(self) -> float | None:
        """Pearson's r: exact over the kept pairs, else from the moments (equal values leave a sum of squared
        deviations exactly 0: no variance)."""
        if self.xs is not None and self.ys is not None:
            return pearson(self.xs, self.ys)
        if self._m2x <= 0 or self._m2y <= 0:
            return None
        return round(self._cxy / math.sqrt(self._m2x * self._m2y), 4) + 0.0

    def missing(self) -> str | None:
        """Why :meth:`pearson` is None (None when it is not)."""
        if self.xs is not None and self.ys is not None:
            return pearson_missing(self.xs, self.ys)
        if self._m2x <= 0:
            return "no variance: every predicted time is the same"
        if self._m2y <= 0:
            return "no variance: every actual time is the same"
        return None
