"""The OpenAI-compatible backend driven through the real runtime against a real serve-sim: the CLI in
subprocesses, the inflight limit seen at the server, a run stopped with requests in flight, and the
flags only HTTP backends take."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from asyncroll.backends.server_model import ServerModelConfig
from asyncroll.clock import SystemClock
from asyncroll.config import build_config
from asyncroll.errors import UsageError
from asyncroll.event_log import EventCapture
from asyncroll.events import ModelEnqueued, ModelFailed, ModelStarted
from asyncroll.runtime.run import Run, prepare
from asyncroll.runtime.virtual_worker import builtin_duration, virtual_factory
from asyncroll.serve_sim.config import FaultConfig
from tests.children import end
from tests.conftest import REPO, write_workload
from tests.http_backend import final_problems, http_run, serve


def test_http_only_flags_and_replay_needs_scripts(tmp_path: Path) -> None:
    workload = write_workload(tmp_path / "w.jsonl", final_problems(1))
    with pytest.raises(UsageError, match="--replay, --max-retries only apply to HTTP backends"):
        build_config({"workload": workload, "output": tmp_path / "o", "replay": True, "max_retries": 1})
    cfg = build_config(
        {"workload": workload, "output": tmp_path / "o", "backend": "vllm", "model": "m", "replay": True}
    )
    with pytest.raises(UsageError, match="script: required"):
        prepare(cfg)
    assert not (tmp_path / "o").exists()


@pytest.mark.timeout(90)
def test_end_to_end_run_against_a_serve_sim_subprocess(tmp_path: Path) -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "asyncroll.cli", "serve-sim", "--port", "0", "--step-base-ms", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().split()[3]
        out = tmp_path / "run"
        run = subprocess.run(
            [
                sys.executable, "-m", "asyncroll.cli", "run",
                "--workload", REPO / "examples" / "smoke.jsonl", "--output", out,
                "--backend", "vllm", "--model", "sim", "--endpoint", url,
                "--replay", "--max-tokens", "32", "--cpu-workers", "1", "--telemetry-interval", "0.02",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert "complete: 3/3 completed" in run.stdout
        for name in (
            "run.json",
            "events.jsonl",
            "results.jsonl",
            "summary.json",
            "trace.json",
            "timeline.html",
        ):
            assert (out / name).stat().st_size > 0, name
        summary = json.loads((out / "summary.json").read_text())
        assert summary["counts"]["completed"] == 3 and summary["accuracy"]["exact"] == 1.0
        receipt = json.loads((out / "run.json").read_text())
        assert receipt["status"] == "complete" and receipt["backend"]["server_kind"] == "vllm"
        events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
        tokens = [e["completion_tokens"] for e in events if e["event"] == "model_finished"]
        assert tokens == [32] * 5  # smoke actions carry no output_tokens: --max-tokens is the budget
        reasons = [e["finish_reason"] for e in events if e["event"] == "model_finished"]
        assert reasons == ["length"] * 5  # serve-sim generates the whole --max-tokens budget
        assert summary["model"]["finish_reasons"] == {"length": 5}
        # telemetry is on by default with --backend vllm: serve-sim's /metrics sampled, estimates covered
        assert receipt["telemetry"]["sources"][0]["available"] is True
        assert sum(e["event"] == "resource_sample" for e in events) >= 3
        resources = summary["resources"]
        # covered, though not how much: a loaded machine delays samples past the gap limit (≈ 0.8 of a
        # 0.2 s run when idle, 0.34 seen under a loaded full suite); the folding is unit-tested
        assert resources["server_coverage_s"] > 0 and resources["server_coverage_fraction"] <= 1
        assert resources["sampled_starvation_s"] is not None
        assert resources["sampled_starvation_coverage_s"] > 0
    finally:
        server.terminate()
        try:
            server.communicate(timeout=30)
        finally:
            end(server)


@pytest.mark.timeout(60)
def test_inflight_limit_is_respected_at_the_server(tmp_path: Path) -> None:
    engine = ServerModelConfig(
        max_num_seqs=64, step_base_ms=2.0, step_per_seq_ms=0.0, prefill_ms_per_token=0.0
    )
    with serve(engine=engine) as running:
        outcome, _, _ = http_run(
            tmp_path,
            final_problems(30),
            running.url,
            max_active_trajectories=16,
            max_inflight_model_requests=3,
        )
        stats = running.stats()
    assert outcome.status == "complete" and stats["requests"] == 30
    assert stats["peak_inflight"] == 3  # the simulator's own counter: never more, and the limit was reached
    assert outcome.summary is not None
    assert outcome.summary["peaks"]["inflight_model_requests"] == 3


@pytest.mark.timeout(60)
def test_requests_in_flight_when_the_run_is_stopped_end_as_cancelled(tmp_path: Path) -> None:
    """Interrupting a run ends every request holding a slot with ``model_failed`` kind ``cancelled`` (as a
    CPU job holding a worker gets ``cpu_failed`` reason ``cancelled``); a request still queued for a slot
    was never sent and ends with nothing. They are counted, but are neither errors nor responses."""
    workload = write_workload(tmp_path / "w.jsonl", final_problems(4))
    capture = EventCapture()

    async def main(url: str) -> None:
        ready = asyncio.Event()  # two requests in flight and two queued behind them

        def watch(event: Any) -> None:
            if len(capture.of(ModelStarted)) == 2 and len(capture.of(ModelEnqueued)) == 4:
                ready.set()

        cfg = build_config(
            {
                "workload": workload,
                "output": tmp_path / "run",
                "backend": "vllm",
                "model": "sim",
                "endpoint": url,
                "warmup_requests": 0,
                "max_inflight_model_requests": 2,
                "telemetry": False,
            }
        )
        clock = SystemClock()
        run = Run(
            prepare(cfg, ["test"]),
            clock,
            worker_factory=virtual_factory(clock, builtin_duration),
            subscribers=(capture, watch),
        )
        task = asyncio.create_task(run.execute())
        async with asyncio.timeout(20):
            await ready.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with serve(faults=FaultConfig(slow_rate=1.0, slow_s=30.0)) as running:
        asyncio.run(main(running.url))
    cancelled = capture.of(ModelFailed)
    assert sorted(e.request_id for e in cancelled) == sorted(e.request_id for e in capture.of(ModelStarted))
    assert len(cancelled) == 2 and {(e.kind, e.response_received) for e in cancelled} == {
        ("cancelled", False)
    }
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert summary["model"]["requests"] == 2 and summary["model"]["failed"] == {"cancelled": 2}
    assert summary["rates"]["validity_denominator"] == 0
    trace = json.loads((tmp_path / "run" / "trace.json").read_text())
    assert trace["metadata"]["unknown_events"] == {}
