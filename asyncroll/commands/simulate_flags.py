"""`asyncroll simulate`'s flag checks: what its options accept, refused with the flag named (exit 2)
before anything is created, the warnings about flags a policy does not read, and a replay's warnings."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from asyncroll.floats import shown

if TYPE_CHECKING:
    from asyncroll.simulation.engine import Assumed
    from asyncroll.simulation.from_run import DerivedRun


#: simulate's own options: not settings of the run it simulates (not given to build_config).
SIMULATE_ONLY = frozenset(
    {
        "turn_overhead_ms",
        "job_overhead_ms",
        "sweep",
        "policies",
        "active",
        "inflight",
        "workers",
        "seeds",
        "jitter",
        "jobs",
        "progress",
        "from_run",
        "server",
        "chars_per_token",
        "max_num_seqs",
        "step_base_ms",
        "step_per_seq_ms",
        "prefill_ms_per_token",
    }
)


def cap_simulated_workers(counts: Iterable[int], flag: str) -> None:
    """Simulated workers are bounded as real ones are (more slowed the simulation to minutes and GBs)."""
    from asyncroll.config import MAX_SIMULATED_WORKERS
    from asyncroll.errors import UsageError

    most = max(counts)
    if most > MAX_SIMULATED_WORKERS:
        raise UsageError(
            f"{flag} {most}: at most {MAX_SIMULATED_WORKERS} simulated workers (each is simulated with its "
            "own start-up: 1,000,000 took 96 s and 3.8 GB of memory for 3 problems)"
        )


def only_with(flags: Mapping[str, object], applies: bool, mode: str) -> None:
    """Options that mean something only in one mode are refused outside it, not silently ignored."""
    from asyncroll.errors import UsageError

    given = [flag for flag, value in flags.items() if value is not None]
    if given and not applies:
        verb = "applies" if len(given) == 1 else "apply"
        raise UsageError(f"{', '.join(given)} {verb} only with {mode}")


def refuse_aliases(policies: Sequence[str]) -> None:
    """Two names of one policy would be two identical rows of the sweep: refused like a repeated name;
    the deprecated ``gpu_first`` is said to be so."""
    from asyncroll.errors import UsageError
    from asyncroll.policies.registry import canonical_policy, two_names_of_one

    if "gpu_first" in policies:
        typer.echo("warning: --policies gpu_first is a deprecated alias of tool_first", err=True)
    pair = two_names_of_one(policies)
    if pair is not None and pair[0] != pair[1]:  # a name given twice is refused as repeated, elsewhere
        raise UsageError(
            f"--policies: {pair[0]!r} and {pair[1]!r} are the same policy ({canonical_policy(pair[1])}); "
            "each value is one cell of the sweep"
        )


def warn_sync_rows(policies: Sequence[str], active: Sequence[int]) -> None:
    """A sweep's ``sync`` runs one trajectory at a time: its rows at an active limit above 1 are said to be
    those of 1 (as ``--policy sync --max-active-trajectories N`` is; sweep.md says it under the table)."""
    ignored = ", ".join(str(n) for n in sorted(active) if n > 1)
    if "sync" in policies and ignored:
        typer.echo(
            f"warning: --policies sync runs one trajectory at a time: --active {ignored} has no effect on "
            "its rows",
            err=True,
        )


def warn_inflight_rows(inflight: Sequence[int], active: Sequence[int]) -> None:
    """A sweep's ``--inflight`` values above an ``--active`` one: at most one model request per active
    trajectory is in flight, so those rows are the simulation at the active limit under another label."""
    for value in sorted(set(inflight)):
        below = [str(a) for a in sorted(set(active)) if a < value]
        if below:
            typer.echo(
                f"warning: --inflight {value} has no effect at --active {', '.join(below)} (a trajectory has "
                "one model request at a time at most): those rows are the simulation at an inflight limit "
                "equal to the active one",
                err=True,
            )


def warn_unjittered_seeds(seeds: int, jitter: float) -> None:
    """A seed draws only the timing jitter: under ``--jitter 0`` each of a sweep's seeds runs the same
    durations, so every cell is one simulation run ``seeds`` times alike, its min / median / max one value
    that reads as agreeing samples."""
    if seeds > 1 and jitter == 0:
        typer.echo(
            f"warning: --jitter 0 draws no jitter: the {seeds} seeds run the same durations, each cell one "
            f"simulation {seeds} times alike (its min / median / max are one value); give --seeds 1, or a "
            "--jitter above 0",
            err=True,
        )


def warn_unread(given: dict[str, Any], policies: Sequence[str], what: str) -> None:
    from asyncroll.policies.registry import unread_pressure_flags

    for flag in unread_pressure_flags(given, policies):
        typer.echo(
            f"warning: {flag} has no effect with {what} (read only by the pressure-aware policies: "
            "asyncroll, asyncroll_*)",
            err=True,
        )


def warn_replay(
    derived: DerivedRun, from_run: Path, *, given: Iterable[str], policy: str, active: int
) -> None:
    """What a replay of ``from_run`` must say before it starts: the rule it keeps when ``asyncroll`` named
    another then (unless ``--policy`` chose one), the active slots of a ``sync`` run replayed under another
    policy (the run's configured number, not the one it ran), and that a simulated run's timings are not
    measurements. ``given``: the settings flags gave; ``policy``, ``active``: the replay's."""
    given = set(given)
    if derived.policy_note and "policy" not in given:
        typer.echo(f"warning: {derived.policy_note}", err=True)
    sync_run = derived.source_config.get("policy") == "sync" and policy != "sync"
    if sync_run and active > 1 and "max_active_trajectories" not in given:
        typer.echo(
            f"warning: --from-run {from_run} ran --policy sync, one trajectory at a time; this replay "
            f"under --policy {policy} takes its configured --max-active-trajectories {active}: add "
            "--max-active-trajectories 1 to replay it at the run's one",
            err=True,
        )
    if derived.model_waits:
        waits = ", ".join(f"{kind} ×{n}" for kind, n in derived.model_waits)
        typer.echo(
            f"warning: --from-run {from_run}: its requests waited inside their measured latencies ({waits}: "
            "retry back-off, an open circuit); the replay takes those waits as model service time",
            err=True,
        )
    if derived.source_simulated:
        typer.echo(
            f"warning: --from-run {from_run} is itself a simulation (run.json: simulated): its timings "
            "and verdicts are that simulation's, not measurements, and what it assumed (0 s for a job "
            "without cpu_ms, a pass for a submission without a verdict) replays as if measured",
            err=True,
        )


def warn_assumed(assumed: Assumed, *, replay: bool, over: str = "") -> None:
    """What the simulation(s) assumed for want of a declaration in the script (a job without a cost took
    0 s, a submission without a verdict passed), counted on stderr; ``replay``: a ``--from-run`` replay;
    ``over``: where the counts come from (a sweep's: `` over the sweep's N simulations``)."""
    untimed, passed = assumed.untimed, assumed.passed
    if untimed:
        tools = ", ".join(f"{Path(tool).name} ×{n}" for tool, n in untimed.most_common(5))
        tools += ", …" if len(untimed) > 5 else ""
        why = (
            "their script gives no cpu_ms: declare each step's cpu_ms, or simulate --from-run a real run to "
            "replay measured times"
            if not replay
            else "the run never ran them (their trajectories went further in the replay), so nothing "
            "measured their cost"
        )
        typer.echo(f"warning: {untimed.total()} CPU job(s){over} took 0 s ({tools}) because {why}", err=True)
    if passed:
        why = (
            "their script declares no verdict (code is never run in a simulation), so no repair turn "
            'followed them: declare each submit\'s "passes", or simulate --from-run a real run to replay '
            "its verdicts"
            if not replay
            else "the run never evaluated them (their trajectories went further in the replay)"
        )
        typer.echo(f"warning: {passed} submission(s){over} passed because {why}", err=True)


#: The settings a replay may change that decide where a trajectory ends (config field → flag).
ENDING_SETTINGS = {
    "max_turns": "--max-turns",
    "tool_timeout": "--tool-timeout",
    "tool_errors": "--tool-errors",
}


def why_ended_otherwise(
    changes: Mapping[str, int],
    run: Mapping[str, Any],
    replay: Mapping[str, Any],
    graded: Mapping[str, int] | None = None,
) -> str:
    """Why a replay's trajectories ended otherwise than the run's (``changes``: ``"recorded → replayed"``
    counts; ``run``, ``replay``: the two configs; ``graded``: those whose grade job failed in the run, by
    reason): the ending settings the replay changed, named with the run's values (a changed
    ``--max-turns`` alone only where a change is to or from ``max_turns``, all it can explain); the grade
    jobs it could not fail; where the run stopped a trajectory at its max_turns, that the turns past it
    are scripted; and for the rest, that the replay did not reproduce how the run ended them."""

    def shown(value: object) -> str:
        return f"{value:g}" if isinstance(value, float) else str(value)

    changed = [key for key in ENDING_SETTINGS if key in run and run[key] != replay[key]]
    graded = graded or {}
    total, failed_grades = sum(changes.values()), sum(graded.values())
    if set(changed) - {"max_turns"}:  # a tool setting may explain any change but a failed grade's
        explained = total - failed_grades
    else:  # a changed --max-turns explains only a change to or from max_turns
        explained = sum(n for change, n in changes.items() if changed and "max_turns" in change)
    why = []
    if explained:
        named = [f"{ENDING_SETTINGS[k]} {shown(replay[k])} (the run's: {shown(run[k])})" for k in changed]
        why.append(f"the replay's {', '.join(named)} changed where they end")
    if graded:
        how = ", ".join(f"{reason} ×{n}" for reason, n in sorted(graded.items()))
        why.append(
            f"{failed_grades} failed in the run when the grade job of "
            f"{'its' if failed_grades == 1 else 'their'} final answer failed ({how}), which the replay "
            "cannot reproduce: it graded the answer"
        )
    if any(change.startswith("max_turns →") for change in changes) and "max_turns" in run:
        why.append(
            f"the turns past the run's --max-turns {run['max_turns']} took the script's timings "
            "(never measured)"
        )
    rest = total - explained - failed_grades
    if rest > 0:
        them = "them" if rest == total else f"{rest} of them"
        unexplained = " (--max-turns changes only an ending at max_turns)" if changed else ""
        why.append(
            f"the replay did not reproduce how the run ended {them}{unexplained}, so their later turns took "
            "the script's timings"
        )
    return "; ".join(why)


def refuse_single_run_forms(flags: Mapping[str, tuple[object, str]]) -> None:
    """A sweep takes its policies and limits from its list flags; a single-run form would be ignored."""
    from asyncroll.errors import UsageError

    given = [(flag, use) for flag, (value, use) in flags.items() if value is not None]
    if given:
        raise UsageError(
            "; ".join(
                f"{flag} does not apply with --sweep (use {use}, a comma-separated list)"
                for flag, use in given
            )
        )


#: Jitter sigma by default, and the largest accepted (beyond it nearly every duration becomes ~0).
DEFAULT_JITTER, MAX_JITTER = 0.25, 5.0
#: A sweep's seeds per cell by default (the most: ``simulation.sweep.MAX_SEEDS``).
DEFAULT_SEEDS = 5


def check_numbers(**given: float | None) -> None:
    """Every float option is finite and in a range where the simulation means something and ends.

    NaN would silently corrupt every duration it touches and infinity (or a cost near float's limit)
    would stop virtual time; a per-turn, per-job, per-step or per-token cost over one day is refused."""
    from asyncroll.errors import UsageError
    from asyncroll.serve_sim.sizes import MIN_CHARS_PER_TOKEN
    from asyncroll.simulation.engine import MAX_COST_MS

    ranges = {
        "tool_timeout": (0.0, math.inf, False),
        "step_base_ms": (0.0, MAX_COST_MS, True),
        "step_per_seq_ms": (0.0, MAX_COST_MS, True),
        "prefill_ms_per_token": (0.0, MAX_COST_MS, True),
        "chars_per_token": (MIN_CHARS_PER_TOKEN, math.inf, True),
        "turn_overhead_ms": (0.0, MAX_COST_MS, True),
        "job_overhead_ms": (0.0, MAX_COST_MS, True),
        "jitter": (0.0, MAX_JITTER, True),
    }
    for name, value in given.items():
        if value is None:
            continue
        low, high, inclusive = ranges[name]
        flag = "--" + name.replace("_", "-")
        if not math.isfinite(value):
            raise UsageError(f"{flag}: must be a finite number, got {value}")
        if value < low or (value == low and not inclusive):
            raise UsageError(f"{flag}: must be {'>=' if inclusive else '>'} {low:g}, got {shown(value)}")
        if value > high:
            limit = f"{high:.0f} ms (one day)" if high == MAX_COST_MS else f"{high:g}"
            raise UsageError(f"{flag}: must be at most {limit}, got {shown(value)}")


def sweep_jobs(seeds: int | None, jobs: int | None) -> int:
    """Check ``--seeds`` (1 to MAX_SEEDS) and return the processes a sweep runs at once: ``--jobs``, at most
    the CPUs this process may use (more is lowered to that, said on stderr), every one by default."""
    from asyncroll.errors import UsageError
    from asyncroll.simulation.sweep import MAX_SEEDS
    from asyncroll.simulation.sweep_cells import usable_cpus

    if seeds is not None and not 1 <= seeds <= MAX_SEEDS:
        raise UsageError(f"--seeds: must be from 1 to {MAX_SEEDS}, got {seeds}")
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs: must be >= 1, got {jobs}")
    cpus = usable_cpus()
    if jobs is not None and jobs > cpus:
        typer.echo(
            f"warning: --jobs {jobs}: this process may use {cpus} CPU(s); running {cpus} cells at once",
            err=True,
        )
    return cpus if jobs is None else min(jobs, cpus)


def csv_list(text: str, kind: type[str] | type[int], flag: str) -> tuple[Any, ...]:
    """A comma-separated list: no empty items, no duplicates, integers >= 1."""
    from asyncroll.errors import UsageError
    from asyncroll.json_checks import INT64_MAX

    parts = [part.strip() for part in text.split(",")]
    if any(not part for part in parts):
        example = "4,8,16" if kind is int else "fifo,tool_first"
        raise UsageError(f"{flag}: empty item in {text!r} (expected a comma-separated list, e.g. {example})")
    try:
        values: list[Any] = [kind(part) for part in parts]
    except ValueError:
        raise UsageError(
            f"{flag}: expected a comma-separated list of {kind.__name__}, got {text!r}"
        ) from None
    if kind is int and any(v < 1 for v in values):
        raise UsageError(f"{flag}: every value must be an integer >= 1, got {text!r}")
    if kind is int and any(v > INT64_MAX for v in values):  # else refused by a cell, its files left
        raise UsageError(f"{flag}: every value must fit in 64 bits (at most {INT64_MAX}), got {text!r}")
    repeated = sorted({str(v) for v in values if values.count(v) > 1})
    if repeated:
        raise UsageError(
            f"{flag}: {', '.join(repeated)} given more than once; each value is one cell of the sweep"
        )
    return tuple(values)


def warn_timed_out(summary: dict[str, Any] | None, tool_timeout: float) -> None:
    """Tool jobs the simulation timed out, said on stderr: a workload's ``cpu_ms`` longer than
    ``--tool-timeout`` (60 s by default) times out as a real run's would, each a failed trajectory and a
    replaced worker, with nothing else saying why (a workload of minutes-long jobs: 1,921 of 2,000)."""
    timed_out = (((summary or {}).get("tools") or {}).get("failures") or {}).get("timeout")
    if timed_out:
        typer.echo(
            f"warning: {timed_out:,} tool job(s) ran past --tool-timeout {tool_timeout:g} s and timed out, "
            "as in a real run (their cpu_ms is longer): raise --tool-timeout to simulate them finishing",
            err=True,
        )


def say_ended_otherwise(run_dir: Path, replay: Path) -> None:
    """Trajectories the replay could not end as the run did: said on stderr, recorded in run.json."""
    from asyncroll.json_depth import json_loads
    from asyncroll.outputs.receipt import write_json_atomic
    from asyncroll.simulation.replay_changes import (
        ended_otherwise,
        grade_failures,
        restarts_not_replayed,
    )

    changes, lacking = ended_otherwise(run_dir, replay), restarts_not_replayed(run_dir, replay)
    restarts = {reason: held.total() for reason, held in lacking.items()}
    if not changes and not restarts:
        return
    receipt_path = replay / "run.json"
    receipt = json_loads(receipt_path.read_text(encoding="utf-8"))
    found = {"ended_otherwise": changes, "restarts_not_replayed": restarts}
    receipt["simulation"]["replayed"].update({k: v for k, v in found.items() if v})
    try:
        write_json_atomic(receipt_path, receipt)
    except OSError as exc:  # no room for a second copy: the replay's run.json stays whole as it was
        typer.echo(f"warning: {receipt_path}: cannot record what follows ({exc.strerror or exc})", err=True)
    if restarts:
        lost = ", ".join(f"{reason}: {n}" for reason, n in restarts.items())
        what = ", ".join(f"{held} ×{n}" for counts in lacking.values() for held, n in sorted(counts.items()))
        typer.echo(
            f"warning: {sum(restarts.values())} worker replacement(s) of the run not replayed ({lost}), nor "
            f"their start-up: after {what}",
            err=True,
        )
    if changes:
        counts = ", ".join(f"{n} {change}" for change, n in sorted(changes.items()))
        run = json_loads((run_dir / "run.json").read_text(encoding="utf-8"))["config"]
        why = why_ended_otherwise(changes, run, receipt["config"], grade_failures(run_dir, replay))
        n = sum(changes.values())
        what = "trajectory" if n == 1 else "trajectories"
        typer.echo(f"warning: {n} {what} ended otherwise than in the run ({counts}): {why}", err=True)
