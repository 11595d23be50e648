"""What a policy sees (a frozen snapshot of the CPU queue) and what it returns (a decision).

A policy is called each time a worker is free and at least one job waits. It must be a pure function of
the snapshot so that it can be unit-tested from factories and replayed by the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

JobKind = Literal["tool", "grade", "evaluate"]


@dataclass(frozen=True, slots=True)
class JobView:
    """A queued CPU job as policies see it: identity and features, never its payload."""

    job_id: int
    trajectory_id: str
    kind: JobKind
    tool: str
    turn: int
    enqueued_at: float
    arg_bytes: int = 0


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    """The CPU queue (oldest first) and the model-side pressure at one dispatch."""

    now: float
    jobs: tuple[JobView, ...]
    model_outstanding: int
    inflight_capacity: int
    free_workers: int

    @property
    def oldest(self) -> JobView:
        return self.jobs[0]


@dataclass(frozen=True, slots=True)
class Decision:
    """The chosen job and why; ``eligible`` says whether the policy's reordering rule could apply."""

    job_id: int
    reason: str
    eligible: bool = False


class Policy(Protocol):
    @property
    def name(self) -> str: ...

    def choose(self, snapshot: QueueSnapshot) -> Decision: ...
