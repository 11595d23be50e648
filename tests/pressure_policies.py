"""The pressure-aware rules the tests compare with, built as the registry builds them: the seed rule, the
tail guard, the unlock rule, the critical-path rule and the balanced rule (critical path plus the
straggler guard), and the snapshots the decision tests hand them."""

from __future__ import annotations

from asyncroll.policies import JobView, Prediction, QueueSnapshot
from asyncroll.policies.base import JobKind
from asyncroll.policies.pressure import PressurePolicy

SEED = PressurePolicy("asyncroll_seed")
GUARDED = PressurePolicy("asyncroll_guarded", tail_guard=True)
UNLOCK = PressurePolicy("asyncroll_unlock", unlock=True)
CRITICAL = PressurePolicy("asyncroll_critical", unlock=True, drain_multiple=None, critical_path=True)
BALANCED = PressurePolicy(
    "asyncroll_balanced", unlock=True, drain_multiple=None, critical_path=True, straggler=True
)

Job = tuple[JobKind, float, float]  # kind, predicted s, waited s


def snap(
    *jobs: Job,
    outstanding: int = 0,
    threshold: int = 4,
    now: float = 100.0,
    pending: bool = True,
    workers: int = 1,
    remaining: tuple[float | None, ...] = (),
    running_left: float = 0.0,
) -> QueueSnapshot:
    """Jobs as (kind, predicted seconds, waited seconds), oldest first; ids 1, 2, … in that order."""
    views = tuple(
        JobView(job_id=i + 1, trajectory_id=f"t{i}", kind=kind, tool="x", turn=0, enqueued_at=now - waited)
        for i, (kind, _, waited) in enumerate(jobs)
    )
    predictions = tuple(Prediction(pred, "ridge") for _, pred, _ in jobs)
    return QueueSnapshot(
        now, views, outstanding, predictions, threshold, pending, workers, remaining, running_left
    )
