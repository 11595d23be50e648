"""The lower bound's terms at their edges: a run stopped with trajectories still active, a trajectory that
did no work, the rounding clamp's tolerance (0.5 µs per recorded duration plus 1 µs), terms to the µs."""

from __future__ import annotations

from asyncroll.outputs.bounds import WorkMeter

LIMITS = {"max_active_trajectories": 2, "max_inflight_model_requests": 2, "cpu_workers": 1}


def test_a_stopped_run_counts_the_work_of_its_active_trajectories() -> None:
    """Stopped with ``b`` active (5 s done, not finished) and ``c`` admitted with nothing done yet: the
    longest trajectory is ``b``'s 5 s, and in admission order ``c`` (0 s) adds nothing after ``a``, ``b``."""
    work = WorkMeter()
    for name in ("a", "b"):
        work.admitted(name)
    work.add("a", 1.0, model=True)
    work.finished("a")
    work.add("b", 5.0, model=False)
    work.admitted("c")
    terms = work.bounds(10.0, LIMITS)["terms"]
    assert terms["longest_trajectory_s"] == 5.0
    assert terms["trajectory_work_s"] == 3.0
    assert terms["admission_order_s"] == 5.0  # a (1 s) and b (5 s) on two slots, c after a: 1 + 0
    assert terms["cpu_execute_s"] == 5.0 and terms["model_service_s"] == 0.5


def test_an_unfinished_trajectory_in_the_tail_of_the_admission_order_counts() -> None:
    """One slot: ``a`` (1 s, finished) then ``b`` (2 s so far, still active) — the slot is busy 3 s."""
    work = WorkMeter()
    limits = {**LIMITS, "max_active_trajectories": 1}
    work.admitted("a")
    work.add("a", 1.0, model=True)
    work.finished("a")
    work.admitted("b")
    work.add("b", 2.0, model=False)
    bounds = work.bounds(4.0, limits)
    assert bounds["terms"]["admission_order_s"] == 3.0
    assert (bounds["binding"], bounds["lower_bound_s"], bounds["efficiency"]) == (
        "trajectory_work_s",
        3.0,
        0.75,
    )


def test_a_trajectory_that_did_no_work_adds_none() -> None:
    work = WorkMeter()
    work.admitted("idle")
    work.finished("idle")
    bounds = work.bounds(1.0, LIMITS)
    assert bounds["lower_bound_s"] == 0.0 and set(bounds["terms"].values()) == {0.0}


def test_the_rounding_clamp_allows_half_a_microsecond_per_duration_plus_one() -> None:
    """Three recorded durations: up to 2.5 µs above the makespan is their rounding (the bound is clamped to
    the makespan); 3 µs above it is not."""
    limits = {"max_active_trajectories": 1, "max_inflight_model_requests": 1, "cpu_workers": 1}
    work = WorkMeter()
    for seconds in (1.0, 1.0, 1.000003):
        work.add("t", seconds, model=True)
    near = work.bounds(3.000001, limits)
    assert (near["rounding_clamped"], near["lower_bound_s"], near["efficiency"]) == (True, 3.000001, 1.0)
    far = work.bounds(3.0, limits)
    assert (far["rounding_clamped"], far["lower_bound_s"], far["efficiency"]) == (False, 3.000003, 1.000001)


def test_every_term_and_total_is_given_to_the_microsecond() -> None:
    limits = {"max_active_trajectories": 1, "max_inflight_model_requests": 1, "cpu_workers": 1}
    work = WorkMeter()
    work.admitted("t")
    work.add("t", 0.123456, model=True)
    work.add("t", 0.654321, model=False)
    work.finished("t")
    bounds = work.bounds(1.0, limits)
    assert bounds["terms"] == {
        "model_service_s": 0.123456,
        "cpu_execute_s": 0.654321,
        "trajectory_work_s": 0.777777,
        "longest_trajectory_s": 0.777777,
        "admission_order_s": 0.777777,
    }
    assert bounds["totals"] == {"model_service_s": 0.123456, "cpu_execute_s": 0.654321}


def test_the_server_batch_term_spreads_the_time_in_the_batch_over_its_slots() -> None:
    """8 s of requests' time in a batch of 4 slots: at least 2 s, above latency ÷ client capacity (1 s)."""
    work = WorkMeter()
    work.add("t", 2.0, model=True)
    bounds = work.bounds(4.0, LIMITS, model_capacity=4, server_batch_s=8.0)
    assert bounds["terms"]["model_service_s"] == 2.0 and bounds["totals"]["server_batch_s"] == 8.0
    assert (bounds["binding"], bounds["server_batch_capacity"]) == ("model_service_s", 4)


def test_more_inflight_requests_than_active_trajectories_spread_model_time_over_the_trajectories() -> None:
    """One trajectory has at most one model request out: with 2 active and 8 inflight, at most 2 requests
    are ever in flight, so 10 s of model latency takes at least 5 s (not 10 ÷ 8), and the reported model
    capacity is 2."""

    def two_of_five_seconds() -> WorkMeter:
        work = WorkMeter()
        for name in ("a", "b"):
            work.admitted(name)
            work.add(name, 5.0, model=True)
            work.finished(name)
        return work

    bounds = two_of_five_seconds().bounds(6.0, {**LIMITS, "max_inflight_model_requests": 8})
    assert (bounds["terms"]["model_service_s"], bounds["model_capacity"]) == (5.0, 2)
    narrow = two_of_five_seconds().bounds(
        6.0, {**LIMITS, "max_active_trajectories": 4, "max_inflight_model_requests": 1}
    )
    assert (narrow["terms"]["model_service_s"], narrow["model_capacity"]) == (10.0, 1)
