"""Property-based tests of the runtime's books when generated workloads fail (``tests/test_properties.py``
checks workloads that mostly succeed): tool jobs, evaluations and grade jobs that run past the tool
timeout (their worker killed and replaced), scripts that run out (a model failure), under both
``--tool-errors``, run through the real runtime on the simulator's virtual clock.

A simulation can express these failures only: a file tool is never run there (docs/SIMULATION.md), so a
tool that
raises or kills its worker is checked against a real run (the last test).

Checked, besides the invariants of ``tests/test_properties.py``: every failure is counted once in the
summary under its own name (``model.failed`` by kind, ``tools.failures`` by reason,
``workers.restarts_by_reason``), each timed-out job's worker is replaced once, each job and request has
exactly one end event, each failure stays in its trajectory (the others end as their scripts say, with
the error their failure names), ``results.jsonl`` says what the events say, and the run is ``complete``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from asyncroll.simulation.engine import SimulationSettings
from tests.property_runs import PROPS, SERVERS, run_settings, workloads
from tests.test_properties import (
    EVENT_SCHEMAS,
    check_decisions,
    check_lifecycles,
    check_limits,
    check_summary,
)

pytestmark = pytest.mark.usefixtures("hypothesis_without_local_constants", "versions_read_once")

#: Job costs around the timeouts drawn below: many jobs time out, many do not.
FAULTY_MS = st.sampled_from([0, 10, 40, 60, 120, 200, 400])


@st.composite
def faulty_settings(draw: st.DrawFn) -> dict[str, Any]:
    """``run_settings`` with a tool timeout always: 2 ms (with a job overhead, even a grade job of 0 s
    times out), 50 ms or 150 ms."""
    out = draw(run_settings())
    out["tool_timeout"] = draw(st.sampled_from([0.002, 0.05, 0.15]))
    return out


def expected(
    problems: list[dict[str, Any]], values: dict[str, Any], job_overhead_s: float
) -> dict[str, dict[str, Any]]:
    """Each trajectory's ending from its script: status, turns, tool calls, verdict, the start of its
    error (None when it has none) and the reasons of its failed jobs, in order."""
    timeout = values["tool_timeout"]
    out = {}
    for problem in problems:
        turns, calls, status, correct, error = 0, 0, "max_turns", None, None
        failed: list[str] = []
        for action in problem["script"][: values["max_turns"]]:
            turns += 1
            if action["type"] == "final":
                status = "completed"
                if "reference_answer" in problem:
                    if job_overhead_s > timeout:  # the grade job of 0 s times out
                        status, error = "failed", "grading failed: "
                        failed.append("timeout")
                    else:
                        correct = " ".join(action["answer"].split()) == problem["reference_answer"]
                break
            cost = action.get("cpu_ms", action.get("arguments", {}).get("milliseconds", 0)) / 1000
            timed_out = cost + job_overhead_s > timeout
            if timed_out:
                failed.append("timeout")
            if action["type"] == "submit":
                if timed_out:
                    status, error = "failed", "evaluation failed: "
                    break
                correct = action.get("passes") is not False
                if correct or turns == 2:
                    status = "completed"
                    break
                continue
            calls += 1
            if timed_out and values["tool_errors"] == "fail":
                status, error = "failed", f"tool '{action['name']}' failed: "
                break
        else:
            if turns < values["max_turns"]:
                turns += 1
                status, error = "failed", "model script_exhausted: "
        out[problem["id"]] = {
            "status": status,
            "turns": turns,
            "tool_calls": calls,
            "correct": correct,
            "error": error,
            "failed_jobs": failed,
        }
    return out


def simulate_faulty(
    folder: Path, problems: list[dict[str, Any]], values: dict[str, Any], server: SimulationSettings
) -> tuple[Any, dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    from asyncroll.config import build_config
    from asyncroll.simulation.engine import simulate
    from tests.conftest import write_workload

    workload = write_workload(folder / "w.jsonl", problems)
    out = folder / "run"
    outcome = simulate(build_config({"workload": workload, "output": out, **values}), server, ["test"])
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    events = [json.loads(line) for line in (out / "events.jsonl").read_text(encoding="utf-8").splitlines()]
    results = [json.loads(line) for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines()]
    return outcome, summary, events, results


def check_failure_counts(summary: dict[str, Any], events: list[dict[str, Any]]) -> None:
    """The summary counts each failure and restart the events show once, under its name."""
    model_failed = Counter(e["kind"] for e in events if e["event"] == "model_failed")
    assert summary["model"]["failed"] == dict(model_failed)
    assert summary["model"]["requests"] == model_failed.total() + sum(
        e["event"] == "model_finished" for e in events
    )
    cpu_failed = [e for e in events if e["event"] == "cpu_failed"]
    assert summary["tools"]["failures"] == dict(Counter(e["reason"] for e in cpu_failed))
    restarts = Counter(e["reason"] for e in events if e["event"] == "worker_restarting")
    assert summary["workers"]["restarts_by_reason"] == dict(restarts)
    assert summary["workers"]["restarts"] == restarts.total()
    tool_ends = [e for e in events if e["event"] in ("cpu_finished", "cpu_failed") and e["kind"] == "tool"]
    assert summary["tools"]["calls"] == len(tool_ends)


def check_failure_books(
    summary: dict[str, Any], events: list[dict[str, Any]], results: list[dict[str, Any]]
) -> None:
    """Every failure counted once under its name; each job and request ends once; each worker whose job
    timed out is replaced once; results.jsonl holds each trajectory's ending once."""
    check_failure_counts(summary, events)
    by: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        by.setdefault(e["event"], []).append(e)
    assert summary["model"]["failed"] == dict(Counter(e["kind"] for e in by.get("model_failed", [])))
    assert summary["tools"]["failures"] == dict(Counter(e["reason"] for e in by.get("cpu_failed", [])))
    restarts = by.get("worker_restarting", [])
    assert summary["workers"]["restarts_by_reason"] == dict(Counter(e["reason"] for e in restarts))
    assert summary["workers"]["restarts"] == len(restarts)
    # one end event per job and per request
    job_ends = Counter(e["job_id"] for e in by.get("cpu_finished", []) + by.get("cpu_failed", []))
    assert job_ends == Counter(e["job_id"] for e in by.get("cpu_enqueued", [])), job_ends
    request_ends = Counter(e["request_id"] for e in by.get("model_finished", []) + by.get("model_failed", []))
    assert request_ends == Counter(e["request_id"] for e in by.get("model_enqueued", [])), request_ends
    # a timed-out job's worker is replaced (one worker_restarting with reason timeout), and no other
    timed_out = [e for e in by.get("cpu_failed", []) if e["reason"] == "timeout"]
    assert len(timed_out) == sum(e["reason"] == "timeout" for e in restarts), (timed_out, restarts)
    tools = summary["tools"]
    tool_failed = sum(e["kind"] == "tool" for e in by.get("cpu_failed", []))
    if tools["calls"]:
        assert tools["error_rate"] == pytest.approx(
            (tools["errors"] + tool_failed) / tools["calls"], abs=1e-6
        )
    ended = {e["id"]: e for e in by["trajectory_finished"]}
    assert len(results) == len(ended) == len({r["id"] for r in results})
    for r in results:
        e = ended[r["id"]]
        assert {k: r[k] for k in ("status", "turns", "tool_calls", "correct", "error")} == {
            k: e[k] for k in ("status", "turns", "tool_calls", "correct", "error")
        }, (r, e)


@settings(PROPS, max_examples=40)
@given(problems=workloads(cpu=FAULTY_MS), values=faulty_settings(), server=SERVERS)
def test_a_simulated_run_whose_jobs_and_scripts_fail_keeps_its_books(
    problems: list[dict[str, Any]], values: dict[str, Any], server: SimulationSettings
) -> None:
    with tempfile.TemporaryDirectory(prefix="faultprops-") as folder:
        outcome, summary, events, results = simulate_faulty(Path(folder), problems, values, server)
    assert outcome.status == "complete", outcome.error  # failed trajectories do not fail the run
    for e in events:
        EVENT_SCHEMAS[e["event"]].validate(e)
    peaks = check_limits(events, values)
    check_lifecycles(events)
    check_decisions(events, values)
    check_summary(summary, events, peaks)
    check_failure_books(summary, events, results)
    want = expected(problems, values, server.job_overhead_ms / 1000)
    failed_jobs: dict[str, list[str]] = {}
    for e in events:
        if e["event"] == "cpu_failed":
            failed_jobs.setdefault(e["id"], []).append(e["reason"])
    for e in events:
        if e["event"] != "trajectory_finished":
            continue
        w = want[e["id"]]
        got = {k: e[k] for k in ("status", "turns", "tool_calls", "correct")}
        assert got == {k: w[k] for k in got}, (e, w)
        assert failed_jobs.get(e["id"], []) == w["failed_jobs"], (e, w, failed_jobs.get(e["id"]))
        if w["error"] is None:
            assert e["error"] is None, (e, w)
        else:
            assert e["error"] is not None and e["error"].startswith(w["error"]), (e, w)
            event(" ".join(w["error"].split(" ")[:2]))


TOOLS = """import os, time
def boom(x: int) -> int:
    raise ValueError(f"boom {x}")
def die(x: int) -> int:
    os._exit(9)
def hang(x: int) -> int:
    time.sleep(100)
    return x
"""


@pytest.mark.parametrize("tool_errors", ["fail", "observe"])
def test_a_real_run_whose_tools_raise_die_and_hang_keeps_its_books(tmp_path: Path, tool_errors: str) -> None:
    """The same books in a real run (real workers) with what a simulation cannot express: a tool that
    raises, one that kills its worker and one that hangs past the tool timeout, beside scripts that run
    out and trajectories that succeed."""
    from tests.conftest import write_workload

    (tmp_path / "tools.py").write_text(TOOLS, encoding="utf-8")
    declared = [
        {"name": n, "inputs": {"x": "int"}, "implementation": "tools.py"} for n in ("boom", "die", "hang")
    ]
    tools = [*declared, {"name": "add"}]

    def tool(name: str) -> dict[str, Any]:
        args = {"a": 1, "b": 2} if name == "add" else {"x": 1}
        return {"type": "tool", "name": name, "arguments": args}

    final = {"type": "final", "answer": "3"}
    scripts = {
        "ok": [tool("add"), final],
        "raise": [tool("boom"), final],
        "die": [tool("die"), tool("add"), final],
        "hang": [tool("hang"), final],
        "exhaust": [tool("add")],
        "ok2": [tool("add"), tool("add"), final],
    }
    problems = [
        {"id": pid, "prompt": "p", "tools": tools, "reference_answer": "3", "script": script}
        for pid, script in scripts.items()
    ]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    out = tmp_path / "run"
    flags = ["--tool-timeout", "1", "--no-telemetry", "--max-turns", "4", "--tool-errors", tool_errors]
    args = ["run", "--workload", str(workload), "--output", str(out), *flags]
    if tool_errors == "fail":  # as a user runs it, in an interpreter of its own
        done = subprocess.run(
            [sys.executable, "-m", "asyncroll", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        code, stderr = done.returncode, done.stderr
    else:  # the same books in this process (its workers are processes all the same): seconds less
        from tests.conftest import invoke

        ran = invoke(*args)
        code, stderr = ran.exit_code, ran.stderr
    assert code == 0, stderr  # failed trajectories do not fail the run
    assert json.loads((out / "run.json").read_text(encoding="utf-8"))["status"] == "complete"
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    events = [json.loads(line) for line in (out / "events.jsonl").read_text(encoding="utf-8").splitlines()]
    results = [json.loads(line) for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines()]
    for e in events:
        EVENT_SCHEMAS[e["event"]].validate(e)
    check_lifecycles(events)
    check_failure_books(summary, events, results)
    assert summary["model"]["failed"] == {"script_exhausted": 1}
    assert summary["tools"]["failures"] == {"worker_died": 1, "timeout": 1}
    assert summary["workers"]["restarts_by_reason"] == {"died": 1, "timeout": 1}
    assert summary["tools"]["errors"] == 1
    ended = {r["id"]: r for r in results}
    assert ended["ok"]["status"] == ended["ok2"]["status"] == "completed"
    assert ended["exhaust"]["error"].startswith("model script_exhausted: ")
    if tool_errors == "fail":
        assert ended["raise"]["error"] == "tool 'boom' failed: ValueError: boom 1"
        assert ended["die"]["error"].startswith("tool 'die' failed: worker ")
        assert ended["hang"]["error"].startswith("tool 'hang' failed: worker ")
        assert ended["hang"]["error"].endswith("ran past 1s; its process tree was killed")
    else:  # each failure handed back to the model, whose script goes on to its answer
        assert {ended[pid]["status"] for pid in ("raise", "die", "hang")} == {"completed"}


@settings(PROPS, max_examples=25)
@given(
    problems=workloads(cpu=FAULTY_MS),
    values=faulty_settings(),
    server=SERVERS,
    stop_at=st.sampled_from([0.0, 0.001, 0.05, 0.2, 0.5]),
)
def test_a_simulation_stopped_midway_ends_every_job_and_request_once(
    problems: list[dict[str, Any]], values: dict[str, Any], server: SimulationSettings, stop_at: float
) -> None:
    """A simulation stopped by SIGTERM ``stop_at`` virtual seconds into its measured window (trajectories
    cancelled mid-way): every job and request that started has exactly one end event (``cancelled`` for
    those the stop cut; one still queued has none, MEASUREMENT.md), the summary counts the failures and
    restarts the events show, every event validates, time never goes backwards, and the run is
    ``interrupted`` (exit code 130, as its ``measurement_finished`` says) or, stopped after every
    trajectory ended, ``complete``."""
    import asyncio
    import signal
    from unittest import mock

    from asyncroll.config import build_config
    from asyncroll.event_log import EventLog
    from asyncroll.simulation import engine
    from tests.conftest import write_workload

    start = EventLog.start_measurement

    def stop_later(log: EventLog) -> float:  # the stop is timed from the measured window's start
        asyncio.get_running_loop().call_later(stop_at, signal.raise_signal, signal.SIGTERM)
        return start(log)

    with tempfile.TemporaryDirectory(prefix="faultprops-") as folder:
        workload = write_workload(Path(folder) / "w.jsonl", problems)
        out = Path(folder) / "run"
        cfg = build_config({"workload": workload, "output": out, **values})
        with mock.patch.object(EventLog, "start_measurement", stop_later):
            outcome = engine.simulate(cfg, server, ["test"], signals=True)
        text = (out / "events.jsonl").read_text(encoding="utf-8")
        receipt = json.loads((out / "run.json").read_text(encoding="utf-8"))
        summary_text = (out / "summary.json").read_text(encoding="utf-8")
    events = [json.loads(line) for line in text.splitlines()]
    assert outcome.status in ("interrupted", "complete"), outcome.error
    assert receipt["status"] == outcome.status
    assert outcome.exit_code == (130 if outcome.status == "interrupted" else 0)
    for e in events:
        EVENT_SCHEMAS[e["event"]].validate(e)
    times = [e["t"] for e in events]
    assert times == sorted(times)
    # every job and request that started ends once; one still queued was never sent (MEASUREMENT.md)
    for key, begun, ends in (
        ("job_id", "cpu_started", ("cpu_finished", "cpu_failed")),
        ("request_id", "model_started", ("model_finished", "model_failed")),
    ):
        ended = Counter(e[key] for e in events if e["event"] in ends)
        assert set(ended.values()) <= {1}, ended
        assert set(ended) == {e[key] for e in events if e["event"] == begun}, (key, ended)
    summary = json.loads(summary_text)
    check_failure_counts(summary, events)
    (end,) = [e for e in events if e["event"] == "measurement_finished"]
    assert end["status"] == outcome.status
    event(outcome.status)
