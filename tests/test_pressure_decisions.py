"""The pressure-aware rules as pure decisions: snapshots from factories, no runtime, no clock; the
registry that builds them by name, and the decision bench's queue."""

from __future__ import annotations

import math
import random
from dataclasses import replace

from asyncroll.policies import Prediction, QueueSnapshot, get_policy
from asyncroll.policies.base import JobKind
from asyncroll.policies.pressure import PressurePolicy
from tests.conftest import REPO
from tests.pressure_policies import BALANCED, CRITICAL, GUARDED, SEED, UNLOCK, Job, snap


def test_hard_aging_wins_over_everything() -> None:
    decision = SEED.choose(snap(("tool", 0.5, 10), ("grade", 9.0, 31), ("tool", 0.01, 40)))
    assert (decision.job_id, decision.reason, decision.eligible) == (2, "hard_starvation_fifo", False)


def test_a_trigger_that_held_is_not_eligible_when_hard_aging_or_no_prediction_took_it() -> None:
    """MEASUREMENT.md defined an eligible decision as one whose trigger held (≥ 2 queued, model outstanding
    < threshold): counted that way from cpu_selected events, a simulated run under the guarded rule had 86
    eligible decisions more than summary.json's, every one a hard-aged pick. The rules mark eligible only
    their own choice; the definition says so."""
    aged = SEED.choose(snap(("tool", 0.5, 10), ("tool", 0.01, 40), outstanding=0, threshold=4))
    no_predictions = replace(snap(("tool", 0.5, 1), ("tool", 0.01, 2), outstanding=0), predictions=())
    unpredicted = SEED.choose(no_predictions)
    assert (aged.reason, aged.eligible) == ("hard_starvation_fifo", False)
    assert (unpredicted.reason, unpredicted.eligible) == ("not_eligible_no_predictions", False)
    text = (REPO / "MEASUREMENT.md").read_text(encoding="utf-8")
    definition = text[text.index("`eligible_decisions` counts") :].split("`reorders` counts")[0]
    assert (
        "hard aging took (`hard_starvation_fifo`" in definition
        and "(`not_eligible_no_predictions`) is not eligible" in definition
    )


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


def _scored_by_key_tuples(policy: PressurePolicy, view: QueueSnapshot) -> int:
    """The scored choice as it was first written: the smallest (grade job while grades go last, predicted
    seconds − aging weight × waited seconds, job order) over every queued job."""
    grade_last = not (policy.unlock and view.admission_pending)
    keys = [
        (
            grade_last and job.kind == "grade",
            p.seconds - policy.aging_weight * (view.now - job.enqueued_at),
            i,
        )
        for i, (job, p) in enumerate(zip(view.jobs, view.predictions, strict=True))
    ]
    return view.jobs[min(keys)[2]].job_id


def test_the_scored_choice_is_the_smallest_key_tuple_ties_and_kinds_mixed_or_not() -> None:
    """The scored choice finds its job without a key tuple per queued job (it runs at every decision over
    the whole queue): the same job as the key tuples' minimum, on queues of grades only, of none, and of
    both, with equal scores (the oldest of them wins), negative and infinite scores and predictions that are
    not numbers, whether grades go last or not."""
    rng = random.Random(11)
    kinds: tuple[JobKind, ...] = ("tool", "evaluate", "grade")
    values = (0.001, 0.25, 0.5, 1.0, 60.0, -0.0, 0.0, math.inf, math.nan)
    checked = 0
    for case in range(3000):
        n = rng.randint(2, 40)
        mix = rng.choice((kinds, ("grade",), ("tool", "evaluate")))
        tied = case % 2 == 0  # few distinct values: many equal scores
        jobs = tuple(
            (
                rng.choice(mix),
                rng.choice(values[:4]) if tied else rng.choice(values) if case % 7 == 0 else rng.random(),
                rng.choice((0.0, 1.0, 2.5)) if tied else rng.random() * 10,
            )
            for _ in range(n)
        )
        for pending in (True, False):
            view = snap(*jobs, pending=pending, now=1000.0)
            for policy in (SEED, CRITICAL):  # grades last always; while no problem waits (no aging by drain)
                decision = policy.choose(view)
                assert decision.reason == "low_model_supply_predicted_unlock"
                assert decision.job_id == _scored_by_key_tuples(policy, view), (case, pending, policy.name)
                checked += 1
    assert checked == 3000 * 2 * 2


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
