"""Run one simulation: the real :class:`~asyncroll.runtime.run.Run` on a virtual clock, with virtual
workers and either the scripted latencies (``fixed``) or a batching server model (``batching``)."""

from __future__ import annotations

import math
import shutil
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from asyncroll.backends.base import Backend
from asyncroll.backends.scripted import ScriptedBackend
from asyncroll.backends.server_model import BatchingServer, ServerModelConfig
from asyncroll.clock import VirtualClock
from asyncroll.config import RunConfig
from asyncroll.errors import OutputExistsError, OutputWriteError, UsageError, WorkloadError
from asyncroll.runtime.pool import WorkerFactory
from asyncroll.runtime.run import Run, RunOutcome, prepare
from asyncroll.runtime.signals import interruptible
from asyncroll.runtime.trajectory import GRADE_TOOL
from asyncroll.runtime.virtual_worker import builtin_duration, virtual_factory
from asyncroll.serve_sim.sizes import MIN_CHARS_PER_TOKEN
from asyncroll.simulation.from_run import DerivedRun
from asyncroll.workers.protocol import JobRequest
from asyncroll.workload import MAX_DURATION_MS, scan_workload

ServerKind = Literal["fixed", "batching"]
#: The largest per-turn, per-job, per-step or per-token cost a simulation accepts: the limit of a
#: workload's declared durations (one day). Above it a run is nonsense; near float's limit time stops.
MAX_COST_MS = float(MAX_DURATION_MS)


#: How a simulated CPU job's duration is chosen (recorded in run.json): a file tool or an evaluation has
#: no cost a simulation could know unless the script declares it.
CPU_JOBS = (
    "each job's cpu_ms, else the milliseconds of spin_ms/sleep_ms, else 0 s (a file tool's call or an "
    "evaluation without cpu_ms takes no time; --from-run replays measured ones)"
)
#: How a simulated submission is judged (recorded in run.json): untrusted code is never run.
VERDICTS = (
    "a submission passes unless its action declares passes: false (code is never run in a simulation; "
    "--from-run replays the recorded verdicts)"
)
#: Built-in tools whose zero-cost default is right (or whose cost is their argument).
_TIMED_BUILTINS = frozenset({"spin_ms", "sleep_ms", "add", GRADE_TOOL})
_EVALUATE = "lcb_evaluate"


@dataclass
class Assumed:
    """What a simulation assumed for want of a declaration in the script (the command reports it):
    ``untimed`` counts, by tool, the jobs with no cost that took 0 s (see :data:`CPU_JOBS`); ``passed``
    the submissions with no declared verdict, which passed (see :data:`VERDICTS`)."""

    untimed: Counter[str] = field(default_factory=Counter)
    passed: int = 0


@dataclass(frozen=True)
class SimulationSettings:
    server: ServerKind = "fixed"
    model: ServerModelConfig = field(default_factory=ServerModelConfig)
    chars_per_token: float = 4.0
    turn_overhead_ms: float = 0.0  # added to every model turn (client-side cost a real run pays)
    job_overhead_ms: float = 0.0  # added to every CPU job, holding its worker (dispatch + IPC)

    def __post_init__(self) -> None:
        # the server model's own costs are checked by ServerModelConfig (the same range, for serve-sim too)
        costs = {"turn_overhead_ms": self.turn_overhead_ms, "job_overhead_ms": self.job_overhead_ms}
        for name, value in costs.items():
            if not (math.isfinite(value) and 0 <= value <= MAX_COST_MS):
                raise ValueError(f"{name} must be a finite number from 0 to {MAX_COST_MS:.0f} (one day)")
        if not (math.isfinite(self.chars_per_token) and self.chars_per_token >= MIN_CHARS_PER_TOKEN):
            raise ValueError(f"chars_per_token must be a finite number >= {MIN_CHARS_PER_TOKEN}")

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "server": self.server,
            "turn_overhead_ms": self.turn_overhead_ms,
            "job_overhead_ms": self.job_overhead_ms,
        }
        if self.server == "batching":
            out["server_model"] = asdict(self.model)
            out["chars_per_token"] = self.chars_per_token
        else:
            out["model_latency"] = "each action's latency_ms (0 when absent), independent of load"
        out["cpu_jobs"] = CPU_JOBS
        out["verdicts"] = VERDICTS
        return out


def simulate(
    config: RunConfig,
    settings: SimulationSettings,
    argv: list[str],
    *,
    derived: DerivedRun | None = None,
    source: str | None = None,
    signals: bool = False,
    assumed: Assumed | None = None,
    made: list[Path] | None = None,
) -> RunOutcome:
    """Validate, then run on a virtual clock; the output directory is the same as ``asyncroll run``'s.

    ``signals``: SIGINT, SIGTERM and SIGHUP interrupt the run as they do ``asyncroll run`` — run.json
    records ``interrupted by SIGTERM`` — and the outcome is ``interrupted`` (exit code 130), without a
    summary.
    ``assumed``: filled with what the script left undeclared (jobs without a cost, submissions without
    a verdict). ``made``: as :func:`~asyncroll.runtime.prepare.prepare`'s."""
    try:
        prepared = prepare(config, argv, output_ready=derived is not None, made=made)
    except WorkloadError:
        if derived is not None and derived.source_workload is not None:
            # its lines name the replay workload, removed with the refused output: told against the run's
            scan_workload(
                derived.source_workload,
                config.resolved_tool_root,
                scripted=True,
                limit=derived.source_limit,
            ).raise_if_invalid()
        raise
    clock = VirtualClock()
    backend, capacity = backend_for(settings, clock)
    extra = {
        "simulation": {
            **settings.describe(),
            "clock": "virtual",
            "workers": "virtual (no processes)",
            "from_run": source,
            "replayed": None
            if derived is None
            else {
                "trajectories": derived.trajectories,
                "model_turns": derived.model_turns,
                "cpu_jobs": derived.cpu_jobs,
                "source_simulated": derived.source_simulated,
                "model_waits": dict(derived.model_waits),
            },
        }
    }
    run = Run(
        prepared,
        clock,
        worker_factory=workers_for(
            settings,
            clock,
            () if derived is None else derived.replacement_startup_s,
            assumed,
            prepared.config.tool_timeout,
        ),
        backend=backend,
        receipt_extra=extra,
        model_capacity=capacity,
    )
    outcome = clock.run(interruptible(run) if signals else run.execute())
    if derived is not None and not outcome.opened and not (config.output / "run.json").exists():
        # no room for the first run.json: the directory, made for this replay, holds only its workload (a
        # run.json missing there for another reason — the directory moved or removed while the replay ran
        # — does not make what stands at that path now this replay's to remove)
        remove_output(config.output, derived.made_parents)
        outcome.error = f"{outcome.error}; nothing written, {config.output} removed"
    return outcome


def backend_for(settings: SimulationSettings, clock: VirtualClock) -> tuple[Backend, int | None]:
    """The model side of a simulation and its own concurrency limit (None when unbounded)."""
    if settings.server == "batching":
        # here, not at the top: it renders each turn's messages as the HTTP backend does (jsonschema and
        # all), which a fixed-latency simulation never needs
        from asyncroll.backends.simulated import SimulatedServerBackend

        server = BatchingServer(settings.model, clock)
        backend = SimulatedServerBackend(server, settings.chars_per_token, settings.turn_overhead_ms / 1000)
        return backend, settings.model.max_num_seqs
    return ScriptedBackend(clock, settings.turn_overhead_ms / 1000), None


def workers_for(
    settings: SimulationSettings,
    clock: VirtualClock,
    replacement_startup: tuple[float, ...] = (),
    assumed: Assumed | None = None,
    tool_timeout: float = math.inf,
) -> WorkerFactory:
    """Virtual workers whose jobs execute for their declared cost, each holding its worker the per-job
    overhead before (not in its ``execute_s``, as a real job's execute time leaves out the runtime's
    dispatch); replacements take ``replacement_startup`` to start (a replay's measured ones; see
    :func:`virtual_factory`). ``assumed`` collects what the script left undeclared (see :class:`Assumed`);
    ``tool_timeout``: the run's, past which a job times out (and a submission does not pass)."""
    overhead = settings.job_overhead_ms / 1000

    def duration(request: JobRequest) -> float:
        seconds = builtin_duration(request)
        if assumed is not None:
            if request.cost_s is None and request.tool not in _TIMED_BUILTINS:
                assumed.untimed[request.tool] += 1
            # one that fails by its script (its raises, its worker's death) or times out never passes
            declared = (request.declared, request.declared_error, request.declared_death)
            if (
                request.tool == _EVALUATE
                and declared == (None, None, None)
                and overhead + seconds <= tool_timeout
            ):
                assumed.passed += 1
        return seconds

    return virtual_factory(
        clock, duration, simulate_tools=True, replacement_startup=replacement_startup, overhead_s=overhead
    )


def prepare_from_run(
    run_dir: Path,
    output: Path,
    tool_root: Path | None = None,
    workload: Path | None = None,
    *,
    job_overhead_ms: float = 0.0,
) -> DerivedRun:
    """Create ``output`` and write the replay workload into it (removed again if that fails or is
    interrupted); ``job_overhead_ms``: the replay's (see :func:`derive_workload`). Whatever the run
    directory holds, a failure to read it is a :class:`UsageError`."""
    from asyncroll.cli_signals import deferred
    from asyncroll.runtime.prepare import output_exists, refuse_unwritable
    from asyncroll.simulation.from_run import derive_workload

    if output_exists(output):
        raise OutputExistsError(output)
    made = tuple(p for p in output.absolute().parents if not p.exists())  # nearest first
    created = False
    try:
        with deferred():  # a stop signal waits until ``created`` says whether mkdir made it
            try:
                output.mkdir(parents=True)
            except OSError as exc:  # not made here (it may be another's, made meanwhile): only its parents go
                remove_output(None, made)
                if isinstance(exc, FileExistsError) and exc.filename == str(output):  # made since the look
                    raise OutputExistsError(output) from exc
                raise UsageError(f"--output {output}: cannot create: {exc.strerror or exc}") from exc
            created = True
        refuse_unwritable(output)
        derived = derive_workload(
            run_dir, output / "replay-workload.jsonl", tool_root, workload, job_overhead_ms=job_overhead_ms
        )
    except UsageError:
        if created:
            remove_output(output, made)
        raise
    except OutputWriteError as exc:  # no room for the replay workload: not the recorded run's fault
        remove_output(output, made)
        raise OutputWriteError(f"{exc}; nothing written, {output} removed") from exc
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        # a run directory this code cannot read (another version, or damaged) is bad input, not a crash
        remove_output(output, made)
        raise UsageError(f"--from-run {run_dir}: cannot replay it: {type(exc).__name__}: {exc}") from exc
    except BaseException:
        remove_output(output if created else None, made)
        raise
    return replace(derived, made_parents=made)


def remove_output(output: Path | None, made_parents: tuple[Path, ...] = ()) -> None:
    """Remove a replay's output directory that holds no run yet, and the folders above it that were
    created with it (nearest first, each only while empty): a refused command leaves nothing behind."""
    if output is not None:
        shutil.rmtree(output, ignore_errors=True)
    for parent in made_parents:
        try:
            parent.rmdir()
        except OSError:  # something else was put there meanwhile: it stays
            break
