"""The active-slot term of the lower bound: trajectories list-scheduled on the slots in admission order."""

from __future__ import annotations

import heapq
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncroll.outputs.bounds import WorkMeter, admission_order_makespan
from tests.conftest import VirtualRun, tool_problem


def test_the_tail_of_the_batch_counts() -> None:
    # Two slots; the long trajectory is admitted last, after a short one frees its slot: 1 + 3.
    # (Work ÷ slots says 2.5 and the longest trajectory 3; no schedule admitting in order beats 4.)
    assert admission_order_makespan([1, 1, 3], 2) == pytest.approx(4.0)
    assert admission_order_makespan([3, 1, 1], 2) == pytest.approx(3.0)


def test_never_below_the_plain_terms() -> None:
    works = [0.3, 2.0, 0.1, 0.7, 1.1, 0.4, 0.9]
    for slots in range(1, 9):
        bound = admission_order_makespan(works, slots)
        assert bound >= sum(works) / slots - 1e-12 and bound >= max(works)
    assert admission_order_makespan(works, 1) == pytest.approx(sum(works))
    assert admission_order_makespan([], 3) == 0.0


def test_the_summary_bound_reaches_a_tail_only_it_sees(virtual_run: VirtualRun) -> None:
    # Model-only trajectories of 0.1, 0.1 and 0.3 s on two slots, nothing else limiting: the third
    # starts at 0.1 and ends at 0.4 — the optimum, which the plain terms (0.25 and 0.3) miss.
    problems = [tool_problem(f"p{i}", model_ms=ms, cpu_ms=0, turns=0) for i, ms in enumerate((100, 100, 300))]
    outcome, _, _ = virtual_run(problems, max_active_trajectories=2, max_inflight_model_requests=8)
    assert outcome.summary is not None
    bounds = outcome.summary["bounds"]
    assert outcome.summary["makespan_s"] == pytest.approx(0.4)
    assert bounds["terms"]["trajectory_work_s"] == pytest.approx(0.25)
    assert bounds["terms"]["admission_order_s"] == pytest.approx(0.4)
    assert bounds["binding"] == "admission_order_s" and bounds["efficiency"] == pytest.approx(1.0)


def test_a_bound_above_the_makespan_by_its_rounding_only_is_clamped() -> None:
    """Durations are recorded to 1 µs; on an exactly critical trajectory their sum can pass the clock's
    makespan by a few µs. That excess is clamped (efficiency exactly 1); a real excess stays visible."""
    limits = {"max_active_trajectories": 1, "max_inflight_model_requests": 1, "cpu_workers": 1}
    work = WorkMeter()
    for _ in range(10):
        work.add("t", 0.1000005, model=True)  # ten µs-rounded durations: ≤ 5 µs of rounding
    near = work.bounds(1.000003, limits)
    assert near["rounding_clamped"] and near["lower_bound_s"] == 1.000003 and near["efficiency"] == 1.0
    far = work.bounds(0.99, limits)
    assert not far["rounding_clamped"] and far["efficiency"] is not None and far["efficiency"] > 1


def test_a_bound_equal_to_the_reported_makespan_is_efficiency_one() -> None:
    """The makespan is reported to 1 µs; a bound equal to that rounded value is efficiency 1, not
    1.000016 against the clock's unrounded reading (seen on a 25 ms simulated run)."""
    limits = {"max_active_trajectories": 1, "max_inflight_model_requests": 1, "cpu_workers": 1}
    work = WorkMeter()
    work.add("t", 0.024808, model=True)
    bounds = work.bounds(0.0248076, limits)
    assert bounds["lower_bound_s"] == 0.024808 and not bounds["rounding_clamped"]
    assert bounds["efficiency"] == 1.0


def test_an_active_limit_far_above_the_trajectories_costs_nothing() -> None:
    """The list schedule holds only as many slots as there are trajectories: an active limit of a billion
    ("all at once") allocated a slot list that size as the run ended (a MemoryError lost the summary)."""
    assert admission_order_makespan([1.0, 3.0, 2.0], 10**12) == 3.0
    assert admission_order_makespan([], 10**12) == 0.0


def test_a_run_with_a_huge_active_limit_still_summarises(virtual_run: VirtualRun) -> None:
    problems = [tool_problem(f"p{i}", model_ms=100, cpu_ms=50) for i in range(3)]
    outcome, _, _ = virtual_run(problems, max_active_trajectories=10**12, cpu_workers=3)
    assert outcome.status == "complete" and outcome.summary is not None
    bounds = outcome.summary["bounds"]
    assert bounds["terms"]["admission_order_s"] == pytest.approx(0.25)
    assert bounds["lower_bound_s"] == pytest.approx(outcome.summary["makespan_s"])


def slot_free_times(works: list[float], slots: int) -> float:
    """The list schedule as first written: every slot free at 0, each work on the earliest free one."""
    free = [0.0] * min(slots, len(works))
    makespan = 0.0
    for work in works:
        end = heapq.heappop(free) + work
        heapq.heappush(free, end)
        makespan = max(makespan, end)
    return makespan


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.floats(min_value=0, max_value=50, allow_nan=False), max_size=40),
    st.integers(min_value=1, max_value=6),
    st.randoms(use_true_random=False),
    st.integers(min_value=0, max_value=40),
    st.booleans(),
)
def test_the_meter_places_works_as_trajectories_end_and_gets_the_same_term(
    works: list[float], slots: int, rng: random.Random, still_running: int, started_late: bool
) -> None:
    """Trajectories end in any order, some still run when the bound is asked for, the slots become known
    at any point (``measurement_started``) or only then: the term is the whole admission order's, bit for
    bit, and the meter holds no work of a trajectory that ended after every earlier one."""
    work = WorkMeter()
    if not started_late:
        work.start(slots)
    for i, seconds in enumerate(works):
        work.admitted(str(i))
        work.add(str(i), seconds, model=False)
    order = list(range(len(works)))
    rng.shuffle(order)
    running = set(order[len(order) - still_running :]) if still_running else set()
    for i in order:
        if i not in running:
            work.finished(str(i))
    first_running = min(running, default=len(works))
    assert all(position > first_running for position in work._ended) or started_late
    limits = {"max_active_trajectories": slots, "max_inflight_model_requests": 1, "cpu_workers": 1}
    terms = work.bounds(10**6, limits)["terms"]
    assert terms["admission_order_s"] == round(slot_free_times(works, slots), 6)


def test_a_meter_asked_about_other_slots_than_it_placed_works_on_refuses() -> None:
    work = WorkMeter()
    work.start(2)
    limits = {"max_active_trajectories": 3, "max_inflight_model_requests": 1, "cpu_workers": 1}
    with pytest.raises(ValueError, match="placed on 2 active slots, asked about 3"):
        work.bounds(1.0, limits)
