"""The chain's remaining-work estimate at its edges: a first evaluation after turn 0 (its own predicted
time stands for its repair's at any turn), and a next job not seen to finish yet."""

from __future__ import annotations

from typing import Any

import pytest

from asyncroll.events import CpuEnqueued, CpuFinished, ModelFinished
from asyncroll.policies import JobView
from asyncroll.policies.remaining import StepwiseWork
from tests.test_remaining_chain import Script


def test_a_first_evaluation_after_turn_0_has_its_own_time_for_its_repair() -> None:
    """Four trajectories: a first evaluation at turn 1 (0.3 s), 0.4 s of model, its repair (1 s), the end.
    After a first evaluation predicted at 0.5 s comes 0.4 s + 0.5 s; predicted at 5 s, 0.4 s + 5 s."""
    work = StepwiseWork(own_repair=True)
    for i in range(4):
        script = Script(f"t{i}", work)
        script.model(0, 0.4)
        script.job(1, 0.3)
        script.model(1, 0.4)
        script.job(3, 1.0, resub=True)
        script.finish()
    first = JobView(9, "y", "tool", "crunch", 1, 0.0)
    assert work.estimate(first) == pytest.approx(1.4)  # no prediction: the repairs' mean, 1 s
    assert (work.estimate(first, 0.5), work.estimate(first, 5.0)) == (pytest.approx(0.9), pytest.approx(5.4))


def _queued_repairs(work: StepwiseWork, *, first_finishes: bool) -> None:
    """Three trajectories: a first evaluation (0.3 s, finished or still running), 0.2 s of model, then its
    repair queued and not finished: the chain knows what follows a first evaluation, not the repair's time."""
    for i in range(3):
        tid = f"q{i}"
        common: dict[str, Any] = {"id": tid, "kind": "tool", "tool": "crunch"}
        work(CpuEnqueued(**common, job_id=10 * i + 1, turn=0, arg_bytes=1, queue_depth=1))
        if first_finishes:
            work(
                CpuFinished(
                    **common, job_id=10 * i + 1, worker=0, ok=True, execute_s=0.3, cpu_s=None, roundtrip_s=0.3
                )
            )
        work(ModelFinished(id=tid, request_id=i, turn=1, latency_s=0.2, action="tool"))
        work(CpuEnqueued(**common, job_id=10 * i + 2, turn=1, arg_bytes=1, queue_depth=1, resubmission=True))


def test_a_next_job_not_seen_to_finish_counts_at_the_mean_of_every_finished_job() -> None:
    first = JobView(99, "y", "tool", "crunch", 0, 0.0)
    seen = StepwiseWork()
    _queued_repairs(seen, first_finishes=True)
    assert seen.estimate(first) == pytest.approx(0.2 + 0.3)  # the model turn, then a repair at the mean
    unseen = StepwiseWork()
    _queued_repairs(unseen, first_finishes=False)
    assert unseen.estimate(first) == pytest.approx(0.2)  # no job finished yet: the repair counts 0 s
