"""Run one simulation: the real :class:`~asyncroll.runtime.run.Run` on a virtual clock, with virtual
workers and either the scripted latencies (``fixed``) or a batching server model (``batching``)."""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from asyncroll.backends.base import Backend
from asyncroll.backends.scripted import ScriptedBackend
from asyncroll.backends.server_model import BatchingServer, ServerModelConfig
from asyncroll.backends.simulated import SimulatedServerBackend
from asyncroll.clock import VirtualClock
from asyncroll.config import RunConfig
from asyncroll.errors import OutputExistsError, UsageError
from asyncroll.runtime.pool import WorkerFactory
from asyncroll.runtime.run import Run, RunOutcome, prepare
from asyncroll.runtime.virtual_worker import builtin_duration, virtual_factory
from asyncroll.simulation.from_run import DerivedRun
from asyncroll.workers.protocol import JobRequest

ServerKind = Literal["fixed", "batching"]


@dataclass(frozen=True)
class SimulationSettings:
    server: ServerKind = "fixed"
    model: ServerModelConfig = field(default_factory=ServerModelConfig)
    chars_per_token: float = 4.0
    turn_overhead_ms: float = 0.0  # added to every model turn (client-side cost a real run pays)
    job_overhead_ms: float = 0.0  # added to every CPU job, holding its worker (dispatch + IPC)

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
        return out


def simulate(
    config: RunConfig,
    settings: SimulationSettings,
    argv: list[str],
    *,
    derived: DerivedRun | None = None,
    source: str | None = None,
) -> RunOutcome:
    """Validate, then run on a virtual clock; the output directory is the same as ``asyncroll run``'s."""
    prepared = prepare(config, argv, output_ready=derived is not None)
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
            },
        }
    }
    run = Run(
        prepared,
        clock,
        worker_factory=workers_for(settings, clock),
        backend=backend,
        receipt_extra=extra,
        model_capacity=capacity,
    )
    return clock.run(run.execute())


def backend_for(settings: SimulationSettings, clock: VirtualClock) -> tuple[Backend, int | None]:
    """The model side of a simulation and its own concurrency limit (None when unbounded)."""
    if settings.server == "batching":
        server = BatchingServer(settings.model, clock)
        backend = SimulatedServerBackend(server, settings.chars_per_token, settings.turn_overhead_ms / 1000)
        return backend, settings.model.max_num_seqs
    return ScriptedBackend(clock, settings.turn_overhead_ms / 1000), None


def workers_for(settings: SimulationSettings, clock: VirtualClock) -> WorkerFactory:
    """Virtual workers whose jobs take their declared cost plus the per-job overhead."""
    extra = settings.job_overhead_ms / 1000

    def duration(request: JobRequest) -> float:
        return builtin_duration(request) + extra

    return virtual_factory(clock, duration, simulate_tools=True)


def prepare_from_run(run_dir: Path, output: Path) -> DerivedRun:
    """Create ``output`` and write the replay workload into it (removed again if that fails)."""
    from asyncroll.simulation.from_run import derive_workload

    if output.exists():
        raise OutputExistsError(f"--output {output} already exists; asyncroll never overwrites a run")
    output.mkdir(parents=True)
    try:
        return derive_workload(run_dir, output / "replay-workload.jsonl")
    except (UsageError, OSError, ValueError):
        shutil.rmtree(output, ignore_errors=True)
        raise
