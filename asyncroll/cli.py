"""The command line: ``asyncroll …`` or ``python -m asyncroll.cli …``. The only ``asyncio.run``.

Imports stay light at module level so that ``asyncroll --help`` starts fast; each command imports what
it needs. Exit codes: 0 run complete, 1 run failed, 2 usage or validation error, 130 interrupted.
"""

from __future__ import annotations

import json
import signal
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(
    name="asyncroll",
    help="Run agentic rollouts with bounded trajectories, model requests and warm CPU workers; measure them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

Opt = typer.Option


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


@app.command()
def run(
    workload: Annotated[Path | None, Opt("--workload", help="Workload JSONL (required).")] = None,
    output: Annotated[Path | None, Opt("--output", help="Run directory to create; must not exist.")] = None,
    backend: Annotated[str | None, Opt(help="scripted | vllm | openai")] = None,
    policy: Annotated[
        str | None, Opt(help="sync | fifo | tool_first | gpu_first (deprecated) | asyncroll")
    ] = None,
    tool_root: Annotated[
        Path | None, Opt(help="Root of trusted tool files (default: the workload's folder).")
    ] = None,
    model: Annotated[str | None, Opt(help="Model name (HTTP backends).")] = None,
    endpoint: Annotated[
        str | None, Opt(help="HTTP backends: server URL (default http://localhost:8000).")
    ] = None,
    limit: Annotated[int | None, Opt(help="Run only the first N problems.")] = None,
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
    warmup_requests: Annotated[
        int | None, Opt(help="Untimed warm-up requests (2; the scripted backend needs none).")
    ] = None,
    tool_timeout: Annotated[
        float | None, Opt(help="Seconds per tool job before the worker is killed (60).")
    ] = None,
    worker_startup_timeout: Annotated[
        float | None, Opt(help="Seconds for a worker to get ready (120).")
    ] = None,
    request_timeout: Annotated[
        float | None, Opt(help="HTTP backends: seconds per model request (120).")
    ] = None,
    structured_output: Annotated[
        bool | None,
        Opt("--structured-output/--no-structured-output", help="HTTP backends: JSON-schema actions."),
    ] = None,
    metrics_url: Annotated[
        str | None,
        Opt(help="Server /metrics URL (vLLM or SGLang names; default ENDPOINT/metrics for --backend vllm)."),
    ] = None,
    telemetry: Annotated[
        bool | None,
        Opt("--telemetry/--no-telemetry", help="Sample server metrics / NVML when asked for (on)."),
    ] = None,
    nvml_device: Annotated[int | None, Opt(help="Physical GPU index for NVML sampling.")] = None,
    telemetry_interval: Annotated[float | None, Opt(help="Telemetry sample interval, s (0.2).")] = None,
    seed: Annotated[int | None, Opt(help="HTTP backends: request seed (default 0); recorded.")] = None,
    starvation_threshold: Annotated[
        int | None, Opt(help="Pressure trigger (default: inflight limit).")
    ] = None,
    aging_seconds: Annotated[float | None, Opt(help="Hard aging bound for the pressure policy (30).")] = None,
    aging_weight: Annotated[
        float | None, Opt(help="Soft aging weight for the pressure policy (0.02).")
    ] = None,
    nvtx: Annotated[bool | None, Opt("--nvtx", help="Emit NVTX ranges.")] = None,
    dedicated_gpu: Annotated[bool | None, Opt("--dedicated-gpu", help="Declare one dedicated GPU.")] = None,
    progress: Annotated[
        bool | None,
        Opt("--progress/--no-progress", help="Live progress line on stderr (default: on when a terminal)."),
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
    allow_weak_isolation: Annotated[
        bool | None,
        Opt(
            "--allow-weak-isolation",
            help="Run untrusted code (lcb_evaluate) even when a sandbox layer is missing (recorded).",
        ),
    ] = None,
    replay: Annotated[
        bool | None,
        Opt(
            "--replay", help="HTTP backends: actions from the workload script; the server decodes their size."
        ),
    ] = None,
    server_kind: Annotated[
        str | None,
        Opt(
            help="HTTP backends: vllm | sglang | transformers | generic (default: vllm for --backend vllm, "
            "probed for openai)."
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
        Path | None, Opt("--config", help="JSON/TOML file of these settings; flags override.")
    ] = None,
) -> None:
    """Run a workload: writes run.json, events, results, summary.json, trace.json and timeline.html."""
    flags = {k: v for k, v in locals().items() if k != "config" and v is not None}
    from asyncroll.config import build_config, load_config_file
    from asyncroll.errors import UsageError

    if "gpu_slots" in flags:
        warnings.warn(
            "--gpu-slots is deprecated; use --max-inflight-model-requests", DeprecationWarning, stacklevel=1
        )
        typer.echo("warning: --gpu-slots is deprecated; use --max-inflight-model-requests", err=True)
        if "max_inflight_model_requests" in flags:
            raise _fail("--gpu-slots and --max-inflight-model-requests both given; use only the latter")
        flags["max_inflight_model_requests"] = flags.pop("gpu_slots")
    try:
        values: dict[str, Any] = load_config_file(config) if config is not None else {}
        values.update(flags)
        missing = [f"--{k}" for k in ("workload", "output") if k not in values]
        if missing:
            raise UsageError(f"missing required option(s): {', '.join(missing)}")
        cfg = build_config(values)
    except UsageError as exc:
        raise _fail(str(exc), exc.exit_code) from None
    if cfg.policy == "gpu_first":
        typer.echo("warning: --policy gpu_first is a deprecated alias of tool_first", err=True)
    raise typer.Exit(_run(cfg))


def _run(cfg: Any) -> int:
    import asyncio

    from asyncroll.clock import SystemClock
    from asyncroll.errors import UsageError
    from asyncroll.runtime.run import EXIT_INTERRUPTED, Run, prepare

    try:
        prepared = prepare(cfg, probe_isolation=True)
    except UsageError as exc:
        typer.echo(f"error: {exc}", err=True)
        return exc.exit_code
    clock = SystemClock()
    runner = Run(prepared, clock)

    async def main() -> int:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        assert task is not None

        def interrupt(name: str) -> None:
            if runner.interrupt_reason is None:
                runner.interrupt_reason = name
                task.cancel(f"{name} received")

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, interrupt, sig.name)
        try:
            outcome = await runner.execute()
        except asyncio.CancelledError:
            if runner.interrupt_reason is None:
                raise
            typer.echo(f"interrupted by {runner.interrupt_reason}; partial outputs in {cfg.output}", err=True)
            return EXIT_INTERRUPTED
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        _print_summary(outcome.summary, cfg.output)
        if outcome.error:
            typer.echo(f"error: run {outcome.status}: {outcome.error}", err=True)
        return outcome.exit_code

    return asyncio.run(main())


@app.command()
def timeline(
    run_dir: Annotated[Path, typer.Argument(help="A run directory holding events.jsonl.")],
) -> None:
    """Regenerate trace.json and timeline.html of a finished (or interrupted) run from its events."""
    if not run_dir.is_dir():
        raise _fail(f"{run_dir}: not a directory")
    if not (run_dir / "events.jsonl").is_file():
        raise _fail(f"{run_dir}: no events.jsonl (not a run directory?)")
    from asyncroll.outputs.rundir import export

    exports = export(run_dir)
    failed = [
        f"{name}: {info['error']}"
        for name, info in exports.items()
        if isinstance(info, dict) and not info.get("ok")
    ]
    if failed:
        raise _fail("export failed: " + "; ".join(failed), 1)
    typer.echo(f"wrote {run_dir / 'trace.json'} and {run_dir / 'timeline.html'}")


def _print_summary(summary: dict[str, Any] | None, output: Path) -> None:
    if not summary:
        return
    c, acc, sch = summary["counts"], summary["accuracy"], summary["scheduler"]
    tput = summary["throughput"]["completed_per_wall_hour"]
    exact = "n/a" if acc["exact"] is None else f"{acc['exact']:.3f}"
    evaluated = summary["tools"]["jobs_by_kind"].get("evaluate", 0)
    evaluations = f", code evaluations {evaluated}" if evaluated else ""
    typer.echo(
        f"{summary['status']}: {c['completed']}/{c['trajectories']} completed, {c['failed']} failed, "
        f"{c['max_turns']} max_turns | tool calls {summary['tools']['calls']}{evaluations} | "
        f"exact accuracy {exact} (n={acc['denominator']}) | makespan {summary['makespan_s']:.3f}s | "
        f"{'n/a' if tput is None else f'{tput:.1f}'} completed/h | policy {sch['policy']}: "
        f"{sch['decisions']} decisions, {sch['reorders']} reorders | worker restarts "
        f"{summary['workers']['restarts']}\noutputs: {output}"
    )


@app.command()
def simulate(
    workload: Annotated[Path | None, Opt("--workload", help="Workload JSONL to simulate.")] = None,
    from_run: Annotated[Path | None, Opt("--from-run", help="Replay a recorded run's exact timings.")] = None,
    output: Annotated[Path | None, Opt("--output", help="Run directory to create; must not exist.")] = None,
    policy: Annotated[str | None, Opt(help="sync | fifo | tool_first | gpu_first")] = None,
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
    max_num_seqs: Annotated[int, Opt(help="batching: running-batch limit.")] = 256,
    step_base_ms: Annotated[float, Opt(help="batching: decode step time at batch 1 (ms).")] = 12.0,
    step_per_seq_ms: Annotated[
        float, Opt(help="batching: added step time per running sequence (ms).")
    ] = 0.08,
    prefill_ms_per_token: Annotated[float, Opt(help="batching: prefill cost per prompt token (ms).")] = 0.03,
    chars_per_token: Annotated[float, Opt(help="batching: characters per token for size estimates.")] = 4.0,
    turn_overhead_ms: Annotated[float, Opt(help="Client cost added to every model turn (ms).")] = 0.0,
    job_overhead_ms: Annotated[float, Opt(help="Dispatch + IPC cost added to every CPU job (ms).")] = 0.0,
    sweep: Annotated[bool, Opt("--sweep", help="Sweep policies × operating points × seeds instead.")] = False,
    policies: Annotated[str, Opt(help="sweep: comma-separated policies.")] = "fifo,tool_first,sync",
    active: Annotated[
        str | None, Opt(help="sweep: comma-separated active limits (default: the one given).")
    ] = None,
    inflight: Annotated[str | None, Opt(help="sweep: comma-separated inflight limits.")] = None,
    workers: Annotated[str | None, Opt(help="sweep: comma-separated worker counts.")] = None,
    seeds: Annotated[int, Opt(help="sweep: seeds per cell (timings jittered per seed).")] = 5,
    jitter: Annotated[float, Opt(help="sweep: sigma of the mean-one lognormal timing jitter.")] = 0.25,
) -> None:
    """Simulate a workload on a virtual clock: the real runtime and policies, no processes, no server.

    Writes the same run directory as ``run`` (marked simulated) with the makespan lower bound and
    efficiency in summary.json. ``--from-run RUN`` replays a recorded run's measured latencies and job
    times under another policy or limits: "what would policy X have done on exactly this run?".
    """
    flags = {k: v for k, v in locals().items() if v is not None}
    import sys

    from asyncroll.backends.server_model import ServerModelConfig
    from asyncroll.config import build_config
    from asyncroll.errors import UsageError
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
        settings = SimulationSettings(
            "batching" if server == "batching" else "fixed",
            ServerModelConfig(max_num_seqs, step_base_ms, step_per_seq_ms, prefill_ms_per_token),
            chars_per_token,
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
            from asyncroll.simulation.sweep import SweepSpec, aggregate, markdown, run_sweep

            cfg0 = build_config({**values, "output": output / "unused"})
            spec = SweepSpec(
                tuple(_csv(policies, str, "--policies")),
                tuple(_csv(active, int, "--active") if active else [cfg0.max_active_trajectories]),
                tuple(_csv(inflight, int, "--inflight") if inflight else [cfg0.max_inflight_model_requests]),
                tuple(_csv(workers, int, "--workers") if workers else [cfg0.cpu_workers]),
                seeds,
                jitter,
            )
            if seeds < 1 or jitter < 0:
                raise UsageError("--seeds must be >= 1 and --jitter >= 0")
            for name in spec.policies:
                build_config({**values, "output": output, "policy": name})
            from asyncroll.workload import scan_workload

            scan_workload(
                cfg0.workload, cfg0.resolved_tool_root, scripted=True, limit=cfg0.limit
            ).raise_if_invalid()
            if output.exists():
                raise UsageError(f"--output {output} already exists; asyncroll never overwrites a run")
            rows = run_sweep(cfg0.workload, cfg0.resolved_tool_root, values, spec, settings, output)
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
    except (UsageError, ValueError) as exc:
        if derived is not None and output is not None and not (output / "run.json").exists():
            import shutil

            shutil.rmtree(output, ignore_errors=True)
        raise _fail(str(exc), getattr(exc, "exit_code", 2)) from None
    except KeyboardInterrupt:
        typer.echo(f"interrupted; partial outputs in {output}", err=True)
        raise typer.Exit(130) from None
    _print_summary(outcome.summary, cfg.output)
    if outcome.summary:
        b = outcome.summary["bounds"]
        eff = "n/a" if b["efficiency"] is None else f"{b['efficiency']:.3f}"
        typer.echo(f"lower bound {b['lower_bound_s']:.3f}s ({b['binding']}) | efficiency {eff}")
    raise typer.Exit(outcome.exit_code)


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


@app.command()
def validate(
    workload: Annotated[Path, typer.Argument(help="Workload JSONL to check.")],
    tool_root: Annotated[
        Path | None, Opt(help="Root of trusted tool files (default: the workload's folder).")
    ] = None,
    backend: Annotated[
        str, Opt(help="Backend the workload is meant for (scripted needs scripts).")
    ] = "scripted",
) -> None:
    """Check a workload without running it; reports every problem, not just the first."""
    from asyncroll.workload import scan_workload

    root = (tool_root or workload.parent).resolve()
    scan = scan_workload(workload, root, scripted=backend == "scripted")
    if scan.problems:
        for line in scan.problems:
            typer.echo(line, err=True)
        if scan.truncated:
            typer.echo(f"... and {scan.truncated} more problems", err=True)
        typer.echo(
            f"{workload}: {len(scan.problems) + scan.truncated} problem(s) in {scan.count} lines", err=True
        )
        raise typer.Exit(2)
    typer.echo(
        f"{workload}: ok, {scan.count} problems, {len(scan.tools)} distinct tools, sha256 {scan.sha256}"
    )


@app.command()
def schema(
    which: Annotated[str, typer.Argument(help="workload | events | run | summary | config | all")] = "all",
) -> None:
    """Print JSON Schemas of workload lines, events, run.json, summary.json and the run config."""
    from asyncroll.schemas import schemas

    all_schemas = schemas()
    if which != "all" and which not in all_schemas:
        raise _fail(f"unknown schema {which!r}; choose from {', '.join(['all', *all_schemas])}")
    chosen = all_schemas if which == "all" else all_schemas[which]
    typer.echo(json.dumps(chosen, indent=2))


@app.command("convert-toolmath")
def convert_toolmath(
    source: Annotated[Path, Opt("--source", help="ToolMATH.json: a JSON list of tool records.")],
    functions_dir: Annotated[
        Path,
        Opt("--functions-dir", help="Folder of the tool files (DIR/<function> or DIR/function_ToolMATH/…)."),
    ],
    output: Annotated[Path, Opt("--output", help="Workload JSONL to create; must not exist.")],
    limit: Annotated[int | None, Opt(help="Keep the first N problems in seeded order.")] = None,
    seed: Annotated[int, Opt(help="Seed of the order-independent selection.")] = 0,
    answers_from_solution: Annotated[
        bool,
        Opt(
            "--answers-from-solution",
            help="Derive reference_answer from the solution's last \\boxed{…} (labelled in metadata).",
        ),
    ] = False,
) -> None:
    """Convert ToolMATH tool records: one problem per source problem, with all its tools."""
    from asyncroll.convert.toolmath import convert_toolmath as convert
    from asyncroll.errors import UsageError

    try:
        report = convert(
            source, functions_dir, output, limit=limit, seed=seed, answers_from_solution=answers_from_solution
        )
    except UsageError as exc:
        raise _fail(str(exc)) from None
    hint = (
        ""
        if output.parent.resolve() == functions_dir.resolve()
        else f"; run with --tool-root {functions_dir}"
    )
    typer.echo(
        f"{output}: {report.written} of {report.problems} problems ({report.records} tool records), "
        f"seed {seed}{hint}"
    )
    if report.without_answer:
        typer.echo(
            f"note: {len(report.without_answer)} problem(s) have no \\boxed{{}} answer and no "
            f"reference_answer: {', '.join(report.without_answer[:10])}",
            err=True,
        )


@app.command("convert-livecodebench")
def convert_livecodebench(
    source: Annotated[Path, Opt("--source", help="LiveCodeBench rows: JSON array, object or JSONL.")],
    output: Annotated[Path, Opt("--output", help="Workload JSONL to create; must not exist.")],
    limit: Annotated[int | None, Opt(help="Keep the first N problems in seeded order.")] = None,
    seed: Annotated[int, Opt(help="Seed of the order-independent selection.")] = 0,
    stdin_only: Annotated[bool, Opt("--stdin-only", help="Drop functional (LeetCode) problems.")] = False,
) -> None:
    """Convert LiveCodeBench code-generation rows to one-repair problems evaluated by lcb_evaluate."""
    from asyncroll.convert.livecodebench import convert_livecodebench as convert
    from asyncroll.errors import UsageError

    try:
        report = convert(source, output, limit=limit, seed=seed, stdin_only=stdin_only)
    except UsageError as exc:
        raise _fail(str(exc)) from None
    kept = report.rows - report.skipped
    dropped = f"; {report.skipped} functional rows dropped by --stdin-only" if report.skipped else ""
    typer.echo(
        f"{output}: {report.written} of {kept} problems ({report.functional} functional rows{dropped}), "
        f"seed {seed}"
    )


@app.command("serve-sim")
def serve_sim(
    host: Annotated[str, Opt(help="Address to listen on (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, Opt(help="Port; 0 picks a free one (printed on the first line).")] = 8000,
    model: Annotated[str, Opt(help="The served model name requests must use.")] = "sim",
    max_num_seqs: Annotated[int, Opt(help="Running-batch limit.")] = 256,
    step_base_ms: Annotated[float, Opt(help="Decode step time at batch 1 (ms).")] = 12.0,
    step_per_seq_ms: Annotated[float, Opt(help="Added step time per running sequence (ms).")] = 0.08,
    prefill_ms_per_token: Annotated[float, Opt(help="Prefill cost per prompt token (ms).")] = 0.03,
    chars_per_token: Annotated[float, Opt(help="Characters per token for size estimates.")] = 4.0,
    kv_cache_tokens: Annotated[int, Opt(help="KV-cache capacity in tokens (for the usage gauge).")] = 262_144,
    max_model_len: Annotated[int, Opt(help="Context length (prompt + completion) in tokens.")] = 32_768,
    metrics_flavor: Annotated[
        str, Opt(help="vllm | sglang: /metrics names and /v1/models owned_by.")
    ] = "vllm",
    enforce_schema: Annotated[
        bool, Opt("--enforce-schema/--no-enforce-schema", help="Replies always match a json_schema.")
    ] = True,
    seed: Annotated[int, Opt(help="Seed of the reply policy and the fault draws.")] = 0,
    rate_429: Annotated[float, Opt("--rate-429", help="Fraction of requests answered 429.")] = 0.0,
    rate_500: Annotated[float, Opt("--rate-500", help="Fraction answered 500.")] = 0.0,
    rate_503: Annotated[float, Opt("--rate-503", help="Fraction answered 503.")] = 0.0,
    retry_after: Annotated[float, Opt(help="retry-after of a 429, s (negative: none).")] = 1.0,
    reset_rate: Annotated[float, Opt(help="Fraction whose connection is reset before a response.")] = 0.0,
    truncate_rate: Annotated[float, Opt(help="Fraction whose body is cut off mid-way.")] = 0.0,
    malformed_rate: Annotated[float, Opt(help="Fraction answered 200 with a body that is not JSON.")] = 0.0,
    invalid_action_rate: Annotated[
        float, Opt(help="With --no-enforce-schema: fraction answered with prose, not an action.")
    ] = 0.0,
    slow_rate: Annotated[float, Opt(help="Fraction delayed by --slow-s before the engine.")] = 0.0,
    slow_s: Annotated[float, Opt(help="Delay of a slow request, s.")] = 1.0,
    reject_schema: Annotated[
        bool, Opt("--reject-schema", help="Refuse every json_schema request with 400 (as vLLM does).")
    ] = False,
    log_level: Annotated[str, Opt(help="uvicorn log level.")] = "warning",
) -> None:
    """Serve an OpenAI-compatible inference-server simulator (batching engine in real time, faults, metrics).

    Endpoints: POST /v1/chat/completions, GET /health, GET /v1/models, GET /metrics, GET /sim/stats.
    The first line printed is "serve-sim listening on http://HOST:PORT ...".
    """
    from asyncroll.backends.server_model import ServerModelConfig
    from asyncroll.serve_sim.config import FaultConfig, SimConfig
    from asyncroll.serve_sim.server import serve_forever

    try:
        if not 0 <= port <= 65535:
            raise ValueError(f"--port must be in [0, 65535], got {port}")
        sim = SimConfig(
            model=model,
            engine=ServerModelConfig(max_num_seqs, step_base_ms, step_per_seq_ms, prefill_ms_per_token),
            chars_per_token=chars_per_token,
            kv_cache_tokens=kv_cache_tokens,
            max_model_len=max_model_len,
            metrics_flavor=metrics_flavor,  # type: ignore[arg-type]  # validated by SimConfig
            enforce_schema=enforce_schema,
            seed=seed,
            faults=FaultConfig(
                rate_429=rate_429,
                rate_500=rate_500,
                rate_503=rate_503,
                reset_rate=reset_rate,
                truncate_rate=truncate_rate,
                malformed_rate=malformed_rate,
                invalid_action_rate=invalid_action_rate,
                slow_rate=slow_rate,
                slow_s=slow_s,
                retry_after_s=None if retry_after < 0 else retry_after,
                reject_schema=reject_schema,
            ),
        )
    except ValueError as exc:
        raise _fail(str(exc)) from None
    if invalid_action_rate and enforce_schema:
        raise _fail("--invalid-action-rate needs --no-enforce-schema (an enforcing server never sends one)")
    try:
        code = serve_forever(sim, host, port, log_level=log_level)
    except OSError as exc:
        raise _fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}", 1) from None
    raise typer.Exit(code)


experiment_app = typer.Typer(
    help="Paired policy experiments: a fresh inference server per arm, staged gates, receipts, resume.",
    no_args_is_help=True,
)
app.add_typer(experiment_app, name="experiment")


def _experiment_config(config: Path, overrides: dict[str, Any] | None = None) -> Any:
    from asyncroll.errors import UsageError
    from asyncroll.experiment.config import load_experiment_config

    try:
        return load_experiment_config(config, overrides)
    except UsageError as exc:
        raise _fail(str(exc), exc.exit_code) from None


@experiment_app.command("run")
def experiment_run(
    config: Annotated[Path, Opt("--config", help="Experiment config (JSON; see `experiment schema`).")],
    output: Annotated[Path, Opt("--output", help="Experiment directory to create (or resume).")],
    resume: Annotated[
        bool, Opt("--resume", help="Continue an interrupted experiment; finished arms are not re-run.")
    ] = False,
) -> None:
    """Run an experiment: qualification → opportunity → activation gates, then the paired comparison."""
    from asyncroll.errors import UsageError
    from asyncroll.experiment.runner import ExperimentRunner

    cfg = _experiment_config(config)
    runner = ExperimentRunner(cfg, output, resume=resume, config_path=config, echo=typer.echo)
    try:
        outcome = runner.run()
    except UsageError as exc:
        raise _fail(str(exc), exc.exit_code) from None
    typer.echo(outcome.message, err=outcome.exit_code != 0)
    raise typer.Exit(outcome.exit_code)


@experiment_app.command("plan")
def experiment_plan(
    config: Annotated[Path, Opt("--config", help="Experiment config (JSON).")],
    output: Annotated[Path | None, Opt("--output", help="Shown in the client commands.")] = None,
) -> None:
    """Validate a config and print every server and client command, in order; starts nothing."""
    from asyncroll.experiment.plan import render_plan

    typer.echo(render_plan(_experiment_config(config), output))


@experiment_app.command("schema")
def experiment_schema() -> None:
    """Print the JSON Schema of an experiment config."""
    from asyncroll.experiment.config import ExperimentConfig

    typer.echo(json.dumps(ExperimentConfig.model_json_schema(), indent=2))


@app.command()
def report(
    comparison: Annotated[Path, Opt("--comparison", help="comparison.json of an experiment.")],
    output: Annotated[Path, Opt("--output", help="Folder for REPORT.md, aggregate.json and the figure.")],
    figure: Annotated[bool, Opt("--figure", help="Also draw the three-panel figure (PNG and PDF).")] = False,
) -> None:
    """Report an experiment: medians, paired ratios, % change with t and bootstrap intervals, figure."""
    from asyncroll.errors import UsageError
    from asyncroll.experiment.report import write_report

    try:
        files = write_report(comparison, output, figure=figure)
    except UsageError as exc:
        raise _fail(str(exc), exc.exit_code) from None
    typer.echo("wrote " + ", ".join(str(f) for f in files))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
