"""Whole simulations with ``--server batching`` whose model requests are cut off in the middle of a
stretch of decode steps taken in place (``VirtualClock.sleep_stepping``): a stop at a virtual instant, a
policy that raises (the run fails and its task groups cancel every request in flight). Each runs stepped
in place (the default) and with ``stepping=False`` (the engine's task wakes at every step), and the run
directories must be the same byte for byte. Also: the asyncio debug mode (no step in place, the same
outputs), and a stop signal to the real command while one long request decodes alone."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from asyncroll.backends.server_model import BatchingServer, ServerModelConfig
from asyncroll.clock import VirtualClock
from asyncroll.config import build_config
from asyncroll.policies.base import Decision, Policy, QueueSnapshot
from asyncroll.runtime import assembly
from asyncroll.simulation.engine import SimulationSettings, simulate
from tests.children import end
from tests.cli_runs import load_run
from tests.conftest import REPO, write_workload
from tests.simulations import wait_until
from tests.test_server_stepping import _both, _request

#: the run directory's files a simulation writes the same each time (events.jsonl without its wall time)
_FILES = ("events.jsonl", "results.jsonl", "summary.json", "trace.json")


def _workload(path: Path, seed: int, problems: int, declared: bool) -> Path:
    """Problems of 0–3 ``sleep_ms`` tool turns (0 to 333 ms: their timers fall among the decode steps,
    some on step boundaries), then a final answer; ``declared``: each action's ``output_tokens`` (else
    its size decides)."""
    rng = random.Random(seed)
    items = []
    for i in range(problems):
        script: list[dict[str, Any]] = []
        for _ in range(rng.randint(0, 3)):
            ms = rng.choice([0, 1, 7.5, 40, 120, 333.3])
            script.append({"type": "tool", "name": "sleep_ms", "arguments": {"milliseconds": ms}})
        script.append({"type": "final", "answer": 1})
        if declared:
            for action in script:
                action["output_tokens"] = rng.randint(1, 600)
        prompt = "x" * rng.randint(1, 300)
        items.append({"id": f"p{i}", "prompt": prompt, "tools": [{"name": "sleep_ms"}], "script": script})
    return write_workload(path, items)


class _Raising:
    """A policy that raises at its ``at``-th decision (the trajectory that asked fails the run)."""

    def __init__(self, inner: Policy, at: int, when_raised: Callable[[], None]) -> None:
        self._inner, self._at, self._calls, self._when_raised = inner, at, 0, when_raised

    @property
    def name(self) -> str:
        return self._inner.name

    def choose(self, snapshot: QueueSnapshot) -> Decision:
        self._calls += 1
        if self._calls == self._at:
            self._when_raised()
            raise RuntimeError("the policy broke")
        return self._inner.choose(snapshot)


@dataclass
class _Simulated:
    files: list[str]  # _FILES' texts, then run.json's status and error
    in_place: int  # decode steps taken in place
    pending: int  # at the stop (or the policy's failure): steps taken in place not yet counted by the task


def _simulate(
    out: Path,
    workload: Path,
    model: ServerModelConfig,
    *,
    stepping: bool,
    policy: str,
    stop_at: float | None = None,
    raise_at: int | None = None,
    overhead_ms: float = 0.0,
) -> _Simulated:
    """``simulate --server batching`` in this process with stop signals handled as the command does
    (``signals=True``); ``stop_at``: the run's SIGTERM handler is called that long after the first model
    request (the measurement's start); ``raise_at``: the policy raises at that decision."""
    servers: list[BatchingServer] = []
    in_place = 0
    pending = -1

    def at_the_cut() -> None:
        nonlocal pending
        pending = servers[0]._decoded

    def stop() -> None:
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler)  # the run's own (the stop is before its end)
        at_the_cut()
        handler(signal.SIGTERM, None)

    init = BatchingServer.__init__
    start_next_step = BatchingServer._start_next_step
    generate = BatchingServer.generate
    get_policy = assembly.get_policy

    def made(self: BatchingServer, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **{**kwargs, "stepping": stepping})
        servers.append(self)

    def counted(self: BatchingServer) -> None:
        nonlocal in_place
        in_place += 1
        start_next_step(self)

    async def first_starts_the_stop(self: BatchingServer, prompt_tokens: int, output_tokens: int) -> Any:
        nonlocal stop_at
        if stop_at is not None:  # a timer of the loop, as a signal's callback would be
            asyncio.get_running_loop().call_later(stop_at, stop)
            stop_at = None
        return await generate(self, prompt_tokens, output_tokens)

    def raising(name: str, **kwargs: Any) -> Policy:
        inner = get_policy(name, **kwargs)
        return inner if raise_at is None else _Raising(inner, raise_at, at_the_cut)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(BatchingServer, "__init__", made)
        mp.setattr(BatchingServer, "_start_next_step", counted)
        mp.setattr(BatchingServer, "generate", first_starts_the_stop)
        mp.setattr(assembly, "get_policy", raising)
        config = build_config(
            {
                "workload": workload,
                "output": out,
                "policy": policy,
                "max_active_trajectories": 8,
                "max_inflight_model_requests": 6,
                "cpu_workers": 2,
            }
        )
        settings = SimulationSettings(
            "batching", model, turn_overhead_ms=overhead_ms, job_overhead_ms=overhead_ms
        )
        simulate(config, settings, ["test"], signals=True)
    assert len(servers) == 1
    texts = [(out / name).read_text(encoding="utf-8") for name in _FILES]
    texts[0] = re.sub(r'"wall_time":[^,]+,', "", texts[0], count=1)
    receipt = json.loads((out / "run.json").read_text(encoding="utf-8"))
    return _Simulated([*texts, f"{receipt['status']}: {receipt['error']}"], in_place, pending)


_CASES = {
    # name: (max_num_seqs, output_tokens declared, policy, stop_at, raise_at, overhead_ms)
    "batch-1-stopped": (1, True, "fifo", 29.7231, None, 0.0),
    "batch-2-stopped-sized-by-action": (2, False, "asyncroll", 0.6619, None, 0.0),
    "batch-8-stopped-overheads": (8, True, "asyncroll", 8.6623, None, 0.5),
    "batch-256-stopped": (256, True, "fifo", 10.7354, None, 0.0),
    "batch-8-policy-raises-sized-by-action": (8, False, "asyncroll", None, 13, 1.0),
}


@pytest.mark.parametrize("case", sorted(_CASES))
def test_a_run_cut_off_mid_stretch_is_the_same_stepped_in_place(tmp_path: Path, case: str) -> None:
    """The stop or the failure lands while sequences are mid-stretch (steps taken in place that their
    ``remaining`` does not count yet): the run's directory is the same as with one loop round per step,
    byte for byte: the requests cancelled, the partial counts, the summary and the trace."""
    seqs, declared, policy, stop_at, raise_at, overhead = _CASES[case]
    workload = _workload(tmp_path / "w.jsonl", seed=sum(map(ord, case)), problems=14, declared=declared)
    model = ServerModelConfig(max_num_seqs=seqs, step_base_ms=5.0, step_per_seq_ms=0.3)
    runs = {
        stepping: _simulate(
            tmp_path / str(stepping),
            workload,
            model,
            stepping=stepping,
            policy=policy,
            stop_at=stop_at,
            raise_at=raise_at,
            overhead_ms=overhead,
        )
        for stepping in (True, False)
    }
    fast, slow = runs[True], runs[False]
    assert fast.files == slow.files
    assert fast.pending > 0 and slow.pending == 0  # cut off mid-stretch
    assert fast.in_place > 50 and slow.in_place == 0
    events = [json.loads(line) for line in fast.files[0].splitlines()]
    cancelled = [e for e in events if e["event"] == "model_failed" and e["kind"] == "cancelled"]
    assert cancelled and all(e["latency_s"] > 0 for e in cancelled)
    # cancelled in the order their trajectories started (asyncio's task groups: their tasks' addresses)
    started = [int(e["id"][1:]) for e in cancelled]
    assert started == sorted(started)
    expected = "interrupted: interrupted by SIGTERM" if raise_at is None else "failed: RuntimeError"
    assert fast.files[-1].startswith(expected)


def test_the_asyncio_debug_mode_steps_the_loop_and_gives_the_same_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``PYTHONASYNCIODEBUG=1`` (and ``-X dev``, which sets the same loop flag): the loop takes no step in
    place (debug mode times and traces every callback), and the run is the same."""
    workload = _workload(tmp_path / "w.jsonl", seed=11, problems=10, declared=True)
    model = ServerModelConfig(max_num_seqs=4, step_base_ms=5.0, step_per_seq_ms=0.3)

    def once(out: Path) -> _Simulated:
        return _simulate(out, workload, model, stepping=True, policy="asyncroll", stop_at=3.0)

    plain = once(tmp_path / "plain")
    monkeypatch.setenv("PYTHONASYNCIODEBUG", "1")
    debug = once(tmp_path / "debug")
    assert plain.files == debug.files
    assert plain.in_place > 50 and plain.pending > 0 and debug.in_place == 0


# --- a stop signal to the real command ---------------------------------------------------------------

#: requests of a million tokens (the most one may script) decoding one at a time at a batch of one:
#: ≈ 2 µs of CPU per step in place, ≈ 2–3 s each. Eight, so that a test slow to see the first start (a
#: loaded machine: the suite runs in two processes) still signals mid-run: with one request, it ended
#: before the signal, and the run with it. (With three, the SIGTERM case failed once in a whole-suite run
#: in two processes, its assertion not kept; a run ended before the signal is the one cause in sight.)
_LONG = [
    {
        "id": f"long{i}",
        "prompt": "x",
        "tools": [],
        "script": [{"type": "final", "answer": 1, "output_tokens": 1_000_000}],
    }
    for i in range(8)
]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_in_a_long_stretch_stops_the_simulation_at_once(tmp_path: Path, sig: signal.Signals) -> None:
    """The signal lands while the loop steps the one sequence in place (it wakes no task for a million
    steps): its handler's callback is seen at the next step, the request is cancelled mid-decode, and the
    command ends as documented (exit 130, run.json ``interrupted by SIG…``, valid events) within moments,
    not when the decode would have ended (≈ 2 s of CPU later, 12,080 s of virtual time per request)."""
    workload = write_workload(tmp_path / "w.jsonl", _LONG)
    out = tmp_path / "sim"
    args = ["simulate", "--workload", str(workload), "--output", str(out), "--server", "batching"]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "asyncroll.cli",
            *args,
            "--max-num-seqs",
            "1",
            "--max-inflight-model-requests",
            "1",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    receipt = out / "run.json"
    try:
        wait_until(lambda: receipt.exists() and '"running"' in receipt.read_text(), "the start", writer=proc)
        events = out / "events.jsonl"
        wait_until(lambda: '"model_started"' in events.read_text(), "the request's start", writer=proc)
        sent = time.monotonic()
        os.kill(proc.pid, sig)
        _, stderr = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        end(proc)
    assert proc.returncode == 130, stderr
    assert f"interrupted by {sig.name}; partial outputs in {out}" in stderr and "Traceback" not in stderr
    assert took < 10, took  # the interpreter's exit included (≈ 0.6 s here); the loop's part is ≈ 30 ms
    run, summary, parsed = load_run(out)
    assert run["status"] == "interrupted" and run["error"] == f"interrupted by {sig.name}"
    assert summary["status"] == "interrupted"
    failed = [e for e in parsed if e.event == "model_failed"]
    assert len(failed) == 1 and failed[0].kind == "cancelled"
    # cancelled before its decode ended; 0 where the signal landed before the first step (the request's
    # model_started is written before the loop steps it: a failure seen once in a whole-suite run)
    assert 0 <= failed[0].latency_s < 12_000
    assert parsed[-1].event == "measurement_finished" and parsed[-1].status == "interrupted"


# --- two servers on one loop ----------------------------------------------------------------------------


def _two_servers(seed: int, stepping: bool) -> tuple[list[tuple[str, float]], Any, int]:
    """Two or three servers of their own step times on one virtual loop, requests to each, some
    withdrawn: the log of answers and withdrawals (with ``clock.now()``), the servers' final state, and
    how many steps their tasks ended themselves."""
    rng = random.Random(seed)
    cfgs = [
        ServerModelConfig(
            max_num_seqs=rng.choice([1, 2, 4]),
            step_base_ms=rng.choice([10.0, 5.0, 7.3, 1.0]),
            step_per_seq_ms=rng.choice([0.0, 0.3]),
            prefill_ms_per_token=rng.choice([0.0, 0.01]),
        )
        for _ in range(rng.choice([2, 3]))
    ]
    requests = [
        (f"r{i}", rng.randrange(len(cfgs)), round(rng.random() * 2, rng.choice([2, 9])), rng.randint(0, 200))
        for i in range(rng.randint(2, 8))
    ]
    outputs = [rng.randint(1, 500) for _ in requests]
    withdrawals = [
        (rng.randrange(len(requests)), round(rng.random() * 3, 2)) for _ in range(rng.randint(0, 3))
    ]
    clock = VirtualClock(wall=lambda: 0.0)
    log: list[tuple[str, float]] = []
    woke = 0

    async def main() -> Any:
        servers = [BatchingServer(cfg, clock, stepping=stepping) for cfg in cfgs]

        def counted(end_step: Callable[[], None]) -> Callable[[], None]:
            def end() -> None:
                nonlocal woke
                woke += 1
                end_step()

            return end

        for server in servers:
            server._end_step = counted(server._end_step)  # type: ignore[method-assign]

        async def request(i: int, name: str, k: int, at: float, prompt: int) -> None:
            try:
                await asyncio.sleep(at)
                g = await servers[k].generate(prompt, outputs[i])
            except asyncio.CancelledError:
                log.append((f"{name} cancelled", clock.now()))
                return
            log.append((f"{name} {g!r}", clock.now()))

        async with asyncio.TaskGroup() as tg:
            for server in servers:
                tg.create_task(server.serve())
            tasks = [tg.create_task(request(i, *r)) for i, r in enumerate(requests)]

            async def withdraw(i: int, at: float) -> None:
                await asyncio.sleep(at)
                tasks[i].cancel()
                log.append((f"withdraw r{i} {[s.snapshot() for s in servers]}", clock.now()))

            tasks += [tg.create_task(withdraw(*w)) for w in withdrawals]
            await asyncio.gather(*tasks)
            for server in servers:
                server.close()
        return [(s.snapshot(), s.batch_seconds) for s in servers], clock.now()

    state = clock.run(main())
    return log, state, woke


def test_two_servers_on_one_loop_are_stepped_in_place_each_as_it_would_be_woken() -> None:
    """Each server's engine sleeps on a timer of the same heap: one server's step in place must stop
    where the other's timer is due (equal step times put them at the same instants), and each timer's
    step is its own server's."""
    steps = woke = 0
    for seed in range(40):
        fast_log, fast_state, fast_woke = _two_servers(seed, True)
        slow_log, slow_state, slow_woke = _two_servers(seed, False)
        assert fast_log == slow_log, seed
        assert fast_state == slow_state, seed
        steps, woke = steps + slow_woke, woke + fast_woke
    assert woke * 10 < steps


# --- a callback that becomes ready during a stretch -------------------------------------------------------


def test_a_callback_made_ready_during_a_step_runs_at_that_steps_time() -> None:
    """A stop signal's handler (or a thread) makes a callback ready while the loop steps a sequence in
    place (``call_soon_threadsafe``): the loop runs it before time moves on, as it does when the engine's
    task wakes for the step (time never jumps while a callback is ready). It ran one step later, at the
    next step's end."""
    cfg = ServerModelConfig(max_num_seqs=2, step_base_ms=7.0, step_per_seq_ms=0.5)

    async def script(server: BatchingServer, log: Any, tg: asyncio.TaskGroup, clock: VirtualClock) -> None:
        loop = asyncio.get_running_loop()
        started = 0

        def arrives() -> None:
            log.append(("the signal's callback", clock.now()))

        def counting(start: Callable[[], Any]) -> Callable[[], Any]:
            def counted() -> Any:
                nonlocal started
                started += 1
                if started in (40, 41, 300, 333):  # some in place, after a few steps or a poll of I/O
                    log.append((f"signal at step {started}", clock.now()))
                    loop.call_soon_threadsafe(arrives)
                return start()

            return counted

        server._start_step = counting(server._start_step)  # type: ignore[method-assign]
        server._start_next_step = counting(server._start_next_step)  # type: ignore[method-assign]
        await asyncio.gather(
            _request(server, log, clock, "a", 0.0, 20, 500), _request(server, log, clock, "b", 0.1, 5, 200)
        )

    log, fast_woke, slow_woke = _both(cfg, script)
    assert [what for what, _ in log].count("the signal's callback") == 4
    assert fast_woke * 10 < slow_woke
