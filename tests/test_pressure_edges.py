"""The pressure rules at their edges: ties, one worker, the exact aging boundaries — the choices a wrong
comparison, a dropped sign or a changed constant would flip while every mid-range case still passed."""

from __future__ import annotations

from tests.pressure_policies import BALANCED, CRITICAL, GUARDED, SEED, UNLOCK, Job, snap


def test_relative_aging_drains_the_queue_on_one_worker_at_the_whole_sum() -> None:
    """One worker drains the queue in Σ predicted (6 s here): the unlock rule ages a job after twice that,
    12 s, not after twice half of it."""
    rest: tuple[Job, ...] = (("tool", 1.0, 1), ("tool", 1.0, 0.5))
    waiting = UNLOCK.choose(snap(("tool", 4.0, 11.5), *rest, workers=1))
    assert (waiting.job_id, waiting.reason) == (2, "low_model_supply_predicted_unlock")
    aged = UNLOCK.choose(snap(("tool", 4.0, 12.0), *rest, workers=1))
    assert (aged.job_id, aged.reason) == (1, "hard_starvation_fifo")


def test_a_job_is_aged_at_exactly_the_absolute_limit() -> None:
    """``aging_seconds`` is a cap reached, not passed: a job that has waited exactly 30 s goes first."""
    at_limit = SEED.choose(snap(("tool", 4.0, 30.0), ("tool", 1.0, 1)))
    assert (at_limit.job_id, at_limit.reason) == (1, "hard_starvation_fifo")
    below = SEED.choose(snap(("tool", 4.0, 29.5), ("tool", 1.0, 1)))
    assert (below.job_id, below.reason) == (2, "low_model_supply_predicted_unlock")


def test_model_supply_at_the_threshold_is_enough() -> None:
    """Eligible only while model outstanding is *below* the threshold: at it, FIFO."""
    jobs: tuple[Job, ...] = (("tool", 4.0, 2), ("tool", 1.0, 1))
    assert SEED.choose(snap(*jobs, outstanding=4, threshold=4)).reason == "not_eligible_model_supply_ok"
    assert SEED.choose(snap(*jobs, outstanding=3, threshold=4)).job_id == 2


def test_equal_remaining_work_in_the_tail_starts_the_oldest() -> None:
    """The critical-path rule breaks a tie in remaining work by job order, as every other rule does."""
    jobs: tuple[Job, ...] = (("tool", 0.5, 3), ("tool", 0.5, 2), ("tool", 0.5, 1))
    tail = CRITICAL.choose(snap(*jobs, pending=False, remaining=(2.0, 2.0, 1.0)))
    assert (tail.job_id, tail.reason) == (1, "tail_critical_path")
    unknown = CRITICAL.choose(snap(*jobs, pending=False, remaining=(None, 0.0, None)))
    assert unknown.job_id == 1


def test_equal_stragglers_start_the_oldest() -> None:
    """Two tool jobs predicted equally long, each longer than the pool's share of the rest: the older goes."""
    jobs: tuple[Job, ...] = (("tool", 0.1, 3), ("tool", 5.0, 2), ("tool", 5.0, 1))
    alone = BALANCED.choose(snap(*jobs, pending=False, remaining=(9.0, 0.0, 0.0), workers=4))
    assert (alone.job_id, alone.reason) == (2, "tail_straggler_longest")


def test_equal_predictions_in_the_tail_guard_start_the_oldest() -> None:
    jobs: tuple[Job, ...] = (("tool", 0.1, 3), ("tool", 2.0, 2), ("tool", 2.0, 1))
    assert GUARDED.choose(snap(*jobs, pending=False)).job_id == 2
