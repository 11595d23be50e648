"""The baseline policies: ``fifo`` (and ``sync``, which is FIFO with one active trajectory) and
``tool_first`` (tool and evaluation jobs before terminal grade jobs; FIFO within each class)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from asyncroll.policies.base import Decision, QueueSnapshot


@dataclass(frozen=True)
class Fifo:
    """Oldest job first. ``sync`` is this policy with admission forced to one trajectory."""

    name: str = "fifo"
    reads_remaining: ClassVar[bool] = False
    reads_predictions: ClassVar[bool] = False

    def choose(self, snapshot: QueueSnapshot) -> Decision:
        return Decision(snapshot.oldest.job_id, "fifo")


@dataclass(frozen=True)
class ToolFirst:
    """Jobs that unlock further model turns (tool, evaluate) before terminal grade jobs; non-preemptive."""

    name: str = "tool_first"
    reads_remaining: ClassVar[bool] = False
    reads_predictions: ClassVar[bool] = False

    def choose(self, snapshot: QueueSnapshot) -> Decision:
        # jobs are oldest first, so the first non-grade job is the oldest of its class.
        for job in snapshot.jobs:
            if job.kind != "grade":
                reason = "fifo" if job is snapshot.oldest else "tool_before_grade"
                return Decision(job.job_id, reason)
        return Decision(snapshot.oldest.job_id, "fifo")
