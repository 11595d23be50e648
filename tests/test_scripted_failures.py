"""A request a script's ``error`` step failed is marked ``scripted`` in its ``model_failed`` (absent from
every other), counted apart in summary.json (``model.scripted_failures``, absent with none), and says
nothing of the server: an HTTP ``--replay`` run whose every request failed by its script before any
succeeded asked "is the server up?"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_runs import load_run
from tests.conftest import invoke, write_workload
from tests.http_backend import serve
from tests.simulations import simulate_here

UNAVAILABLE = {
    "type": "error",
    "kind": "http_status",
    "status": 503,
    "message": "Unavailable",
    "latency_ms": 5,
}


@pytest.mark.timeout(90)
def test_an_http_replay_whose_every_request_failed_by_its_script_asks_for_no_server(tmp_path: Path) -> None:
    problems = [{"id": f"e{i}", "prompt": "p", "script": [UNAVAILABLE]} for i in range(2)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    run = tmp_path / "run"
    with serve() as running:
        done = invoke(
            "run", "--workload", workload, "--output", run, "--backend", "vllm", "--model", "sim",
            "--endpoint", running.url, "--replay", "--warmup-requests", "0", "--cpu-workers", "1",
            "--no-telemetry", "--no-progress",
        )  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "no model request succeeded" not in done.stderr, done.stderr
    _, summary, events = load_run(run)
    assert summary["model"]["failed"] == {"http_status": 2} and summary["model"]["finished"] == 0
    assert summary["model"]["scripted_failures"] == {"http_status": 2}
    failed = [e for e in events if e.event == "model_failed"]
    assert [(e.kind, e.status, e.scripted) for e in failed] == [("http_status", 503, True)] * 2

    replay = tmp_path / "replay"
    replayed = simulate_here("--from-run", run, "--output", replay)
    assert replayed.exit_code == 0, replayed.output
    assert "ended otherwise" not in replayed.stderr
    again = [e for e in load_run(replay)[2] if e.event == "model_failed"]
    key = sorted((e.id, e.turn, e.kind, e.status, e.error, e.scripted) for e in failed)
    assert sorted((e.id, e.turn, e.kind, e.status, e.error, e.scripted) for e in again) == key


def test_a_failure_no_script_made_writes_no_scripted_field(tmp_path: Path) -> None:
    """Absent unless true: a ``model_failed`` of anything but an error step (here a script run out) is
    written as before, without the field; ``asyncroll schema events`` names it."""
    out = tmp_path / "sim"
    step = {"type": "tool", "name": "add", "arguments": {"a": 1, "b": 2}}
    problem = {"id": "x", "prompt": "p", "tools": [{"name": "add"}], "script": [step]}
    workload = write_workload(tmp_path / "w.jsonl", [problem])
    assert simulate_here("--workload", workload, "--output", out).exit_code == 0
    lines = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    (failed,) = [line for line in lines if line["event"] == "model_failed"]
    assert failed["kind"] == "script_exhausted" and "scripted" not in failed
    summary = json.loads((out / "summary.json").read_text())
    assert "scripted_failures" not in summary["model"]  # absent with none: a summary as it always was
    schema = json.loads(invoke("schema", "events").output)["$defs"]["ModelFailed"]
    assert "scripted" in schema["properties"] and "scripted" not in schema.get("required", [])


def test_a_failure_no_script_made_still_asks_for_the_server(capsys: pytest.CaptureFixture[str]) -> None:
    """Only the scripted failures are left out: one more of the same kind that a server gave still asks
    (and a summary written before ``scripted_failures`` reads as it did)."""
    from asyncroll.commands.run_warnings import warn_server_down

    circuit = {"open_at_end": False, "opened": 0, "paused_s": 0.0}
    model = {"finished": 0, "failed": {"http_status": 3}, "circuit": circuit}
    warn_server_down({"model": model | {"scripted_failures": {"http_status": 3}}})
    assert capsys.readouterr().err == ""
    warn_server_down({"model": model | {"scripted_failures": {"http_status": 2}}})
    assert "no model request succeeded (1 failed: http_status 1)" in capsys.readouterr().err
    warn_server_down({"model": model})
    assert "no model request succeeded (3 failed: http_status 3)" in capsys.readouterr().err


def test_the_printed_events_schema_says_scripted_is_true_or_absent() -> None:
    """``scripted`` is written only as ``true`` (absent otherwise): ``asyncroll schema events`` said a
    boolean or null, defaulting to null, which no events.jsonl ever holds (a reader filling defaults from
    it would write a null that asyncroll never does)."""
    done = invoke("schema", "events")
    assert done.exit_code == 0, done.output
    scripted = json.loads(done.output)["$defs"]["ModelFailed"]["properties"]["scripted"]
    assert scripted["type"] == "boolean" and scripted["const"] is True, scripted
    assert "anyOf" not in scripted and "default" not in scripted, scripted
    assert "absent otherwise" in scripted["description"]
