"""Per-second rates of Prometheus counters read series by series, with resets told from bad readings
(:class:`CounterRate`; MEASUREMENT.md, "Token rates")."""

from __future__ import annotations

from typing import NamedTuple

#: One series of a metric: its labels, sorted.
SeriesKey = tuple[tuple[str, str], ...]
#: A counter series that falls to at most this fraction of its last reading was reset; a smaller fall
#: makes the reading invalid (see :class:`CounterRate`).
RESET_FRACTION = 0.5


class CounterUpdate(NamedTuple):
    """What one reading of a counter gave (:meth:`CounterRate.update`)."""

    rate: float | None  # per second; None when there is none (first reading, or an invalid one)
    resets: int  # series reset in this reading
    fell: int  # series that fell by less than a reset: the reading is invalid, its rate None


class CounterRate:
    """Per-second rate of a (multi-series) Prometheus counter: the sum of each series' own rate since
    its last good reading (``sum(rate(...))`` in Prometheus terms).

    Each series keeps its last good reading and when it was taken. A series absent from a reading, or
    invalid in it (the caller leaves it out), keeps its previous reading, so its next increase spans the
    gap instead of being lost; when every series was read at the same times this is Σ increases ÷ Δt. A
    series whose value fell to at most :data:`RESET_FRACTION` (half) of its last reading was reset (the
    server restarted, and its counter starts again near zero): its increase is its new value, as
    Prometheus' ``rate()`` takes it. A series that fell by less is no restart but a bad reading (a
    counter never decreases; Prometheus would take it for a reset and report the whole counter as one
    interval's increase): the reading gives no rate and the series keeps its last good reading, as an
    invalid one does (``fell`` counts them; the caller reports the quantity invalid). A series seen for
    the first time contributes from its second reading. ``complete=False`` (the quantity is invalid in
    this reading: some series are missing from ``values``) advances the good series but gives no rate:
    a sum over part of the series is not the quantity.
    """

    def __init__(self) -> None:
        self._last: dict[SeriesKey, tuple[float, float]] = {}  # series → (value, when read)
        self.resets = 0

    def update(self, values: dict[SeriesKey, float], at: float, *, complete: bool = True) -> CounterUpdate:
        """Advance every series in ``values`` read at ``at``; the rate, resets and falls of this reading."""
        rate, common, resets, fell = 0.0, 0, 0, 0
        for key, value in values.items():
            prev = self._last.get(key)
            if prev is not None and at <= prev[1]:
                continue  # not after its last reading: nothing to measure, and keep that reading
            if prev is not None and prev[0] * RESET_FRACTION < value < prev[0]:
                fell += 1  # too little a fall for a restart: keep the last good reading
                continue
            self._last[key] = (value, at)
            if prev is None:
                continue
            common += 1
            if value < prev[0]:
                resets += 1
                rate += value / (at - prev[1])
            else:
                rate += (value - prev[0]) / (at - prev[1])
        self.resets += resets
        return CounterUpdate(round(rate, 6) if common and complete and not fell else None, resets, fell)
