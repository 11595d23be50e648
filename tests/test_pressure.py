"""The pressure-aware policy and its predictor: pure decisions from factories, then the real runtime on
a virtual clock."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest

from asyncroll.events import CpuSelected
from asyncroll.policies import JobView, Prediction, QueueSnapshot, get_policy
from asyncroll.policies.base import JobKind
from asyncroll.policies.predictor import MAX_S, MIN_S, DurationPredictor
from asyncroll.policies.pressure import PressurePolicy
from asyncroll.policies.registry import PRESSURE_POLICIES
from bench import synthetic
from tests.conftest import VirtualRun

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
    """Jobs as (kind, predicted seconds, waited seconds), oldest first."""
    views = tuple(
        JobView(job_id=i + 1, trajectory_id=f"t{i}", kind=kind, tool="x", turn=0, enqueued_at=now - waited)
        for i, (kind, _, waited) in enumerate(jobs)
    )
    predictions = tuple(Prediction(pred, "ridge") for _, pred, _ in jobs)
    return QueueSnapshot(
        now, views, outstanding, 4, 1, predictions, threshold, pending, workers, remaining, running_left
    )


def test_hard_aging_wins_over_everything() -> None:
    decision = SEED.choose(snap(("tool", 0.5, 10), ("grade", 9.0, 31), ("tool", 0.01, 40)))
    assert (decision.job_id, decision.reason, decision.eligible) == (2, "hard_starvation_fifo", False)


def test_not_eligible_means_fifo() -> None:
    supplied = SEED.choose(snap(("tool", 5.0, 2), ("tool", 0.1, 1), outstanding=4))
    assert (supplied.job_id, supplied.reason, supplied.eligible) == (1, "not_eligible_model_supply_ok", False)
    single = SEED.choose(snap(("tool", 5.0, 2)))
    assert (single.job_id, single.reason, single.eligible) == (1, "not_eligible_single_job", False)
    reactive = SEED.choose(snap(("tool", 5.0, 2), ("tool", 0.1, 1), outstanding=1, threshold=1))
    assert reactive.job_id == 1 and not reactive.eligible


def test_shortest_predicted_when_eligible_and_grades_last() -> None:
    decision = SEED.choose(snap(("tool", 1.0, 2), ("tool", 0.1, 1), ("tool", 0.5, 1), outstanding=3))
    assert (decision.job_id, decision.reason, decision.eligible) == (
        2,
        "low_model_supply_predicted_unlock",
        True,
    )
    graded = SEED.choose(snap(("grade", 0.001, 5), ("tool", 2.0, 1)))
    assert graded.job_id == 2


def test_soft_aging_changes_the_order_gradually() -> None:
    # A: older, 1.0 s predicted; B: 0.5 s. A wins once 1.0 − 0.02 × waited < 0.5, i.e. waited > 25 s.
    assert SEED.choose(snap(("tool", 1.0, 20), ("tool", 0.5, 0))).job_id == 2
    assert SEED.choose(snap(("tool", 1.0, 26), ("tool", 0.5, 0))).job_id == 1


def test_tail_guard_prefers_the_longest_job_only_in_the_tail() -> None:
    jobs: tuple[Job, ...] = (("tool", 0.2, 1), ("tool", 3.0, 1), ("grade", 9.0, 1))
    assert GUARDED.choose(snap(*jobs, pending=True)).job_id == 1
    tail = GUARDED.choose(snap(*jobs, pending=False))
    assert (tail.job_id, tail.reason, tail.eligible) == (2, "tail_guard_longest_predicted", True)
    assert SEED.choose(snap(*jobs, pending=False)).job_id == 1


def test_unlock_ranks_grade_jobs_by_time_while_admission_waits_and_last_in_the_tail() -> None:
    jobs: tuple[Job, ...] = (("tool", 2.0, 1), ("grade", 0.01, 1), ("tool", 0.5, 1))
    pending = UNLOCK.choose(snap(*jobs, pending=True))
    assert (pending.job_id, pending.reason, pending.eligible) == (
        2,
        "low_model_supply_predicted_unlock",
        True,
    )
    assert UNLOCK.choose(snap(*jobs, pending=False)).job_id == 3  # the grade frees a slot nobody needs
    assert SEED.choose(snap(*jobs, pending=True)).job_id == 3  # the seed ranks grades last always


def test_unlock_hard_ages_relative_to_the_predicted_queue_drain() -> None:
    # Queue drains in (4 + 1 + 1) ÷ 2 workers = 3 s; twice that is 6 s < the absolute 30 s.
    jobs: tuple[Job, ...] = (("tool", 4.0, 6.5), ("tool", 1.0, 1), ("tool", 1.0, 0.5))
    aged = UNLOCK.choose(snap(*jobs, workers=2))
    assert (aged.job_id, aged.reason, aged.eligible) == (1, "hard_starvation_fifo", False)
    fresh = UNLOCK.choose(snap(("tool", 4.0, 5.5), *jobs[1:], workers=2))
    assert fresh.job_id == 2 and fresh.eligible
    assert SEED.choose(snap(*jobs, workers=2)).job_id == 2  # the seed ages only at 30 s


def test_critical_path_in_the_tail_runs_the_job_with_the_most_work_after_it() -> None:
    """In the tail, when eligible, the critical rule starts the job whose trajectory has the most work
    left after it (largest delivery time first): its own predicted time does not count, unknown = 0 s."""
    jobs: tuple[Job, ...] = (("tool", 0.2, 1), ("tool", 5.0, 1), ("grade", 0.01, 1), ("tool", 0.5, 1))
    rest = (3.0, 0.5, 0.0, None)
    tail = CRITICAL.choose(snap(*jobs, pending=False, remaining=rest))
    assert (tail.job_id, tail.reason, tail.eligible) == (1, "tail_critical_path", True)
    # without the first: 0.5 s left after the 5 s job (now job 1) beats 0 s and unknown
    assert CRITICAL.choose(snap(*jobs[1:], pending=False, remaining=rest[1:])).job_id == 1
    # a grade job ends its trajectory: it goes last, even before a tool job of a kind not yet seen to end
    older_grade = CRITICAL.choose(
        snap(("grade", 0.01, 2), ("tool", 0.3, 1), pending=False, remaining=(0.0, None))
    )
    assert (older_grade.job_id, older_grade.reason) == (2, "tail_critical_path")
    # model supply fine: not eligible, FIFO as in every pressure rule
    supplied = CRITICAL.choose(snap(*jobs[::-1], pending=False, remaining=rest[::-1], outstanding=4))
    assert (supplied.job_id, supplied.reason) == (1, "not_eligible_model_supply_ok")
    # while problems wait for admission (no estimates in the snapshot): the unlock rule, no drain aging
    assert CRITICAL.choose(snap(*jobs)).job_id == 3
    long_wait: tuple[Job, ...] = (("tool", 4.0, 6.5), ("tool", 1.0, 1), ("tool", 1.0, 0.5))
    assert CRITICAL.choose(snap(*long_wait, workers=2)).job_id == 2  # UNLOCK would age job 1 here
    assert CRITICAL.choose(snap(("tool", 4.0, 31), ("tool", 1.0, 1))).reason == "hard_starvation_fifo"


def test_balanced_rule_starts_a_job_that_would_end_the_batch_alone() -> None:
    """In the tail, with two or more workers, the longest predicted tool job goes first when it is longer than
    the pool's even share of the other queued jobs and of what the running jobs have left; otherwise (and
    with one worker, before the tail, or not eligible) the balanced rule is the critical-path rule."""
    jobs: tuple[Job, ...] = (("tool", 0.2, 1), ("tool", 5.0, 1), ("grade", 0.01, 1), ("tool", 0.5, 1))
    rest = (3.0, 0.5, 0.0, None)
    # 5 s > (0.2 + 0.01 + 0.5) / 2: started after the others, it would run alone at the end
    alone = BALANCED.choose(snap(*jobs, pending=False, remaining=rest, workers=2))
    assert (alone.job_id, alone.reason, alone.eligible) == (2, "tail_straggler_longest", True)
    # the running jobs' 10 s left: (10 + 0.71) / 2 = 5.35 s ≥ 5 s, so the others finish no earlier than it
    busy = BALANCED.choose(snap(*jobs, pending=False, remaining=rest, workers=2, running_left=10.0))
    assert (busy.job_id, busy.reason) == (1, "tail_critical_path")
    nearly = snap(*jobs, pending=False, remaining=rest, workers=2, running_left=9.0)
    assert BALANCED.choose(nearly).job_id == 2
    # one worker: the order of the last jobs does not change when they end
    single = BALANCED.choose(snap(*jobs, pending=False, remaining=rest, workers=1))
    assert single == CRITICAL.choose(snap(*jobs, pending=False, remaining=rest, workers=1))
    # a grade job is never the straggler, however long its prediction
    grades = BALANCED.choose(
        snap(("tool", 0.1, 1), ("grade", 9.0, 1), pending=False, remaining=(1.0, 0.0), workers=2)
    )
    assert (grades.job_id, grades.reason) == (1, "tail_critical_path")
    # before the tail and when not eligible: exactly the critical-path rule
    supplied = snap(*jobs, pending=False, remaining=rest, workers=2, outstanding=4)
    for view in (snap(*jobs, workers=2), supplied):
        assert BALANCED.choose(view) == CRITICAL.choose(view)


def test_the_rules_add_predictions_left_to_right_on_every_python() -> None:
    """The unlock rule's drain and the balanced rule's even share add the queue's predictions left to
    right, as ``sum`` did on Python 3.11; its compensated sum from 3.12 on differs in the last bit for
    these, which decided both boundaries the other way there (a simulation differing by Python version)."""
    # drain (0.4 + 0.3 + 0.1) ÷ 1 worker, aged at twice that: the oldest job waited exactly as long
    limit = 2 * (0.4 + 0.3 + 0.1)  # 1.5999999999999999; 1.6 by 3.12's sum
    aged = UNLOCK.choose(snap(("tool", 0.4, limit), ("tool", 0.3, 0), ("tool", 0.1, 0), now=limit))
    assert (aged.job_id, aged.reason) == (1, "hard_starvation_fifo")
    # the 0.8 s job's share: (0.1 + 0.3 + 0.8 − 0.8 + 1.2 s still running) ÷ 2 workers, exactly 0.8 s
    # left to right (0.7999999999999999 by 3.12's sum, a straggler there): it is not longer than its share
    jobs: tuple[Job, ...] = (("tool", 0.1, 1), ("tool", 0.3, 1), ("tool", 0.8, 1))
    even = BALANCED.choose(snap(*jobs, pending=False, remaining=(1.0, 0.5, 0.0), workers=2, running_left=1.2))
    assert (even.job_id, even.reason) == (1, "tail_critical_path")


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


def test_registry_names() -> None:
    assert get_policy("asyncroll") == PressurePolicy(
        "asyncroll_repair", unlock=True, drain_multiple=None, critical_path=True
    )
    assert get_policy("asyncroll_chain") == PressurePolicy(
        "asyncroll_chain", unlock=True, drain_multiple=None, critical_path=True
    )
    assert get_policy("asyncroll_critical") == CRITICAL
    assert get_policy("asyncroll_balanced") == BALANCED
    assert get_policy("asyncroll_unlock") == UNLOCK
    assert get_policy("asyncroll_seed") == SEED
    policy = get_policy("asyncroll_guarded", aging_seconds=5, aging_weight=0.1)
    assert isinstance(policy, PressurePolicy) and policy.tail_guard and policy.aging_seconds == 5


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


def _synthetic(n: int) -> tuple[list[dict[str, object]], dict[str, str]]:
    return synthetic.make(n, 400.0, 500.0, 3), {synthetic.TOOLS_FILE: synthetic.TOOLS_SOURCE}


def test_mechanism_fires_on_the_synthetic_workload(virtual_run: VirtualRun) -> None:
    problems, files = _synthetic(120)
    outcome, cap, _ = virtual_run(
        problems,
        simulate_tools=True,
        tool_files=files,
        policy="asyncroll",
        max_active_trajectories=8,
        max_inflight_model_requests=4,
        cpu_workers=2,
        max_turns=6,
    )
    assert outcome.summary is not None
    sched = outcome.summary["scheduler"]
    assert sched["eligible_decisions"] >= 0.2 * sched["decisions"]
    assert sched["reorders"] >= 10
    assert sched["prediction"]["pearson_log"] >= 0.7
    selected = cap.of(CpuSelected)
    # honest flags: an eligible decision is never a hard-aging pick, a reorder is logged as such
    assert all(not (e.eligible and e.reason == "hard_starvation_fifo") for e in selected)
    assert all(e.reordered == (e.job_id != e.oldest_job_id) for e in selected)
    assert all(e.threshold == 4 and e.predicted_s and len(e.candidates) <= 8 for e in selected)
    assert selected[0].observations == 0 and selected[0].prediction_source == "prior"


def test_predictions_are_logged_under_fifo_and_reset_per_run(virtual_run: VirtualRun) -> None:
    problems, files = _synthetic(30)
    for _ in range(2):
        outcome, cap, _ = virtual_run(
            problems, simulate_tools=True, tool_files=files, policy="fifo", max_turns=6
        )
        selected = cap.of(CpuSelected)
        assert selected[0].prediction_source == "prior" and selected[0].observations == 0
        assert all(not e.reordered and e.predicted_s for e in selected)
        assert outcome.summary is not None and outcome.summary["scheduler"]["prediction"]["pairs"] > 0


def test_hard_aging_in_the_runtime(virtual_run: VirtualRun) -> None:
    problems, files = _synthetic(60)
    outcome, cap, _ = virtual_run(
        problems,
        simulate_tools=True,
        tool_files=files,
        policy="asyncroll_seed",  # absolute aging only (the unlock rule also ages relative to the queue)
        aging_seconds=0.5,
        max_active_trajectories=16,
        cpu_workers=1,
        max_turns=6,
    )
    aged = [e for e in cap.of(CpuSelected) if e.reason == "hard_starvation_fifo"]
    # an aged pick is the oldest job (the oldest has waited longest), never counted as an eligible reorder
    assert aged and all(not e.eligible and not e.reordered and e.waited_s >= 0.5 for e in aged)
    assert all(e.job_id == e.oldest_job_id for e in aged)
    assert outcome.summary is not None and outcome.summary["counts"]["completed"] == 60


def test_every_policy_name_the_config_accepts_is_one_the_registry_builds() -> None:
    """``--policy`` is validated against config's list of names and built by the registry: the two lists
    must not drift apart (a rule added to one only would be refused, or accepted and then fail)."""
    from typing import get_args

    from asyncroll.config import PolicyName
    from asyncroll.policies.registry import PRESSURE_POLICIES

    names = set(get_args(PolicyName))
    assert names == {"sync", "fifo", "tool_first", "gpu_first", "asyncroll", *PRESSURE_POLICIES}
    for name in names:
        get_policy(name)


@pytest.mark.parametrize("policy", PRESSURE_POLICIES)
def test_pressure_policies_complete_everything(virtual_run: VirtualRun, policy: str) -> None:
    problems, files = _synthetic(40)
    outcome, _, _ = virtual_run(problems, simulate_tools=True, tool_files=files, policy=policy, max_turns=6)
    assert outcome.summary is not None and outcome.summary["counts"]["completed"] == 40


def test_the_critical_rule_takes_over_in_the_runtime_tail(virtual_run: VirtualRun) -> None:
    """In a real (virtual-clock) run the tail's decisions use the remaining-work estimates the run learned
    from its own events; before the tail none does."""
    problems, files = _synthetic(60)
    outcome, cap, _ = virtual_run(
        problems,
        simulate_tools=True,
        tool_files=files,
        policy="asyncroll_critical",
        max_active_trajectories=16,
        cpu_workers=1,
        max_turns=6,
    )
    assert outcome.summary is not None and outcome.summary["counts"]["completed"] == 60
    selected = cap.of(CpuSelected)
    tail = [e for e in selected if e.reason == "tail_critical_path"]
    assert tail and all(e.eligible for e in tail)
    assert any(e.reordered for e in tail)
    first_tail = selected.index(tail[0])
    assert all(e.reason != "tail_critical_path" for e in selected[:first_tail])
    # the estimates the tail decided on are logged, for the chosen job and every candidate; none before
    assert all(e.remaining_s is None for e in selected[:first_tail])
    assert all(c.remaining_s is None for e in selected[:first_tail] for c in e.candidates)
    assert all(e.candidates and e.candidates[0].remaining_s is not None for e in tail if e.remaining_s)
    chosen = [e for e in tail if e.reordered and e.remaining_s is not None]
    assert chosen and all(
        e.remaining_s >= max(c.remaining_s or 0.0 for c in e.candidates) for e in chosen
    )  # the critical pick has the most work after it among the logged candidates
    assert outcome.summary["scheduler"]["reasons"]["tail_critical_path"] == len(tail)


def test_the_balanced_rule_weighs_what_the_running_jobs_have_left(
    virtual_run: VirtualRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dispatcher tells the policy, in the tail, the predicted seconds the running jobs still have
    (Σ max(0, predicted − time since selected), recomputed here from the run's own cpu_selected and
    cpu_finished events), and the straggler guard fires in a real (virtual-clock) run with two workers."""
    from asyncroll.runtime import run as run_module

    seen: list[QueueSnapshot] = []

    class Spy:
        name = "asyncroll_balanced"

        def choose(self, snapshot: QueueSnapshot) -> Any:
            seen.append(snapshot)
            return BALANCED.choose(snapshot)

    monkeypatch.setattr(run_module, "get_policy", lambda *a, **k: Spy())
    problems, files = _synthetic(80)
    outcome, cap, _ = virtual_run(
        problems,
        simulate_tools=True,
        tool_files=files,
        policy="asyncroll",
        max_active_trajectories=16,
        max_inflight_model_requests=8,
        cpu_workers=2,
        max_turns=6,
    )
    assert outcome.summary is not None and outcome.summary["counts"]["completed"] == 80
    from asyncroll.events import CpuFailed, CpuFinished

    selected = cap.of(CpuSelected)
    assert len(seen) == len(selected)
    snapshots = dict(zip((id(e) for e in selected), seen, strict=True))
    running: dict[int, tuple[float, float]] = {}  # job → (selected at, predicted s)
    checked = tails = 0
    for event in cap.events:
        if isinstance(event, CpuFinished | CpuFailed):
            running.pop(event.job_id, None)
        elif isinstance(event, CpuSelected):
            snapshot = snapshots[id(event)]
            if snapshot.remaining:  # the tail: the dispatcher weighed the running jobs
                expected = sum(max(0.0, p - (snapshot.now - t)) for t, p in running.values())
                assert snapshot.running_left == pytest.approx(expected, abs=1e-5)
                assert event.running_left_s == round(snapshot.running_left, 6)  # logged with the decision
                checked += expected > 0
                tails += 1
            else:
                assert snapshot.running_left == 0.0 and event.running_left_s is None
            assert event.predicted_s is not None  # the pressure policies predict every job they select
            running[event.job_id] = (snapshot.now, event.predicted_s)
    assert tails and checked  # some tail decisions saw running work
    reasons = outcome.summary["scheduler"]["reasons"]
    assert reasons.get("tail_straggler_longest", 0) > 0 and reasons.get("tail_critical_path", 0) > 0


def test_what_the_running_jobs_have_left_is_capped_at_the_tool_timeout(
    virtual_run: VirtualRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A running job is stopped at the tool timeout, so it cannot have more left than the timeout minus
    the time it has run, however long it was predicted (predictions go up to 60 s): the straggler guard
    must not wait for work that cannot happen."""
    from asyncroll.runtime import run as run_module

    seen: list[QueueSnapshot] = []

    class Spy:
        name = "asyncroll_balanced"

        def choose(self, snapshot: QueueSnapshot) -> Any:
            seen.append(snapshot)
            return BALANCED.choose(snapshot)

    def predict_long(self: DurationPredictor, jobs: Any) -> tuple[Prediction, ...]:
        return tuple(Prediction(50.0, "ridge") for _ in jobs)

    monkeypatch.setattr(run_module, "get_policy", lambda *a, **k: Spy())
    monkeypatch.setattr(DurationPredictor, "predict", predict_long)
    problems, files = _synthetic(24)
    outcome, _, _ = virtual_run(
        problems,
        simulate_tools=True,
        tool_files=files,
        policy="asyncroll",
        max_active_trajectories=16,
        max_inflight_model_requests=8,
        cpu_workers=2,
        max_turns=6,
        tool_timeout=5.0,
    )
    assert outcome.summary is not None and outcome.summary["counts"]["completed"] == 24
    tail = [s for s in seen if s.remaining]
    assert tail and any(s.running_left > 0 for s in tail)
    # one worker runs a job while the other decides: at most one timeout's worth left
    assert all(s.running_left <= 5.0 + 1e-9 for s in tail)


def test_decision_bench_times_the_scored_choice_not_the_hard_aging_shortcut() -> None:
    """``bench.decision`` times ``choose()`` with 64 queued jobs: each must be younger than the hard-aging
    bound, or ``choose()`` returns the first aged job without scoring any (what the bench used to time)."""
    import random

    from bench import decision

    queue = decision.make_queue(random.Random(0))
    assert len(queue) == 64 and all(decision.NOW - j.enqueued_at < 30.0 for j in queue)
    predictions = tuple(Prediction(1.0 + (37 * i + 5) % 64, "ridge") for i in range(len(queue)))
    chosen = get_policy("asyncroll").choose(decision.snapshot(queue, predictions))
    shortest = min(range(len(queue)), key=lambda i: predictions[i].seconds)
    assert (chosen.job_id, chosen.reason, chosen.eligible) == (queue[shortest].job_id, decision.SCORED, True)
    assert all(x > 0 for x in decision.one_repeat(0, calls=3))  # and the bench checks its own decision


def test_timeouts_enter_the_fit_in_the_runtime(virtual_run: VirtualRun) -> None:
    """A timed-out job is observed censored at the timeout by the dispatcher: the next job is predicted
    from it (not from the prior, as it would be if the slowest jobs were dropped)."""
    from asyncroll.events import CpuFailed
    from tests.conftest import tool_problem

    problems = [tool_problem("slow", model_ms=1, cpu_ms=5000), tool_problem("next", model_ms=2, cpu_ms=10)]
    outcome, cap, _ = virtual_run(problems, policy="fifo", cpu_workers=1, tool_timeout=1.0)
    assert outcome.status == "complete" and [e.reason for e in cap.of(CpuFailed)] == ["timeout"]
    after = next(e for e in cap.of(CpuSelected) if e.id == "next")
    assert after.observations == 1 and after.prediction_source == "ridge"
    assert after.predicted_s > 0.5  # pulled from the 0.1 s prior toward the 1 s timeout


def test_features_never_read_declared_results_or_expected_outputs(
    virtual_run: VirtualRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script's declared ``cpu_ms`` and ``passes`` and the tests' expected outputs (simulation-only or
    hidden) must not reach the predictor's features: the same jobs give the same rows without them."""
    import copy

    import asyncroll.policies.predictor as predictor
    from tests.test_one_repair import _code_problem

    def rows(problems: list[dict[str, Any]]) -> dict[tuple[str, bool], list[float]]:
        seen: dict[tuple[str, bool], list[float]] = {}  # by job: (problem, repair); job ids follow timing
        real = predictor.features

        def record(job: JobView) -> list[float]:
            row = seen[(job.trajectory_id, job.resubmission)] = real(job)
            return row

        with monkeypatch.context() as patch:
            patch.setattr(predictor, "features", record)
            outcome, _, _ = virtual_run(
                problems, policy="asyncroll", cpu_workers=1, max_active_trajectories=4
            )
        assert outcome.status == "complete"
        return seen

    plain = [_code_problem(f"p{i}", [False, True]) for i in range(6)]
    loaded = copy.deepcopy(plain)
    for i, problem in enumerate(loaded):
        for action in problem["script"]:
            action["cpu_ms"] = 40 * (i + 1) ** 2
        problem["script"][-1]["passes"] = False  # the last generation: the same path either way
        for test in problem["metadata"]["reference_tests"]:
            test["output"] = "x" * 1000 * (i + 1)
    first = rows(plain)
    assert len(first) == 12 and first == rows(loaded)


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


def test_every_way_a_job_leaves_its_worker_clears_what_it_had_left() -> None:
    """The straggler guard weighs what the running jobs have left (the dispatcher's slot → (selected at,
    predicted) table): an entry left behind by a job that is gone would count forever (the guard would
    never fire again). A job leaves its worker by finishing, by failing (a tool error), by a timeout (the
    worker replaced), by a stop while it runs, and by a stop in the same loop step as it was handed a
    worker; after each, no entry is left."""
    import asyncio

    from asyncroll.clock import VirtualClock
    from asyncroll.event_log import EventLog
    from asyncroll.events import CpuStarted
    from asyncroll.runtime.dispatcher import CpuDispatcher, JobSpec
    from asyncroll.runtime.model_gate import ModelGate
    from asyncroll.runtime.pool import WorkerPool
    from asyncroll.runtime.virtual_worker import VirtualWorker

    clock = VirtualClock()

    def job(ms: float, tool: str = "sleep_ms") -> JobSpec:
        return JobSpec("t", "tool", tool, {"milliseconds": ms}, 0)

    async def stopped(task: asyncio.Task[Any]) -> None:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def scenario() -> dict[str, dict[int, tuple[float, float]]]:
        events = EventLog(clock)
        events.start_measurement()
        pool = WorkerPool(2, lambda i, g: VirtualWorker(i, g, clock), clock, events)
        gate = ModelGate(1, clock, events)
        dispatcher = CpuDispatcher(pool, get_policy("asyncroll"), gate, clock, events, tool_timeout=1.0)
        left: dict[str, dict[int, tuple[float, float]]] = {}
        async with asyncio.TaskGroup() as tg:
            await pool.start(tg)
            assert (await dispatcher.run(job(10))).ok
            left["finished"] = dict(dispatcher._running)
            assert not (await dispatcher.run(job(1, tool="no_such_tool"))).ok
            left["tool error"] = dict(dispatcher._running)
            assert (await dispatcher.run(job(5000))).failure == "timeout"
            left["timeout"] = dict(dispatcher._running)
            await clock.sleep(0.1)  # the replacement starts
            running = asyncio.create_task(dispatcher.run(job(500)))
            await clock.sleep(0.1)
            assert len(dispatcher._running) == 1  # it holds a worker
            await stopped(running)
            left["stopped while running"] = dict(dispatcher._running)
            await clock.sleep(0.1)
            # both workers busy, a third job waits; the first to finish hands it a worker, and the run
            # stops it in that same loop step (before its task runs again)
            busy = [asyncio.create_task(dispatcher.run(job(ms))) for ms in (200, 300)]
            await clock.sleep(0.01)
            waiting = asyncio.create_task(dispatcher.run(job(50)))
            await clock.sleep(0.01)
            loop = asyncio.get_running_loop()
            handed: list[int] = []

            def on_started(event: Any) -> None:
                if isinstance(event, CpuStarted) and event.job_id == 7:
                    handed.append(event.job_id)
                    loop.call_soon(waiting.cancel)  # runs before the task wakes with its worker

            events.subscribe(on_started)
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert handed == [7]
            await asyncio.gather(*busy)
            left["stopped as handed a worker"] = dict(dispatcher._running)
            await pool.aclose()
        return left

    left = clock.run(scenario())
    assert len(left) == 5 and all(entries == {} for entries in left.values()), left
