"""The real collaborators of a run, built from its config: the process-worker factory, the backend
``--backend`` names, each workload tool's worker key and the options bound to every evaluation.

:class:`~asyncroll.runtime.run.Run` uses these unless it is given others (virtual workers, another
backend: tests and the simulator).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from asyncroll.backends.base import Backend
from asyncroll.backends.scripted import ScriptedBackend
from asyncroll.clock import Clock
from asyncroll.config import RunConfig
from asyncroll.runtime.pool import Worker, WorkerFactory
from asyncroll.workers.builtin import BUILTIN_TOOLS
from asyncroll.workers.protocol import ToolSpec
from asyncroll.workload import WorkloadScan


def worker_tool_keys(scan: WorkloadScan) -> dict[str, str]:
    """Workload tool key → the key a worker serves it under (absolute path for trusted files)."""
    return {src.key: ToolSpec(src.name, src.path).key for src in scan.tools.values()}


def evaluator_options(config: RunConfig) -> dict[str, Any]:
    """The run's settings of every ``lcb_evaluate`` call, bound like the hidden tests. The evaluator caps
    its default total budget below the tool timeout (and :class:`RunConfig` refuses an explicit one that
    does not fit under it): a slow program gets a verdict, and a repair, not a killed worker."""
    options: dict[str, Any] = {
        "tool_timeout_s": config.tool_timeout,
        "time_limit_s": config.test_timeout,
        "memory_limit_mb": config.test_memory_mb,
    }
    if config.evaluation_timeout is not None:
        options["total_time_limit_s"] = config.evaluation_timeout
    if config.allow_weak_isolation:
        options["allow_weak_isolation"] = True
    return options


def default_backend(config: RunConfig, clock: Clock) -> Backend:
    """The backend ``--backend`` names: scripted, or the OpenAI-compatible HTTP client."""
    if config.backend == "scripted":
        return ScriptedBackend(clock)
    from asyncroll.backends.openai import HttpSettings, OpenAIBackend

    return OpenAIBackend(HttpSettings.from_config(config), clock)


def process_worker_factory(
    config: RunConfig,
    scan: WorkloadScan,
    sha256: Callable[[Path], str],
    output: Callable[[], Path] | None = None,
) -> WorkerFactory:
    """Workers that preload the workload's tools, each file only if it still has the SHA-256 that
    ``sha256`` gives (run.json's: the receipt is written before the first worker starts). ``output``:
    the run's directory where it is now (moved while the run ran: never a new run's at ``--output``)."""
    from asyncroll.workers.process import ProcessWorker
    from asyncroll.workers.spawn import log_folder

    def factory(index: int, generation: int) -> Worker:
        # made with the first worker, after run.json: a folder that cannot be made (a full disk) fails
        # the run in its receipt; made before it, it was a traceback that left the output behind
        logs = log_folder((config.output if output is None else output()) / "workers")
        specs = [ToolSpec(name) for name in BUILTIN_TOOLS]
        for src in scan.tools.values():
            if src.path is not None:
                specs.append(ToolSpec(src.name, src.path, sha256(src.path)))
        return ProcessWorker(
            index,
            specs,
            generation=generation,
            log_path=logs / f"worker-{index}.log",
            startup_timeout=config.worker_startup_timeout,
        )

    return factory
