"""A CPU dispatcher on a virtual clock with virtual workers, for the ``test_dispatcher_*`` files: a
scenario gets the dispatcher, its pool, gate and clock inside a task group; the events are captured and
every snapshot the policy saw is kept."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from asyncroll.clock import VirtualClock
from asyncroll.event_log import EventCapture, EventLog
from asyncroll.policies import QueueSnapshot
from asyncroll.policies.base import Decision
from asyncroll.runtime.dispatcher import CpuDispatcher
from asyncroll.runtime.jobs import JobOutcome, JobSpec
from asyncroll.runtime.model_gate import ModelGate
from asyncroll.runtime.pool import WorkerPool
from asyncroll.runtime.virtual_worker import VirtualWorker


class Scripted:
    """A policy that picks by ``pick`` (the oldest job by default) and keeps every snapshot it saw."""

    name = "scripted"

    def __init__(self, pick: Callable[[QueueSnapshot], Decision] | None = None) -> None:
        self.seen: list[QueueSnapshot] = []
        self._pick = pick or (lambda s: Decision(s.oldest.job_id, "oldest"))

    def choose(self, snapshot: QueueSnapshot) -> Decision:
        self.seen.append(snapshot)
        return self._pick(snapshot)


def sleep_job(ms: float, trajectory: str = "t", tool: str = "sleep_ms", **fields: Any) -> JobSpec:
    return JobSpec(trajectory, "tool", tool, {"milliseconds": ms}, 0, **fields)


@dataclass
class Rig:
    clock: VirtualClock
    events: EventLog
    pool: WorkerPool
    gate: ModelGate
    dispatcher: CpuDispatcher
    tg: asyncio.TaskGroup
    capture: EventCapture = field(default_factory=EventCapture)

    def submit(self, spec: JobSpec) -> asyncio.Task[JobOutcome]:
        return self.tg.create_task(self.dispatcher.run(spec))


def run_rig(
    scenario: Callable[[Rig], Awaitable[None]],
    policy: Any,
    *,
    workers: int = 1,
    model_limit: int = 2,
    tool_timeout: float = 30.0,
    worker: type[VirtualWorker] = VirtualWorker,
    **options: Any,
) -> EventCapture:
    """Runs ``scenario`` against a fresh dispatcher (``options``: its keyword arguments) with ``workers``
    workers of the class ``worker`` and returns the captured events; the pool is closed at the end."""
    clock = VirtualClock()
    capture = EventCapture()

    async def main() -> None:
        events = EventLog(clock)
        events.subscribe(capture)
        pool = WorkerPool(workers, lambda i, g: worker(i, g, clock), clock, events)
        gate = ModelGate(model_limit, clock, events)
        dispatcher = CpuDispatcher(pool, policy, gate, clock, events, tool_timeout, **options)
        events.start_measurement()
        async with asyncio.TaskGroup() as tg:
            await pool.start(tg)
            await scenario(Rig(clock, events, pool, gate, dispatcher, tg, capture))
            await pool.aclose()

    clock.run(main())
    return capture
