"""A run's activity as both views draw it: spans, instants, counter series and telemetry gaps.

:class:`Activity` is what :func:`asyncroll.outputs.activity.collect_activity` pairs a run's events into and
what ``trace.json`` (:mod:`asyncroll.outputs.trace`) and ``timeline.html`` (:mod:`asyncroll.outputs.timeline`)
draw, in seconds since measurement start. Finished spans and instants wait in a :class:`SpanLog` (an
anonymous temporary file, :mod:`asyncroll.outputs.spool`), counters in compact :class:`Series`; a run of
null telemetry samples is a :class:`CounterGap`.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncroll.outputs.spool import Spool

Track = tuple[str, Any]  # ("trajectory", id) | ("worker", n) | ("model", lane) | ("scheduler", 0)
# | ("telemetry", resource field): the gaps of that field's counter
SUFFIX = {
    "failed": " (failed)",
    "cancelled": " (cancelled)",
    "incomplete": " (incomplete)",
    "unmatched": " (unmatched end)",
}
COUNTER_LABELS = {
    "cpu_queue_depth": "CPU queue depth",
    "model_outstanding": "model requests outstanding",
    "active_trajectories": "active trajectories",
}
#: ``resource_sample`` fields drawn as counters when a sample carries them (a null value adds no point).
RESOURCE_LABELS = {
    "server_running": "server requests running",
    "server_waiting": "server requests waiting",
    "kv_cache_usage": "server KV-cache usage",
    "prompt_tokens_per_s": "server prompt tokens/s",
    "generation_tokens_per_s": "server generation tokens/s",
    "gpu_util_pct": "GPU utilisation %",
    "gpu_mem_util_pct": "GPU memory utilisation %",
}


@dataclass(slots=True)
class Span:
    """One drawn interval, or an instant when ``start == end``; ``state``: ok/failed/incomplete/unmatched,
    or cancelled: a request or job the stopping run cancelled (it did not fail: MEASUREMENT.md)."""

    track: Track
    cat: str
    name: str
    start: float
    end: float
    state: str = "ok"
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The name with its state suffix, unless the name already says it (a trajectory named ``failed``)."""
        return self.name if self.name == self.state else self.name + SUFFIX.get(self.state, "")


class SpanLog(Spool):
    """Spans (or instants) in a :class:`~asyncroll.outputs.spool.Spool`, as plain tuples, read back as
    :class:`Span`; counts the trajectory spans on the way in (the timeline's layout needs that number) and
    the event loop's stalls and stops (``trace.json`` gives them a thread of their own when there are any)."""

    def __init__(self, dir: Path | None = None) -> None:
        super().__init__(dir)
        self.trajectory_spans = 0
        self.loop_spans = 0

    def append(self, record: Any) -> None:
        span: Span = record
        self.trajectory_spans += span.cat == "trajectory"
        self.loop_spans += span.cat == "loop_stall"
        super().append((span.track, span.cat, span.name, span.start, span.end, span.state, span.args))

    def __iter__(self) -> Iterator[Any]:
        return (Span(*fields) for fields in super().__iter__())


class Series:
    """A counter's ``(t, value)`` steps, compactly: times in a float array, values as given (ints, floats,
    ``None``), so that both views draw exactly the numbers the events carried."""

    __slots__ = ("t", "values")

    def __init__(self) -> None:
        self.t = array("d")
        self.values: list[float | None] = []

    def append(self, t: float, value: float | None) -> None:
        self.t.append(t)
        self.values.append(value)

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self) -> Iterator[tuple[float, float | None]]:
        return zip(self.t, self.values, strict=True)


@dataclass(slots=True)
class CounterGap:
    """A run of samples in which a telemetry counter had no value, after it had one: from the first
    null sample to the next sample with a value (or the last sample of the run)."""

    name: str
    start: float
    end: float
    samples: int = 0
    reasons: list[str] = field(default_factory=list)  # the samples' null reasons, each once
    error: str | None = None  # the first sampling error inside the gap, if any

    @property
    def label(self) -> str:
        return f"no data ({', '.join(self.reasons) or 'null'})"


@dataclass
class Activity:
    """Everything both exporters draw, in seconds since measurement start (``t_min`` may be negative)."""

    spans: SpanLog = field(default_factory=SpanLog)
    instants: SpanLog = field(default_factory=SpanLog)
    #: (t, value) steps; a ``None`` value: unknown from t until the next point (telemetry only)
    counters: dict[str, Series] = field(default_factory=lambda: {k: Series() for k in COUNTER_LABELS})
    counter_gaps: list[CounterGap] = field(default_factory=list)
    trajectories: list[Any] = field(default_factory=list)
    workers: set[int] = field(default_factory=set)
    model_lanes: int = 0
    t_min: float = 0.0
    t_max: float = 0.0
    events: int = 0
    unknown: Counter[str] = field(default_factory=Counter)
    invalid_lines: int = 0
    run: dict[str, Any] = field(default_factory=dict)
    #: the ``resource_probe`` sources as found before the clock started (None: no probe event in the run)
    telemetry_sources: list[dict[str, Any]] | None = None
    resource_samples: int = 0
    last_sample_t: float | None = None
