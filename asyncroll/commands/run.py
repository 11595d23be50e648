"""`asyncroll run`: every §4.1 flag, a config file, the run itself and its exit code."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Annotated, Any

import typer

from asyncroll.commands.common import (
    POLICY_HELP,
    Opt,
    fail,
    note_limit_past,
    note_workers_past_cpus,
    open_files_for_requests,
    print_summary,
    warn_exports,
    warn_inflight_past_active,
    warn_low_address_space,
    warn_mechanism_off,
    warn_moved,
    warn_no_evaluations,
    warn_no_telemetry_source,
    warn_replay_structured,
    warn_sync_active,
    warn_weak_isolation,
)
from asyncroll.commands.run_warnings import (
    warn_loop_stalls,
    warn_replay_length_unfixed,
    warn_server_down,
    warn_telemetry,
    written_summary,
)


def run(
    workload: Annotated[Path | None, Opt("--workload", help="Workload JSONL (required).")] = None,
    output: Annotated[Path | None, Opt("--output", help="Run directory to create; must not exist.")] = None,
    backend: Annotated[str | None, Opt(help="scripted (the default) | vllm | openai")] = None,
    policy: Annotated[str | None, Opt(help=POLICY_HELP)] = None,
    tool_root: Annotated[
        Path | None, Opt(help="Root of trusted tool files (default: the workload's folder).")
    ] = None,
    model: Annotated[str | None, Opt(help="Model name (HTTP backends).")] = None,
    endpoint: Annotated[
        list[str] | None,
        Opt(
            metavar="<str>",
            help="HTTP backends: server URL (default http://localhost:8000); one server per run.",
        ),
    ] = None,
    limit: Annotated[
        int | None, Opt(help="Run only the first N problems (only those lines are validated).")
    ] = None,
    cpu_workers: Annotated[int | None, Opt(help="Persistent tool worker processes (default 2).")] = None,
    max_active_trajectories: Annotated[int | None, Opt(help="Admission bound (default 16).")] = None,
    max_inflight_model_requests: Annotated[
        int | None, Opt("--max-inflight-model-requests", help="Concurrent model requests (default 4).")
    ] = None,
    gpu_slots: Annotated[
        int | None, Opt("--gpu-slots", help="Deprecated alias of --max-inflight-model-requests.", hidden=True)
    ] = None,
    max_turns: Annotated[int | None, Opt(help="Turns per trajectory (default 8).")] = None,
    max_tokens: Annotated[int | None, Opt(help="HTTP backends: tokens per model request (512).")] = None,
    warmup_requests: Annotated[int | None, Opt(help="HTTP backends: untimed warm-up requests (2).")] = None,
    tool_timeout: Annotated[
        float | None,
        Opt(
            help="Seconds per tool job before the worker is killed (60); a code evaluation's total "
            "budget stays below it."
        ),
    ] = None,
    worker_startup_timeout: Annotated[
        float | None, Opt(help="Seconds for a worker to get ready (120).")
    ] = None,
    worker_max_rss_mb: Annotated[
        int | None,
        Opt(
            help="Replace a tool worker that a job leaves above this resident memory, MiB (off; at "
            "least 64): a leaking tool cannot grow the warm workers for the whole run."
        ),
    ] = None,
    request_timeout: Annotated[
        float | None,
        Opt(
            help="HTTP backends: seconds a model request may wait for a connection, a send or any read "
            "(120); the whole request ends max(1 s, 10%) later at most."
        ),
    ] = None,
    structured_output: Annotated[
        bool | None,
        Opt(
            "--structured-output/--no-structured-output",
            help="HTTP backends: JSON-schema actions (agent mode; a --replay sends no schema).",
        ),
    ] = None,
    metrics_url: Annotated[
        str | None,
        Opt(
            help="Server /metrics URL (vLLM or SGLang names; default ENDPOINT/metrics for a declared "
            "--server-kind vllm|sglang, as --backend vllm declares vllm)."
        ),
    ] = None,
    telemetry: Annotated[
        bool | None,
        Opt("--telemetry/--no-telemetry", help="Sample server metrics / NVML when asked for (on)."),
    ] = None,
    nvml_device: Annotated[int | None, Opt(help="Physical GPU index for NVML sampling.")] = None,
    telemetry_interval: Annotated[
        float | None,
        Opt(help="Telemetry sample interval, s (0.2; at least 0.01: a source is not read back to back)."),
    ] = None,
    seed: Annotated[int | None, Opt(help="HTTP backends: request seed (default 0); recorded.")] = None,
    starvation_threshold: Annotated[
        int | None, Opt(help="Pressure trigger (default: inflight limit).")
    ] = None,
    aging_seconds: Annotated[float | None, Opt(help="Hard aging bound for the pressure policy (30).")] = None,
    aging_weight: Annotated[
        float | None, Opt(help="Soft aging weight for the pressure policy (0.02).")
    ] = None,
    nvtx: Annotated[bool | None, Opt("--nvtx/--no-nvtx", help="Emit NVTX ranges.")] = None,
    dedicated_gpu: Annotated[
        bool | None, Opt("--dedicated-gpu/--no-dedicated-gpu", help="Declare one dedicated GPU.")
    ] = None,
    progress: Annotated[
        bool | None,
        Opt(
            "--progress/--no-progress",
            help="Live progress line on stderr, redrawn in place when stderr is a terminal; on by default, "
            "--no-progress turns it off. Into a file or pipe only when given: one whole line every 30 s.",
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        Opt(help="Serve the runtime's gauges and counters for Prometheus on this port (0: any free port)."),
    ] = None,
    metrics_host: Annotated[str | None, Opt(help="Address for --metrics-port (default 127.0.0.1).")] = None,
    tool_errors: Annotated[
        str | None,
        Opt(help="fail (default) | observe: a tool error ends the trajectory or is returned to the model."),
    ] = None,
    max_observation_chars: Annotated[
        int | None,
        Opt(
            help="A tool result longer than this many characters (as JSON text) is cut before the model "
            "sees it, with a note saying so; counted in summary.json (100000; at least 100)."
        ),
    ] = None,
    transcripts: Annotated[
        bool | None,
        Opt(
            "--transcripts/--no-transcripts",
            help="Also write transcripts.jsonl: each ended trajectory's conversation (prompt, each reply's "
            "text and action, tool results and repair messages as the model saw them); off: it is large.",
        ),
    ] = None,
    allow_weak_isolation: Annotated[
        bool | None,
        Opt(
            "--allow-weak-isolation/--no-allow-weak-isolation",
            help="Run untrusted code (lcb_evaluate) even when a sandbox layer is missing (recorded).",
        ),
    ] = None,
    test_timeout: Annotated[
        float | None,
        Opt(
            help="lcb_evaluate: wall seconds per hidden test (6, as LiveCodeBench); at most --tool-timeout "
            "less its margin of max(1 s, 10%)."
        ),
    ] = None,
    evaluation_timeout: Annotated[
        float | None,
        Opt(
            help="lcb_evaluate: seconds for a whole evaluation (default: (--test-timeout + 1) × tests + 5, "
            "as LiveCodeBench, capped at --tool-timeout less its margin); at most that cap."
        ),
    ] = None,
    test_memory_mb: Annotated[
        int | None,
        Opt(help="lcb_evaluate: address space of each process of a test, MiB (768; 64 to 1048576)."),
    ] = None,
    replay: Annotated[
        bool | None,
        Opt(
            "--replay/--no-replay",
            help="HTTP backends: actions from the workload script; the server decodes each action's "
            "output_tokens (else --max-tokens).",
        ),
    ] = None,
    server_kind: Annotated[
        str | None,
        Opt(
            help="HTTP backends: vllm | sglang | transformers | generic (default: vllm for --backend vllm, "
            "probed for openai)."
        ),
    ] = None,
    api_key_env: Annotated[
        str | None,
        Opt(
            help="HTTP backends: the name of an environment variable holding the server's API key, sent "
            "as 'Authorization: Bearer …' (the key itself is never written anywhere)."
        ),
    ] = None,
    max_retries: Annotated[
        int | None, Opt(help="HTTP backends: retries of a retryable failure (0 = off, the default).")
    ] = None,
    retry_max_delay: Annotated[
        float | None, Opt(help="HTTP backends: cap on a retry delay or retry-after, s (8).")
    ] = None,
    circuit_failures: Annotated[
        int | None,
        Opt(help="HTTP backends: consecutive unavailable failures that pause admission (5; 0 off)."),
    ] = None,
    server_down_timeout: Annotated[
        float | None, Opt(help="HTTP backends: seconds paused on a down server before the run fails (120).")
    ] = None,
    config: Annotated[
        Path | None,
        Opt(
            "--config",
            help="JSON/TOML file of these settings (paths in it relative to the current directory, as "
            "flags; numbers as numbers, switches as true/false); flags override.",
        ),
    ] = None,
) -> None:
    """Run a workload: writes run.json, events, results, summary.json, trace.json and timeline.html
    (and transcripts with --transcripts)."""
    flags = {k: v for k, v in locals().items() if k != "config" and v is not None}
    if endpoint and len(endpoint) > 1:  # click would keep the last one silently
        raise fail(
            f"--endpoint given {len(endpoint)} times: a run sends every request to one server (routing "
            "across several endpoints is not implemented); run one client per server instead"
        )
    flags.pop("endpoint", None)
    if endpoint:
        flags["endpoint"] = endpoint[0]
    from asyncroll.config import MAX_PROCESS_WORKERS, build_config
    from asyncroll.config_file import config_file_origins, config_file_paths_missing, load_config_file
    from asyncroll.errors import UsageError

    given_flags = set(flags)
    if "gpu_slots" in flags:
        warnings.warn(
            "--gpu-slots is deprecated; use --max-inflight-model-requests", DeprecationWarning, stacklevel=1
        )
        typer.echo("warning: --gpu-slots is deprecated; use --max-inflight-model-requests", err=True)
        if "max_inflight_model_requests" in flags:
            raise fail("--gpu-slots and --max-inflight-model-requests both given; use only the latter")
        flags["max_inflight_model_requests"] = flags.pop("gpu_slots")
    try:
        values: dict[str, Any] = {}
        origins: dict[str, str] = {}
        if config is not None:
            values, spelled = load_config_file(config)
            origins = config_file_origins(config, spelled, values.keys() - flags.keys())
        if "gpu_slots" in given_flags:  # its errors name the flag the user typed
            origins["max_inflight_model_requests"] = "--gpu-slots"
        values.update(flags)
        missing = [f"--{k}" for k in ("workload", "output") if k not in values]
        if missing:
            given = "" if config is None else f" (--config {config} gives none)"
            raise UsageError(f"missing required option(s): {', '.join(missing)}{given}")
        try:
            cfg = build_config(values, origins)
        except UsageError as exc:  # told with the settings' errors: a path not found, an output taken
            said = str(exc).splitlines()
            refused = {k for k, o in origins.items() if any(line.startswith(f"{o}:") for line in said)}
            kept = {k: v for k, v in values.items() if k not in refused}  # each problem told once
            paths = [] if config is None else config_file_paths_missing(config, kept, origins)
            raise UsageError("\n".join([*said, *paths, *_taken(values.get("output"), origins)])) from None
        not_found = [] if config is None else config_file_paths_missing(config, values, origins)
        if not_found:
            raise UsageError("\n".join([*not_found, *_taken(values.get("output"), origins)]))
        if config is not None:
            from asyncroll.receipt_settings import receipt_notes

            notes = receipt_notes(config, "policy" in flags, cfg.workload, cfg.tool_root)
            for note in notes:
                typer.echo(f"warning: {note}", err=True)
        if cfg.cpu_workers > MAX_PROCESS_WORKERS:  # simulated workers may be more: not a RunConfig bound
            where = origins.get("cpu_workers", "--cpu-workers")
            raise UsageError(
                f"{where}: {cfg.cpu_workers}: at most {MAX_PROCESS_WORKERS} worker processes (each is a "
                "Python process holding tens of MB)"
            )
        if cfg.metrics_port is not None:  # a busy or foreign address, before any output exists
            from asyncroll.telemetry.exporter import listen_error

            reason = listen_error(cfg.metrics_host, cfg.metrics_port)
            if reason is not None:
                source = origins.get("metrics_port")
                port = f"{source}: {cfg.metrics_port}" if source else f"--metrics-port {cfg.metrics_port}"
                raise UsageError(f"{port} on {cfg.metrics_host}: cannot listen: {reason}")
    except UsageError as exc:
        raise fail(str(exc), exc.exit_code) from None
    if cfg.policy == "gpu_first":  # named where it was given: a flag, or the config file's setting
        where = f"{origins['policy']}:" if "policy" in origins else "--policy"
        typer.echo(f"warning: {where} gpu_first is a deprecated alias of tool_first", err=True)
    warn_sync_active(cfg.policy, values, cfg.max_active_trajectories)
    warn_inflight_past_active(
        cfg.policy, values, cfg.max_inflight_model_requests, cfg.max_active_trajectories
    )
    from asyncroll.commands.simulate_flags import warn_unread

    warn_unread(values, [cfg.policy], f"--policy {cfg.policy}")
    warn_no_telemetry_source(cfg)
    warn_replay_structured(cfg)
    warn_mechanism_off(cfg)
    raise typer.Exit(_run(cfg, origins))  # a taken output, a missing tool root: named where given


def _taken(output: object, origins: dict[str, str]) -> list[str]:
    """The refusal of an output directory that exists, as a line to tell with other problems."""
    from asyncroll.runtime.prepare import taken_output

    return taken_output(output, origins.get("output"))


def _run(cfg: Any, origins: dict[str, str] | None = None) -> int:
    import shutil

    from asyncroll.clock import SystemClock
    from asyncroll.errors import UsageError
    from asyncroll.outputs.receipt import EXIT_INTERRUPTED
    from asyncroll.runtime.run import Run, prepare
    from asyncroll.runtime.signals import CommandSignals, interruptible, late_signal_note

    # Validation and set-up stop on SIGINT, SIGTERM or SIGHUP too (exit 130); the run itself has its own
    # handlers (interruptible); once its outcome is final a signal is only recorded (CommandSignals).
    signals = CommandSignals()
    warn_low_address_space()
    open_files_for_requests(cfg)
    made: list[Path] = []  # the output directory, once this command made it (not another's)
    try:
        try:
            prepared = prepare(cfg, probe_isolation=True, made=made, origins=origins)
        except UsageError as exc:
            typer.echo(f"error: {exc}", err=True)
            return exc.exit_code
        warn_weak_isolation(prepared.isolation)
        warn_no_evaluations(cfg.model_fields_set, prepared.scan.tools)
        note_limit_past(cfg.limit, prepared.scan.count, "run")
        note_workers_past_cpus(cfg.limits.cpu_workers)
        clock = SystemClock()
        runner = Run(prepared, clock)
        # a scripted backend has no server: its failures are the script's (``error`` steps), not a sign of
        # one that is down
        served = cfg.backend != "scripted"

        async def main() -> int:
            outcome = await interruptible(runner)
            signals.hold()
            output = outcome.output(cfg.output)
            warn_moved(outcome.moved_to, cfg.output)
            where = f"{output} (no longer there)" if outcome.gone else output  # removed while it ran
            if runner.interrupt_reason is not None and outcome.status == "interrupted":
                typer.echo(f"interrupted by {runner.interrupt_reason}; partial outputs in {where}", err=True)
                # an interrupted outcome carries none: the file's (none of a run whose directory is gone)
                written = None if outcome.gone else written_summary(output)
                warn_telemetry(written)
                if served:
                    warn_server_down(written)  # stopped while waiting for a server that was down
                warn_loop_stalls(written)  # stopped, maybe, because it seemed stuck: its loop was held
                warn_exports(outcome.exports_failed, output, gone=outcome.gone)
                return EXIT_INTERRUPTED
            print_summary(outcome.summary, output, gone=outcome.gone)
            warn_telemetry(outcome.summary)
            if served:
                warn_server_down(outcome.summary, outcome.error)
            warn_loop_stalls(outcome.summary)
            if not outcome.gone:  # what is at its path now is not its run.json
                warn_replay_length_unfixed(output)
            warn_exports(outcome.exports_failed, output, gone=outcome.gone)
            if outcome.late_signal:
                typer.echo(late_signal_note(outcome.late_signal, outcome.exports_failed), err=True)
            if outcome.error:
                typer.echo(f"error: run {outcome.status}: {outcome.error}", err=True)
            return outcome.exit_code

        return clock.run(main())
    except KeyboardInterrupt as exc:  # before the run began: no receipt yet
        where = "nothing written"
        if made and cfg.output.is_dir() and not (cfg.output / "run.json").exists():
            shutil.rmtree(cfg.output, ignore_errors=True)  # made by this command a moment ago, still empty
        elif made and cfg.output.exists():
            where = f"partial outputs in {cfg.output}"
        typer.echo(f"interrupted by {signals.received or str(exc) or 'SIGINT'}; {where}", err=True)
        return EXIT_INTERRUPTED
    finally:
        signals.restore()
