"""The chain's remaining-work estimate at its edges: a first evaluation after turn 0 (its own predicted
time stands for its repair's at any turn, and only a first evaluation's, only for its own tool), a next job
not seen to finish yet, and a failed model request's latency (service like a finished one's)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from asyncroll.events import CpuEnqueued, CpuFinished, ModelFailed, ModelFinished, TrajectoryFinished
from asyncroll.policies import JobView
from asyncroll.policies.base import JobKind
from asyncroll.policies.remaining import RemainingWork, StepwiseWork
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


def test_only_a_first_evaluation_stands_for_its_repair() -> None:
    """Two repairs in a row (``max_generations`` 3): after the first repair comes the second, but the
    first repair's prediction (its first evaluation's time) is not the second's: the chain's mean is."""
    work = StepwiseWork(own_repair=True)
    for i in range(4):
        script = Script(f"t{i}", work)
        script.model(0, 0.4)
        script.job(0, 0.3)
        script.model(1, 0.4)
        script.job(1, 1.0, resub=True)
        script.model(1, 0.4)
        script.job(3, 1.0, resub=True)
        script.finish()
    repair = JobView(9, "y", "tool", "crunch", 1, 0.0, resubmission=True)
    assert work.estimate(repair) == pytest.approx(1.4)
    assert work.estimate(repair, 5.0) == pytest.approx(1.4)


def _job(work: Any, tid: str, job_id: int, tool: str, turn: int, seconds: float, resub: bool) -> None:
    common: dict[str, Any] = {"id": tid, "job_id": job_id, "kind": "tool", "tool": tool}
    work(CpuEnqueued(**common, turn=turn, arg_bytes=1, queue_depth=1, resubmission=resub))
    work(CpuFinished(**common, worker=0, ok=True, execute_s=seconds, cpu_s=None, roundtrip_s=seconds))


def test_a_first_run_stands_only_for_a_resubmission_of_its_own_tool() -> None:
    """After a first ``lookup`` comes a resubmission of another tool (``crunch``, 2 s): the lookup's own
    predicted time says nothing about it."""
    work = StepwiseWork(own_repair=True)
    for i in range(4):
        tid = f"m{i}"
        _job(work, tid, 10 * i + 1, "lookup", 0, 0.1, False)
        work(ModelFinished(id=tid, request_id=i, turn=1, latency_s=0.2, action="tool"))
        _job(work, tid, 10 * i + 2, "crunch", 1, 2.0, True)
        work(TrajectoryFinished(id=tid, status="completed", turns=2, tool_calls=2, duration_s=3.0))
    lookup = JobView(99, "y", "tool", "lookup", 0, 0.0)
    assert work.estimate(lookup) == pytest.approx(2.2)
    assert work.estimate(lookup, 9.0) == pytest.approx(2.2)


def test_a_failed_model_requests_latency_is_service_after_the_job() -> None:
    """A model request that failed after 2 s served its trajectory for 2 s, as a finished one would:
    both estimators count it in the work after the job before it."""
    means, chain = RemainingWork(), StepwiseWork(1)
    for i in range(2):
        tid = f"f{i}"
        for work in (means, chain):
            _job(work, tid, i, "crunch", 0, 0.3, False)
            work(ModelFailed(id=tid, request_id=i, turn=1, latency_s=2.0, kind="timeout", error="x"))
            work(TrajectoryFinished(id=tid, status="failed", turns=1, tool_calls=1, duration_s=3.0))
    job = JobView(99, "y", "tool", "crunch", 0, 0.0)
    assert means.estimate(job) == pytest.approx(2.0)
    assert chain.estimate(job) == pytest.approx(2.0)


@pytest.mark.parametrize("make", [lambda: StepwiseWork(own_repair=True), StepwiseWork, RemainingWork])
def test_a_whole_queue_is_estimated_as_each_job_alone(make: Any) -> None:
    """``estimate_queue`` (what the dispatcher asks at each decision in the tail) gives each job's own
    ``estimate`` exactly — jobs queued (their keys read from their ``CpuEnqueued``), jobs of keys never
    seen, first evaluations with their own predicted times — as the chain keeps learning in between."""
    rng = random.Random(7)
    work = make()
    queue: list[JobView] = []
    next_id = 1000
    for round_ in range(6):
        for i in range(8):
            script = Script(f"r{round_}-{i}", work)
            script.model(0, rng.uniform(0.1, 1.0))
            script.job(0, rng.uniform(0.01, 2.0))
            if rng.random() < 0.5:
                script.model(1, rng.uniform(0.1, 1.0))
                script.job(1, rng.uniform(0.01, 2.0), resub=True)
            script.model(2, 0.1)
            script.job(2, 0.001)
            script.finish()
        for _ in range(20):  # queued, not finished: the key from the event
            next_id += 1
            turn, resub = rng.choice([(0, False), (1, True), (2, False)])
            kind: JobKind = "grade" if turn == 2 else "tool"
            tool = "__grade__" if kind == "grade" else "crunch"
            work(
                CpuEnqueued(
                    id=f"q{next_id}",
                    job_id=next_id,
                    kind=kind,
                    tool=tool,
                    turn=turn,
                    arg_bytes=1,
                    queue_depth=1,
                    resubmission=resub,
                )
            )
            queue.append(JobView(next_id, f"q{next_id}", kind, tool, turn, 0.0, resubmission=resub))
        # a job of a key seen before whose CpuEnqueued was not (its key is made from the job)
        queue.append(JobView(next_id + 20_000, "unannounced", "tool", "crunch", 0, 0.0))
        queue.append(JobView(next_id + 10_000, "never", "tool", "other", 5, 0.0))  # a key never seen
        predicted = [rng.uniform(0.001, 3.0) for _ in queue]
        alone = tuple(work.estimate(job, seconds) for job, seconds in zip(queue, predicted, strict=True))
        assert work.estimate_queue(queue, predicted) == alone
        assert alone[-1] is None and any(value is not None for value in alone[:-1])
