"""Coverage-aware resource metrics: what the server and the GPU were doing while the client was blocked.

Built incrementally from the event stream, like the rest of the summary: :class:`ResourceMeter` reads
``resource_probe`` and ``resource_sample`` events and the client CPU-blocked state of
:class:`~asyncroll.outputs.blocked.BlockedMeter` (≥ 1 active trajectory, 0 model requests outstanding,
≥ 1 CPU job pending). Definitions (MEASUREMENT.md, "Telemetry and resource metrics"):

* A **window** is the span between two consecutive samples, clipped to the measured window. It is
  *covered* only when the two samples are at most :data:`MAX_GAP_INTERVALS` intervals apart and both
  have the values the estimate needs: running and waiting for the server, utilisation for the GPU.
* **Sampled model starvation** = client-blocked seconds inside server-covered windows whose two ends
  both saw the server with running = waiting = 0.
* **CPU-related idle candidate** = the same, in jointly covered windows whose two ends also saw GPU
  utilisation ≤ :data:`GPU_IDLE_PCT` %.
* **Coverage** = seconds of covered windows (server; joint = server and GPU).

An estimate with no coverage is ``null`` with the reason, never zero. Only the last window is held
back (the run's end clips it); everything else is folded into counters as samples arrive.
"""

from __future__ import annotations

from array import array
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from asyncroll.events import ResourceProbe, ResourceSample
from asyncroll.outputs.blocked import BlockedMeter
from asyncroll.outputs.statistics import distribution
from asyncroll.telemetry import REQUESTED_BY

MAX_GAP_INTERVALS = 3
GPU_IDLE_PCT = 10.0


@dataclass(frozen=True, slots=True)
class _Point:
    """One sample as the window arithmetic needs it."""

    t: float
    blocked: float  # cumulative client-blocked seconds at t
    server_idle: bool | None  # running = waiting = 0; None when either is unknown
    gpu_low: bool | None  # utilisation ≤ GPU_IDLE_PCT; None when unknown


def _ratio(num: float | None, den: float) -> float | None:
    return None if num is None or den <= 0 else round(num / den, 6)


class _Mean:
    """Count, mean and max of the non-null values of one sampled quantity."""

    __slots__ = ("max", "n", "total")

    def __init__(self) -> None:
        self.n = 0
        self.total = 0.0
        self.max: float | None = None

    def add(self, value: float | None) -> None:
        if value is None:
            return
        self.n += 1
        self.total += value
        self.max = value if self.max is None else max(self.max, value)

    def out(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "mean": None if self.n == 0 else round(self.total / self.n, 6),
            "max": self.max,
        }


class ResourceMeter:
    """Folds samples into coverage and starvation totals; shares the summary's blocked meter."""

    def __init__(self, blocked: BlockedMeter) -> None:
        self._blocked = blocked
        self.probe: ResourceProbe | None = None
        #: why no source was probed, when the run says (:meth:`TelemetrySampler.no_source_note`)
        self.no_source: str | None = None
        self._last: _Point | None = None
        self._pending: tuple[_Point, _Point] | None = None
        self._end: float | None = None  # the measured window's end, once the run says it has come
        self.windows: Counter[str] = Counter()
        self.seconds: defaultdict[str, float] = defaultdict(float)
        # telemetry bookkeeping
        self.samples = 0
        self.errors = 0
        self.counter_resets = 0
        self.nulls: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self.collection: defaultdict[str, array[float]] = defaultdict(lambda: array("d"))
        self.late = array("d")
        self.values: dict[str, _Mean] = {
            k: _Mean()
            for k in (
                "server_running",
                "server_waiting",
                "kv_cache_usage",
                "prompt_tokens_per_s",
                "generation_tokens_per_s",
                "gpu_util_pct",
                "gpu_mem_util_pct",
                "gpu_mem_used_bytes",
            )
        }

    @property
    def interval(self) -> float | None:
        return None if self.probe is None else self.probe.interval_s

    def on_probe(self, event: ResourceProbe) -> None:
        self.probe = event

    def end_window(self, end_s: float) -> None:
        """The measured window ended at ``end_s``: a sample taken later (during the run's cleanup, or the
        sampler's last one at its stop) adds only what lies inside the window."""
        self._end = end_s

    def on_sample(self, event: ResourceSample) -> None:
        self.samples += 1
        self.errors += len(event.errors)
        self.counter_resets += event.counter_resets
        for name, why in event.nulls.items():
            self.nulls[name][why] += 1
        for source, seconds in event.collection_s.items():
            self.collection[source].append(seconds)
        if event.late_s is not None:  # the final sample has no grid point
            self.late.append(event.late_s)
        for name, mean in self.values.items():
            mean.add(getattr(event, name))
        running, waiting, util = event.server_running, event.server_waiting, event.gpu_util_pct
        point = _Point(
            event.t,
            self._blocked.total(event.t),
            None if running is None or waiting is None else (running == 0 and waiting == 0),
            None if util is None else util <= GPU_IDLE_PCT,
        )
        if self._last is not None:
            if self._pending is not None:
                self._fold(*self._pending, end=self._end)
            self._pending = (self._last, point)
        self._last = point

    def _fold(self, a: _Point, b: _Point, end: float | None) -> None:
        """Add one window [a, b], clipped to [0, end], to the totals."""
        lo = max(a.t, 0.0)
        hi = b.t if end is None else min(b.t, end)
        if hi <= lo:
            return
        span = hi - lo
        blocked_hi = b.blocked if hi >= b.t else self._blocked.total(hi)
        blocked_lo = a.blocked if lo <= a.t else self._blocked.total(lo)
        blocked = min(span, max(0.0, blocked_hi - blocked_lo))
        interval = self.interval or 0.0
        self.windows["total"] += 1
        if b.t - a.t > MAX_GAP_INTERVALS * interval + 1e-9:
            self.windows["too_long"] += 1
            self.seconds["too_long"] += span
            return
        server = a.server_idle is not None and b.server_idle is not None
        gpu = a.gpu_low is not None and b.gpu_low is not None
        if server:
            self.windows["server_covered"] += 1
            self.seconds["server"] += span
            self.seconds["blocked_in_server"] += blocked
            if a.server_idle and b.server_idle:
                self.windows["server_idle"] += 1
                self.seconds["starvation"] += blocked
        if gpu:
            self.windows["gpu_covered"] += 1
            self.seconds["gpu"] += span
        if server and gpu:
            self.windows["joint_covered"] += 1
            self.seconds["joint"] += span
            self.seconds["blocked_in_joint"] += blocked
            if a.server_idle and b.server_idle and a.gpu_low and b.gpu_low:
                self.windows["idle_candidate"] += 1
                self.seconds["idle_candidate"] += blocked

    def _finish(self, makespan_s: float) -> None:
        if self._pending is not None:
            self._fold(*self._pending, end=makespan_s)
            self._pending = None

    def _source(self, name: str) -> dict[str, Any] | None:
        if self.probe is None:
            return None
        for status in self.probe.sources:
            if status.source == name:
                return {"available": status.available, "reason": status.reason, **status.detail}
        return None

    def telemetry(self) -> dict[str, Any]:
        """The ``telemetry`` section: sources, sample counts, nulls by field and reason, timings."""
        probe = self.probe
        sources = {s.source: self._source(s.source) for s in probe.sources} if probe is not None else {}
        return {
            "probed": probe is not None,
            "interval_s": self.interval,
            "sources": sources,
            "samples": self.samples,
            "errors": self.errors,
            "counter_resets": self.counter_resets,
            "nulls": {name: dict(reasons) for name, reasons in sorted(self.nulls.items())},
            "collection_s": {name: distribution(values) for name, values in sorted(self.collection.items())},
            "late_s": distribution(self.late),
            "values": {name: mean.out() for name, mean in self.values.items() if mean.n},
            "note": None if sources else self._no_source_note(),
        }

    def _no_source_note(self) -> str:
        if self.no_source is not None:
            return self.no_source
        return (
            f"no telemetry source probed: none requested ({REQUESTED_BY}), --no-telemetry, a simulation (it "
            "reads none), or the run stopped before the probe"
        )

    def _why_not(self, source: str, what: str) -> str:
        status = self._source(source)
        flag = "--metrics-url" if source == "server_metrics" else "--nvml-device"
        if status is None:
            return f"no {what} source: {flag} not given" if self.probe is not None else self._no_source_note()
        if not status["available"]:
            return f"{what} source unavailable: {status['reason']}"
        return (
            f"no covered {what} window (samples lacked the values, or were more than "
            f"{MAX_GAP_INTERVALS} intervals apart)"
        )

    def build(self, makespan_s: float, measured: bool = True) -> dict[str, Any]:
        """The ``resources`` section of ``summary.json``. ``measured`` False: the measured window never
        opened, so the client's blocked time is unknown (null), not 0."""
        self._finish(makespan_s)
        sec, win = self.seconds, self.windows
        server_s, joint_s = sec["server"], sec["joint"]
        starvation = round(sec["starvation"], 6) if win["server_covered"] else None
        idle = round(sec["idle_candidate"], 6) if win["joint_covered"] else None
        interval = self.interval
        return {
            "interval_s": interval,
            "max_gap_s": None if interval is None else round(MAX_GAP_INTERVALS * interval, 6),
            "windows": {
                k: win[k]
                for k in (
                    "total",
                    "too_long",
                    "server_covered",
                    "gpu_covered",
                    "joint_covered",
                    "server_idle",
                    "idle_candidate",
                )
            },
            "server_coverage_s": round(server_s, 6),
            "server_coverage_fraction": _ratio(server_s, makespan_s),
            "gpu_coverage_s": round(sec["gpu"], 6),
            "joint_coverage_s": round(joint_s, 6),
            "joint_coverage_fraction": _ratio(joint_s, makespan_s),
            "too_long_s": round(sec["too_long"], 6),
            "client_cpu_blocked_s": self._blocked.total(makespan_s) if measured else None,
            "blocked_in_server_coverage_s": round(sec["blocked_in_server"], 6) if measured else None,
            "blocked_in_joint_coverage_s": round(sec["blocked_in_joint"], 6) if measured else None,
            "sampled_starvation_s": starvation,
            "sampled_starvation_fraction_of_coverage": _ratio(starvation, server_s),
            "sampled_starvation_coverage_s": round(server_s, 6),
            "sampled_starvation_reason": None
            if starvation is not None
            else self._why_not("server_metrics", "server"),
            "cpu_idle_candidate_s": idle,
            "cpu_idle_candidate_fraction_of_coverage": _ratio(idle, joint_s),
            "cpu_idle_candidate_coverage_s": round(joint_s, 6),
            "cpu_idle_candidate_reason": None if idle is not None else self._idle_reason(),
        }

    def _idle_reason(self) -> str:
        if not self.windows["server_covered"]:
            return self._why_not("server_metrics", "server")
        return self._why_not("nvml", "GPU utilisation")


def gpu_hour(completed: int, makespan_s: float, dedicated_gpu: bool) -> dict[str, Any]:
    """Completions per allocated GPU-hour: only when the user declared one dedicated GPU for the run."""
    if not dedicated_gpu:
        return {
            "completed_per_gpu_hour": None,
            "completed_per_gpu_hour_reason": "only computed with --dedicated-gpu",
        }
    if makespan_s <= 0:
        return {
            "completed_per_gpu_hour": None,
            "completed_per_gpu_hour_reason": "the measured window is empty",
        }
    return {
        "completed_per_gpu_hour": round(completed / (makespan_s / 3600.0), 6),
        "completed_per_gpu_hour_reason": None,
        "allocated_gpu_hours": round(makespan_s / 3600.0, 9),
    }
