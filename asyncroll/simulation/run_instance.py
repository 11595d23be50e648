"""The work a recorded run holds, as a scheduling instance: each trajectory's model turns and CPU jobs in
order with their measured durations, the run's limits, and the analytic lower bound on its makespan.

Read from a run directory (``events.jsonl``, checked against ``summary.json`` and ``run.json``) by
:func:`instance_from_run`; solved by :mod:`asyncroll.simulation.optimum`. A damaged or mismatched file
is refused (:class:`UsageError`) rather than solved as less work than the run did.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from asyncroll.errors import UsageError
from asyncroll.events import MAX_EVENT_TIME_S
from asyncroll.events import SCHEMA_VERSION as EVENTS_SCHEMA_VERSION
from asyncroll.floats import left_to_right_sum
from asyncroll.json_checks import INT64_MAX, json_kind, line_column
from asyncroll.json_depth import json_loads, read_json_object
from asyncroll.outputs.bounds import admission_order_makespan
from asyncroll.outputs.summary import SUMMARY_SCHEMA_VERSION as SUMMARY_VERSION
from asyncroll.workload import MAX_DURATION_MS

StepKind = Literal["model", "cpu"]


@dataclass(frozen=True)
class Step:
    kind: StepKind
    seconds: float
    start: float | None = None  # when the recorded run started it (a hint for the solver)


@dataclass(frozen=True)
class Instance:
    """One run's work: each trajectory's steps in order, trajectories in admission order."""

    chains: tuple[tuple[Step, ...], ...]
    active: int
    model_capacity: int
    workers: int
    makespan_s: float | None = None  # the recorded run's, when there is one
    analytic_bound_s: float | None = None
    begins: tuple[float, ...] | None = None  # when the recorded run admitted each trajectory
    notes: tuple[str, ...] = ()  # what could not be read from the run (e.g. a killed run's makespan)


def _run_status(run_dir: Path) -> tuple[str | None, dict[str, Any] | None]:
    """``run.json``'s status and config, or None where it cannot be read."""
    receipt = read_json_object(run_dir / "run.json")
    if receipt is None:
        return None, None
    status, config = receipt.get("status"), receipt.get("config")
    return (status if isinstance(status, str) else None), (config if isinstance(config, dict) else None)


def _limits(values: Any, where: str) -> tuple[int, int, int]:
    """(active, model capacity, workers) from a ``limits`` mapping, as the summary computes them."""
    if not isinstance(values, dict):
        raise UsageError(f"{where}: missing or malformed limits (got {json_kind(values)}, not an object)")
    active, inflight, workers = (
        _whole(values, name, where)
        for name in ("max_active_trajectories", "max_inflight_model_requests", "cpu_workers")
    )
    if min(active, inflight, workers) < 1:
        raise UsageError(f"{where}: limits must be ≥ 1, got {values}")
    return active, min(inflight, active), workers  # the summary's model capacity


def _whole(values: dict[str, Any], name: str, where: str) -> int:
    """``values[name]``: a JSON integer within 64 bits (as a run's setting is), else refused naming it.
    ``int()`` took 1.5 as 1 and "2" as 2, and said "invalid literal for int() with base 10: 'x'" or
    "cannot convert float infinity to integer" (a traceback); 10**30 reached the solver, a traceback too."""
    if name not in values:
        raise UsageError(f"{where}: missing or malformed limit {name!r} (missing)")
    value = values[name]
    if not isinstance(value, int) or isinstance(value, bool):
        shown = json_kind(value) + (f" {value!r}"[:40] if isinstance(value, float | str) else "")
        raise UsageError(f"{where}: {name} must be a whole number, not {shown}")
    if abs(value) > INT64_MAX:
        raise UsageError(f"{where}: {name} must fit in 64 bits (at most {INT64_MAX})")
    return value


def _seconds(values: dict[str, Any], name: str, where: str) -> float:
    """``values[name]``: a finite number of seconds from 0 (a NaN makespan was shown as "makespan nans")."""
    value = values[name]
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value < math.inf:
        raise UsageError(f"{where}: {name} must be a finite number of seconds from 0, got {value!r}"[:300])
    return float(value)


def _number(event: dict[str, Any], name: str, where: str) -> float:
    """``event[name]``: a finite JSON number (a bool or a string is not one), else refused naming the line."""
    value = event.get(name)
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise UsageError(f"{where}: {event.get('event')} lacks a valid {name!r} (got {value!r})")
    return float(value)


def _time(event: dict[str, Any], where: str) -> float:
    """``event["t"]``: seconds from the run's clock origin, finite and within :data:`MAX_EVENT_TIME_S`."""
    value = _number(event, "t", where)
    if abs(value) > MAX_EVENT_TIME_S:
        raise UsageError(
            f"{where}: {event.get('event')} has t {value!r}: not a time in seconds of a run (at most "
            f"{MAX_EVENT_TIME_S:.0e} s, about 31.7 years, either side of its start)"
        )
    return value


def _duration(event: dict[str, Any], name: str, where: str) -> float:
    """A recorded duration: seconds from 0 to one day (the bound on any duration a workload declares)."""
    value = _number(event, name, where)
    if not 0 <= value * 1000.0 <= MAX_DURATION_MS:
        raise UsageError(
            f"{where}: {event.get('event')} has {name} {value!r}: not a duration in seconds from 0 to one day"
        )
    return value


def instance_from_run(run_dir: Path, *, still_going: bool = False) -> Instance:
    """Read a run directory's ``events.jsonl`` and ``summary.json`` (a real or a simulated run).

    A run stopped before it wrote ``summary.json`` (killed, ``run.json`` still says ``running``) is read
    from ``events.jsonl`` alone: its limits from ``measurement_started`` (or ``run.json``'s config), its
    analytic bound recomputed from the recorded steps; its makespan is unknown (None) and ``notes`` say so.
    ``still_going``: the run's process is alive (read from another terminal), and the notes say that
    rather than that it stopped.
    """
    path = run_dir / "summary.json"
    summary: Any = None
    notes: list[str] = []
    try:
        summary = json_loads(path.read_text())
    except FileNotFoundError as exc:
        status, _ = _run_status(run_dir)
        if status is None:
            raise UsageError(
                f"{run_dir}: no summary.json nor a readable run.json (not a run directory?)"
            ) from exc
        if status == "complete":  # a damaged complete run
            raise UsageError(f"{run_dir}: the run is complete but its summary.json is missing") from exc
    except (OSError, ValueError, RecursionError) as exc:  # not UTF-8, not JSON, past Python's limits
        raise UsageError(f"{run_dir}: cannot read summary.json: {exc}") from exc
    makespan: float | None = None
    analytic: float | None = None
    if isinstance(summary, dict) and summary.get("schema_version", SUMMARY_VERSION) != SUMMARY_VERSION:
        raise UsageError(
            f"{path}: schema_version {repr(summary['schema_version'])[:40]}; this asyncroll reads "
            f"summary.json version {SUMMARY_VERSION} only"
        )
    if summary is not None:
        try:
            if not isinstance(summary, dict):
                raise UsageError(f"{path}: not an asyncroll summary ({json_kind(summary)}, not an object)")
            limits, bounds = summary["limits"], summary["bounds"]
            if bounds is None or summary["makespan_s"] is None:
                raise UsageError(
                    f"{path}: the run never opened its measured window: there is no work to solve"
                )
            if not isinstance(limits, dict) or not isinstance(bounds, dict):
                raise KeyError("limits" if not isinstance(limits, dict) else "bounds")
            for values, name in ((bounds, "lower_bound_s"), (summary, "makespan_s")):
                if name not in values:
                    raise KeyError(name)
        except KeyError as exc:
            raise UsageError(f"{path}: not an asyncroll summary (missing or malformed {exc})") from exc
        active = _whole(limits, "max_active_trajectories", f"{path}: limits")
        workers = _whole(limits, "cpu_workers", f"{path}: limits")
        capacity = _whole(bounds, "model_capacity", f"{path}: bounds")
        makespan, analytic = (
            _seconds(summary, "makespan_s", str(path)),
            _seconds(bounds, "lower_bound_s", str(path)),
        )
        if min(active, capacity, workers) < 1:  # a division by zero, or "infeasible", further on
            raise UsageError(
                f"{path}: limits must be ≥ 1, got max_active_trajectories {active}, "
                f"bounds.model_capacity {capacity}, cpu_workers {workers}"
            )
    chains: dict[str, list[Step]] = {}
    order: list[str] = []
    begins: list[float] = []
    measured: dict[str, Any] | None = None  # the measurement_started event, read without a summary
    last_t: float | None = None
    try:
        handle = (run_dir / "events.jsonl").open("rb")
    except OSError as exc:
        raise UsageError(f"{run_dir}: cannot read events.jsonl: {exc.strerror or exc}") from exc
    with handle:
        for number, raw in enumerate(handle, 1):
            where = f"{run_dir}/events.jsonl line {number}"
            try:
                event = json_loads(raw)
            except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, past Python's limits
                if summary is None and not raw.endswith(b"\n"):  # killed in the middle of a write
                    cut = "is still being written" if still_going else "was cut short when the run stopped"
                    notes.append(f"events.jsonl line {number} {cut}: ignored")
                    break
                if isinstance(exc, json.JSONDecodeError):  # its own "line 1 column 5" counts within the line
                    column = line_column(exc)
                    raise UsageError(f"{where}: not valid JSON ({exc.msg}, column {column})") from exc
                raise UsageError(f"{where}: not JSON: {exc}") from exc
            if not isinstance(event, dict):
                raise UsageError(f"{where}: not a JSON object")
            if event.get("v") != EVENTS_SCHEMA_VERSION:
                raise UsageError(
                    f"{where}: event schema version {event.get('v')!r}; this asyncroll reads version "
                    f"{EVENTS_SCHEMA_VERSION} only"
                )
            try:
                kind, tid = event.get("event"), str(event.get("id"))
                if isinstance(event.get("t"), int | float):
                    last_t = float(event["t"])
                # Each step as the run placed it: ending at its event, starting its duration before.
                if kind == "measurement_started" and measured is None:
                    measured = event
                elif kind == "trajectory_started":
                    order.append(tid)
                    chains[tid] = []
                    begins.append(_time(event, where))
                elif kind in ("model_finished", "model_failed"):
                    seconds = _duration(event, "latency_s", where)
                    chains[tid].append(Step("model", seconds, _time(event, where) - seconds))
                elif kind == "cpu_finished":
                    seconds = _duration(event, "execute_s", where)
                    chains[tid].append(Step("cpu", seconds, _time(event, where) - seconds))
                elif kind == "cpu_failed":  # the worker was held until the timeout or the crash
                    seconds = _duration(event, "roundtrip_s", where)
                    chains[tid].append(Step("cpu", seconds, _time(event, where) - seconds))
            except KeyError as exc:
                raise UsageError(f"{where}: {kind} without {exc} (or of a trajectory never started)") from exc
            except (TypeError, ValueError) as exc:
                raise UsageError(f"{where}: malformed {kind}: {exc}") from exc
    if summary is None:
        if measured is not None:
            active, capacity, workers = _limits(measured, f"{run_dir}/events.jsonl measurement_started")
        else:
            _, config = _run_status(run_dir)
            limits_of = (config or {}).get("limits", config)
            active, capacity, workers = _limits(limits_of, f"{run_dir}/run.json config")
            notes.append("limits read from run.json's config (events.jsonl has no measurement_started)")
        recorded = "" if last_t is None else f" (its last recorded event is at t = {last_t:.6g} s)"
        notes.append(
            f"the run {'is still going' if still_going else 'stopped before it wrote summary.json'}: its "
            f"makespan is unknown{recorded}, so it is not compared with the bounds"
        )
        notes.append("analytic bound recomputed from the recorded steps, not read from summary.json")
    loop = summary.get("event_loop") if isinstance(summary, dict) else None
    stalled = loop.get("stalled_s") if isinstance(loop, dict) else None
    if isinstance(stalled, int | float) and not isinstance(stalled, bool) and stalled > 0:
        share = loop.get("fraction_of_makespan") if isinstance(loop, dict) else None
        part = f" ({100 * share:.0f}% of it)" if isinstance(share, int | float) else ""
        notes.append(
            f"the client's event loop stalled {stalled:.3f} s in the measured window (summary.json "
            f"event_loop): the makespan includes that time{part}, in which admission, dispatch and the "
            "reading of responses waited for the loop, whatever the schedule"
        )
    stopped = loop.get("stopped_s") if isinstance(loop, dict) else None
    if isinstance(stopped, int | float) and not isinstance(stopped, bool) and stopped > 0:
        notes.append(
            f"the process was stopped (job control) {stopped:.3f} s in the measured window (summary.json "
            "event_loop): the makespan includes that time, whatever the schedule"
        )
    if not order:
        raise UsageError(f"{run_dir}: the run started no trajectory")
    instance = Instance(
        chains=tuple(tuple(chains[t]) for t in order),
        active=active,
        model_capacity=capacity,
        workers=workers,
        makespan_s=makespan,
        analytic_bound_s=analytic,
        begins=tuple(begins),
        notes=tuple(notes),
    )
    if summary is None:
        instance = dataclasses.replace(instance, analytic_bound_s=round(analytic_bound(instance), 6))
    else:
        _check_counts(run_dir, summary, instance)
    if summary is not None and makespan is not None:
        # Every recorded step happened inside the run's measured window, so the bound of the recorded work
        # cannot exceed the run's makespan (beyond the events' rounding to the microsecond): where it does,
        # events.jsonl and summary.json do not describe one run, and every number solved would be wrong.
        need = analytic_bound(instance)
        if need > makespan + rounding_slack_s(instance):  # beyond it, optimum's bound would pass the makespan
            raise UsageError(
                f"{run_dir}: the steps events.jsonl records need at least {need:.6g} s under the run's "
                f"limits, but summary.json's makespan is {makespan:.6g} s: the two files do not describe "
                "one run (one of them damaged or replaced)"
            )
    return instance


def rounding_slack_s(instance: Instance) -> float:
    """How far a bound of the recorded steps may exceed the run's makespan by the events' rounding of
    each duration to 1 µs alone: half a microsecond a step, and one for the makespan's own."""
    return 5e-7 * sum(len(chain) for chain in instance.chains) + 1e-6


def _check_counts(run_dir: Path, summary: dict[str, Any], instance: Instance) -> None:
    """summary.json counts what events.jsonl holds (trajectories started, model requests ended, CPU jobs
    ended): where they differ, events were removed or the file was cut at a line boundary, and the work
    solved would silently be less than the run's."""
    try:
        expected = (
            summary["counts"]["trajectories"],
            summary["model"]["requests"],
            sum(summary["tools"]["jobs_by_kind"].values()),
        )
    except (KeyError, TypeError, AttributeError):
        return  # a summary without these counts (another version): nothing to compare with
    steps = [step.kind for chain in instance.chains for step in chain]
    found = (len(instance.chains), steps.count("model"), steps.count("cpu"))
    if expected != found:
        names = ("trajectories", "model requests", "CPU jobs")
        differ = "; ".join(
            f"{name}: {had} in events.jsonl, {want} in summary.json"
            for name, had, want in zip(names, found, expected, strict=True)
            if had != want
        )
        raise UsageError(
            f"{run_dir}: events.jsonl does not hold the work summary.json counts ({differ}): events removed "
            "or the file cut short; the work solved would be less than the run's"
        )


def analytic_bound(instance: Instance) -> float:
    """The summary's bound, recomputed from the instance (the same terms)."""
    model = left_to_right_sum(s.seconds for c in instance.chains for s in c if s.kind == "model")
    cpu = left_to_right_sum(s.seconds for c in instance.chains for s in c if s.kind == "cpu")
    lengths = [left_to_right_sum(s.seconds for s in c) for c in instance.chains]
    return max(
        model / instance.model_capacity,
        cpu / instance.workers,
        admission_order_makespan(lengths, instance.active),  # ≥ work ÷ slots and the longest chain
    )
