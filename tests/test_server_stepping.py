"""The batching server model stepped in place by the virtual loop (``VirtualClock.sleep_stepping``):
exactly what one round of the loop per decode step gives, at every instant any other task can see.

Each scenario runs twice on a virtual clock, stepped in place (the default) and with ``stepping=False``
(the engine's task wakes at every step), and everything observable is compared exactly: the floats of
every wake-up of other tasks (arrivals, cancellations, equal-time timers whose order is the heap's),
the generations, the server's counters. Each also checks that the steps were taken in place (the
engine's task woke for only a few of them), so the comparison is of the two paths."""

from __future__ import annotations

import asyncio
import json
import random
import re
from functools import partialmethod
from pathlib import Path
from typing import Any

import pytest

from asyncroll.backends import server_model
from asyncroll.backends.server_model import MAX_COST_MS, BatchingServer, ServerModelConfig
from asyncroll.clock import VirtualClock

#: (what happened, clock.now() at that moment, exactly)
Log = list[tuple[str, float]]


def _run(cfg: ServerModelConfig, stepping: bool, script: Any) -> tuple[Log, Any, int]:
    """Run ``script(server, log, tg)`` beside the engine; return the log, the server's snapshot and
    its batch seconds, and how many steps the engine's task ended itself (not in place)."""
    clock = VirtualClock(wall=lambda: 0.0)
    log: Log = []
    woke = 0

    async def main() -> tuple[Any, float]:
        nonlocal woke
        server = BatchingServer(cfg, clock, stepping=stepping)
        end_step = server._end_step

        def counted() -> None:
            nonlocal woke
            woke += 1
            end_step()

        server._end_step = counted  # type: ignore[method-assign]
        async with asyncio.TaskGroup() as tg:
            tg.create_task(server.serve())
            await script(server, log, tg, clock)
            server.close()
        return server.snapshot(), server.batch_seconds

    snapshot, batch_seconds = clock.run(main())
    log.append(("end", clock.now()))
    return log, (snapshot, batch_seconds), woke


def _both(cfg: ServerModelConfig, script: Any) -> tuple[Log, int, int]:
    fast_log, fast_state, fast_woke = _run(cfg, True, script)
    slow_log, slow_state, slow_woke = _run(cfg, False, script)
    assert fast_log == slow_log
    assert fast_state == slow_state
    assert slow_woke == fast_state[0].steps  # one wake-up per step without stepping
    return fast_log, fast_woke, slow_woke


async def _request(
    server: BatchingServer, log: Log, clock: VirtualClock, name: str, at: float, prompt: int, out: int
) -> None:
    await asyncio.sleep(at)
    log.append((f"{name} arrives", clock.now()))
    try:
        g = await server.generate(prompt, out)
    except asyncio.CancelledError:
        log.append((f"{name} cancelled", clock.now()))
        return
    log.append((f"{name} {g.queued_s!r} {g.ttft_s!r} {g.latency_s!r} {g.output_tokens}", clock.now()))


async def _ticker(log: Log, clock: VirtualClock, name: str, every: float, times: int) -> None:
    for _ in range(times):
        await asyncio.sleep(every)
        log.append((name, clock.now()))


def test_arrivals_and_a_cancellation_in_the_middle_of_stepping() -> None:
    """Arrivals land between step boundaries while one long sequence decodes alone (each joins at the
    next boundary), a sequence is withdrawn mid-stretch (the step it leaves during is wasted), and
    tickers wake on equal-time timers throughout (their order is the heap's, which must not change)."""
    cfg = ServerModelConfig(
        max_num_seqs=3, step_base_ms=11.3, step_per_seq_ms=0.7, prefill_ms_per_token=0.013
    )

    async def script(server: BatchingServer, log: Log, tg: asyncio.TaskGroup, clock: VirtualClock) -> None:
        tasks = [
            tg.create_task(_request(server, log, clock, "a", 0.0, 300, 2_000)),
            tg.create_task(_request(server, log, clock, "b", 0.5004, 40, 300)),
            tg.create_task(_request(server, log, clock, "c", 3.25, 0, 1_500)),
            tg.create_task(_request(server, log, clock, "d", 3.2500001, 7, 5)),
            tg.create_task(_request(server, log, clock, "e", 3.3, 9, 1)),
            tg.create_task(_request(server, log, clock, "f", 4.0, 9, 2)),
        ]
        for name in ("t1", "t2", "t3"):  # three timers due at the same instants
            tasks.append(tg.create_task(_ticker(log, clock, name, 0.75, 20)))

        async def cancel_a() -> None:
            await asyncio.sleep(9.87)
            tasks[0].cancel()

        tasks.append(tg.create_task(cancel_a()))
        await asyncio.gather(*tasks)

    log, fast_woke, slow_woke = _both(cfg, script)
    assert ("a cancelled", 9.87) in log
    assert any(what.startswith("b ") for what, _ in log) and any(what.startswith("f ") for what, _ in log)
    assert fast_woke * 10 < slow_woke  # most steps were taken in place


def test_a_full_batch_with_sequences_waiting() -> None:
    """A full batch steps in place while others wait (none can be admitted until one finishes); a
    waiting one is withdrawn mid-stretch, and the next is admitted when a running one finishes."""
    cfg = ServerModelConfig(max_num_seqs=2, step_base_ms=9.7, step_per_seq_ms=0.4, prefill_ms_per_token=0.02)

    async def script(server: BatchingServer, log: Log, tg: asyncio.TaskGroup, clock: VirtualClock) -> None:
        tasks = [
            tg.create_task(_request(server, log, clock, "a", 0.0, 50, 400)),
            tg.create_task(_request(server, log, clock, "b", 0.0, 10, 250)),
            tg.create_task(_request(server, log, clock, "c", 0.1, 30, 100)),
            tg.create_task(_request(server, log, clock, "d", 0.35, 5, 3)),
            tg.create_task(_request(server, log, clock, "e", 0.36, 0, 120)),
            tg.create_task(_ticker(log, clock, "t", 0.5, 8)),
        ]

        async def cancel_c() -> None:
            await asyncio.sleep(1.5)
            assert server.snapshot().waiting == 3
            tasks[2].cancel()

        tasks.append(tg.create_task(cancel_c()))
        await asyncio.gather(*tasks)

    log, fast_woke, slow_woke = _both(cfg, script)
    assert ("c cancelled", 1.5) in log
    assert fast_woke * 5 < slow_woke


def test_arrivals_on_a_step_boundary_keep_their_order_with_the_step() -> None:
    """Round step times: arrivals, tickers and probes fall exactly on step boundaries (0.01 + 0.01 ==
    0.02), where the order of equal-time timers decides whether an arrival joins at this step or the
    next, and whether a probe sees the step ended."""
    cfg = ServerModelConfig(max_num_seqs=2, step_base_ms=10.0, step_per_seq_ms=0.0, prefill_ms_per_token=0.0)

    async def script(server: BatchingServer, log: Log, tg: asyncio.TaskGroup, clock: VirtualClock) -> None:
        tasks = [
            tg.create_task(_request(server, log, clock, "a", 0.0, 0, 500)),
            tg.create_task(_request(server, log, clock, "b", 0.02, 0, 3)),
            tg.create_task(_request(server, log, clock, "c", 0.64, 0, 100)),
            tg.create_task(_request(server, log, clock, "d", 1.28, 0, 2)),
        ]
        for name in ("t1", "t2"):
            tasks.append(tg.create_task(_ticker(log, clock, name, 0.32, 12)))

        def probe() -> None:  # a plain timer callback: runs before any task woken at the same time
            log.append((f"probe {server.snapshot()}", clock.now()))

        loop, boundary = asyncio.get_running_loop(), 0.0
        for k in range(1, 300):  # at some step boundaries: the server never idles, each step is 10 ms
            boundary += 0.01
            if k % 7 in (0, 1):
                loop.call_at(boundary, probe)
        await asyncio.gather(*tasks)

    log, fast_woke, slow_woke = _both(cfg, script)
    assert [what for what, _ in log if what.startswith(("b ", "d "))]  # both were served
    assert fast_woke * 3 < slow_woke


def test_steps_longer_than_the_longest_select() -> None:
    """A step longer than a day: asyncio waits for its timer in selects of a day at most, so time gets
    there in pieces (other floats than one jump). The loop's own selects take it there; only then,
    with the timer due, is the step done in place."""
    cfg = ServerModelConfig(max_num_seqs=2, step_base_ms=MAX_COST_MS, step_per_seq_ms=1234.5)

    async def script(server: BatchingServer, log: Log, tg: asyncio.TaskGroup, clock: VirtualClock) -> None:
        await asyncio.gather(
            _request(server, log, clock, "a", 0.0, 10, 6),
            _request(server, log, clock, "b", 200_000.0, 10, 3),
            _ticker(log, clock, "t", 100_000.0, 5),
        )

    _, fast_woke, slow_woke = _both(cfg, script)
    assert fast_woke < slow_woke


def _random_scenario(seed: int) -> tuple[ServerModelConfig, Any]:
    """Requests, withdrawals, tickers and plain-callback probes at random times, many of them round
    (0.01 s) so that they fall on step boundaries of round step times."""
    rng = random.Random(seed)
    cfg = ServerModelConfig(
        max_num_seqs=rng.choice([1, 1, 2, 3, 4, 8]),
        step_base_ms=rng.choice([10.0, 12.0, 7.3, 5.0, 0.001, 100.0]),
        step_per_seq_ms=rng.choice([0.0, 0.08, 1.0, 2.5]),
        prefill_ms_per_token=rng.choice([0.0, 0.03, 0.1]),
    )

    def at(scale: float) -> float:
        return round(rng.random() * scale, rng.choice([2, 2, 3, 9]))

    requests = [
        (f"r{i}", at(3.0), rng.randint(0, 500), rng.choice([1, 2, 3, rng.randint(1, 400)]))
        for i in range(rng.randint(1, 8))
    ]
    withdrawals = [(rng.randrange(len(requests)), at(4.0)) for _ in range(rng.randint(0, 3))]
    tickers = [
        (f"t{i}", rng.choice([0.01, 0.02, 0.05, 0.1, 0.37, 0.001]), rng.randint(1, 40))
        for i in range(rng.randint(0, 3))
    ]
    probes = [at(4.0) for _ in range(rng.randint(0, 30))]

    async def script(server: BatchingServer, log: Log, tg: asyncio.TaskGroup, clock: VirtualClock) -> None:
        async def request(name: str, arrival: float, prompt: int, out: int) -> None:
            try:  # withdrawn before or after it arrives
                await asyncio.sleep(arrival)
                log.append((f"{name} arrives", clock.now()))
                g = await server.generate(prompt, out)
            except asyncio.CancelledError:
                log.append((f"{name} cancelled", clock.now()))
                return
            log.append((f"{name} {g!r}", clock.now()))

        def probe() -> None:
            log.append((f"probe {server.snapshot()}", clock.now()))

        tasks = [tg.create_task(request(*r)) for r in requests]
        tasks += [tg.create_task(_ticker(log, clock, *t)) for t in tickers]
        loop = asyncio.get_running_loop()
        for when in probes:
            loop.call_at(when, probe)

        async def withdraw(i: int, when: float) -> None:
            await asyncio.sleep(when)
            tasks[i].cancel()
            log.append((f"withdraw r{i} {server.snapshot()}", clock.now()))

        tasks += [tg.create_task(withdraw(*w)) for w in withdrawals]
        await asyncio.gather(*tasks)

    return cfg, script


def test_random_scenarios() -> None:
    """Seeded random scenarios (a fuzz of 4,000 seeds found no difference; these caught a step taken in
    place while another timer was due at its end)."""
    steps = woke = 0
    for seed in range(130):
        cfg, script = _random_scenario(seed)
        _, fast_woke, slow_woke = _both(cfg, script)
        steps, woke = steps + slow_woke, woke + fast_woke
    assert woke * 5 < steps


def _events(out: Path) -> list[str]:
    return [
        re.sub(r'"wall_time":[0-9.e+-]+', "", line)
        for line in (out / "events.jsonl").read_text(encoding="utf-8").splitlines()
    ]


def test_a_simulation_is_the_same_stepped_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole simulator with --server batching: the same events and summary either way."""
    from asyncroll.config import build_config
    from asyncroll.simulation.engine import SimulationSettings, simulate
    from tests.conftest import write_workload

    problems = [
        {
            "id": f"p{i}",
            "prompt": "x",
            "tools": [{"name": "sleep_ms", "description": "Sleep.", "inputs": {"milliseconds": "number"}}],
            "script": [
                {
                    "type": "tool",
                    "name": "sleep_ms",
                    "arguments": {"milliseconds": 40 * (i % 3)},
                    "output_tokens": 90,
                },
                {"type": "final", "answer": 1, "output_tokens": 150 + 37 * (i % 4)},
            ],
        }
        for i in range(10)
    ]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    model = ServerModelConfig(
        max_num_seqs=3, step_base_ms=10.0, step_per_seq_ms=0.5, prefill_ms_per_token=0.01
    )

    def simulate_to(out: Path) -> dict[str, Any]:
        config = build_config(
            {
                "workload": workload,
                "output": out,
                "max_active_trajectories": 6,
                "max_inflight_model_requests": 3,
            }
        )
        outcome = simulate(config, SimulationSettings("batching", model), ["test"])
        assert outcome.summary is not None
        return json.loads((out / "summary.json").read_text(encoding="utf-8"))

    in_place = 0
    start_next_step = BatchingServer._start_next_step

    def counted(self: BatchingServer) -> None:
        nonlocal in_place
        in_place += 1
        start_next_step(self)

    monkeypatch.setattr(BatchingServer, "_start_next_step", counted)
    fast = simulate_to(tmp_path / "fast")
    assert in_place > 500  # most steps
    monkeypatch.setattr(
        server_model.BatchingServer,
        "__init__",
        partialmethod(server_model.BatchingServer.__init__, stepping=False),
    )
    slow = simulate_to(tmp_path / "slow")
    assert fast == slow
    assert _events(tmp_path / "fast") == _events(tmp_path / "slow")
    assert fast["counts"]["completed"] == 10


@pytest.mark.parametrize("raises_in", ["next_sleep", "step"])
def test_a_step_that_raises_in_place_fails_the_sleeper_not_the_loop(raises_in: str) -> None:
    """``next_sleep`` and ``step`` run in the sleeper's place: what they raise reaches the sleeper's
    ``await`` (its task fails as if its own code had raised it; a run's task group then fails the run
    and writes its outputs). It used to escape the event loop itself, past every task's clean-up."""
    clock = VirtualClock(wall=lambda: 0.0)
    calls = {"next_sleep": 0, "step": 0}

    def next_sleep() -> float:
        calls["next_sleep"] += 1
        if raises_in == "next_sleep" and calls["next_sleep"] == 5:
            raise ValueError("broken next_sleep")
        return 0.01

    def step() -> None:
        calls["step"] += 1
        if raises_in == "step" and calls["step"] == 5:
            raise ValueError("broken step")

    async def main() -> tuple[str, float, bool]:
        async def sleeper() -> str:
            try:
                await clock.sleep_stepping(0.01, next_sleep, step)
            except ValueError as exc:
                return f"caught: {exc}"
            return "woke"

        late = asyncio.create_task(asyncio.sleep(1.0))  # the loop goes on after the failure
        caught = await sleeper()
        await late
        return caught, clock.now(), bool(asyncio.get_running_loop().steppers)  # type: ignore[attr-defined]

    caught, now, left = clock.run(main())
    assert caught == f"caught: broken {raises_in}"
    assert calls["step"] == (4 if raises_in == "next_sleep" else 5)
    assert now == 1.0 and not left  # the sleeper's stepper was removed with its sleep
