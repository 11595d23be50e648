"""`asyncroll simulate`: the runtime on a virtual clock, one run, a replay of a recorded run, or a sweep."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from asyncroll.commands.common import (
    POLICY_HELP,
    Opt,
    fail,
    note_limit_past,
    print_summary,
    say,
    seconds,
    warn_exports,
    warn_inflight_past_active,
    warn_low_address_space,
    warn_moved,
    warn_sync_active,
)
from asyncroll.commands.simulate_flags import (
    DEFAULT_JITTER,
    DEFAULT_SEEDS,
    SIMULATE_ONLY,
    cap_simulated_workers,
    check_numbers,
    csv_list,
    only_with,
    refuse_aliases,
    refuse_single_run_forms,
    say_ended_otherwise,
    sweep_jobs,
    warn_assumed,
    warn_inflight_rows,
    warn_replay,
    warn_sync_rows,
    warn_timed_out,
    warn_unjittered_seeds,
    warn_unread,
)
from asyncroll.commands.sweep_progress import SweepProgress

if TYPE_CHECKING:  # imported lazily below: the CLI's start-up stays light
    from asyncroll.simulation.engine import Assumed


def simulate(
    workload: Annotated[
        Path | None, Opt("--workload", help="Workload JSONL; with --from-run: the run's, where it is now.")
    ] = None,
    from_runs: Annotated[
        list[Path] | None, Opt("--from-run", metavar="<path>", help="Replay a recorded run's exact timings.")
    ] = None,
    output: Annotated[Path | None, Opt("--output", help="Run directory to create; must not exist.")] = None,
    policy: Annotated[str | None, Opt(help=POLICY_HELP + " (a sweep: --policies)")] = None,
    max_active_trajectories: Annotated[
        int | None, Opt(help="Admission bound (default 16; a sweep: --active).")
    ] = None,
    max_inflight_model_requests: Annotated[
        int | None, Opt(help="Concurrent model requests (4; a sweep: --inflight).")
    ] = None,
    cpu_workers: Annotated[
        int | None, Opt(help="Simulated tool workers (default 2, at most 10240; a sweep: --workers).")
    ] = None,
    max_turns: Annotated[int | None, Opt(help="Turns per trajectory (default 8).")] = None,
    tool_timeout: Annotated[
        float | None, Opt(help="Seconds per tool job before the worker is replaced (60).")
    ] = None,
    tool_errors: Annotated[
        str | None, Opt(help="fail (default) | observe: a tool error ends the trajectory or is returned.")
    ] = None,
    starvation_threshold: Annotated[
        int | None,
        Opt(help="Pressure trigger (default: the inflight limit; a sweep: the same in every cell)."),
    ] = None,
    aging_seconds: Annotated[float | None, Opt(help="Hard aging bound for the pressure policy (30).")] = None,
    aging_weight: Annotated[
        float | None, Opt(help="Soft aging weight for the pressure policy (0.02).")
    ] = None,
    limit: Annotated[int | None, Opt(help="Simulate only the first N problems.")] = None,
    tool_root: Annotated[
        Path | None,
        Opt(
            help="Root of trusted tool files (validated, not executed); with --from-run, overrides the "
            "recorded run's (needed when it was relative and run.json cannot say to what)."
        ),
    ] = None,
    server: Annotated[
        str, Opt(help="fixed: each action's latency_ms | batching: a continuous-batching server model")
    ] = "fixed",
    max_num_seqs: Annotated[int | None, Opt(help="batching: running-batch limit (256).")] = None,
    step_base_ms: Annotated[float | None, Opt(help="batching: fixed step time, any batch (12 ms).")] = None,
    step_per_seq_ms: Annotated[
        float | None, Opt(help="batching: added step time per running sequence (0.08 ms).")
    ] = None,
    prefill_ms_per_token: Annotated[
        float | None, Opt(help="batching: prefill cost per prompt token (0.03 ms).")
    ] = None,
    chars_per_token: Annotated[
        float | None, Opt(help="batching: characters per token for size estimates (4; at least 0.01).")
    ] = None,
    turn_overhead_ms: Annotated[
        float, Opt(help="Client cost added to every model turn (ms, 0 to one day; not with --from-run).")
    ] = 0.0,
    job_overhead_ms: Annotated[
        float, Opt(help="Dispatch + IPC cost added to every CPU job (ms, 0 to one day).")
    ] = 0.0,
    transcripts: Annotated[
        bool | None,
        Opt(
            "--transcripts",
            help="Also write transcripts.jsonl, as run does (no server wrote the replies: each reply's text "
            "is null).",
        ),
    ] = None,
    sweep: Annotated[bool, Opt("--sweep", help="Sweep policies × operating points × seeds instead.")] = False,
    policies: Annotated[
        str | None, Opt(help="sweep: comma-separated policies (fifo,tool_first,sync).")
    ] = None,
    active: Annotated[
        str | None, Opt(help="sweep: comma-separated active limits, each >= 1 (default 16).")
    ] = None,
    inflight: Annotated[str | None, Opt(help="sweep: comma-separated inflight limits (default 4).")] = None,
    workers: Annotated[str | None, Opt(help="sweep: comma-separated worker counts (default 2).")] = None,
    seeds: Annotated[
        int | None, Opt(help="sweep: seeds per cell, 0 to N-1, timings jittered per seed (5; at most 1000).")
    ] = None,
    jitter: Annotated[
        float | None, Opt(help="sweep: sigma of the mean-one lognormal timing jitter (0.25; at most 5).")
    ] = None,
    jobs: Annotated[
        int | None,
        Opt(help="sweep: cell processes (default and at most: this process's CPUs; more is lowered)."),
    ] = None,
    progress: Annotated[
        bool | None,
        Opt("--progress/--no-progress", help="sweep: cells done, on stderr (default: on when a terminal)."),
    ] = None,
) -> None:
    """Simulate a workload on a virtual clock: the real runtime and policies, no processes, no server.

    Writes the same run directory as `run` (marked simulated) with the makespan lower bound and
    efficiency in summary.json. `--from-run RUN` replays a recorded run's measured latencies and job
    times under another policy or limits: "what would policy X have done on exactly this run?".
    """
    if from_runs is not None and len(from_runs) > 1:  # click would keep the last one silently
        raise fail(f"--from-run given {len(from_runs)} times: a replay is of one run; replay each on its own")
    from_run = from_runs[0] if from_runs else None
    flags = {k: v for k, v in locals().items() if v is not None and k != "from_runs"}
    from asyncroll.backends.server_model import ServerModelConfig
    from asyncroll.config import build_config
    from asyncroll.errors import OutputExistsError, OutputWriteError, SimulationError, UsageError
    from asyncroll.simulation.engine import Assumed, SimulationSettings, prepare_from_run
    from asyncroll.simulation.engine import simulate as run_simulation

    values = {k: v for k, v in flags.items() if k not in SIMULATE_ONLY}
    derived = None
    from asyncroll.runtime.signals import CommandSignals

    signals = CommandSignals()
    warn_low_address_space()
    final = swept = False
    made: list[Path] = []  # the output directory, once this command made it (not another's)
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
        only_with(batching, server == "batching", "--server batching")
        sweeping = {
            "--policies": policies,
            "--active": active,
            "--inflight": inflight,
            "--workers": workers,
            "--seeds": seeds,
            "--jitter": jitter,
            "--jobs": jobs,
            "--progress": progress or None,  # --no-progress asks for nothing: a single run shows none
        }
        only_with(sweeping, sweep, "--sweep")
        if sweep and transcripts:
            raise UsageError("--transcripts does not apply with --sweep (its cells write no run directory)")
        if sweep:
            refuse_single_run_forms(
                {
                    "--policy": (policy, "--policies"),
                    "--max-active-trajectories": (max_active_trajectories, "--active"),
                    "--max-inflight-model-requests": (max_inflight_model_requests, "--inflight"),
                    "--cpu-workers": (cpu_workers, "--workers"),
                }
            )
        check_numbers(
            tool_timeout=tool_timeout,
            step_base_ms=step_base_ms,
            step_per_seq_ms=step_per_seq_ms,
            prefill_ms_per_token=prefill_ms_per_token,
            chars_per_token=chars_per_token,
            turn_overhead_ms=turn_overhead_ms,
            job_overhead_ms=job_overhead_ms,
            jitter=jitter,
        )
        if max_num_seqs is not None and max_num_seqs < 1:
            raise UsageError(f"--max-num-seqs: must be >= 1, got {max_num_seqs}")
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
        if workload is None and from_run is None:
            raise UsageError("give --workload, or --from-run (with --workload: the run's, where it is now)")
        if from_run is not None and server == "batching":
            raise UsageError(
                "--from-run replays the run's measured model latencies; --server batching would replace "
                "them with the server model's, from token counts the recorded run does not carry"
            )
        if from_run is not None and turn_overhead_ms:
            raise UsageError(
                "--turn-overhead-ms does not apply with --from-run: the run's measured model latencies, "
                "which the replay takes, already hold the client's own cost per turn (the latency beyond "
                "the scripted one, which --turn-overhead-ms adds to a workload's latency_ms)"
            )
        if output is None:
            raise UsageError("missing required option: --output")
        if sweep:
            if from_run is not None:
                raise UsageError(
                    "--sweep needs --workload, not --from-run: to sweep a recorded run's timings, replay it "
                    "once (simulate --from-run RUN --output REPLAY) and sweep REPLAY/replay-workload.jsonl "
                    "with --tool-root set to the config.tool_root of REPLAY/run.json"
                )
            from asyncroll.simulation.sweep import SweepSpec, run_sweep
            from asyncroll.simulation.sweep_table import aggregate, markdown

            cfg0 = build_config({**values, "output": output / "unused"})
            processes = sweep_jobs(seeds, jobs)
            spec = SweepSpec(
                csv_list("fifo,tool_first,sync" if policies is None else policies, str, "--policies"),
                csv_list(active, int, "--active") if active is not None else (cfg0.max_active_trajectories,),
                csv_list(inflight, int, "--inflight")
                if inflight is not None
                else (cfg0.max_inflight_model_requests,),
                csv_list(workers, int, "--workers") if workers is not None else (cfg0.cpu_workers,),
                DEFAULT_SEEDS if seeds is None else seeds,
                DEFAULT_JITTER if jitter is None else jitter,
            )
            refuse_aliases(spec.policies)
            if active is not None:  # as with --max-active-trajectories: said when given (sweep.md says it)
                warn_sync_rows(spec.policies, spec.active)
            cap_simulated_workers(spec.workers, "--workers")
            warn_unread(values, spec.policies, "--policies " + ",".join(spec.policies))
            warn_unjittered_seeds(spec.seeds, spec.jitter)
            if inflight is not None:
                warn_inflight_rows(spec.inflight, spec.active)
            for name in spec.policies:
                try:
                    build_config({**values, "output": output, "policy": name})
                except UsageError as exc:
                    raise UsageError(str(exc).replace("--policy:", f"--policies: {name!r}:", 1)) from None
            from asyncroll.workload import scan_workload

            scan = scan_workload(
                cfg0.workload, cfg0.resolved_tool_root, scripted=True, limit=cfg0.limit, flag="--workload"
            )
            from asyncroll.runtime.prepare import output_exists, raise_together, taken_output

            raise_together(taken_output(output), scan)  # a taken output is told with the workload's errors
            note_limit_past(cfg0.limit, scan.count, "in each simulation")

            if output_exists(output):
                raise OutputExistsError(output)
            assumed = Assumed()
            line = SweepProgress.wanted(progress)
            try:
                rows = run_sweep(
                    cfg0.workload,
                    cfg0.resolved_tool_root,
                    values,
                    spec,
                    settings,
                    output,
                    jobs=processes,
                    progress=line,
                    argv=list(sys.argv),
                    assumed=assumed,
                    made=made,
                )
            finally:  # a sweep stopped early: what stderr says next starts a line of its own
                if line is not None:
                    line.end()
            swept = True  # the tables are written: a signal while they print (a pager's full pipe) stops
            say(markdown(aggregate(rows)) + f"{len(rows)} simulations; tables in {output}")
            warn_assumed(assumed, replay=False, over=f" over the sweep's {len(rows)} simulations")
            raise typer.Exit(0)
        given = dict(values)  # the user's own settings, not those kept from a recorded run
        origins: dict[str, str] = {}
        if from_run is not None:
            if limit is not None:
                raise UsageError("--limit comes from the recorded run with --from-run")
            _settings({**values, "workload": output / "replay-workload.jsonl"}, output)  # flags checked first
            derived = prepare_from_run(from_run, output, tool_root, workload, job_overhead_ms=job_overhead_ms)
            from asyncroll.simulation.from_run import kept_settings

            base = kept_settings(from_run, derived.source_config, set(given))
            values = {**base, **values, "workload": derived.workload, "tool_root": derived.tool_root}
            # a setting kept from the run is named where it came from, not as a flag nobody gave
            receipt = from_run / "run.json"
            origins = {k: f"--from-run {receipt}: config.{k}" for k in base if k not in given}
        cfg = build_config(values, origins) if from_run is not None else _settings(values, output)
        cap_simulated_workers([cfg.cpu_workers], origins.get("cpu_workers", "--cpu-workers"))  # replays too
        if cfg.policy == "gpu_first" and "policy" in given:
            typer.echo("warning: --policy gpu_first is a deprecated alias of tool_first", err=True)
        warn_sync_active(cfg.policy, given, cfg.max_active_trajectories)
        warn_inflight_past_active(
            cfg.policy, given, cfg.max_inflight_model_requests, cfg.max_active_trajectories
        )
        warn_unread(given, [cfg.policy], f"--policy {cfg.policy}")
        if derived is not None and from_run is not None:
            warn_replay(derived, from_run, given=given, policy=cfg.policy, active=cfg.max_active_trajectories)
        assumed = Assumed()
        outcome = run_simulation(
            cfg,
            settings,
            sys.argv,
            derived=derived,
            source=None if from_run is None else str(from_run.resolve()),
            signals=True,
            assumed=assumed,
            made=made,
        )
        final = True
    except (UsageError, SimulationError, OutputWriteError, ValueError) as exc:
        if derived is not None and output is not None and not (output / "run.json").exists():
            from asyncroll.simulation.engine import remove_output

            remove_output(output, derived.made_parents)
        raise fail(str(exc), getattr(exc, "exit_code", 2)) from None
    except KeyboardInterrupt as exc:  # outside a run (a run itself returns an interrupted outcome)
        ours = bool(made) or derived is not None  # --from-run: made by prepare_from_run
        done = getattr(exc, "done", None)  # a sweep that kept the simulations it finished
        if (
            (not sweep or (done is None and not swept))  # a sweep stopped before any simulation finished
            and ours
            and output is not None
            and output.is_dir()
            and not (output / "run.json").exists()
        ):
            # made by this command a moment ago (--from-run: holding only the replay workload), before the
            # run began: removed, as `run` removes its own, so that the same command can be given again
            from asyncroll.simulation.engine import remove_output

            remove_output(output, () if derived is None else derived.made_parents)
        where = (  # a directory another run made meanwhile holds nothing of this command's
            f"partial outputs in {output}"
            if output is not None and output.exists() and (ours or sweep)
            else "nothing written"
        )
        if swept:  # the printing, not the sweep: its tables are whole
            where = f"the sweep had finished: its tables are in {output}"
        if done is not None:
            where = (
                f"{done} of {getattr(exc, 'total', '?')} simulations finished: their rows are in "
                f"{output} (sweep.csv, sweep.md, sweep.json, marked partial)"
            )
        typer.echo(f"interrupted by {signals.received or str(exc) or 'SIGINT'}; {where}", err=True)
        raise typer.Exit(130) from None
    finally:
        if final:  # the outcome is final: a signal now is only recorded (it used to kill the process)
            signals.hold()
        else:
            signals.restore()
    try:
        _report(outcome, cfg, from_run, assumed)
    finally:
        signals.restore()


def _report(outcome: Any, cfg: Any, from_run: Path | None, assumed: Assumed) -> NoReturn:
    """Print a single simulation's outcome and exit with its code."""
    output = outcome.output(cfg.output)
    warn_moved(outcome.moved_to, cfg.output)
    if outcome.status == "interrupted" and outcome.summary is None:
        gone = " (no longer there)" if outcome.gone else ""  # removed while the run ran
        typer.echo(f"{outcome.error}; partial outputs in {output}{gone}", err=True)
        warn_exports(outcome.exports_failed, output, gone=outcome.gone)
        raise typer.Exit(outcome.exit_code)
    print_summary(outcome.summary, output, gone=outcome.gone)
    warn_exports(outcome.exports_failed, output, gone=outcome.gone)
    if from_run is None and outcome.status == "complete" and outcome.summary is not None:
        note_limit_past(cfg.limit, outcome.summary["counts"]["trajectories"], "simulated")
    # a failed replay's endings are not compared: its directory may be gone (moved or removed), and what
    # stands at its path then another's
    if from_run is not None and outcome.summary is not None and outcome.status == "complete":
        say_ended_otherwise(from_run, output)
        from asyncroll.simulation.replay_changes import stalls_taken

        if (stalls := stalls_taken(from_run)) is not None:
            typer.echo(stalls, err=True)
    warn_assumed(assumed, replay=from_run is not None)
    if from_run is None:  # a replay's timeouts are the recorded run's, at its own timeout
        warn_timed_out(outcome.summary, cfg.tool_timeout)
    if outcome.late_signal:
        from asyncroll.runtime.signals import late_signal_note

        typer.echo(late_signal_note(outcome.late_signal, outcome.exports_failed), err=True)
    if outcome.error:
        typer.echo(f"error: run {outcome.status}: {outcome.error}", err=True)
    b = outcome.summary.get("bounds") if outcome.summary else None
    if b:
        eff = "n/a" if b["efficiency"] is None else f"{b['efficiency']:.3f}"
        say(f"lower bound {seconds(b['lower_bound_s'])} ({b['binding']}) | efficiency {eff}")
    raise typer.Exit(outcome.exit_code)


def _settings(values: dict[str, Any], output: Path) -> Any:
    """The run's settings; refused, with ``--output`` too where it is taken (as ``run`` tells it): the
    output is looked at only later, so one error hid the other."""
    from asyncroll.config import build_config
    from asyncroll.errors import UsageError
    from asyncroll.runtime.prepare import taken_output

    try:
        return build_config(values)
    except UsageError as exc:
        raise UsageError("\n".join([str(exc), *taken_output(output)])) from None
