"""What a policy sees (a frozen snapshot of the CPU queue) and what it returns (a decision).

A policy is called each time a worker is free and at least one job waits. It must be a pure function of
the snapshot so that it can be unit-tested from factories and replayed by the simulator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

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
    resubmission: bool = False  # the trajectory already ran this tool: a repair / retry
    n_tests: int = 0  # evaluation jobs: tests the program will run
    test_bytes: int = 0  # evaluation jobs: bytes of test inputs
    code_bytes: int = 0  # evaluation jobs: bytes of submitted code


class Prediction(NamedTuple):
    """A job's predicted execute time and where it came from (``prior``, ``ridge``,
    ``same_problem_first_evaluation``). A named tuple: a whole queue of them is made after every refit,
    and a tuple is made twice as fast as a frozen dataclass."""

    seconds: float
    source: str


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    """The CPU queue (oldest first) and the model-side pressure at one dispatch."""

    now: float
    jobs: tuple[JobView, ...]
    model_outstanding: int
    # aligned with ``jobs``; empty for a policy that never reads them (``Policy``)
    predictions: tuple[Prediction, ...] = ()
    starvation_threshold: int = 1
    admission_pending: bool = True  # a problem waits for an active slot (False: the batch's tail)
    workers: int = 1  # the pool's size
    # aligned with ``jobs``: mean remaining service of the job's trajectory after jobs like it (None:
    # none seen yet); filled only in the batch's tail, where the critical-path rule reads it, and only
    # for a policy that reads it (``Policy``); the dispatcher's are made on the first read of a value
    # (:class:`~asyncroll.policies.queue_estimates.QueueEstimates`: valid while ``choose`` runs)
    remaining: Sequence[float | None] = ()
    # predicted seconds still to run on the jobs the workers hold (Σ max(0, min(predicted, the tool
    # timeout) − elapsed)); filled, like ``remaining``, only in the tail, where the balanced rule's
    # straggler guard reads it
    running_left: float = 0.0

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
    """``choose`` picks the next job. A policy may also say ``reads_remaining = False``: it never reads
    ``QueueSnapshot.remaining``, so the dispatcher leaves it empty (and estimates only the jobs each
    decision logs) instead of estimating every queued job at every decision in the tail; and
    ``reads_predictions = False``: it never reads ``QueueSnapshot.predictions``, which the dispatcher then
    leaves empty instead of gathering every queued job's prediction at every decision (they are still
    made, and logged, all the same)."""

    @property
    def name(self) -> str: ...

    def choose(self, snapshot: QueueSnapshot) -> Decision: ...
