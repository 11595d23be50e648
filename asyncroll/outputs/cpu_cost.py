"""The run's CPU cost: client and worker core-seconds during the measured window, and per completion."""

from __future__ import annotations

import time
from typing import Any


def client_cpu() -> float:
    """This process's CPU seconds (user + system, every thread) so far, to the nanosecond
    (``CLOCK_PROCESS_CPUTIME_ID``; the kernel's tick counts behind ``psutil`` move in 10 ms steps)."""
    return time.process_time()


def cpu_cost(
    start: tuple[float, float | None] | None,
    end: tuple[float, float | None] | None,
    replaced: bool,
    completed: int,
    simulated: bool = False,
) -> dict[str, Any]:
    """Client + worker CPU core-seconds during measurement; unknown if a worker was replaced, and not a
    property of a simulated run (the simulator's own CPU would make its summary differ run to run).
    Worker CPU comes from the kernel's per-process tick counts: 10 ms steps per worker."""
    if simulated:
        return {
            "client_cpu_s": None,
            "workers_cpu_s": None,
            "total_cpu_s": None,
            "per_completion_s": None,
            "reason": "a simulated run spends no real CPU (see bench.simspeed for the simulator's own)",
        }
    if start is None or end is None:
        return {
            "client_cpu_s": None,
            "workers_cpu_s": None,
            "total_cpu_s": None,
            "per_completion_s": None,
            "reason": "the measured window never started or never ended",
        }
    client = round(end[0] - start[0], 6)
    reason = None
    workers: float | None
    if replaced:
        workers, reason = None, "a worker was replaced during the run; its CPU time before death is unknown"
    elif start[1] is None or end[1] is None:
        workers = None
        reason = (
            "worker CPU time unavailable: a worker could not be read at the start or the end of the "
            "window (virtual workers, a worker killed as the run stopped, or psutil could not read it)"
        )
    else:
        workers = round(end[1] - start[1], 6)
    total = None if workers is None else round(client + workers, 6)
    per = None if total is None or completed == 0 else round(total / completed, 6)
    if total is not None and completed == 0:
        reason = "no trajectory completed"
    return {
        "client_cpu_s": client,
        "workers_cpu_s": workers,
        "total_cpu_s": total,
        "per_completion_s": per,
        "reason": reason,
    }
