"""Policies are pure functions of a snapshot: tested from factories, no runtime, no clock."""

from __future__ import annotations

import pytest

from asyncroll.policies import JobView, QueueSnapshot, get_policy
from asyncroll.policies.base import JobKind


def _snapshot(*kinds: JobKind) -> QueueSnapshot:
    jobs = tuple(
        JobView(job_id=10 + i, trajectory_id=f"t{i}", kind=k, tool="x", turn=0, enqueued_at=float(i))
        for i, k in enumerate(kinds)
    )
    return QueueSnapshot(now=100.0, jobs=jobs, model_outstanding=0)


@pytest.mark.parametrize("name", ["fifo", "sync"])
def test_fifo_takes_the_oldest(name: str) -> None:
    decision = get_policy(name).choose(_snapshot("grade", "tool", "tool"))
    assert (decision.job_id, decision.reason) == (10, "fifo")


def test_tool_first_prefers_unlocking_jobs_fifo_within_class() -> None:
    policy = get_policy("tool_first")
    assert policy.choose(_snapshot("grade", "grade", "tool", "evaluate")).job_id == 12
    assert policy.choose(_snapshot("grade", "grade", "tool")).reason == "tool_before_grade"
    assert policy.choose(_snapshot("grade", "grade")).job_id == 10
    assert policy.choose(_snapshot("tool", "grade")).reason == "fifo"


def test_policies_are_pure() -> None:
    snap = _snapshot("grade", "tool")
    policy = get_policy("tool_first")
    assert [policy.choose(snap) for _ in range(3)] == [policy.choose(snap)] * 3


def test_unknown_policy() -> None:
    with pytest.raises(ValueError, match="unknown"):
        get_policy("lifo")
