"""The duration predictor's documented numbers, checked against literals rather than its own constants:
predictions clamped to [1 ms, 60 s] on every path, and a queued job predicted again once the model
changed (a prediction kept from the old model would rank the queue by the prior for the rest of the run)."""

from __future__ import annotations

import pytest

import asyncroll.runtime.assembly as assembly
from asyncroll.events import CpuSelected
from asyncroll.policies import JobView, Prediction
from asyncroll.policies.predictor import DurationPredictor
from tests.conftest import VirtualRun, tool_problem


def _job(i: int, size: int = 100, *, resub: bool = False, traj: str | None = None) -> JobView:
    return JobView(i, traj or f"t{i}", "tool", "crunch", 0, 0.0, arg_bytes=size, resubmission=resub)


def _steep() -> DurationPredictor:
    """A predictor that learned time ∝ argument bytes (1 µs per byte): it extrapolates far below 1 ms
    for a tiny job and far above 60 s for a huge one."""
    p = DurationPredictor()
    for i in range(100):
        size = 100 * (1 + i % 20)
        p.observe(_job(i, size), size / 1e6)
    return p


def test_a_few_queued_jobs_are_clamped_to_1_ms_and_60_s() -> None:
    tiny, huge = _steep().predict([_job(1000, 0), _job(1001, 10**12)])
    assert (tiny, huge) == (Prediction(0.001, "ridge"), Prediction(60.0, "ridge"))


def test_a_large_queue_is_clamped_to_1_ms_and_60_s() -> None:
    """More than 8 jobs are predicted in one matrix product: the same clamp."""
    jobs = [_job(1000 + i, 0 if i % 2 else 10**12) for i in range(12)]
    seconds = {x.seconds for x in _steep().predict(jobs)}
    assert seconds == {0.001, 60.0}


def _one_byte_apart() -> DurationPredictor:
    """A tool whose arguments were 9 or 10 bytes, the 9-byte jobs 0.1 ms and the 10-byte ones 600 s: the
    fit's slope on log argument bytes is ~150, so a 1 MB argument is e^700 s and more beyond the prior."""
    p = DurationPredictor()
    for i in range(1024):
        p.observe(_job(i, 9 if i % 2 else 10), 1e-4 if i % 2 else 600.0)
    return p


@pytest.mark.parametrize("queued", [1, 12], ids=["a few jobs", "a large queue"])
def test_an_extrapolation_past_a_float_is_clamped_to_60_s(queued: int) -> None:
    """A linear prediction past ~709 (log seconds) has no float exponential: the few-job path raised
    OverflowError ('math range error': a simulation of such a tool failed with it), and the matrix path
    printed numpy's 'overflow encountered in exp' RuntimeWarning (an error under the tests' filters)."""
    jobs = [_job(5000 + i, 10**6) for i in range(queued)]
    assert set(_one_byte_apart().predict(jobs)) == {Prediction(60.0, "ridge")}


def test_a_repair_predicted_by_its_first_evaluation_is_clamped_too() -> None:
    p = DurationPredictor()
    p.observe(_job(1, traj="quick"), 1e-5)
    p.observe(_job(2, traj="slow"), 1e5)
    quick, slow = p.predict([_job(3, resub=True, traj="quick"), _job(4, resub=True, traj="slow")])
    assert quick == Prediction(0.001, "same_problem_first_evaluation")
    assert slow == Prediction(60.0, "same_problem_first_evaluation")


def test_a_queued_job_is_predicted_again_after_a_refit() -> None:
    """A job queued under the prior and still queued after the model learned is predicted by the model."""
    p = DurationPredictor()
    queued = [_job(1000, 2000), _job(1001, 100)]
    assert p.predict(queued) == (Prediction(0.1, "prior"), Prediction(0.1, "prior"))
    for i in range(100):
        size = 100 * (1 + i % 20)
        p.observe(_job(i, size), size / 1000)
    long, short = p.predict(queued)
    assert (long.source, short.source) == ("ridge", "ridge")
    assert short.seconds < 0.5 < long.seconds


def test_update_gives_the_whole_queue_new_predictions_after_a_refit() -> None:
    p = DurationPredictor()
    queued = [_job(1000, 2000), _job(1001, 100)]
    assert list(p.update(lambda: queued, queued)) == queued
    assert p.prediction(1000) == Prediction(0.1, "prior")
    for i in range(100):
        size = 100 * (1 + i % 20)
        p.observe(_job(i, size), size / 1000)
    assert list(p.update(lambda: queued, [])) == queued  # refitted: every queued job is new to the model
    assert p.prediction(1000).source == p.prediction(1001).source == "ridge"
    assert p.prediction(1001).seconds < 0.5 < p.prediction(1000).seconds


def test_a_job_slower_than_the_60_s_clamp_is_learned_at_its_own_time() -> None:
    """Observations are kept up to 10 × the 60 s clamp: a 30 s evaluation is learned as 30 s (its repair
    predicted at 30 s, the tool's next job near it), a 200 s one as 200 s, predicted at the 60 s clamp."""
    p = DurationPredictor()
    for i in range(20):
        p.observe(_job(i, traj=f"slow{i}"), 30.0)
    p.observe(_job(100, traj="slower"), 200.0)
    repair, slower_repair, fresh = p.predict(
        [_job(101, resub=True, traj="slow0"), _job(102, resub=True, traj="slower"), _job(103)]
    )
    assert repair == Prediction(30.0, "same_problem_first_evaluation")
    assert slower_repair == Prediction(60.0, "same_problem_first_evaluation")
    assert fresh.source == "ridge" and 20.0 < fresh.seconds <= 60.0


@pytest.mark.timeout(20)
def test_a_ninth_tool_shares_a_bucket_instead_of_looking_for_a_free_one_forever() -> None:
    """Eight one-hot buckets: eight tools get one each, the ninth shares its hashed bucket."""
    p = DurationPredictor()
    for i in range(9):
        p.observe(JobView(i, "t", "tool", f"tool{i}", 0, 0.0), 0.1 * (i + 1))
    assert len(p.predict([JobView(100 + i, "t", "tool", f"tool{i}", 0, 0.0) for i in range(9)])) == 9
    assert len(set(p._buckets.values())) == 8 and len(p._buckets) == 9


def test_an_ended_trajectory_is_forgotten_and_the_others_keep_their_first_evaluation() -> None:
    """What the predictor keeps for repairs is bounded by the trajectories in flight: an ended one's first
    runs go (its repairs would come no more), every other one keeps its own, however many have ended
    (a cap of 10,000 dropped the oldest first, a trajectory still running among them)."""
    p = DurationPredictor()
    for i in range(20_000):
        p.observe(_job(i, traj=f"done{i}"), 1.0)
        p.end_trajectory(f"done{i}")
    p.observe(_job(20_000, traj="early"), 2.0)
    for i in range(20_001, 40_001):
        p.observe(_job(i, traj=f"later{i}"), 3.0)
    p.end_trajectory("never-seen")  # nothing to forget: no error
    early, ended = p.predict([_job(50_000, resub=True, traj="early"), _job(50_001, resub=True, traj="done1")])
    assert early == Prediction(2.0, "same_problem_first_evaluation") and ended.source == "ridge"
    assert len(p._first) == 20_001


def test_a_repair_is_never_the_first_evaluation_of_a_later_repair() -> None:
    """Only a trajectory's first run of a tool stands for its repairs: a repair observed while that first
    run is unknown (forgotten, or never observed) is learned by the model, not remembered as the first."""
    p = DurationPredictor()
    p.observe(_job(1, resub=True, traj="a"), 7.0)
    (again,) = p.predict([_job(2, resub=True, traj="a")])
    assert again.source == "ridge"
    p.observe(_job(3, traj="b"), 2.0)
    p.observe(_job(4, traj="b"), 5.0)  # a second first run (resubmission not flagged): the first one stands
    (repair,) = p.predict([_job(5, resub=True, traj="b")])
    assert repair == Prediction(2.0, "same_problem_first_evaluation")


def test_a_duration_that_is_not_a_number_is_not_learned() -> None:
    """``max(nan, 1e-4)`` is NaN: a NaN duration got through the clamp, and once in the window every
    prediction was the fit's NaN (then the 1 ms clamp: the ranking gone). ±inf are clamped as before."""
    p = _steep()
    p.observe(_job(2001, 300), float("nan"))
    p.observe(_job(2002, 300), float("inf"))
    p.observe(_job(2003, 300), float("-inf"))
    assert p.observations == 102
    small, big = p.predict([_job(2004, 1500), _job(2005, 20_000)])
    assert 0.001 < small.seconds < big.seconds < 60.0


def test_a_run_forgets_each_trajectorys_first_evaluations_when_it_ends(
    virtual_run: VirtualRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a run, a repair is still predicted by its trajectory's first run, and when the run ends its
    predictor keeps nothing for the trajectories that ended (it kept every one of them, up to 10,000)."""
    made: list[DurationPredictor] = []

    class Kept(DurationPredictor):
        def __init__(self) -> None:
            super().__init__()
            made.append(self)

    monkeypatch.setattr(assembly, "DurationPredictor", Kept)
    problems = [tool_problem(f"p{i}", model_ms=50, cpu_ms=100 + 10 * i, turns=2) for i in range(8)]
    outcome, capture, _ = virtual_run(problems, max_active_trajectories=8, cpu_workers=1, policy="asyncroll")
    assert outcome.summary is not None and outcome.summary["counts"]["completed"] == 8
    sources = {e.prediction_source for e in capture.of(CpuSelected) if e.job_id is not None}
    assert "same_problem_first_evaluation" in sources
    (predictor,) = made
    assert predictor.observations == 16 and predictor._first == {}
