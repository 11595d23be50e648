"""`asyncroll simulate`: the runtime on a virtual clock, one run, a replay of a recorded run, or a sweep."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from asyncroll.commands.common import POLICY_HELP, Opt, fail, print_summary


def simulate(
    workload: Annotated[Path | None, Opt("--workload", help="Workload JSONL to simulate.")] = None,
    from_run: Annotated[Path | None, Opt("--from-run", help="Replay a recorded run's exact timings.")] = None,
    output: Annotated[Path | None, Opt("--output", help="Run directory to create; must not exist.")] = None,
    policy: Annotated[str | None, Opt(help=POLICY_HELP)] = None,
    max_active_trajectories: Annotated[int | None, Opt(help="Admission bound (default 16).")] = None,
    max_inflight_model_requests: Annotated[int | None, Opt(help="Concurrent model requests (4).")] = None,
    cpu_workers: Annotated[int | None, Opt(help="Simulated tool workers (default 2).")] = None,
    max_turns: Annotated[int | None, Opt(help="Turns per trajectory (default 8).")] = None,
    tool_timeout: Annotated[
        float | None, Opt(help="Seconds per tool job before the worker is replaced.")
    ] = None,
    tool_errors: Annotated[str | None, Opt(help="fail | observe")] = None,
    limit: Annotated[int | None, Opt(help="Simulate only the first N problems.")] = None,
    tool_root: Annotated[
        Path | None, Opt(help="Root of trusted tool files (validated, not executed).")
    ] = None,
    server: Annotated[
        str, Opt(help="fixed: each action's latency_ms | batching: a continuous-batching server model")
    ] = "fixed",
    max_num_seqs: Annotated[int | None, Opt(help="batching: running-batch limit (256).")] = None,
    step_base_ms: Annotated[float | None, Opt(help="batching: decode step time at batch 1 (12 ms).")] = None,
    step_per_seq_ms: Annotated[
        float | None, Opt(help="batching: added step time per running sequence (0.08 ms).")
    ] = None,
    prefill_ms_per_token: Annotated[
        float | None, Opt(help="batching: prefill cost per prompt token (0.03 ms).")
    ] = None,
    chars_per_token: Annotated[
        float | None, Opt(help="batching: characters per token for size estimates (4).")
    ] = None,
    turn_overhead_ms: Annotated[float, Opt(help="Client cost added to every model turn (ms).")] = 0.0,
    job_overhead_ms: Annotated[float, Opt(help="Dispatch + IPC cost added to every CPU job (ms).")] = 0.0,
    sweep: Annotated[bool, Opt("--sweep", help="Sweep policies × operating points × seeds instead.")] = False,
    policies: Annotated[
        str | None, Opt(help="sweep: comma-separated policies (fifo,tool_first,sync).")
    ] = None,
    active: Annotated[
        str | None, Opt(help="sweep: comma-separated active limits (default: the one given).")
    ] = None,
    inflight: Annotated[str | None, Opt(help="sweep: comma-separated inflight limits.")] = None,
    workers: Annotated[str | None, Opt(help="sweep: comma-separated worker counts.")] = None,
    seeds: Annotated[int | None, Opt(help="sweep: seeds per cell, timings jittered per seed (5).")] = None,
    jitter: Annotated[
        float | None, Opt(help="sweep: sigma of the mean-one lognormal timing jitter (0.25).")
    ] = None,
    jobs: Annotated[
        int | None,
        Opt(help="sweep: processes running cells at once (default: every CPU this process may use)."),
    ] = None,
    progress: Annotated[
        bool | None,
        Opt("--progress/--no-progress", help="sweep: cells done, on stderr (default: on when a terminal)."),
    ] = None,
) -> None:
    """Simulate a workload on a virtual clock: the real runtime and policies, no processes, no server.

    Writes the same run directory as ``run`` (marked simulated) with the makespan lower bound and
    efficiency in summary.json. ``--from-run RUN`` replays a recorded run's measured latencies and job
    times under another policy or limits: "what would policy X have done on exactly this run?".
    """
    flags = {k: v for k, v in locals().items() if v is not None}
    from asyncroll.backends.server_model import ServerModelConfig
    from asyncroll.config import build_config
    from asyncroll.errors import SimulationError, UsageError
    from asyncroll.simulation.engine import SimulationSettings, prepare_from_run
    from asyncroll.simulation.engine import simulate as run_simulation

    sim_keys = {
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
    values = {k: v for k, v in flags.items() if k not in sim_keys}
    derived = None
    try:
        if server not in ("fixed", "batching"):
            raise UsageError(f"--server: must be fixed or batching, not {server!r}")
        batching = {
            "--max-num-seqs": max_num_seqs,
            "--step-base-ms": step_base_ms,
            "--step-per-seq-ms": step_per_seq_ms,
            "--prefill-ms-per-token": prefill_ms_per_token,
            "--chars-per-token": chars_per_token,
        }
        _only_with(batching, server == "batching", "--server batching")
        sweeping = {
            "--policies": policies,
            "--active": active,
            "--inflight": inflight,
            "--workers": workers,
            "--seeds": seeds,
            "--jitter": jitter,
            "--jobs": jobs,
            "--progress": progress,
        }
        _only_with(sweeping, sweep, "--sweep")
        model = ServerModelConfig()
        settings = SimulationSettings(
            "batching" if server == "batching" else "fixed",
            ServerModelConfig(
                model.max_num_seqs if max_num_seqs is None else max_num_seqs,
                model.step_base_ms if step_base_ms is None else step_base_ms,
                model.step_per_seq_ms if step_per_seq_ms is None else step_per_seq_ms,
                model.prefill_ms_per_token if prefill_ms_per_token is None else prefill_ms_per_token,
            ),
            SimulationSettings.chars_per_token if chars_per_token is None else chars_per_token,
            turn_overhead_ms,
            job_overhead_ms,
        )
        if turn_overhead_ms < 0 or job_overhead_ms < 0:
            raise UsageError("--turn-overhead-ms and --job-overhead-ms must be >= 0")
        if (workload is None) == (from_run is None):
            raise UsageError("give exactly one of --workload and --from-run")
        if output is None:
            raise UsageError("missing required option: --output")
        if sweep:
            if workload is None:
                raise UsageError("--sweep needs --workload")
            from asyncroll.simulation.sweep import SweepSpec, aggregate, markdown, run_sweep, usable_cpus

            cfg0 = build_config({**values, "output": output / "unused"})
            seeds = 5 if seeds is None else seeds
            jitter = 0.25 if jitter is None else jitter
            jobs = jobs or usable_cpus()
            spec = SweepSpec(
                tuple(_csv(policies or "fifo,tool_first,sync", str, "--policies")),
                tuple(_csv(active, int, "--active") if active else [cfg0.max_active_trajectories]),
                tuple(_csv(inflight, int, "--inflight") if inflight else [cfg0.max_inflight_model_requests]),
                tuple(_csv(workers, int, "--workers") if workers else [cfg0.cpu_workers]),
                seeds,
                jitter,
            )
            if seeds < 1 or jitter < 0 or jobs < 1:
                raise UsageError("--seeds must be >= 1, --jitter >= 0 and --jobs >= 1")
            for name in spec.policies:
                build_config({**values, "output": output, "policy": name})
            from asyncroll.workload import scan_workload

            scan_workload(
                cfg0.workload, cfg0.resolved_tool_root, scripted=True, limit=cfg0.limit
            ).raise_if_invalid()
            if output.exists():
                raise UsageError(f"--output {output} already exists; asyncroll never overwrites a run")
            rows = run_sweep(
                cfg0.workload,
                cfg0.resolved_tool_root,
                values,
                spec,
                settings,
                output,
                jobs=jobs,
                progress=_sweep_progress(progress),
            )
            typer.echo(markdown(aggregate(rows)) + f"{len(rows)} simulations; tables in {output}")
            raise typer.Exit(0)
        if from_run is not None:
            if limit is not None or tool_root is not None:
                raise UsageError("--limit and --tool-root come from the recorded run with --from-run")
            build_config({**values, "workload": output / "replay-workload.jsonl"})  # flags checked first
            derived = prepare_from_run(from_run, output)
            keep = (
                "policy",
                "max_active_trajectories",
                "max_inflight_model_requests",
                "cpu_workers",
                "max_turns",
                "tool_timeout",
                "tool_errors",
            )
            base = {k: derived.source_config[k] for k in keep if k in derived.source_config}
            values = {**base, **values, "workload": derived.workload, "tool_root": derived.tool_root}
        cfg = build_config(values)
        outcome = run_simulation(
            cfg,
            settings,
            sys.argv,
            derived=derived,
            source=None if from_run is None else str(from_run.resolve()),
        )
    except (UsageError, SimulationError, ValueError) as exc:
        if derived is not None and output is not None and not (output / "run.json").exists():
            import shutil

            shutil.rmtree(output, ignore_errors=True)
        raise fail(str(exc), getattr(exc, "exit_code", 2)) from None
    except KeyboardInterrupt:
        typer.echo(f"interrupted; partial outputs in {output}", err=True)
        raise typer.Exit(130) from None
    print_summary(outcome.summary, cfg.output)
    if outcome.summary:
        b = outcome.summary["bounds"]
        eff = "n/a" if b["efficiency"] is None else f"{b['efficiency']:.3f}"
        typer.echo(f"lower bound {b['lower_bound_s']:.3f}s ({b['binding']}) | efficiency {eff}")
    raise typer.Exit(outcome.exit_code)


def _only_with(flags: Mapping[str, object], applies: bool, mode: str) -> None:
    """Options that mean something only in one mode are refused outside it, not silently ignored."""
    from asyncroll.errors import UsageError

    given = [flag for flag, value in flags.items() if value is not None]
    if given and not applies:
        verb = "applies" if len(given) == 1 else "apply"
        raise UsageError(f"{', '.join(given)} {verb} only with {mode}")


def _csv(text: str, kind: type, flag: str) -> list[Any]:
    from asyncroll.errors import UsageError

    try:
        values = [kind(part.strip()) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(
            f"{flag}: expected a comma-separated list of {kind.__name__}, got {text!r}"
        ) from None
    if not values:
        raise UsageError(f"{flag}: empty list")
    return values


def _sweep_progress(wanted: bool | None) -> Callable[[int, int, dict[str, Any]], None] | None:
    """A line on stderr redrawn after each cell (``--progress``; by default only on a terminal)."""
    stream = sys.stderr
    if not (stream.isatty() if wanted is None else wanted):
        return None
    tty = stream.isatty()

    def report(done: int, total: int, row: dict[str, Any]) -> None:
        line = (
            f"[{done}/{total}] {row['policy']} {row['active']} / {row['inflight']} / {row['workers']} "
            f"seed {row['seed']}: makespan {row['makespan_s']:.3f} s"
        )
        stream.write(
            ("\r" + line.ljust(79) if tty else line + "\n") + ("\n" if tty and done == total else "")
        )
        stream.flush()

    return report
