"""The continuous-batching server model, on a virtual clock: exact step arithmetic."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from asyncroll.backends.server_model import (
    MAX_COST_MS,
    BatchingServer,
    Generation,
    ServerModelConfig,
    ServerSnapshot,
)
from asyncroll.clock import VirtualClock

CFG = ServerModelConfig(max_num_seqs=2, step_base_ms=10.0, step_per_seq_ms=1.0, prefill_ms_per_token=0.1)


def _serve(requests: list[tuple[float, int, int]], cfg: ServerModelConfig = CFG) -> list[Generation]:
    """Submit (arrival s, prompt tokens, output tokens) requests; return their generations in order."""
    return _serve_on(BatchingServer(cfg, VirtualClock()), requests)


def _serve_on(server: BatchingServer, requests: list[tuple[float, int, int]]) -> list[Generation]:
    """:func:`_serve` on this server (of a fresh virtual clock), whose counters the caller reads after."""
    clock = server.clock
    assert isinstance(clock, VirtualClock)

    async def main() -> list[Generation]:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(server.serve())

            async def one(at: float, prompt: int, out: int) -> Generation:
                await asyncio.sleep(at)
                return await server.generate(prompt, out)

            tasks = [tg.create_task(one(*r)) for r in requests]
            results = [await t for t in tasks]
            server.close()
        return results

    return clock.run(main())


def test_single_request_prefill_then_decode() -> None:
    (g,) = _serve([(0.0, 100, 3)])
    # step 1: 10 + 1×1 + 0.1×100 = 21 ms (first token); steps 2, 3: 11 ms each
    assert g.ttft_s == pytest.approx(0.021)
    assert g.latency_s == pytest.approx(0.043)
    assert g.queued_s == 0 and g.output_tokens == 3


def test_batching_slows_each_step_but_raises_throughput() -> None:
    alone = _serve([(0.0, 0, 10)])[0].latency_s
    pair = _serve([(0.0, 0, 10), (0.0, 0, 10)])
    assert alone == pytest.approx(10 * 0.011)
    assert [g.latency_s for g in pair] == pytest.approx([10 * 0.012] * 2)  # both finish together


def test_max_num_seqs_queues_the_rest_fcfs() -> None:
    gens = _serve([(0.0, 0, 2), (0.0, 0, 2), (0.0, 0, 1)])
    # two run (12 ms steps), the third waits for both to finish at 24 ms, then one 11 ms step
    assert gens[2].queued_s == pytest.approx(0.024)
    assert gens[2].latency_s == pytest.approx(0.035)


def test_arrival_mid_step_waits_for_the_next_step() -> None:
    gens = _serve([(0.0, 0, 3), (0.005, 0, 1)])
    assert gens[1].queued_s == pytest.approx(0.006)  # admitted when the first 11 ms step ends


def test_the_counters_and_batch_seconds_follow_the_steps() -> None:
    """What serve-sim's /sim/stats and the lower bound's server term read: all zero before any request,
    then the steps of a hand-computed timeline (a request admitted beside another, a prefill each)."""
    server = BatchingServer(CFG, VirtualClock())
    assert server.snapshot() == ServerSnapshot(0, 0, 0, 0, 0.0, 0, 0) and server.batch_seconds == 0
    a, b = _serve_on(server, [(0.0, 100, 3), (0.005, 50, 1)])
    # step 1 (0–21 ms): a alone, 10 + 1 + 0.1×100; step 2 (21–38 ms): b joins, 10 + 2 + 0.1×50, b's only
    # token; step 3 (38–49 ms): a alone again, 10 + 1
    assert (b.queued_s, b.ttft_s, b.latency_s) == pytest.approx((0.016, 0.033, 0.033))
    assert (a.queued_s, a.ttft_s, a.latency_s) == pytest.approx((0.0, 0.021, 0.049))
    snap = server.snapshot()
    assert snap == ServerSnapshot(0, 0, 2, 3, pytest.approx(0.049), 4, 150)  # type: ignore[arg-type]
    assert server.batch_seconds == pytest.approx(0.049 + 0.017)


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        ServerModelConfig(max_num_seqs=0)
    with pytest.raises(ValueError):
        ServerModelConfig(step_base_ms=0, step_per_seq_ms=0)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_num_seqs": 0}, "--max-num-seqs must be >= 1, got 0"),
        ({"max_num_seqs": 2.5}, "--max-num-seqs must be an integer, got 2.5"),
        ({"max_num_seqs": True}, "--max-num-seqs must be an integer, got True"),
        ({"step_base_ms": -1.0}, "--step-base-ms must be from 0 to 86400000 ms (one day), got -1"),
        ({"step_per_seq_ms": -0.5}, "--step-per-seq-ms must be from 0 to 86400000 ms (one day), got -0.5"),
        ({"prefill_ms_per_token": 1e300}, "--prefill-ms-per-token must be from 0 to 86400000 ms"),
        ({"step_base_ms": 1e300}, "--step-base-ms must be from 0 to 86400000 ms (one day), got 1e+300"),
        # just past the bound: the value in full, never a rounding of it that reads as the bound
        (
            {"step_base_ms": 86_400_001.0},
            "--step-base-ms must be from 0 to 86400000 ms (one day), got 86400001.0",
        ),
        ({"step_base_ms": -math.inf}, "--step-base-ms must be a finite number, got -inf"),
        ({"step_per_seq_ms": math.inf}, "--step-per-seq-ms must be a finite number, got inf"),
        (
            {"step_base_ms": 0.0, "step_per_seq_ms": 0.0},
            "--step-base-ms and --step-per-seq-ms are both 0: a step must take some time",
        ),
    ],
)
def test_config_refusals_name_the_flag(settings: dict[str, Any], message: str) -> None:
    """Both front ends (simulate --server batching, serve-sim) refuse with this config's message. A cost
    above one day was accepted (serve-sim --step-base-ms 1e300 then answered no request, ever), and a
    negative or zero-step setting was refused without naming the flag."""
    with pytest.raises(ValueError) as refused:
        ServerModelConfig(**settings)
    assert str(refused.value).startswith(message)


def test_the_cost_limit_is_a_workloads_duration_limit() -> None:
    from asyncroll.workload import MAX_DURATION_MS

    assert MAX_COST_MS == MAX_DURATION_MS
    ServerModelConfig(step_base_ms=MAX_COST_MS, step_per_seq_ms=MAX_COST_MS, prefill_ms_per_token=MAX_COST_MS)
    ServerModelConfig(step_base_ms=0.0, step_per_seq_ms=1e-9, prefill_ms_per_token=0.0)


@pytest.mark.parametrize("name", ["step_base_ms", "step_per_seq_ms", "prefill_ms_per_token"])
def test_config_refuses_nan_costs(name: str) -> None:
    # NaN passed the `< 0` check and made every step time NaN (serve-sim's /sim/stats then failed);
    # infinity is refused by each front end (serve-sim's SimConfig, the simulator's settings)
    flag = "--" + name.replace("_", "-")
    with pytest.raises(ValueError, match=f"{flag} must be a finite number, got nan"):
        ServerModelConfig(**{name: math.nan})  # type: ignore[arg-type]


def test_cancelling_a_request_withdraws_its_sequence() -> None:
    """A cancelled request (its client went away) leaves the running batch or the waiting queue at once:
    the engine stops decoding it and admits the next one."""
    cfg = ServerModelConfig(max_num_seqs=1, step_base_ms=10.0, step_per_seq_ms=0.0, prefill_ms_per_token=0.0)
    clock = VirtualClock()

    async def main() -> tuple[Generation, int, int]:
        server = BatchingServer(cfg, clock)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(server.serve())
            long = tg.create_task(server.generate(0, 1_000))  # would take 10 s
            await asyncio.sleep(0)
            queued = tg.create_task(server.generate(0, 1_000))  # waits behind it
            short = tg.create_task(server.generate(0, 2))
            await asyncio.sleep(0.055)
            long.cancel()
            queued.cancel()
            result = await short
            server.close()
        snap = server.snapshot()
        return result, snap.generated_tokens, snap.running + snap.waiting

    short, generated, left = clock.run(main())
    # the long one decodes 5 tokens; the step it leaves during (50–60 ms) is wasted, as on a GPU; then the
    # short one runs alone: 2 steps, done at 80 ms
    assert short.queued_s == pytest.approx(0.06) and short.latency_s == pytest.approx(0.08)
    assert generated == 5 + 2 and left == 0


class _LateTimers(VirtualClock):
    """A clock whose every sleep ends 0.4 ms late, as a real event loop's timers do."""

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds + 0.0004)


def test_back_to_back_steps_keep_to_schedule_when_timers_fire_late() -> None:
    """serve-sim runs this model on a real clock: each step's timer firing a little late used to add up
    over a request's steps (+0.4 ms × 100 steps here, 8% of the request); now at most one is made up
    per step, so only the first step's lateness remains."""
    cfg = ServerModelConfig(max_num_seqs=4, step_base_ms=5.0, step_per_seq_ms=0.0, prefill_ms_per_token=0.0)
    clock = _LateTimers()

    async def main() -> Generation:
        server = BatchingServer(cfg, clock)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(server.serve())
            generation = await server.generate(10, 100)
            server.close()
        return generation

    g = clock.run(main())
    assert g.latency_s == pytest.approx(0.5004, abs=1e-6)


class _MillisecondTimers(VirtualClock):
    """A clock whose timers fire on whole milliseconds, 50 µs late, as asyncio's on Linux (epoll waits
    whole milliseconds, rounded up); a sleep of 0 or less is a yield, no timer."""

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0 if seconds <= 0 else math.ceil(seconds * 1000) / 1000 + 0.00005)


def test_steps_shorter_than_a_timer_keep_to_schedule() -> None:
    """serve-sim at 0.2 ms steps took 2.9 times the model's time (1,000 tokens: 0.58 s, where
    simulate --server batching says 0.2 s): each timer ended ~0.85 ms late, of which a step made up at
    most its own 0.2 ms. Now the lateness of a timer is made up however many steps it takes."""
    cfg = ServerModelConfig(max_num_seqs=4, step_base_ms=0.2, step_per_seq_ms=0.0, prefill_ms_per_token=0.0)
    clock = _MillisecondTimers()

    async def main() -> Generation:
        server = BatchingServer(cfg, clock)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(server.serve())
            generation = await server.generate(10, 1000)
            server.close()
        return generation

    g = clock.run(main())
    assert 0.2 <= g.latency_s <= 0.2 + 0.002  # a timer's lateness at most remains


@pytest.mark.parametrize("command", ["simulate", "serve-sim"])
def test_help_calls_the_step_base_the_fixed_part_of_every_step(command: str) -> None:
    """It said "decode step time at batch 1", but one sequence's step is base + per-seq (12.08 ms by
    default): a batch-1 step time measured on a GPU and given as --step-base-ms came out one per-seq
    cost too slow."""
    from tests.conftest import invoke

    shown = invoke(command, "--help").stdout
    words = " ".join(shown.replace("│", " ").split())
    assert "at batch 1" not in words
    assert "fixed step time, any batch" in words.lower()


def test_the_defaults_are_the_ones_both_front_ends_state() -> None:
    """simulate takes its server model's defaults from ServerModelConfig and states them in its help;
    serve-sim declares its own: a default changed in one place would make the two front ends (and the
    help) describe different servers."""
    import inspect

    from asyncroll.commands.serve import serve_sim
    from asyncroll.simulation.engine import SimulationSettings
    from tests.conftest import invoke

    defaults = asdict(ServerModelConfig())
    stated = {
        "max_num_seqs": 256,
        "step_base_ms": 12.0,
        "step_per_seq_ms": 0.08,
        "prefill_ms_per_token": 0.03,
    }
    assert defaults == stated
    parameters = inspect.signature(serve_sim).parameters
    assert {name: parameters[name].default for name in defaults} == stated
    # no overheads unless asked for (bench's "pure model" simulations rely on it)
    assert (SimulationSettings().turn_overhead_ms, SimulationSettings().job_overhead_ms) == (0, 0)
    # both size prompts and replies at the same characters per token
    assert SimulationSettings.chars_per_token == parameters["chars_per_token"].default == 4.0
    words = " ".join(invoke("simulate", "--help").stdout.replace("│", " ").split())
    for shown in (
        "running-batch limit (256)",
        "any batch (12 ms)",
        "(0.08 ms)",
        "(0.03 ms)",
        "(4; at least 0.01)",
    ):
        assert shown in words


def _model_latencies(out: Path) -> list[float]:
    """Every model request's latency in a run's events.jsonl, sorted."""
    lines = (out / "events.jsonl").read_text().splitlines()
    return sorted(json.loads(line)["latency_s"] for line in lines if '"model_finished"' in line)


@pytest.mark.parametrize(
    ("trajectories", "latencies"),
    [
        (1, [0.033]),  # alone: 3 steps of 10 + 1 ms
        (2, [0.036, 0.036]),  # together: 3 steps of 10 + 2 ms
        (3, [0.036, 0.036, 0.069]),  # the third waits for the batch of two, then runs alone
        (5, [0.036, 0.036, 0.072, 0.072, 0.105]),
    ],
)
def test_simulate_times_concurrent_turns_as_the_model_does(
    tmp_path: Path, trajectories: int, latencies: list[float]
) -> None:
    """The whole simulator (runtime, gate, simulated backend) on a batch limit of two: every turn's
    latency is the hand-computed timeline (no prefill cost, so prompt sizes do not matter)."""
    from asyncroll.config import build_config
    from asyncroll.simulation.engine import SimulationSettings, simulate
    from tests.conftest import write_workload

    problems = [
        {"id": f"p{i}", "prompt": "x", "script": [{"type": "final", "answer": 1, "output_tokens": 3}]}
        for i in range(trajectories)
    ]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    config = build_config(
        {
            "workload": workload,
            "output": tmp_path / "out",
            "max_active_trajectories": 8,
            "max_inflight_model_requests": 8,
        }
    )
    model = ServerModelConfig(max_num_seqs=2, step_base_ms=10.0, step_per_seq_ms=1.0, prefill_ms_per_token=0)
    outcome = simulate(config, SimulationSettings("batching", model), ["test"])
    assert outcome.summary is not None
    assert _model_latencies(tmp_path / "out") == pytest.approx(latencies)
    assert outcome.summary["makespan_s"] == pytest.approx(max(latencies))
    bounds = outcome.summary["bounds"]
    # the batch's time over its two slots is the whole makespan whenever the batch is never short
    if trajectories % 2 == 0:
        assert bounds["efficiency"] == pytest.approx(1.0)
    assert bounds["lower_bound_s"] <= outcome.summary["makespan_s"]


@pytest.mark.parametrize(
    ("trajectories", "latencies", "batch_s"),
    [
        (1, [0.038], 0.033),  # 3 steps of 10 + 1 ms, then 5 ms of the client's
        # the third is admitted when the pair's last step ends (36 ms), not when their overheads do
        (3, [0.041, 0.041, 0.074], 0.036 + 0.036 + 0.033),
    ],
)
def test_a_batching_simulation_adds_the_turn_overhead_after_the_server_s_time(
    tmp_path: Path, trajectories: int, latencies: list[float], batch_s: float
) -> None:
    """--turn-overhead-ms under --server batching: each turn pays it once its generation is done, outside
    the running batch (its slot is free meanwhile), as a client's own cost would be."""
    from asyncroll.config import build_config
    from asyncroll.simulation.engine import SimulationSettings, simulate
    from tests.conftest import write_workload

    problems = [
        {"id": f"p{i}", "prompt": "x", "script": [{"type": "final", "answer": 1, "output_tokens": 3}]}
        for i in range(trajectories)
    ]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    config = build_config({"workload": workload, "output": tmp_path / "out", "max_active_trajectories": 8})
    model = ServerModelConfig(max_num_seqs=2, step_base_ms=10.0, step_per_seq_ms=1.0, prefill_ms_per_token=0)
    outcome = simulate(config, SimulationSettings("batching", model, turn_overhead_ms=5.0), ["test"])
    assert outcome.summary is not None
    assert _model_latencies(tmp_path / "out") == pytest.approx(latencies)
    assert outcome.summary["makespan_s"] == pytest.approx(max(latencies))
    # the requests' time in the batch leaves the overheads (and the third's wait) out
    assert outcome.summary["bounds"]["totals"]["server_batch_s"] == pytest.approx(batch_s)
    # a simulated server is never warmed up: none of the requested warm-up requests was sent
    receipt = json.loads((tmp_path / "out" / "run.json").read_text())
    assert receipt["warmup"] == {"requested": 2, "sent": 0}
