"""What the pressure rules decide on, learned from factories' jobs and events: the duration predictor
(prior, ridge fit, clamping, censored timeouts, refits, the same bits on every Python) and the work a
trajectory still has after a job."""

from __future__ import annotations

import itertools
import math
import random
import zlib
from typing import Any

import numpy as np
import pytest

from asyncroll.policies import JobView, Prediction
from asyncroll.policies.base import JobKind
from asyncroll.policies.predictor import MAX_S, MIN_S, DurationPredictor


def test_remaining_work_learns_the_service_left_after_each_job() -> None:
    """Per job key, the mean service (model latency + CPU execute) its trajectory still had after it."""
    from asyncroll.events import CpuEnqueued, CpuFailed, CpuFinished, ModelFinished, TrajectoryFinished
    from asyncroll.policies.remaining import RemainingWork

    work = RemainingWork()
    first = JobView(1, "a", "tool", "crunch", 0, 0.0)
    assert work.estimate(first) is None

    def trajectory(tid: str, base: int, repair: bool) -> None:
        def model(turn: int, s: float) -> None:
            work(ModelFinished(id=tid, request_id=base + turn, turn=turn, latency_s=s, action="tool"))

        def job(jid: int, turn: int, s: float, resub: bool = False, failed: bool = False) -> None:
            kind: JobKind = "grade" if turn == 2 else "tool"
            tool = "__grade__" if kind == "grade" else "crunch"
            fields: dict[str, Any] = {"id": tid, "job_id": jid, "kind": kind, "tool": tool}
            work(CpuEnqueued(**fields, turn=turn, arg_bytes=1, queue_depth=1, resubmission=resub))
            if failed:  # a timed-out job counts at its round trip
                work(CpuFailed(**fields, worker=0, reason="timeout", roundtrip_s=s, error="timed out"))
            else:
                work(CpuFinished(**fields, worker=0, ok=True, execute_s=s, cpu_s=None, roundtrip_s=s))

        model(0, 0.4)
        job(base + 1, 0, 0.3)  # first evaluation: 0.3 s
        if repair:
            model(1, 0.4)
            job(base + 2, 1, 1.0, resub=True, failed=True)
        model(2, 0.2)
        job(base + 3, 2, 0.0)  # the grade
        work(TrajectoryFinished(id=tid, status="completed", turns=3, tool_calls=2, duration_s=9.0))

    trajectory("a", 100, repair=True)  # after the first evaluation: 0.4 + 1.0 + 0.2 + 0 = 1.6 s
    trajectory("b", 200, repair=False)  # after it: 0.2 s
    assert work.estimate(first) == pytest.approx((1.6 + 0.2) / 2)
    repair = JobView(9, "c", "tool", "crunch", 1, 0.0, resubmission=True)
    assert work.estimate(repair) == pytest.approx(0.2)
    assert work.estimate(JobView(9, "c", "grade", "__grade__", 2, 0.0)) == 0.0
    assert work.estimate(JobView(9, "c", "tool", "other", 0, 0.0)) is None  # another tool: unknown
    assert work.observations == 5 and not work._running and not work._queued


def _job(
    i: int, *, size: int = 100, tool: str = "crunch", resub: bool = False, traj: str | None = None
) -> JobView:
    return JobView(i, traj or f"t{i}", "tool", tool, 0, 0.0, arg_bytes=size, resubmission=resub)


def test_predictor_prior_learning_and_clamping() -> None:
    p = DurationPredictor()
    assert p.predict([_job(1)]) == (Prediction(0.1, "prior"),)
    for i in range(200):
        size = 100 * (1 + i % 20)
        p.observe(_job(i, size=size), size / 1000)  # cost proportional to argument bytes
    small, large = p.predict([_job(1000, size=150), _job(1001, size=1900)])
    assert small.source == large.source == "ridge"
    assert small.seconds < 0.5 < large.seconds
    assert p.refits == 1  # refit once, at the first prediction after new observations
    p.observe(_job(2000, size=10**9), 10**6)
    extreme = p.predict([_job(2001, size=10**9), _job(2002, size=1)])
    assert all(MIN_S <= x.seconds <= MAX_S for x in extreme)


@pytest.mark.timeout(30)
def test_predictor_predicts_more_queued_jobs_than_its_first_matrix_holds() -> None:
    """More than 64 queued jobs predicted at once after a fit: the matrix of their rows grows while
    their slots are taken, and is read after that (it was read before: IndexError 64, a crashed run)."""
    p = DurationPredictor()
    p.observe(_job(0, size=100), 0.1)
    jobs = [_job(1 + i, size=100 + i) for i in range(200)]
    predicted = p.predict(jobs)
    assert len(predicted) == 200 and all(x.source == "ridge" for x in predicted)
    alone = DurationPredictor()
    alone.observe(_job(0, size=100), 0.1)
    assert alone.predict([jobs[150]])[0].seconds == pytest.approx(predicted[150].seconds)


def test_predictor_fit_equals_sklearn_ridge_on_its_window() -> None:
    from sklearn.linear_model import Ridge

    from asyncroll.policies.predictor import features

    p = DurationPredictor(window=64, alpha=1.0)
    jobs = [_job(i, size=10 + 37 * i % 900, tool=("a", "b", "c")[i % 3]) for i in range(100)]
    for i, job in enumerate(jobs):
        p.observe(job, 0.002 * (1 + (7 * i) % 13))
    p.predict([_job(5000)])  # refits
    kept = range(100 - 64, 100)  # the ring buffer holds the newest 64 observations
    x = np.array([features(jobs[i]) for i in kept])
    y = np.array([math.log(0.002 * (1 + (7 * i) % 13)) - math.log(p.prior_s) for i in kept])
    reference = Ridge(alpha=1.0, fit_intercept=False).fit(x, y).coef_
    assert p._coef is not None
    np.testing.assert_allclose(p._coef, reference, rtol=1e-9, atol=1e-12)


def test_a_few_queued_jobs_are_predicted_with_the_same_bits_on_every_python() -> None:
    """A batch of up to ``SMALL_BATCH`` jobs is predicted in Python: each job's 15 features times the
    coefficients, added left to right from the first, as ``sum`` did on 3.11. ``sum`` of floats compensates
    its rounding errors from 3.12 on, which moved 140 of these 200 predictions by a few ulps there: a
    simulation could choose another job at a tie on 3.12 than on 3.11 (the suite runs on 3.11 to 3.13)."""
    from asyncroll.policies.predictor import SMALL_BATCH, features

    def job(i: int) -> JobView:  # every feature non-zero in some jobs: an evaluation's sizes too
        kind: JobKind = ("tool", "evaluate", "grade")[i % 3]
        size, tool = (i * 7919) % 5000, ("crunch", "lookup", "evaluate", "grade")[i % 4]
        return JobView(i, f"t{i}", kind, tool, i % 5, 0.0, size, i % 4 == 1, i % 9, size // 3, 7 * i % 900)

    p = DurationPredictor()
    for i in range(60):
        p.observe(job(i), 0.003 + (i * 7919) % 5000 * (1 + i % 7) / 1e5)
    jobs = [job(1000 + i) for i in range(200)]
    predicted = [x for k in range(0, len(jobs), SMALL_BATCH) for x in p.predict(jobs[k : k + SMALL_BATCH])]
    assert p._coef is not None and all(x.source == "ridge" for x in predicted)
    coef = [float(c) for c in p._coef]

    def left_to_right(row: list[float]) -> float:
        total = 0.0
        for x, c in zip(row, coef, strict=True):
            total += x * c
        return total

    expected = [min(max(math.exp(left_to_right(features(j)) + math.log(0.1)), MIN_S), MAX_S) for j in jobs]
    assert [x.seconds.hex() for x in predicted] == [e.hex() for e in expected]


def test_predictor_uses_first_evaluation_for_repairs_and_tools_apart() -> None:
    p = DurationPredictor()
    p.observe(_job(1, traj="a"), 2.5)
    repair, other = p.predict([_job(2, traj="a", resub=True), _job(3, traj="b", resub=True)])
    assert repair == Prediction(2.5, "same_problem_first_evaluation")
    assert other.source == "ridge"
    for i in range(100):
        p.observe(_job(10 + i, tool="slow"), 3.0)
        p.observe(_job(200 + i, tool="fast"), 0.01)
    slow, fast = p.predict([_job(500, tool="slow"), _job(501, tool="fast")])
    assert slow.seconds > 10 * fast.seconds


def test_censored_timeouts_are_kept() -> None:
    p = DurationPredictor()
    for i in range(20):
        p.observe(_job(i), 0.05)
    before = p.predict([_job(100)])[0].seconds
    for i in range(20):
        p.observe(_job(200 + i), 60.0, censored=True)
    after = p.predict([_job(300)])[0].seconds
    assert p.censored == 20 and after > 5 * before


def test_every_observation_is_fitted_before_it_leaves_the_window() -> None:
    """Refits come after every ~3% more observations, but at least every half window: in a long run
    (tens of thousands of jobs) the window of the newest observations must not turn over between two
    refits, or the observations in between (timeouts included) never enter any fit."""
    window = 64
    p = DurationPredictor(window=window)
    refitted_at = [0]
    for i in range(3000):
        p.observe(_job(i, size=10 + i % 50), 0.01 * (1 + i % 7))
        before = p.refits
        p.predict([_job(10**6 + i)])  # one dispatch after each finished job
        if p.refits > before:
            refitted_at.append(p.observations)
    gaps = [b - a for a, b in itertools.pairwise(refitted_at)]
    assert max(gaps) <= window // 2
    assert len(refitted_at) < 300  # still one refit per batch of observations, not one per observation


def test_the_window_holds_what_one_observation_at_a_time_would_have_written() -> None:
    """Observations wait in lists and enter the ring buffer together before the next refit: at each refit
    its rows and targets are, bit for bit, those written one observation at a time — whether the batch
    fits before the end of the buffer, wraps around it, or fills the whole window between two refits."""
    from asyncroll.policies.predictor import FEATURES, features

    window = 16
    p = DurationPredictor(window=window)
    x, y = np.zeros((window, FEATURES)), np.zeros(window)
    at = stored = refits = since = longest = 0

    def predict(job: JobView) -> None:
        nonlocal refits, since, longest
        p.predict([job])
        if p.refits > refits:  # refitted on the window as it is now
            refits, since, longest = p.refits, 0, max(longest, since)
            assert p._stored == stored and p._next == at
            assert np.array_equal(p._x, x) and np.array_equal(p._y, y)

    rng = np.random.default_rng(5)
    for i in range(400):
        job = _job(i, size=int(rng.integers(1, 5000)), tool=("a", "b")[i % 2], resub=i % 5 == 0)
        if i % 3 and i < 250:
            predict(job)  # a queued job's row is computed once and kept until it is observed
        seconds = float(rng.lognormal(-2, 1))
        p.observe(job, seconds)
        x[at], y[at] = features(job), math.log(min(max(seconds, MIN_S / 10), MAX_S * 10)) - math.log(0.1)
        at, stored, since = (at + 1) % window, min(stored + 1, window), since + 1
        if rng.random() < (0.03 if i >= 250 else 0.3):  # late: more than a whole window between refits
            predict(_job(10**6 + i))
    assert refits > 20 and longest > window


def test_predictor_update_makes_the_same_predictions_as_predict_to_the_bit() -> None:
    """The dispatcher keeps the queue's predictions and has the predictor ``update`` only the jobs queued
    since its last call (the whole queue after a refit): the same jobs must be predicted in the same
    batches as ``predict(queue)`` did, since a batch of at most 8 jobs is computed another way than a
    larger one (a few ulps apart): every prediction equal to the bit, through refits, first evaluations
    known, jobs leaving the queue, small and large batches."""
    rng = random.Random(7)
    whole, incremental = DurationPredictor(), DurationPredictor()
    queue: dict[int, JobView] = {}
    kept: dict[int, Prediction] = {}  # the incremental caller's predictions of the queue
    new: list[JobView] = []
    next_id = 0
    for _ in range(600):
        for _ in range(rng.choice((0, 0, 1, 1, 2, 3, 12, 40))):  # small batches and large ones
            next_id += 1
            job = _job(
                next_id,
                size=rng.randint(1, 5000),
                tool=rng.choice(("a", "b")),
                resub=rng.random() < 0.3,
                traj=f"t{next_id % 50}",
            )
            queue[job.job_id] = job
            new.append(job)
        if not queue:
            continue
        jobs = tuple(queue.values())
        expected = whole.predict(jobs)
        for job in incremental.update(lambda: jobs, [j for j in new if j.job_id in queue]):  # noqa: B023
            kept[job.job_id] = incremental.prediction(job.job_id)
        new.clear()
        assert tuple(kept) == tuple(queue)  # in the queue's order
        got = tuple(kept.values())
        assert [(p.seconds.hex(), p.source) for p in got] == [(p.seconds.hex(), p.source) for p in expected]
        for _ in range(rng.randint(0, min(4, len(queue)))):  # some leave the queue: run and observed, or not
            job = queue.pop(rng.choice(tuple(queue)))
            del kept[job.job_id]
            if rng.random() < 0.1:
                whole.forget(job)
                incremental.forget(job)
            else:
                seconds = 0.001 * job.arg_bytes * (2.0 if job.tool == "a" else 1.0)
                whole.observe(job, seconds)
                incremental.observe(job, seconds)
    assert whole.refits == incremental.refits > 40 and whole.observations > 1000


def tool_bucket(name: str) -> int:
    """The bucket a tool's name hashes to (CRC-32: the same in every process, unlike ``hash``)."""
    from asyncroll.policies.predictor import HASH_BUCKETS

    return zlib.crc32(name.encode()) % HASH_BUCKETS


def test_tools_whose_names_share_a_hash_bucket_are_still_told_apart() -> None:
    """The tool's identity is hashed into 8 one-hot buckets, and two names share one whenever their CRC-32s
    agree mod 8 (``search`` and ``sql`` do, as ``lookup`` and ``slow``, ``spin_ms`` and ``lcb_evaluate``):
    a 5 ms tool and a 2 s tool with the same arguments' size were both predicted at their geometric mean,
    ~100 ms, for ever. A run's first 8 tools get a bucket each."""
    from asyncroll.policies.predictor import HASH_BUCKETS

    pairs = [("search", "sql"), ("lookup", "slow"), ("spin_ms", "lcb_evaluate")]
    for cheap, costly in pairs:
        assert tool_bucket(cheap) == tool_bucket(costly)
        p = DurationPredictor()
        for i in range(100):
            p.observe(_job(i, tool=cheap), 0.005)
            p.observe(_job(1000 + i, tool=costly), 2.0)
        fast, slow = p.predict([_job(5000, tool=cheap), _job(5001, tool=costly)])
        assert fast.seconds < 0.01 and slow.seconds > 1.0, (cheap, costly, fast, slow)
    # as many tools as buckets, every one hashed to the same bucket: each still learns its own cost
    names = [n for n in (f"tool{i}" for i in range(10_000)) if tool_bucket(n) == 0][:HASH_BUCKETS]
    p = DurationPredictor()
    for i in range(50):
        for k, name in enumerate(names):
            p.observe(_job(100 * i + k, tool=name), 0.01 * 2**k)
    predicted = p.predict([_job(10**6 + k, tool=name) for k, name in enumerate(names)])
    for k, x in enumerate(predicted):
        assert x.seconds == pytest.approx(0.01 * 2**k, rel=0.1)


def test_a_tool_hashed_like_the_grade_job_keeps_its_bucket() -> None:
    """A grade job has a feature of its own, so sharing its bucket costs a tool nothing: the grade job
    claims none, and a tool hashed to it keeps its bucket (the same rows, the same predictions)."""
    from asyncroll.policies.predictor import features

    tool = next(n for n in (f"tool{i}" for i in range(10_000)) if tool_bucket(n) == tool_bucket("__grade__"))
    p = DurationPredictor()
    grade = JobView(1, "t1", "grade", "__grade__", 1, 0.0, arg_bytes=3)
    p.observe(grade, 0.001)
    job = _job(2, tool=tool)
    p.observe(job, 0.2)
    assert p._new_x == [features(grade), features(job)]


def test_a_grade_job_sharing_a_tools_bucket_is_told_apart_by_its_own_feature() -> None:
    """The grade feature is what tells a grade job from a tool hashed to the grade job's bucket: with the
    same argument sizes, a 1 ms grade job and a 1 s tool are each predicted near their own time (without
    it the two rows are equal and both are predicted at their geometric mean)."""
    tool = next(n for n in (f"tool{i}" for i in range(10_000)) if tool_bucket(n) == tool_bucket("__grade__"))
    p = DurationPredictor()
    for i in range(50):
        p.observe(JobView(i, f"g{i}", "grade", "__grade__", 1, 0.0, arg_bytes=100), 0.001)
        p.observe(_job(1000 + i, tool=tool), 1.0)
    grade, job = p.predict(
        [JobView(5000, "g", "grade", "__grade__", 1, 0.0, arg_bytes=100), _job(5001, tool=tool)]
    )
    assert grade.seconds < 0.005 and job.seconds > 0.5, (grade, job)
