"""Run directories for the export tests: hand-made event streams (a normal run, a tool timeout, broken
lines) written as ``events.jsonl`` with their receipts, and the smoke workload real runs use."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from asyncroll import events as ev
from tests.conftest import REPO
from tests.event_records import cpu_finished, cpu_selected


def make_run(tmp_path: Path, events: list[ev.Event], extra_lines: tuple[str, ...] = (), **files: Any) -> Path:
    """A run directory with ``events.jsonl`` (sorted by t, like the writer) plus the given JSON files."""
    run = tmp_path / "run"
    run.mkdir()
    lines = [e.model_dump_json() for e in sorted(events, key=lambda e: e.t)]
    (run / "events.jsonl").write_text("\n".join([*lines, *extra_lines]) + "\n")
    for name, body in files.items():
        (run / f"{name}.json").write_text(json.dumps(body))
    return run


def trajectory(tid: str, i: int, base: float, worker: int, reordered: bool = False) -> list[ev.Event]:
    """One completed trajectory: model turn → tool job → model turn → final."""
    r1, r2, job = 2 * i, 2 * i + 1, i
    return [
        ev.TrajectoryStarted(t=base, id=tid, index=i, prompt_chars=10, active=1),
        ev.ModelEnqueued(t=base, id=tid, request_id=r1, turn=0, outstanding=1),
        ev.ModelStarted(t=base + 0.01, id=tid, request_id=r1, turn=0, inflight=1, queued_s=0.01),
        ev.ModelFinished(t=base + 0.05, id=tid, request_id=r1, turn=0, latency_s=0.04, action="tool"),
        ev.CpuEnqueued(
            t=base + 0.05, id=tid, job_id=job, kind="tool", tool="add", turn=0, arg_bytes=8, queue_depth=1
        ),
        cpu_selected(
            tid, job, t=base + 0.06, worker=worker, policy="asyncroll", waited_s=0.01, reordered=reordered
        ),
        ev.CpuStarted(t=base + 0.06, id=tid, job_id=job, worker=worker, pid=100 + worker, generation=0),
        ev.CpuFinished(
            t=base + 0.09,
            id=tid,
            job_id=job,
            worker=worker,
            kind="tool",
            tool="add",
            ok=True,
            execute_s=0.02,
            cpu_s=0.02,
            roundtrip_s=0.03,
            started=base + 0.065,
            finished=base + 0.085,
        ),
        ev.ModelEnqueued(t=base + 0.09, id=tid, request_id=r2, turn=1, outstanding=1),
        ev.ModelStarted(t=base + 0.09, id=tid, request_id=r2, turn=1, inflight=1, queued_s=0.0),
        ev.ModelFinished(t=base + 0.12, id=tid, request_id=r2, turn=1, latency_s=0.03, action="final"),
        ev.TrajectoryFinished(
            t=base + 0.12, id=tid, status="completed", turns=2, tool_calls=1, duration_s=0.12
        ),
    ]


def normal_events() -> list[ev.Event]:
    out: list[ev.Event] = [
        ev.WorkerReady(t=-0.5, worker=0, pid=100, generation=0, startup_s=0.2),
        ev.WorkerReady(t=-0.4, worker=1, pid=101, generation=0, startup_s=0.2),
        ev.MeasurementStarted(
            t=0.0,
            wall_time=1.7e9,
            policy="asyncroll",
            max_active_trajectories=3,
            max_inflight_model_requests=2,
            cpu_workers=2,
        ),
    ]
    for i, tid in enumerate(["a", "b", "c"]):
        out += trajectory(tid, i, 0.2 * i, worker=i % 2, reordered=i == 2)
    out.append(ev.MeasurementFinished(t=0.6, status="complete", makespan_s=0.6))
    return out


def timeout_events() -> list[ev.Event]:
    """A tool that times out: the job fails, the worker is replaced, the trajectory fails."""
    return [
        ev.TrajectoryStarted(t=0.0, id="slow", index=0, prompt_chars=5, active=1),
        ev.CpuEnqueued(
            t=0.0, id="slow", job_id=7, kind="tool", tool="spin_ms", turn=0, arg_bytes=4, queue_depth=1
        ),
        cpu_selected("slow", 7, t=0.0),
        ev.CpuStarted(t=0.01, id="slow", job_id=7, worker=0, pid=100, generation=0),
        ev.CpuFailed(
            t=1.01,
            id="slow",
            job_id=7,
            worker=0,
            kind="tool",
            tool="spin_ms",
            reason="timeout",
            roundtrip_s=1.0,
            error="tool exceeded 1 s",
        ),
        ev.WorkerRestarting(t=1.01, worker=0, old_pid=100, generation=1, reason="timeout", restarts=1),
        ev.WorkerReady(t=1.3, worker=0, pid=102, generation=1, startup_s=0.29),
        ev.TrajectoryFinished(
            t=1.02, id="slow", status="failed", turns=1, tool_calls=1, duration_s=1.02, error="tool timeout"
        ),
    ]


def broken_events() -> list[ev.Event]:
    """A model request that never ends and a CPU finish that never started."""
    return [
        ev.TrajectoryStarted(t=0.0, id="x", index=0, prompt_chars=5, active=1),
        ev.ModelEnqueued(t=0.0, id="x", request_id=1, turn=0, outstanding=1),
        ev.ModelStarted(t=0.1, id="x", request_id=1, turn=0, inflight=1, queued_s=0.1),
        cpu_finished("y", 99, t=0.5, worker=1, tool="add", execute_s=0.1, roundtrip_s=0.1),
        ev.MeasurementFinished(t=0.8, status="interrupted", makespan_s=0.8),
    ]


SUMMARY = {
    "counts": {"trajectories": 3, "completed": 3, "failed": 0},
    "throughput": {"completed_per_wall_hour": 18000.0},
    "scheduler": {"decisions": 3, "reorders": 1},
    "makespan_s": 0.6,
}

RUN = {
    "status": "complete",
    "config": {
        "policy": "asyncroll",
        "max_active_trajectories": 3,
        "max_inflight_model_requests": 2,
        "cpu_workers": 2,
    },
}

SMOKE = REPO / "examples" / "smoke.jsonl"
