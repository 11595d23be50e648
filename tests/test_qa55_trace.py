"""trace.json as Perfetto's JSON importer reads it: the independent checker of ``tests/perfetto_rules.py``
over traces of real runs (policies, concurrency, a tool timeout, an interrupted run, simulations, ``timeline``
regenerating the exports) and over hand-made event streams that real runs can produce (the event loop
stalling across the moment the server circuit opened or closed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from asyncroll import events as ev
from tests.cli_runs import SMOKE, cli
from tests.conftest import REPO
from tests.export_checks import load_trace
from tests.perfetto_rules import load_strict, perfetto_problems
from tests.synthetic_runs import make_run, normal_events

RECEIPT = {"simulated": False}


def _problems(run: Path) -> list[str]:
    return perfetto_problems(load_strict(run / "trace.json"))


def _start(t: float) -> ev.MeasurementStarted:
    return ev.MeasurementStarted(
        t=t,
        wall_time=0.0,
        policy="fifo",
        max_active_trajectories=4,
        max_inflight_model_requests=2,
        cpu_workers=2,
    )


def test_the_checker_catches_each_rule_it_states() -> None:
    """The checker itself: a crossing pair, a negative or missing dur, a null counter, a NaN literal, a
    nameless thread and an unmatched end are each reported; nested, disjoint and touching slices are not."""
    meta = [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "p"}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "t"}},
    ]

    def x(ts: int, dur: Any, tid: int = 1) -> dict[str, Any]:
        return {"name": "s", "ph": "X", "pid": 1, "tid": tid, "ts": ts, "dur": dur}

    fine = [x(0, 10), x(2, 3), x(5, 5), x(10, 0), x(10, 4)]  # nested, touching, zero-length at an end
    assert perfetto_problems({"traceEvents": meta + fine}) == []
    assert "partially overlaps" in perfetto_problems({"traceEvents": [*meta, x(0, 10), x(5, 10)]})[0]
    assert "negative dur" in perfetto_problems({"traceEvents": [*meta, x(0, -1)]})[0]
    assert "dropped" in perfetto_problems({"traceEvents": [*meta, x(0, None)]})[0]
    counter = {"name": "c", "ph": "C", "pid": 1, "tid": 0, "ts": 0, "args": {"value": None}}
    assert "dropped" in perfetto_problems({"traceEvents": [*meta, counter]})[0]
    assert "no thread_name" in perfetto_problems({"traceEvents": [*meta, x(0, 1, tid=2)]})[0]
    end = {"name": "s", "ph": "E", "pid": 1, "tid": 1, "ts": 3}
    assert "E without" in perfetto_problems({"traceEvents": [*meta, end]})[0]
    with pytest.raises(ValueError, match="NaN"):
        json.loads('{"a": NaN}', parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))


def test_a_loop_stall_across_the_circuit_opening_is_not_dropped(tmp_path: Path) -> None:
    """The server circuit's span starts when the circuit opened (``server_unavailable`` is back-dated to
    it), and a loop stall runs from the watch's asked wake-up to ``t``: the two can cross on the scheduler
    track (here the stall begins before the circuit opens and ends inside it). Perfetto keeps a track's
    slices as a stack and drops a slice that starts inside another and ends after it, so one of the two
    vanished from the trace; each now has a track of its own."""
    events: list[ev.Event] = [
        _start(0.0),
        ev.LoopStalled(t=1.5, late_s=0.6),  # [0.9, 1.5]
        ev.ServerUnavailable(t=1.0, failures=3, reason="connect: refused", opened=1),
        ev.ServerAvailable(t=2.0, paused_s=1.0, probes=2),
        ev.LoopStalled(t=2.4, late_s=0.6),  # [1.8, 2.4]: across the closing
        ev.ProcessStopped(t=3.5, stopped_s=0.5),
        ev.MeasurementFinished(t=4.0, status="complete", makespan_s=4.0),
    ]
    trace = load_trace(make_run(tmp_path, events, run=RECEIPT))
    assert perfetto_problems(trace) == []
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    names = sorted(e["name"] for e in spans)
    assert names == [
        "event loop stalled",
        "event loop stalled",
        "process stopped (job control)",
        "server unavailable: admission paused",
    ]
    assert all(e["pid"] == 4 for e in spans)
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"
    }
    circuit = next(e for e in spans if e["name"].startswith("server"))
    stalls = [e for e in spans if e["cat"] == "loop_stall"]
    assert threads[(4, circuit["tid"])] == "scheduler"
    assert {threads[(4, e["tid"])] for e in stalls} == {"event loop"}


def test_a_run_without_stalls_keeps_the_one_scheduler_thread(tmp_path: Path) -> None:
    trace = load_trace(make_run(tmp_path, normal_events(), run=RECEIPT))
    assert perfetto_problems(trace) == []
    threads = [
        e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name" and e["pid"] == 4
    ]
    assert threads == ["scheduler"]


@pytest.mark.parametrize("policy", ["sync", "fifo", "tool_first", "asyncroll", "asyncroll_guarded"])
def test_real_concurrent_runs_import_cleanly(tmp_path: Path, policy: str) -> None:
    """A real run of every kind of policy, several trajectories, model requests and workers at once."""
    out = tmp_path / "run"
    run = cli(
        "run", "--workload", SMOKE, "--output", out, "--policy", policy, "--cpu-workers", "2",
        "--max-active-trajectories", "3", "--max-inflight-model-requests", "2", "--no-progress",
        timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert _problems(out) == []


def _spin_workload(path: Path, n: int, slow_ms: int) -> Path:
    tool = {"name": "spin_ms", "description": "spin", "inputs": {"milliseconds": "number"}}
    rows = []
    for i in range(n):
        script = [
            {"type": "tool", "name": "spin_ms", "arguments": {"milliseconds": slow_ms if i % 3 == 0 else 10}},
            {"type": "tool", "name": "spin_ms", "arguments": {"milliseconds": 10}},
            {"type": "final", "answer": "7"},
        ]
        rows.append(
            {"id": f"p{i}", "prompt": "spin", "tools": [tool], "reference_answer": "7", "script": script}
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_run_with_worker_timeouts_and_replacements_imports_cleanly(tmp_path: Path) -> None:
    workload = _spin_workload(tmp_path / "w.jsonl", 6, 3_000)
    out = tmp_path / "run"
    run = cli(
        "run", "--workload", workload, "--output", out, "--tool-timeout", "0.4", "--cpu-workers", "2",
        "--max-active-trajectories", "4", "--no-progress", timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    trace = load_strict(out / "trace.json")
    assert any(e["name"].startswith("worker restart") for e in trace["traceEvents"])
    assert perfetto_problems(trace) == []


def test_an_interrupted_run_and_its_regenerated_exports_import_cleanly(tmp_path: Path) -> None:
    workload = _spin_workload(tmp_path / "w.jsonl", 30, 200)
    out = tmp_path / "run"
    args = [sys.executable, "-m", "asyncroll.cli", "run", "--workload", str(workload), "--output", str(out)]
    proc = subprocess.Popen([*args, "--cpu-workers", "2", "--no-progress"], cwd=REPO, stderr=subprocess.PIPE)
    try:
        events = out / "events.jsonl"
        deadline = 600
        while deadline and not (events.exists() and b"cpu_started" in events.read_bytes()):
            deadline -= 1
            subprocess.run(["sleep", "0.05"], check=True)
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()
    assert _problems(out) == []
    (out / "trace.json").unlink()
    regenerated = cli("timeline", out, timeout=60)
    assert regenerated.returncode == 0, regenerated.stderr
    assert _problems(out) == []


@pytest.mark.parametrize("server", ["fixed", "batching"])
def test_a_big_simulated_run_imports_cleanly(tmp_path: Path, server: str) -> None:
    """Two thousand trajectories on the virtual clock (many events share an instant), 64 active."""
    tool = {"name": "spin_ms", "description": "spin", "inputs": {"milliseconds": "number"}}
    rows = []
    for i in range(2_000):
        step = {"type": "tool", "name": "spin_ms", "arguments": {"milliseconds": i % 7}, "cpu_ms": i % 7}
        final = {"type": "final", "answer": "7", "latency_ms": i % 5}
        rows.append(
            {"id": f"p{i}", "prompt": "x", "tools": [tool], "reference_answer": "7", "script": [step, final]}
        )
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    run = cli(
        "simulate", "--workload", workload, "--output", out, "--server", server, "--cpu-workers", "8",
        "--max-active-trajectories", "64", "--max-inflight-model-requests", "16", timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert _problems(out) == []


def _trajectory_lost_its_request_end() -> list[ev.Event]:
    """A damaged log: trajectory ``a`` finished at 1 s, but the lines that ended its model request (queued
    at 0.1 s) were lost, so the request is drawn "(incomplete)" to the run's last event at 5 s."""
    return [
        _start(0.0),
        ev.TrajectoryStarted(t=0.0, id="a", index=0, prompt_chars=1, active=1),
        ev.ModelEnqueued(t=0.1, id="a", request_id=1, turn=0, outstanding=1),
        ev.TrajectoryFinished(
            t=1.0, id="a", status="failed", turns=0, tool_calls=0, duration_s=1.0, error="x"
        ),
        ev.MeasurementFinished(t=5.0, status="complete", makespan_s=5.0),
    ]


def test_an_incomplete_span_that_outlives_its_finished_trajectory_is_clipped_not_dropped(
    tmp_path: Path,
) -> None:
    """An incomplete span is drawn to the run's end, past the end of its trajectory's span when that one
    did end: Perfetto dropped it (it crossed its parent), the one span that said something was lost. It is
    drawn to its enclosing span's end instead, its own length kept in its args."""
    trace = load_trace(make_run(tmp_path, _trajectory_lost_its_request_end(), run=RECEIPT))
    assert perfetto_problems(trace) == []
    queue = next(e for e in trace["traceEvents"] if e["name"] == "model queue (incomplete)")
    assert (queue["ts"], queue["dur"]) == (100_000, 900_000)
    assert queue["args"]["dur_before_clipping_us"] == 4_900_000


def test_an_http_run_with_failed_and_retried_requests_imports_cleanly(tmp_path: Path) -> None:
    """The HTTP backend against a real serve-sim answering 429, 500 and connection resets: failed requests,
    retries (instants inside their request), 8 requests at once on their slots, telemetry counters."""
    server = subprocess.Popen(
        [
            sys.executable, "-m", "asyncroll.cli", "serve-sim", "--port", "0", "--step-base-ms", "2",
            "--rate-429", "0.3", "--retry-after", "0.05", "--rate-500", "0.2", "--reset-rate", "0.1",
            "--seed", "5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        url = server.stdout.readline().split()[3]
        workload = _spin_workload(tmp_path / "w.jsonl", 12, 20)
        out = tmp_path / "run"
        run = cli(
            "run", "--workload", workload, "--output", out, "--backend", "vllm", "--model", "sim",
            "--endpoint", url, "--replay", "--max-tokens", "16", "--cpu-workers", "2",
            "--warmup-requests", "0",
            "--max-retries", "3", "--retry-max-delay", "0.1", "--telemetry-interval", "0.02",
            "--max-inflight-model-requests", "8", "--no-progress", timeout=120,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        assert server.stdout is not None
        server.stdout.close()
    trace = load_strict(out / "trace.json")
    names = [e["name"] for e in trace["traceEvents"]]
    assert any(n.startswith("model retry") for n in names) and any(n.endswith("(failed)") for n in names)
    assert perfetto_problems(trace) == []
