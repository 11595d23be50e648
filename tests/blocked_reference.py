"""Client CPU-blocked time recomputed the plain way, for tests to hold the summary's meter against.

The state after all the events of one timestamp (≥ 1 active trajectory, 0 model requests outstanding,
≥ 1 CPU job pending) holds until the next timestamp (or ``end``); blocked seconds are the sum of those
spans, intervals the maximal runs of them. A request a stop cancelled stays outstanding (MEASUREMENT.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import pairwise
from typing import Any

STEPS = {  # (active trajectories, model requests outstanding, CPU jobs pending)
    "trajectory_started": (1, 0, 0),
    "trajectory_finished": (-1, 0, 0),
    "model_enqueued": (0, 1, 0),
    "model_finished": (0, -1, 0),
    "model_failed": (0, -1, 0),
    "cpu_enqueued": (0, 0, 1),
    "cpu_finished": (0, 0, -1),
    "cpu_failed": (0, 0, -1),
}


def blocked_reference(events: Iterable[Mapping[str, Any]], end: float | None = None) -> tuple[float, int]:
    """Blocked seconds (unrounded) and intervals of ``events`` (``t``, ``event``, ``kind``) up to ``end``
    (at or after the last event; default: the last event)."""
    state = [0, 0, 0]
    after: dict[float, bool] = {}
    for e in events:
        if not (e["event"] == "model_failed" and e.get("kind") == "cancelled"):
            for i, d in enumerate(STEPS.get(e["event"], (0, 0, 0))):
                state[i] += d
        after[e["t"]] = state[0] > 0 and state[1] == 0 and state[2] > 0
    times = sorted(after)
    seconds, intervals, inside = 0.0, 0, False
    for t, until in pairwise([*times, times[-1] if end is None else end]):
        if after[t] and until > t:
            seconds += until - t
            intervals += not inside
        inside = after[t] and until > t
    return seconds, intervals
