"""The time bases of a run's outputs agree: run.json's wall-clock times, the events' ``t``, the
durations events and summary.json carry, and the clock a summary says its durations are on."""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import random
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from asyncroll.clock import SystemClock, VirtualClock
from asyncroll.config import build_config
from asyncroll.outputs.statistics import distribution
from asyncroll.runtime.run import Run, prepare
from asyncroll.runtime.virtual_worker import VirtualWorker, builtin_duration, virtual_factory
from asyncroll.workers.process import CallResult
from asyncroll.workers.protocol import JobRequest
from tests.cli_runs import load_run
from tests.conftest import tool_problem, write_workload
from tests.simulations import simulate_here


def test_a_simulations_receipt_times_are_when_it_ran_not_virtual_time(tmp_path: Path) -> None:
    """run.json's ``*_at`` times are the real wall clock. A simulation of an hour of virtual time that
    took a second said ``complete_at`` an hour after ``created_at``: in the future when it was written."""
    problems = [tool_problem("long", model_ms=1_800_000, cpu_ms=1_000)]  # 30 min, 1 s, 30 min
    workload = write_workload(tmp_path / "w.jsonl", problems)
    before = time.time()
    result = simulate_here("--workload", workload, "--output", tmp_path / "sim")
    after = time.time()
    assert result.exit_code == 0, result.output
    receipt, summary, events = load_run(tmp_path / "sim")
    assert summary["makespan_s"] == 3601.0  # virtual seconds
    stamps = {k: datetime.fromisoformat(receipt[k]) for k in ("created_at", "running_at", "complete_at")}
    for name, stamp in stamps.items():
        assert stamp.tzinfo is not None, name
        assert before - 0.002 <= stamp.timestamp() <= after + 0.002, (name, receipt[name])  # to the ms
    [started] = [e for e in events if e.event == "measurement_started"]
    assert before <= started.wall_time <= after


class _JitteryClock(VirtualClock):
    """Virtual time that also moves on by a seeded random 0–1 ms at every read, as a real clock moves
    between two reads by however much work lies between them: a duration and an event's ``t`` read
    separately then differ, deterministically."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self._rng = random.Random(seed)

    def now(self) -> float:
        self._now += self._rng.uniform(0.0, 0.001)
        return self._now


def _close(recorded: float, derived: float) -> bool:
    return abs(recorded - derived) <= 2.5e-6  # each of t, t and the duration rounded to the microsecond


@pytest.mark.parametrize("seed", [0, 1])
def test_every_duration_in_the_events_is_the_difference_of_their_t(tmp_path: Path, seed: int) -> None:
    """queued_s, latency_s, waited_s and duration_s equal the difference of the ``t`` of the events that
    begin and end them, and measurement_started is at t = 0 (the origin of every ``t``): a user who
    recomputes a summary's distributions from events.jsonl gets its numbers. Each was read from the clock
    apart from the event's own ``t`` (measurement_started at t = 0.0006 in a real run; a model queue
    wait of 4 µs between events 26 µs apart)."""
    problems = [tool_problem(f"p{i}", model_ms=40, cpu_ms=30, turns=2) for i in range(6)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    out = tmp_path / "run"
    cfg = build_config(
        {"workload": workload, "output": out, "max_inflight_model_requests": 2, "cpu_workers": 1}
    )
    clock = _JitteryClock(seed)
    run = Run(prepare(cfg, ["test"]), clock, worker_factory=virtual_factory(clock, builtin_duration))
    outcome = clock.run(run.execute())
    assert outcome.status == "complete"
    _receipt, summary, events = load_run(out)
    by: dict[str, list[Any]] = {}
    for e in events:
        by.setdefault(e.event, []).append(e)
    assert by["measurement_started"][0].t == 0.0
    measured = [e.t for e in events if e.event not in ("worker_ready", "measurement_started")]
    assert measured == sorted(measured) and measured[0] >= 0.0

    started = {e.id: e.t for e in by["trajectory_started"]}
    durations = [e.t - started[e.id] for e in by["trajectory_finished"]]
    assert all(_close(e.duration_s, d) for e, d in zip(by["trajectory_finished"], durations, strict=True))
    enqueued = {e.request_id: e.t for e in by["model_enqueued"]}
    slot = {e.request_id: e.t for e in by["model_started"]}
    assert all(_close(e.queued_s, e.t - enqueued[e.request_id]) for e in by["model_started"])
    assert all(_close(e.latency_s, e.t - slot[e.request_id]) for e in by["model_finished"])
    queued = {e.job_id: e.t for e in by["cpu_enqueued"]}
    assert all(_close(e.waited_s, e.t - queued[e.job_id]) for e in by["cpu_selected"])

    derived = {
        "trajectory_s": durations,
        "model_queue_s": [e.t - enqueued[e.request_id] for e in by["model_started"]],
        "model_latency_s": [e.t - slot[e.request_id] for e in by["model_finished"]],
        "cpu_queue_s": [e.t - queued[e.job_id] for e in by["cpu_selected"]],
    }
    for name, values in derived.items():
        recomputed = distribution(values)
        for stat in ("min", "p50", "p95", "max"):
            assert _close(summary["latency"][name][stat], float(recomputed[stat] or 0.0)), (name, stat)


def test_a_summary_says_which_clock_its_durations_are_on(tmp_path: Path) -> None:
    """A simulation's makespan, latencies and "per wall hour" rates are virtual seconds; its summary.json,
    the line printed, trace.json and events.jsonl (whose measurement_started has the real wall_time beside
    virtual t) did not say so, and read exactly like a measured run's."""
    workload = write_workload(tmp_path / "w.jsonl", [tool_problem("a", model_ms=5, cpu_ms=5)])
    result = simulate_here("--workload", workload, "--output", tmp_path / "sim")
    assert result.exit_code == 0, result.output
    _receipt, simulated, events = load_run(tmp_path / "sim")
    assert simulated["clock"] == "virtual"
    assert [e.clock for e in events if e.event == "measurement_started"] == ["virtual"]
    assert "makespan 0.015s (virtual clock)" in result.output
    assert json.loads((tmp_path / "sim" / "trace.json").read_text())["metadata"]["clock"] == "virtual"

    cfg = build_config({"workload": workload, "output": tmp_path / "real"})
    clock = SystemClock()
    run = Run(prepare(cfg, ["test"]), clock, worker_factory=virtual_factory(clock, builtin_duration))
    outcome = clock.run(run.execute())
    assert outcome.status == "complete" and outcome.summary is not None
    assert outcome.summary["clock"] == "monotonic"
    _receipt, measured, events = load_run(tmp_path / "real")
    assert measured["clock"] == "monotonic"
    assert [e.clock for e in events if e.event == "measurement_started"] == ["monotonic"]
    assert json.loads((tmp_path / "real" / "trace.json").read_text())["metadata"]["clock"] == "monotonic"


def _wall(reads: Iterator[int], step: float) -> float:
    return 1.8e9 + step * next(reads)


def test_a_wall_clock_step_moves_only_the_receipts_times(tmp_path: Path) -> None:
    """The wall clock (NTP may step it during a run) is read for run.json's times and
    measurement_started.wall_time only: a wall clock that jumps back an hour at every read leaves every
    duration of the summary as it is on a steady one."""
    workload = write_workload(
        tmp_path / "w.jsonl", [tool_problem(f"p{i}", model_ms=7, cpu_ms=11) for i in range(3)]
    )
    summaries = []
    for name, step in (("steady", 0.0), ("stepping", -3600.0)):
        reads = itertools.count()
        clock = VirtualClock(wall=functools.partial(_wall, reads, step))
        cfg = build_config({"workload": workload, "output": tmp_path / name})
        run = Run(prepare(cfg, ["test"]), clock, worker_factory=virtual_factory(clock, builtin_duration))
        outcome = clock.run(run.execute())
        assert outcome.status == "complete" and outcome.summary is not None
        summaries.append(outcome.summary)
        receipt, _summary, _events = load_run(tmp_path / name)
        assert (receipt["complete_at"] < receipt["created_at"]) is (step < 0)
    assert summaries[0] == summaries[1]
    assert summaries[0]["makespan_s"] == 0.036  # 7 + 11 + 7 ms, the third waits 11 ms for a worker


class _SlowToKill(VirtualWorker):
    """A virtual worker whose job, cancelled, takes 50 ms to end: a real worker's process tree is killed
    (and reaped) before the cancelled job's ``cpu_failed``."""

    async def call(
        self,
        request: JobRequest,
        timeout: float,  # noqa: ASYNC109 - as a worker
        *,
        large: bool = False,
    ) -> CallResult:
        try:
            return await super().call(request, timeout)
        except asyncio.CancelledError:
            await self._clock.sleep(0.05)
            raise


def test_a_stop_is_not_client_cpu_blocked_time(tmp_path: Path) -> None:
    """A run stopped while one trajectory's tool job runs and another's model request is in flight: the
    stop cancels the request at once and the job only once its worker is killed. In between nothing is
    outstanding for the model and a CPU job is pending: the stop itself was counted as client CPU-blocked
    time (here 50 ms of a run that was never blocked), and as a blocked interval."""
    problems = [tool_problem("tool", model_ms=10, cpu_ms=1000), tool_problem("model", model_ms=500, cpu_ms=1)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    cfg = build_config({"workload": workload, "output": tmp_path / "run"})
    clock = VirtualClock()
    measuring = asyncio.Event()
    run = Run(
        prepare(cfg, ["test"]),
        clock,
        worker_factory=lambda index, generation: _SlowToKill(index, generation, clock),
        subscribers=(lambda e: measuring.set() if e.event == "measurement_started" else None,),
    )

    async def stopped_at(seconds: float) -> None:
        task = asyncio.create_task(run.execute())
        await measuring.wait()  # start-up waits for a real thread (an import): stop in measured time
        await clock.sleep(seconds)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    clock.run(stopped_at(0.2))
    _receipt, summary, events = load_run(tmp_path / "run")
    assert summary["status"] == "interrupted"
    [cancelled_request] = [e for e in events if e.event == "model_failed"]
    [cancelled_job] = [e for e in events if e.event == "cpu_failed"]
    assert cancelled_request.kind == "cancelled" and cancelled_job.reason == "cancelled"
    assert cancelled_job.t - cancelled_request.t == pytest.approx(0.05)
    assert summary["client_cpu_blocked"]["seconds"] == 0.0
    assert summary["client_cpu_blocked"]["intervals"] == 0


def test_run_json_says_running_before_the_measured_window_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writing run.json (fsync, rename) takes ~10 ms on a local disk and seconds on a busy NFS. Its
    "running" rewrite happened just after measurement_started, inside the window: a write that took 5 s
    (the clock moved on by 5 s during it, here) put every trajectory's start at t ≥ 5 and 5 s more into
    the makespan. It happens before the window opens now."""
    from asyncroll.outputs.receipt import Receipt

    clock = VirtualClock()
    transition = Receipt.transition

    def slow(self: Receipt, status: Any, wall: float, **fields: Any) -> None:
        if status == "running":
            clock._now += 5.0  # the write's time
        transition(self, status, wall, **fields)

    monkeypatch.setattr(Receipt, "transition", slow)
    workload = write_workload(tmp_path / "w.jsonl", [tool_problem("p", model_ms=100, cpu_ms=100)])
    cfg = build_config({"workload": workload, "output": tmp_path / "run", "cpu_workers": 1})
    run = Run(prepare(cfg, ["test"]), clock, worker_factory=virtual_factory(clock, builtin_duration))
    assert clock.run(run.execute()).status == "complete"
    receipt, summary, events = load_run(tmp_path / "run")
    assert receipt["status"] == "complete" and "running_at" in receipt
    first = next(e for e in events if e.event == "trajectory_started")
    assert first.t == 0.0 and summary["makespan_s"] == pytest.approx(0.3, abs=0.01)
