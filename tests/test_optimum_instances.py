"""The clairvoyant optimum (CP-SAT) on hand-made instances whose optimum is known: solved exactly, a
relaxation below the resolution, never below the analytic bound, a hint that fits the horizon, a
bound above the makespan by the events' rounding read as the makespan, and a schedule at the analytic
bound proven optimal."""

from __future__ import annotations

import pytest

from asyncroll.simulation.left_shift import Shifted, retimed_s
from asyncroll.simulation.optimum import Instance, Step, analytic_bound, solve
from tests.solver_hints import _fix_the_hint


def chain(*steps: tuple[str, float]) -> tuple[Step, ...]:
    return tuple(Step("model" if kind == "m" else "cpu", seconds) for kind, seconds in steps)


@pytest.fixture
def hint_only(monkeypatch: pytest.MonkeyPatch) -> None:
    _fix_the_hint(monkeypatch)


@pytest.mark.parametrize(
    ("chains", "limits", "optimal"),
    [
        # Two model turns overlap; the single worker then serialises the two 2 s jobs: 1 + 2 + 2.
        # The analytic bound says 4 (CPU ÷ 1 worker): no schedule reaches it.
        ([chain(("m", 1), ("c", 2))] * 2, (2, 2, 1), 5.0),
        # One active slot: trajectories run one after the other, whatever the workers.
        ([chain(("c", 1)), chain(("m", 2)), chain(("m", 1), ("c", 1))], (1, 4, 4), 5.0),
        # Admission in workload order: the long trajectory comes last and cannot be started first.
        ([chain(("c", 1)), chain(("c", 1)), chain(("c", 3))], (2, 1, 2), 4.0),
        # ... where the analytic bound does not see it (3 s): the model-only trajectory cannot start before
        # the second, which queues for the one worker behind the first, so a slot frees at 1 s at best: 4.
        ([chain(("c", 1)), chain(("c", 2), ("m", 1)), chain(("m", 1))], (2, 2, 1), 4.0),
        # A chain's own order: CPU then model, model then CPU, one of each resource: 3 (not 4).
        ([chain(("c", 1), ("m", 2)), chain(("m", 1), ("c", 2))], (2, 1, 1), 3.0),
    ],
)
def test_exact_optimum_of_hand_made_instances(
    chains: list[tuple[Step, ...]], limits: tuple[int, int, int], optimal: float
) -> None:
    active, capacity, workers = limits
    instance = Instance(tuple(chains), active, capacity, workers)
    result = solve(instance, time_limit_s=20, threads=1)
    assert result.status == "optimal"
    assert result.best_schedule_s == pytest.approx(optimal)
    assert result.lower_bound_s == pytest.approx(optimal)
    assert result.lower_bound_s >= analytic_bound(instance) - 1e-9


def test_the_bound_stays_a_relaxation_below_the_resolution() -> None:
    # 0.4 ms steps floor to zero ticks: the solver bound is 0, the analytic bound still holds.
    instance = Instance((chain(("c", 0.0004)),) * 5, 5, 1, 1)
    result = solve(instance, time_limit_s=10, threads=1)
    assert result.solver_bound_s == 0.0
    assert result.lower_bound_s == pytest.approx(0.002)  # floor(5 × 0.4 ms) in whole milliseconds
    assert result.lower_bound_s <= analytic_bound(instance)


def test_the_proven_bound_is_never_below_the_runs_own_analytic_bound() -> None:
    """A batching server's run has an analytic bound with a term this model has not (its in-batch time
    ÷ its batch limit): the optimum undercut it (1.175 s against the summary's 1.202 s)."""
    chains = (chain(("m", 0.5), ("c", 0.1)), chain(("m", 0.5), ("c", 0.1)))
    plain = Instance(chains, 2, 2, 2)
    assert solve(plain, time_limit_s=10, threads=1).lower_bound_s == pytest.approx(0.6)
    batching = Instance(chains, 2, 2, 2, analytic_bound_s=0.9)
    result = solve(batching, time_limit_s=10, threads=1)
    assert result.lower_bound_s == pytest.approx(0.9)
    assert result.best_schedule_s is not None and result.best_schedule_s >= result.lower_bound_s


@pytest.mark.usefixtures("hint_only")
def test_the_hint_of_a_run_close_to_serial_fits_the_horizon() -> None:
    """Ten 1.9 ms steps run back to back: floored, they sum to 10 ms, but the run's own start times end
    at 18 ms. The horizon was the floored sum, the hint was clamped into it and was no schedule at all: on
    200 trajectories at 1 active slot CP-SAT then found none in 3 s (status unknown, no best schedule)."""
    steps = tuple(Step("cpu", 0.0019, start=0.0019 * k) for k in range(10))
    instance = Instance((steps,), 1, 1, 1, makespan_s=0.019, analytic_bound_s=0.019, begins=(0.0,))
    result = solve(instance, time_limit_s=10, threads=1)
    assert result.status == "optimal", result  # was "infeasible": the hint broke the horizon
    assert result.best_schedule_s == pytest.approx(0.019)


def test_a_bound_above_the_makespan_by_the_events_rounding_is_the_makespan() -> None:
    """Each recorded duration is rounded to 1 µs: their sum may exceed the makespan by that much (the
    summary clamps its own bound likewise). The proven bound read 16.712777 s against a 16.712766 s
    makespan, which no schedule can beat: the run's "makespan ÷ proven bound" was 0.99999934."""
    steps = chain(("c", 0.0100005), ("m", 0.0100005))
    within = solve(Instance((steps,), 1, 1, 1, makespan_s=0.02), time_limit_s=10, threads=1)
    assert within.lower_bound_s == within.best_schedule_s == 0.02 and within.rounding_clamped
    report = within.describe(Instance((steps,), 1, 1, 1, makespan_s=0.02))
    assert report["makespan_over_lower_bound"] == 1.0 and report["rounding_clamped"] is True
    # beyond the rounding, the two disagree for real: shown as it is, not hidden
    beyond = solve(Instance((steps,), 1, 1, 1, makespan_s=0.0199), time_limit_s=10, threads=1)
    assert beyond.lower_bound_s == pytest.approx(0.020001) and not beyond.rounding_clamped


def test_a_schedule_at_the_floored_analytic_bound_is_proven_optimal_at_once() -> None:
    """examples/toolmath's run: 21 model turns of 5-9 ms at capacity 4, CPU jobs under a tick. CP-SAT's own
    bound stayed at 25 ms for the whole time limit (60 s) against a schedule at 35 ms, the model work ÷
    capacity: "feasible", never proven, on 8 trajectories."""
    turns = [[6.16, 7.03, 7.28], [7.42, 7.28], [8.41, 7.39], [8.56, 7.46, 5.15, 5.9], [5.65, 5.29]]
    turns += [[7.59, 5.39, 5.16], [8.36, 6.77], [8.52, 5.94, 5.37]]
    chains = tuple(
        chain(*[step for ms in row for step in (("m", ms / 1000), ("c", 0.00002))]) for row in turns
    )
    instance = Instance(chains, 16, 4, 2)
    result = solve(instance, time_limit_s=10, threads=1)
    assert result.status == "optimal", result  # was "feasible" after the whole 10 s, its bound 25 ms
    assert result.solver_bound_s == pytest.approx(0.034)  # the floored turns: 133 ticks ÷ 4, rounded up
    assert result.lower_bound_s == pytest.approx(analytic_bound(instance))
    # the floored schedule re-timed with the real durations: a schedule this long exists
    assert result.best_schedule_s is not None
    assert result.lower_bound_s <= result.best_schedule_s <= result.lower_bound_s + 0.002


def test_the_best_schedule_is_one_of_the_real_durations_not_of_the_floored_ones() -> None:
    """Floored to 1 ms, two trajectories of a 1.9 ms model turn then a 1.9 ms CPU job (one model slot, one
    worker) fit in 3 ms, raised to the analytic bound, 3.8 ms: "optimal 0.0038 0.0038", while no schedule
    of the real durations is shorter than 5.7 ms. The best schedule is now the solver's order re-timed
    with the real durations; the proven bound is unchanged."""
    steps = chain(("m", 0.0019), ("c", 0.0019))
    result = solve(Instance((steps, steps), 2, 1, 1), time_limit_s=10, threads=1)
    assert result.lower_bound_s == pytest.approx(0.0038)
    assert result.best_schedule_s == pytest.approx(0.0057), result  # was 0.0038


def test_a_trajectory_of_sub_resolution_steps_still_gets_a_best_schedule_of_the_real_durations() -> None:
    """A trajectory whose steps all floor to 0 ticks holds an active slot for no time in the solver's model,
    so the solver may place it inside another's: its order re-timed with the real durations had a cycle
    (the other's last step before its begin, its 0-tick model turn before the other's), and an ``optimal``
    result came back with no best schedule at all. The real durations, one active slot: 5 + 0.5 ms."""
    work = (chain(("m", 0.0015), ("c", 0.0035)), chain(("m", 0.0005)))
    result = solve(Instance(work, 1, 1, 1), time_limit_s=10, threads=1)
    assert result.status == "optimal", result
    assert result.best_schedule_s == pytest.approx(0.0055), result  # was None
    inside = Shifted(begins=(0, 0), starts=((0, 1), (0,)), ends=(4, 0), makespan=4)  # a floored schedule
    assert retimed_s(Instance(work, 1, 1, 1), inside, 0.001) == pytest.approx(0.0055)  # was None


def test_a_best_schedule_at_the_bound_but_for_the_float_sum_s_last_bits_is_at_the_bound() -> None:
    """One chain, one worker: the chain back to back is the analytic bound and a real schedule, but the
    re-timed schedule (whole µs) read 0.006672 against the bound's float sum 0.006671999999999999, and the
    command said the real optimum lay between the two."""
    result = solve(Instance((chain(("c", 0.004833), ("c", 0.001839)),), 1, 1, 1), time_limit_s=10, threads=1)
    assert result.status == "optimal", result
    assert result.best_schedule_s == result.lower_bound_s, result  # was above it by 1e-18
