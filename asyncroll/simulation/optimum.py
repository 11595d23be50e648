"""The clairvoyant optimum of a recorded run: how short could *exactly this work* have been?

The analytic lower bound in ``summary.json`` (largest of model service ÷ capacity, CPU ÷ workers,
trajectory work ÷ active slots, longest trajectory, trajectories list-scheduled on the slots in admission
order) is cheap and always valid, but it treats the three limits one at a time. With few active slots,
each trajectory's chain (model → CPU → model …) leaves resources idle whatever the dispatch order, and
the true optimum can lie well above that bound. This module solves the scheduling problem itself with
CP-SAT (OR-Tools, the ``optimum`` extra):

- every trajectory's model turns and CPU jobs, in their recorded order, each starting after the
  previous one ends, with their measured durations (floored to ``resolution_s``);
- trajectories start in workload order (asyncroll admits them that way) and each holds one of the
  ``max_active_trajectories`` slots from its start until its last step ends;
- at most ``model_capacity`` model requests at once (the inflight and active limits: a request's
  recorded latency includes any wait inside the server, so the server's own batch limit is not a
  valid capacity for it) and at most ``cpu_workers`` CPU jobs at once.

Everything else a real run pays (client overheads, admission latency, dispatch) is left out, and the
scheduler is clairvoyant (it knows every duration in advance) and may leave a worker idle on purpose.
So the model is a *relaxation* of what any asyncroll policy can do: its optimum, and CP-SAT's proven
bound on it, are valid lower bounds on the run's makespan (the bound reported is never below the run's
own analytic bound, which for a simulated batching server also counts the server's batch limit), under
the same assumption as the analytic bound (a request or job would not have been faster at another
concurrency). The best schedule reported is what a clairvoyant dispatcher could reach on the same work:
the solver's best schedule of the floored durations, its order on every model slot, worker and active slot
kept, re-timed with the real durations (:func:`~asyncroll.simulation.left_shift.retimed_s`), so a schedule
that long exists (or the recorded run, where shorter); never reported below the proven bound.
``optimal`` is of the floored durations: the real optimum lies between the proven bound and the best
schedule, which the rounding alone separates (up to ``resolution_s`` a step).

Optimality is proved only for small runs (20 trajectories at 4 active slots: often within 30 s; rarely
at 8 or more active); otherwise the solver returns its best schedule and its proven bound at the time
limit, still valid but possibly no better than the analytic one (``status`` says which). The solver
starts from the run's schedule left-shifted (:mod:`asyncroll.simulation.left_shift`), which stays the best
schedule where CP-SAT finds none better; a best schedule at the proven bound is ``optimal`` whoever proved
the bound (CP-SAT, or the analytic bound): nothing is shorter, and a longer solve could change neither.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from asyncroll.errors import UsageError
from asyncroll.outputs.bounds import admission_order_makespan
from asyncroll.simulation.left_shift import Shifted, retimed_s, solver_hint
from asyncroll.simulation.run_instance import (
    Instance,
    Step,
    StepKind,
    analytic_bound,
    instance_from_run,
    rounding_slack_s,
)
from asyncroll.simulation.stoppable_solve import solve_stoppably

__all__ = ["Instance", "Optimum", "Step", "StepKind", "analytic_bound", "instance_from_run", "solve"]

#: A best schedule (whole µs of the real durations) within this of the proven bound (a float sum of the
#: same durations) is at it: "6.672 ms" above "6.671999999999999 ms" said the real optimum lay between.
HALF_MICROSECOND = 5e-7


@dataclass(frozen=True)
class Optimum:
    status: Literal["optimal", "feasible", "unknown", "infeasible"]
    best_schedule_s: float | None  # a schedule reaching this exists (upper bound on the optimum)
    lower_bound_s: float  # proven: no schedule of this work is shorter
    solver_bound_s: float  # CP-SAT's own proven bound (before taking the analytic bound into account)
    wall_s: float
    rounding_clamped: bool = False  # the bound exceeded the makespan by no more than the µs rounding

    def describe(self, instance: Instance) -> dict[str, Any]:
        def ratio(a: float | None, b: float | None) -> float | None:
            return None if a is None or not b else round(a / b, 4)

        return {
            "status": self.status,
            "trajectories": len(instance.chains),
            "steps": sum(len(c) for c in instance.chains),
            "limits": {
                "max_active_trajectories": instance.active,
                "model_capacity": instance.model_capacity,
                "cpu_workers": instance.workers,
            },
            "makespan_s": instance.makespan_s,
            "analytic_bound_s": instance.analytic_bound_s,
            "lower_bound_s": round(self.lower_bound_s, 6),
            "solver_bound_s": round(self.solver_bound_s, 6),
            "best_schedule_s": None if self.best_schedule_s is None else round(self.best_schedule_s, 6),
            "makespan_over_lower_bound": ratio(instance.makespan_s, self.lower_bound_s),
            "makespan_over_best_schedule": ratio(instance.makespan_s, self.best_schedule_s),
            "lower_bound_over_analytic": ratio(self.lower_bound_s, instance.analytic_bound_s),
            "rounding_clamped": self.rounding_clamped,
            "solve_wall_s": round(self.wall_s, 3),
            "notes": list(instance.notes),
        }


def solve(
    instance: Instance, *, time_limit_s: float = 60.0, threads: int = 2, resolution_s: float = 0.001
) -> Optimum:
    """Minimise the makespan of ``instance`` with CP-SAT within ``time_limit_s``."""
    try:
        from ortools.sat.python import cp_model
    except ImportError as exc:
        raise UsageError(
            "the optimum needs OR-Tools: pip install 'asyncroll[optimum]' (or pip install ortools)"
        ) from exc

    def ticks(seconds: float) -> int:  # floored, so the relaxation stays a relaxation
        return max(0, math.floor(seconds / resolution_s + 1e-9))

    total = sum(ticks(s.seconds) for c in instance.chains for s in c)
    hint = solver_hint(instance, ticks)
    # The horizon holds every step run back to back (some optimal schedule fits in it) and the hint:
    # on a run that was close to serial, the floored start times end past the floored durations' sum
    # (each step's fraction of a tick adds up), and a hint clamped to a shorter horizon was infeasible:
    # CP-SAT found no schedule at all in 3 s on 200 trajectories at 1 active slot (status unknown).
    horizon = max(total, 0 if hint is None else hint.makespan) + 1
    model = cp_model.CpModel()
    model_steps: list[Any] = []
    cpu_steps: list[Any] = []
    slots: list[Any] = []
    starts: list[Any] = []
    ends: list[Any] = []
    step_starts: list[list[Any]] = []
    for i, chain in enumerate(instance.chains):
        begin = model.new_int_var(0, horizon, f"begin{i}")
        previous_end: Any = begin
        step_starts.append([])
        for k, step in enumerate(chain):
            start = model.new_int_var(0, horizon, f"s{i}_{k}")
            step_starts[-1].append(start)
            interval = model.new_fixed_size_interval_var(start, ticks(step.seconds), f"i{i}_{k}")
            (model_steps if step.kind == "model" else cpu_steps).append(interval)
            model.add(start >= previous_end)
            previous_end = start + ticks(step.seconds)
            if hint is not None:
                model.add_hint(start, hint.starts[i][k])
        end = model.new_int_var(0, horizon, f"end{i}")
        model.add(end >= previous_end)
        size = model.new_int_var(0, horizon, f"held{i}")
        if hint is not None:
            model.add_hint(begin, hint.begins[i])
            model.add_hint(end, hint.ends[i])
            model.add_hint(size, hint.ends[i] - hint.begins[i])
        slots.append(model.new_interval_var(begin, size, end, f"slot{i}"))
        starts.append(begin)
        ends.append(end)
    for earlier, later in itertools.pairwise(starts):
        model.add(earlier <= later)  # admission in workload order
    if model_steps:
        model.add_cumulative(model_steps, [1] * len(model_steps), instance.model_capacity)
    if cpu_steps:
        model.add_cumulative(cpu_steps, [1] * len(cpu_steps), instance.workers)
    if len(slots) > instance.active:
        model.add_cumulative(slots, [1] * len(slots), instance.active)
    makespan = model.new_int_var(0, horizon, "makespan")
    model.add_max_equality(makespan, ends)
    # The analytic bound of the floored durations bounds every schedule of this model, and CP-SAT did not
    # find it alone: on examples/toolmath's run (8 trajectories, 21 model turns at capacity 4) its bound
    # stayed at 25 ms for the whole 60 s against a 35 ms schedule that met this one ("feasible", not
    # proven); a schedule that reaches it is now proven optimal at once.
    model.add(makespan >= _ticks_bound(instance, ticks))
    if hint is not None:
        model.add_hint(makespan, hint.makespan)
    model.minimize(makespan)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = threads
    solver.parameters.catch_sigint_signal = False  # a stop signal is the command's: see solve_stoppably
    result = solve_stoppably(solver, model, time_limit_s=time_limit_s)
    names = {
        cp_model.OPTIMAL: "optimal",
        cp_model.FEASIBLE: "feasible",
        cp_model.INFEASIBLE: "infeasible",
    }
    status = names.get(result, "unknown")
    found = status in ("optimal", "feasible")
    best = solver.objective_value * resolution_s if found else None
    solver_bound = solver.best_objective_bound * resolution_s if found else 0.0
    if status == "optimal":
        solver_bound = solver.objective_value * resolution_s
    # The run's own analytic bound can hold a term this model has not: a batching server's in-batch time
    # ÷ its batch limit (valid under the same assumption). It bounds every schedule of this work too.
    lower = max(solver_bound, analytic_bound(instance), instance.analytic_bound_s or 0.0)
    # The events round each duration to 1 µs, so a sum of them can exceed the run's makespan by their
    # summed rounding (the summary clamps its own bound likewise): 11 µs on a simulated run whose policy
    # met the bound, and "makespan ÷ proven bound" read 0.99999934. Within that, the bound is the makespan.
    clamped = False
    if instance.makespan_s is not None:
        clamped = instance.makespan_s < lower <= instance.makespan_s + rounding_slack_s(instance)
        lower = instance.makespan_s if clamped else lower
    schedules = []  # the best schedules of the floored durations, in ticks
    if found:
        begins = tuple(solver.value(b) for b in starts)
        placed = tuple(tuple(solver.value(v) for v in row) for row in step_starts)
        done = tuple(solver.value(e) for e in ends)
        schedules.append(Shifted(begins, placed, done, max(done, default=0)))
    if hint is not None and hint.shifted and status in ("feasible", "unknown"):
        # The left-shifted run is a schedule of this model by construction: a solve cut before it found
        # as good a one still has it (a large run's solve can end with no schedule of its own).
        best, status = min(math.inf if best is None else best, hint.makespan * resolution_s), "feasible"
        schedules.append(hint)
    real = None
    if best is not None:
        # A floored schedule can be shorter than any real one (two 1.9 ms steps in a row count 2 ms, not
        # 3.8): the best schedule reported is the floored one's order re-timed with the real durations,
        # so a schedule that long exists; or the recorded run, which is one, where it is shorter.
        timed = [retimed_s(instance, one, resolution_s) for one in schedules] + [instance.makespan_s]
        real = min((t for t in timed if t is not None), default=None)
        # No schedule beats a proven bound: a batching server's term of the analytic bound can lie above
        # every schedule of the recorded durations, which would each have been slower in its batch.
        if status == "feasible" and real is not None and real < lower + HALF_MICROSECOND:
            # A real schedule at the proven bound is optimal, whoever proved the bound: on a simulated run
            # at 1 active slot that met its analytic bound (the chains back to back) the status read
            # "feasible" after the whole time limit, and a longer limit could change nothing. (A floored
            # one at the bound proves nothing: the real durations' schedule of its order may be longer.)
            status = "optimal"
    return Optimum(
        status=status,  # type: ignore[arg-type]
        best_schedule_s=None if real is None else (lower if real < lower + HALF_MICROSECOND else real),
        lower_bound_s=lower,
        solver_bound_s=solver_bound,
        wall_s=solver.wall_time,
        rounding_clamped=clamped,
    )


def _ticks_bound(instance: Instance, ticks: Callable[[float], int]) -> int:
    """The analytic bound's terms of the instance's floored durations (in ticks): model and CPU work ÷
    their capacity, and the chains list-scheduled on the active slots in admission order."""
    chains = [[(s.kind, ticks(s.seconds)) for s in chain] for chain in instance.chains]
    model = sum(t for chain in chains for kind, t in chain if kind == "model")
    cpu = sum(t for chain in chains for kind, t in chain if kind == "cpu")
    lengths = [float(sum(t for _, t in chain)) for chain in chains]  # whole numbers: summed exactly
    return max(
        -(-model // instance.model_capacity),
        -(-cpu // instance.workers),
        math.ceil(admission_order_makespan(lengths, instance.active)),
    )
