"""Online estimate of the work a CPU job unlocks: its trajectory's remaining service after the job ends.

The critical-path rule for a finite batch's tail needs, for each queued job, how much work its trajectory
still has to do once the job is done (later model turns and CPU jobs). That is not knowable from the job
alone (whether a repair follows depends on the verdict), but its *average* is learnable: jobs at the same
point of a trajectory — same kind and tool, first run or resubmission, same turn — leave similar work
behind them.

The estimator subscribes to the run's events. Per running trajectory it keeps one running total of
service (model latency of each finished request, execute time of each finished CPU job, a failed job's
round trip) and, for each finished CPU job, that total at the job's end; when the trajectory finishes,
each job's remaining work is the final total minus its mark, added to a running mean for the job's key
(``kind, tool, resubmission, turn``). Service times, not wall times: the estimate does not depend on the
queueing the schedule caused. Memory: a few floats per job of the active trajectories, and one mean per
key. State lives in one instance per run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asyncroll.events import (
    CpuEnqueued,
    CpuFailed,
    CpuFinished,
    Event,
    ModelFailed,
    ModelFinished,
    TrajectoryFinished,
)
from asyncroll.policies.base import JobView

Key = tuple[str, str, bool, int]  # (kind, tool, resubmission, turn)


def key_of(job: JobView) -> Key:
    return (job.kind, job.tool, job.resubmission, job.turn)


@dataclass(slots=True)
class _Trajectory:
    service_s: float = 0.0
    marks: list[tuple[Key, float]] = field(default_factory=list)  # (job key, service total at its end)


class RemainingWork:
    """Mean remaining service after a job, by the job's key; an event subscriber (``log.subscribe``)."""

    def __init__(self) -> None:
        self._running: dict[str, _Trajectory] = {}
        self._queued: dict[int, tuple[str, Key]] = {}  # job id → (trajectory, key), until it ends
        self._sum: dict[Key, float] = {}
        self._count: dict[Key, int] = {}
        self.observations = 0
        self._handlers: dict[type[Event], Callable[[Any], None]] = {
            ModelFinished: self._model_done,
            ModelFailed: self._model_done,
            CpuEnqueued: self._cpu_enqueued,
            CpuFinished: self._cpu_done,
            CpuFailed: self._cpu_done,
            TrajectoryFinished: self._trajectory_finished,
        }

    def estimate(self, job: JobView) -> float | None:
        """Mean remaining service (seconds) after jobs like this one; None before any has been seen."""
        key = key_of(job)
        count = self._count.get(key)
        return None if count is None else self._sum[key] / count

    def __call__(self, event: Event) -> None:
        # One lookup by the event's type (each event class is final): most events are of no interest here.
        handler = self._handlers.get(type(event))
        if handler is not None:
            handler(event)

    def _model_done(self, event: ModelFinished | ModelFailed) -> None:
        self._add(event.id, event.latency_s)

    def _cpu_enqueued(self, event: CpuEnqueued) -> None:
        assert event.id is not None
        self._queued[event.job_id] = (event.id, (event.kind, event.tool, event.resubmission, event.turn))

    def _cpu_done(self, event: CpuFinished | CpuFailed) -> None:
        job = self._queued.pop(event.job_id, None)
        if job is not None:
            seconds = event.execute_s if isinstance(event, CpuFinished) else event.roundtrip_s
            trajectory = self._add(job[0], seconds)
            trajectory.marks.append((job[1], trajectory.service_s))

    def _trajectory_finished(self, event: TrajectoryFinished) -> None:
        done = self._running.pop(event.id or "", None)
        if done is not None:
            for key, mark in done.marks:
                self._sum[key] = self._sum.get(key, 0.0) + done.service_s - mark
                self._count[key] = self._count.get(key, 0) + 1
                self.observations += 1

    def _add(self, trajectory_id: str | None, seconds: float) -> _Trajectory:
        trajectory = self._running.get(trajectory_id or "")
        if trajectory is None:
            trajectory = self._running[trajectory_id or ""] = _Trajectory()
        trajectory.service_s += seconds
        return trajectory
