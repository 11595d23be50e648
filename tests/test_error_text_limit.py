"""One limit for an error's text: what a trajectory sees of a failure (results.jsonl's error, the model's
observation under ``--tool-errors observe``) is at most :data:`~asyncroll.events.MAX_ERROR_CHARS`
characters, the same text events.jsonl keeps, so that ``simulate --from-run`` gives it back whole."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncroll.events import MAX_ERROR_CHARS, TrajectoryFinished
from tests.cli_runs import load_run
from tests.conftest import VirtualRun, invoke, write_workload
from tests.simulations import simulate_here


def _long_error_run(tmp_path: Path, tool_errors: str) -> Path:
    """A real run (a real worker process) of one trajectory whose tool raises a 5,000-character error."""
    (tmp_path / "boom.py").write_text("def boom(x):\n    raise ValueError('e' * 5000)\n")
    tool = {"name": "boom", "inputs": {"x": "int"}, "implementation": "boom.py"}
    script: list[dict[str, Any]] = [
        {"type": "tool", "name": "boom", "arguments": {"x": 1}},
        {"type": "final", "answer": "1"},
    ]
    workload = write_workload(
        tmp_path / "w.jsonl", [{"id": "b", "prompt": "p", "tools": [tool], "script": script}]
    )
    out = tmp_path / f"run-{tool_errors}"
    done = invoke(
        "run",
        "--workload",
        workload,
        "--output",
        out,
        "--cpu-workers",
        "1",
        "--no-progress",
        "--no-telemetry",
        "--transcripts",
        "--tool-errors",
        tool_errors,
    )
    assert done.exit_code == 0, done.output
    return out


def _row(out: Path) -> dict[str, Any]:
    (row,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return row


@pytest.mark.timeout(90)
def test_a_long_tool_error_is_what_events_keep_in_results_the_observation_and_a_replay(
    tmp_path: Path,
) -> None:
    """A worker reported 2,000 characters of a tool's error and the trajectory saw all of it (results.jsonl,
    the model's observation) while events kept 1,000: a ``--from-run`` replay's error was shorter than the
    run's. Now the worker reports at most what an event keeps, and the text a trajectory sees is cut once,
    prefix included, to that."""
    failed = _long_error_run(tmp_path, "fail")
    error = _row(failed)["error"]
    assert error.startswith("tool 'boom' failed: ValueError: eee") and len(error) == MAX_ERROR_CHARS
    events = load_run(failed)[2]
    (finished,) = [e for e in events if e.event == "trajectory_finished"]
    (job,) = [e for e in events if e.event == "cpu_finished" and e.kind == "tool"]
    assert finished.error == error
    assert job.error is not None and len(job.error) <= MAX_ERROR_CHARS and error.endswith(job.error[-50:])

    observed = _long_error_run(tmp_path, "observe")
    (conversation,) = [json.loads(line) for line in (observed / "transcripts.jsonl").read_text().splitlines()]
    (shown,) = [m["content"] for m in conversation["messages"] if m["role"] == "tool"]
    assert shown == error

    replay = tmp_path / "replay"
    done = simulate_here("--from-run", failed, "--output", replay)
    assert done.exit_code == 0, done.output
    assert _row(replay)["error"] == error


def test_a_long_model_failure_is_cut_once_with_its_prefix(virtual_run: VirtualRun) -> None:
    """A model failure's message (here a script's, at the 1,000 characters a declared message may have;
    an HTTP backend's invalid-action detail is unbounded) became ``model KIND: message``, longer than
    any event keeps: results.jsonl and ``trajectory_finished`` now hold the same text, cut to that."""
    step = {"type": "error", "kind": "http_status", "status": 500, "message": "m" * MAX_ERROR_CHARS}
    _, capture, out = virtual_run([{"id": "x", "prompt": "p", "script": [step]}])
    (finished,) = capture.of(TrajectoryFinished)
    assert (
        _row(out)["error"]
        == finished.error
        == ("model http_status: " + "m" * MAX_ERROR_CHARS)[:MAX_ERROR_CHARS]
    )


def test_the_worker_reports_at_most_what_an_event_keeps() -> None:
    """The worker reported 2,000 characters (and a lone surrogate's escape could lengthen them): its
    reply's error is at most :data:`MAX_ERROR_CHARS`, whatever the tool raised."""
    from asyncroll.workers.child import run_job
    from asyncroll.workers.protocol import JobReply, JobRequest, decode, encode

    def boom(text: str) -> None:
        raise ValueError(text)

    for text in ("e" * 5000, b"\xff".decode("utf-8", "surrogateescape") * 5000):
        reply = decode(run_job({"t": boom}, encode(JobRequest(1, "t", {"text": text}))[4:])[4:])
        assert isinstance(reply, JobReply) and reply.error is not None
        assert reply.error.startswith("ValueError: ") and len(reply.error) == MAX_ERROR_CHARS
