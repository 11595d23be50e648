"""Runtime overhead: the runtime's own cost per model turn and per tool job, event logging included.

Components, each driven in a tight loop on the system clock with events written to a real file:

* **model turn**: one call through the model gate to the scripted backend with zero latency — the
  limiter, the backend call, and three events (enqueued, started, finished) written to events.jsonl.
* **trajectory (1 turn)**: a whole one-turn trajectory through ``TrajectoryRunner``: the above plus the
  trajectory's own start/finish events.
* **tool job, runtime only**: one job through the dispatcher (queue, policy decision, four events) on a
  worker that does nothing (zero-duration virtual worker) — the runtime's own share of a tool job.
* **tool job, real worker**: the same through a real worker process running ``add``: the trajectory's
  view of the round trip (``dispatcher.run`` called → result back), and the pipe round trip alone.

Each figure is the median of per-call timings in one repeat; the table shows min/median/max over repeats.
Run: ``python -m bench.overhead [--repeats 5] [--calls 5000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

from asyncroll.backends.base import ModelRequest
from asyncroll.backends.scripted import ScriptedBackend
from asyncroll.clock import SystemClock
from asyncroll.event_log import EventLog
from asyncroll.policies import get_policy
from asyncroll.runtime.dispatcher import CpuDispatcher
from asyncroll.runtime.jobs import JobSpec
from asyncroll.runtime.model_gate import ModelGate
from asyncroll.runtime.pool import WorkerFactory, WorkerPool
from asyncroll.runtime.trajectory import TrajectoryRunner
from asyncroll.runtime.virtual_worker import virtual_factory
from asyncroll.workers.builtin import BUILTIN_TOOLS
from asyncroll.workers.process import ProcessWorker
from asyncroll.workers.protocol import ToolSpec
from asyncroll.workload import Problem
from bench.common import machine, number_arg, quantiles, run_main, scratch

PROBLEM = Problem.model_validate({"id": "p", "prompt": "answer", "script": [{"type": "final", "answer": 1}]})


def _log(clock: SystemClock) -> EventLog:
    log = EventLog(clock, scratch("overhead-") / "events.jsonl")
    log.start_measurement()
    return log


async def _per_call(calls: int, step: Callable[[int], Awaitable[object]]) -> list[float]:
    for i in range(min(200, calls)):  # warm up
        await step(i)
    out = []
    for i in range(calls):
        began = time.perf_counter()
        await step(i)
        out.append((time.perf_counter() - began) * 1e6)
    return out


async def model_turn(calls: int) -> float:
    clock = SystemClock()
    log = _log(clock)
    gate = ModelGate(4, clock, log)
    backend = ScriptedBackend(clock)
    request = ModelRequest("p", PROBLEM, 0, [])
    samples = await _per_call(calls, lambda _: gate.call("p", 0, lambda: backend.complete(request)))
    log.close()
    return statistics.median(samples)


def _dispatch_parts(
    clock: SystemClock, log: EventLog, factory: WorkerFactory
) -> tuple[WorkerPool, ModelGate, CpuDispatcher]:
    pool = WorkerPool(1, factory, clock, log)
    gate = ModelGate(4, clock, log)
    return pool, gate, CpuDispatcher(pool, get_policy("fifo"), gate, clock, log, tool_timeout=30)


async def trajectory(calls: int) -> float:
    clock = SystemClock()
    log = _log(clock)
    _, gate, dispatcher = _dispatch_parts(clock, log, virtual_factory(clock))
    runner = TrajectoryRunner(
        ScriptedBackend(clock), gate, dispatcher, clock, log, max_turns=8, tool_errors="fail"
    )
    samples = await _per_call(calls, lambda i: runner.run(i, str(i), PROBLEM, 1))
    log.close()
    return statistics.median(samples)


async def tool_job(calls: int, real: bool) -> tuple[float, float | None]:
    clock = SystemClock()
    log = _log(clock)
    specs = [ToolSpec(name) for name in BUILTIN_TOOLS]
    factory: WorkerFactory = (
        (lambda i, g: ProcessWorker(i, specs, generation=g, startup_timeout=60))
        if real
        else virtual_factory(clock)
    )
    pool, _, dispatcher = _dispatch_parts(clock, log, factory)
    roundtrips: list[float] = []
    async with asyncio.TaskGroup() as tg:
        await pool.start(tg)
        spec = JobSpec("p", "tool", "add", {"a": 1, "b": 2}, 0)

        async def step(_: int) -> None:
            outcome = await dispatcher.run(spec)
            assert outcome.ok

        samples = await _per_call(calls, step)
        if real:
            worker = pool.worker(0)
            from asyncroll.workers.protocol import JobRequest

            for i in range(min(calls, 2000)):
                result = await worker.call(JobRequest(i, "add", {"a": 1, "b": 2}), 30)
                roundtrips.append(result.round_trip_s * 1e6)
        await pool.aclose()
    log.close()
    return statistics.median(samples), (statistics.median(roundtrips) if roundtrips else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=number_arg(int, 1, 1_000_000), default=5)
    parser.add_argument("--calls", type=number_arg(int, 1, 1_000_000), default=5000)
    args = parser.parse_args()
    print(f"machine: {machine()}")
    rows: dict[str, list[float]] = {
        k: []
        for k in (
            "model turn (gate + scripted backend + 3 events)",
            "trajectory, 1 turn (+2 events)",
            "tool job, runtime only (virtual worker, 4 events)",
            "tool job dispatch → result, real worker",
            "worker pipe round trip alone (add)",
        )
    }
    names = list(rows)
    for _ in range(args.repeats):
        rows[names[0]].append(asyncio.run(model_turn(args.calls)))
        rows[names[1]].append(asyncio.run(trajectory(args.calls)))
        rows[names[2]].append(asyncio.run(tool_job(args.calls, real=False))[0])
        real, pipe = asyncio.run(tool_job(args.calls, real=True))
        rows[names[3]].append(real)
        if pipe is not None:
            rows[names[4]].append(pipe)
    print(f"repeats: {args.repeats}; {args.calls} sequential calls each; per-call median in µs")
    print(f"| {'measure (µs per call, median of calls)':<50} | {'min':>7} | {'median':>7} | {'max':>7} |")
    print(f"|{'-' * 52}|{'-' * 9}|{'-' * 9}|{'-' * 9}|")
    for name, values in rows.items():
        lo, mid, hi = quantiles(values)
        print(f"| {name:<50} | {lo:7.1f} | {mid:7.1f} | {hi:7.1f} |")


if __name__ == "__main__":
    run_main("bench.overhead", main)
