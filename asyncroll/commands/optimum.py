"""`asyncroll optimum RUN_DIR`: the clairvoyant optimum of a recorded run's exact work (CP-SAT)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer

from asyncroll.commands.common import Opt, fail, say, seconds
from asyncroll.commands.files import other_schema_version, still_running
from asyncroll.json_depth import read_json_object

#: The most solver workers CP-SAT accepts (its parameter check; 10001 made the solve "unknown" at once).
MAX_THREADS = 10_000


def optimum(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (real or simulated).", metavar="RUN_DIR")],
    time_limit: Annotated[float, Opt(help="Solver time limit in seconds.")] = 60.0,
    threads: Annotated[int, Opt(help="Solver threads.")] = 2,
    as_json: Annotated[bool, Opt("--json", help="Print the result as JSON.")] = False,
) -> None:
    """How short could exactly this run's work have been? Solves the schedule of its recorded durations
    under its limits (CP-SAT; needs the `optimum` extra) and reports a proven lower bound on the makespan,
    the best schedule found, and how far the run was from both. Proves optimality only on small runs."""
    from asyncroll.errors import UsageError, no_directory
    from asyncroll.simulation.optimum import instance_from_run, solve

    if not run_dir.is_dir():
        raise fail(f"{run_dir}: {no_directory(run_dir)}")
    if not (0 < time_limit < math.inf):  # (NaN fails it too)
        raise fail(f"--time-limit must be a finite number of seconds > 0, got {time_limit:g}")
    if threads < 1:
        raise fail(f"--threads must be ≥ 1, got {threads}")
    if threads > MAX_THREADS:  # CP-SAT reports more as an invalid model, which read as "no schedule in time"
        raise fail(f"--threads must be at most {MAX_THREADS} (CP-SAT's limit), got {threads}")
    other = other_schema_version(run_dir)  # a run another version wrote: run.json or its first event
    if other is not None:
        raise fail(f"{other}: solve it with the asyncroll that wrote the run (run.json: versions.asyncroll)")
    status = (read_json_object(run_dir / "run.json") or {}).get("status")
    still_going = still_running(run_dir)
    if still_going is None and status in ("preparing", "running"):  # killed; maybe after its summary
        ended = (read_json_object(run_dir / "summary.json") or {}).get("status")
        if isinstance(ended, str):  # its work all recorded: only its exports and final run.json are not
            typer.echo(
                f"note: the run was killed after it wrote summary.json (which says {ended[:40]!r}; run.json "
                f"still says {status}): only its exports and its final run.json are missing",
                err=True,
            )
            status = ended
    if still_going is not None:
        typer.echo(
            f"warning: the run is still going ({still_going}): only the work it has recorded so far is "
            "solved (steps still running now, and trajectories not started yet, are left out)",
            err=True,
        )
    elif status in ("preparing", "running"):  # run.json never finalised: the run was killed
        typer.echo(
            f"warning: the run never finished (run.json says {status}): only the work it recorded is "
            "solved (steps still running when it was killed, and trajectories never started, are left out)",
            err=True,
        )
    elif status is not None and status != "complete":
        # A stopped run ends what it cancels with their time so far (model_failed, cpu_failed): counted.
        typer.echo(
            f"warning: the run ended {status}: only the work it recorded is solved (a request or job it "
            "cancelled counts up to the stop; trajectories never started are left out)",
            err=True,
        )
    try:
        instance = instance_from_run(run_dir, still_going=still_going is not None)
        result = solve(instance, time_limit_s=time_limit, threads=threads).describe(instance)
        # what the bound was proven under: a 'feasible' result is reproduced only with the same two
        result["solver"] = {"time_limit_s": time_limit, "threads": threads}
    except UsageError as exc:
        raise fail(str(exc)) from exc
    if as_json:
        say(json.dumps(result, indent=2))
        return

    def fmt(value: float | None, unit: str = "s") -> str:  # times to the µs below a millisecond
        return "n/a" if value is None else seconds(value) if unit == "s" else f"{value:.3f}{unit}"

    say(
        f"{result['status']}: {result['trajectories']} trajectories, {result['steps']} steps, "
        f"solved in {result['solve_wall_s']:.1f}s\n"
        f"makespan {fmt(result['makespan_s'])} | analytic bound {fmt(result['analytic_bound_s'])} | "
        f"proven lower bound {fmt(result['lower_bound_s'])} | "
        f"best schedule {fmt(result['best_schedule_s'])}\n"
        f"makespan ÷ proven bound {fmt(result['makespan_over_lower_bound'], '')} | "
        f"makespan ÷ best schedule {fmt(result['makespan_over_best_schedule'], '')}"
    )
    for note in result["notes"]:
        say(f"note: {note}")
    best, lower = result["best_schedule_s"], result["lower_bound_s"]
    if result["status"] == "optimal" and best is not None and best > lower:
        say(
            "note: optimal for the durations floored to 1 ms; the best schedule is its order re-timed with "
            "the real ones, so the real optimum lies between the proven bound and it"
        )
    if result["status"] in ("feasible", "unknown"):
        # a "feasible" schedule is above the proven bound (one at it is reported optimal): either may move
        found = "its best schedule is not proven optimal" if result["status"] == "feasible" else "no schedule"
        say(
            f"note: {found} within --time-limit {time_limit:g}s; a longer one may find a shorter schedule "
            "or prove a higher bound"
        )
