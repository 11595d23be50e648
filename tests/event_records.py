"""Typed event records for tests that feed the summary's meters by hand: stamped at a time as
:class:`~asyncroll.event_log.EventLog` stamps them, and the CPU job records with the fields a test
rarely varies filled in (worker 0, tool ``t``, no CPU reading)."""

from __future__ import annotations

from typing import Any, TypeVar

from asyncroll.events import CpuEnqueued, CpuFailed, CpuFinished, CpuSelected, Event

E = TypeVar("E", bound=Event)


def at(t: float, event: E) -> E:
    """``event`` stamped at ``t`` (seconds since measurement start), as EventLog stamps it."""
    event.__dict__["t"] = t
    return event


def cpu_enqueued(tid: str = "a", job: int = 1, **fields: Any) -> CpuEnqueued:
    values: dict[str, Any] = {"kind": "tool", "tool": "t", "turn": 0, "arg_bytes": 1, "queue_depth": 1}
    return CpuEnqueued(id=tid, job_id=job, **{**values, **fields})


def cpu_selected(tid: str = "a", job: int = 1, **fields: Any) -> CpuSelected:
    """A FIFO pick of the only queued job (the oldest), handed to worker 0 at once."""
    values: dict[str, Any] = {"worker": 0, "policy": "fifo", "reason": "fifo", "queue_depth": 1}
    values.update(model_outstanding=0, waited_s=0.0, oldest_job_id=job, reordered=False)
    return CpuSelected(id=tid, job_id=job, **{**values, **fields})


def cpu_finished(tid: str = "a", job: int = 1, **fields: Any) -> CpuFinished:
    values: dict[str, Any] = {"worker": 0, "kind": "tool", "tool": "t", "ok": True, "execute_s": 0.0}
    values.update(cpu_s=None, roundtrip_s=0.0)
    return CpuFinished(id=tid, job_id=job, **{**values, **fields})


def cpu_failed(tid: str = "a", job: int = 1, **fields: Any) -> CpuFailed:
    values: dict[str, Any] = {"worker": 0, "kind": "tool", "tool": "t", "reason": "timeout"}
    values.update(roundtrip_s=0.0, error="x")
    return CpuFailed(id=tid, job_id=job, **{**values, **fields})
