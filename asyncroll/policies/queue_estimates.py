"""A tail snapshot's remaining-work estimates, made when a policy first reads them.

In the batch's tail the critical-path rules read every queued job's remaining-work estimate
(``QueueSnapshot.remaining``), and the dispatcher used to make them all before every decision: one Python
pass over the queue, which with every problem admitted at once holds thousands of jobs. Most of those
decisions never read them (a job past ``--aging-seconds`` goes first, and hard aging is the policy's first
step), so :class:`QueueEstimates` makes them in one :meth:`estimate_queue
<asyncroll.policies.remaining.RemainingEstimator.estimate_queue>` call on the first read of a value, and
not at all when none is read. Its length is the queue's without estimating anything. The values are those
the estimator gives at that read; the dispatcher changes its state only between decisions, so within one
``choose`` they are the snapshot's, as if made with it (a policy keeps no snapshot past its decision).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, overload

from asyncroll.policies.base import JobView, Prediction

if TYPE_CHECKING:
    from asyncroll.policies.remaining import RemainingEstimator


class QueueEstimates(Sequence[float | None]):
    """``estimator.estimate_queue(jobs, seconds)``, aligned with ``jobs``, made on the first read of a value
    (``len`` reads none)."""

    __slots__ = ("_estimator", "_jobs", "_predictions", "_values")

    def __init__(
        self, estimator: RemainingEstimator, jobs: Sequence[JobView], predictions: Sequence[Prediction]
    ) -> None:
        self._estimator = estimator
        self._jobs = jobs
        self._predictions = predictions  # aligned with jobs; their seconds are the estimator's ``predicted``
        self._values: tuple[float | None, ...] | None = None

    @property
    def made(self) -> bool:
        """Whether the estimates were made (a value was read)."""
        return self._values is not None

    def _made(self) -> tuple[float | None, ...]:
        if self._values is None:
            seconds = [p.seconds for p in self._predictions]
            self._values = self._estimator.estimate_queue(self._jobs, seconds)
        return self._values

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[float | None]:
        return iter(self._made())

    def __repr__(self) -> str:
        return f"QueueEstimates({list(self._values) if self._values is not None else '(not made)'})"

    @overload
    def __getitem__(self, index: int) -> float | None: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[float | None, ...]: ...

    def __getitem__(self, index: int | slice) -> float | tuple[float | None, ...] | None:
        return self._made()[index]
