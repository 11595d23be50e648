"""The run's CPU cost: client and worker core-seconds during the measured window, and per completion."""

from __future__ import annotations

from typing import Any

import psutil


def client_cpu() -> float:
    """This process's CPU seconds (user + system) so far."""
    times = psutil.Process().cpu_times()
    return times.user + times.system


def cpu_cost(
    start: tuple[float, float | None] | None,
    end: tuple[float, float | None] | None,
    replaced: bool,
    completed: int,
) -> dict[str, Any]:
    """Client + worker CPU core-seconds during measurement; unknown if a worker was replaced."""
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
        workers, reason = None, "worker CPU time unavailable (virtual workers, or psutil could not read it)"
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
