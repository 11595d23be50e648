"""A property of ``simulate --from-run``: a simulated run (virtual clock, the simulator's virtual workers)
replayed under the same policy and settings reproduces it.

Generated: 2–8 problems of 1–5 steps mixing tool actions with ``cpu_ms``, ``raises`` and ``worker_dies``,
jobs past a small ``--tool-timeout``, ``error`` steps (random kind, status, message, latency and
``scripted``), final answers and scripts that run out, and one-repair problems whose submissions pass, fail,
declare no verdict, raise or lose their worker; the policies ``fifo``, ``tool_first``, ``asyncroll``,
``sync`` and ``asyncroll_repair``, the three limits, ``--max-turns``, ``--tool-errors`` and a per-job
overhead (the same ``--job-overhead-ms`` given to the replay, as the run's settings do not carry it).
Checked: each trajectory's status, turns, tool calls, verdict, error and duration (to the microsecond events
keep), the makespan, each evaluation's verdict, the failed model requests (trajectory, turn, kind, status,
error, whether a script or a server failed it) and summary.json's ``model.scripted_failures``, the failed
jobs and the jobs that finished with an error, the worker replacements, and no warning that a trajectory
"ended otherwise" or a replacement was "not replayed". Nothing had to be narrowed: every difference the
property found was a defect (the last test here).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from tests.cli_runs import load_run
from tests.conftest import write_workload
from tests.property_runs import PROPS, code_problem
from tests.simulations import simulate_here

pytestmark = [
    pytest.mark.usefixtures("hypothesis_without_local_constants", "versions_read_once"),
    pytest.mark.timeout(300),
]

#: Durations (ms) shared by many steps, so that events often fall on the same virtual instant, and
#: around the tool timeouts drawn below (50 and 100 ms): some jobs time out, most do not.
MS = st.sampled_from([0, 1, 5, 10, 20, 50, 60, 120])
TIMEOUTS = st.sampled_from([None, 0.05, 0.1])
#: A model failure's kind as ``model_failed`` records them, and the HTTP status it may carry.
KINDS = st.sampled_from(["scripted", "timeout", "http_status", "transport"])
STATUSES = st.sampled_from([None, 429, 500, 999])


@st.composite
def tool_step(draw: st.DrawFn, pid: str, turn: int) -> dict[str, Any]:
    name = draw(st.sampled_from(["spin_ms", "sleep_ms", "add"]))
    arguments = {"a": 1, "b": 2} if name == "add" else {"milliseconds": draw(MS)}
    step: dict[str, Any] = {"type": "tool", "name": name, "arguments": arguments, "latency_ms": draw(MS)}
    if draw(st.booleans()):
        step["cpu_ms"] = draw(MS)
    failure = draw(st.sampled_from([None, None, "raises", "worker_dies", "both"]))
    if failure in ("raises", "both"):
        step["raises"] = f"ValueError: boom in {pid} turn {turn}"
    if failure in ("worker_dies", "both"):
        step["worker_dies"] = f"worker died holding {pid} turn {turn}"
    return step


@st.composite
def problem(draw: st.DrawFn, pid: str) -> dict[str, Any]:
    steps = draw(st.integers(1, 5))
    script = [draw(tool_step(pid, turn)) for turn in range(steps - 1)]
    ending = draw(st.sampled_from(["final", "final", "error", "tool", "runs out"]))
    if ending == "final":
        script.append({"type": "final", "answer": draw(st.sampled_from(["7", "8"])), "latency_ms": draw(MS)})
    elif ending == "error":
        error: dict[str, Any] = {"type": "error", "kind": draw(KINDS), "latency_ms": draw(MS)}
        status = draw(STATUSES)
        if status is not None:
            error["status"] = status
        if draw(st.booleans()):
            error["message"] = f"server said no to {pid}"
        if draw(st.booleans()):
            error["scripted"] = False  # a server's failure, as a replay of a real run writes it
        script.append(error)
    elif ending == "tool" or not script:  # one step more, then the script runs out
        script.append(draw(tool_step(pid, steps - 1)))
    out: dict[str, Any] = {
        "id": pid,
        "prompt": f"problem {pid}",
        "tools": [{"name": "spin_ms"}, {"name": "sleep_ms"}, {"name": "add"}],
        "script": script,
    }
    if draw(st.booleans()):
        out["reference_answer"] = "7"
    return out


@st.composite
def workloads(draw: st.DrawFn) -> list[dict[str, Any]]:
    n = draw(st.integers(2, 8))
    return [
        draw(code_problem(f"p{i}", failures=True) if draw(st.integers(0, 3)) == 0 else problem(f"p{i}"))
        for i in range(n)
    ]


@st.composite
def flags(draw: st.DrawFn) -> list[str]:
    out = [
        "--policy",
        draw(st.sampled_from(["fifo", "tool_first", "asyncroll", "sync", "asyncroll_repair"])),
        "--max-active-trajectories",
        str(draw(st.integers(1, 4))),
        "--max-inflight-model-requests",
        str(draw(st.integers(1, 4))),
        "--cpu-workers",
        str(draw(st.integers(1, 3))),
        "--tool-errors",
        draw(st.sampled_from(["fail", "observe"])),
        "--max-turns",
        str(draw(st.integers(1, 6))),
    ]
    timeout = draw(TIMEOUTS)
    if timeout is not None:
        out += ["--tool-timeout", str(timeout)]
    return out


def outcome(folder: Path) -> dict[str, Any]:
    """What a run did, as a replay must reproduce it."""
    _, summary, events = load_run(folder)
    turn_of = {e.job_id: (e.id, e.turn) for e in events if e.event == "cpu_enqueued"}
    return {
        "trajectories": {
            e.id: (e.status, e.turns, e.tool_calls, e.correct, e.error, round(e.duration_s, 6))
            for e in events
            if e.event == "trajectory_finished"
        },
        "makespan_s": round(summary["makespan_s"], 6),
        "verdicts": sorted(
            (*turn_of[e.job_id], e.ok) for e in events if e.event == "cpu_finished" and e.kind == "evaluate"
        ),
        "model_failed": sorted(
            (e.id, e.turn, e.kind, e.status, e.error, e.scripted) for e in events if e.event == "model_failed"
        ),
        "scripted_failures": summary["model"].get("scripted_failures"),
        "cpu_failed": sorted(
            (*turn_of[e.job_id], e.reason, e.error) for e in events if e.event == "cpu_failed"
        ),
        "cpu_errors": sorted(
            (*turn_of[e.job_id], e.error) for e in events if e.event == "cpu_finished" and not e.ok
        ),
        "restarts": sorted(e.reason for e in events if e.event == "worker_restarting"),
    }


@settings(PROPS, max_examples=60)
@given(problems=workloads(), given_flags=flags(), overhead=st.sampled_from(["0", "0", "1.5"]))
def test_a_simulated_run_replayed_under_its_own_settings_is_reproduced(
    problems: list[dict[str, Any]], given_flags: list[str], overhead: str
) -> None:
    with tempfile.TemporaryDirectory(prefix="roundtrip-") as name:
        folder = Path(name)
        workload = write_workload(folder / "w.jsonl", problems)
        run, replay = folder / "run", folder / "replay"
        done = simulate_here(
            "--workload", workload, "--output", run, "--job-overhead-ms", overhead, *given_flags
        )
        assert done.exit_code == 0, done.output
        again = simulate_here("--from-run", run, "--output", replay, "--job-overhead-ms", overhead)
        assert again.exit_code == 0, again.output
        assert "ended otherwise" not in again.stderr, again.stderr
        assert "not replayed" not in again.stderr, again.stderr
        recorded, replayed = outcome(run), outcome(replay)
    for key in recorded:
        assert replayed[key] == recorded[key], key
    event(f"{len(recorded['model_failed'])} model failures")
    event(f"restarts {bool(recorded['restarts'])}")


def test_a_worker_death_replayed_with_a_job_overhead_takes_its_round_trip(tmp_path: Path) -> None:
    """A job whose worker died holding it is measured by its round trip, the run's per-job overhead
    included. The replay wrote that round trip as the job's ``cpu_ms`` and added its own
    ``--job-overhead-ms`` before it: under the run's own 2 ms the death came 2 ms late, and so did the
    end of its trajectory and the makespan. The replay's ``cpu_ms`` is now the round trip less its
    overhead: the death comes when it came in the run."""
    dies: dict[str, Any] = {
        "type": "tool",
        "name": "add",
        "arguments": {"a": 1, "b": 2},
        "latency_ms": 5,
        "cpu_ms": 10,
    }
    problems: list[dict[str, Any]] = [
        {
            "id": "dies",
            "prompt": "p",
            "tools": [{"name": "add"}],
            "script": [{**dies, "worker_dies": "gone"}],
        },
        {
            "id": "ok",
            "prompt": "p",
            "tools": [{"name": "add"}],
            "script": [dies, {"type": "final", "answer": "3"}],
        },
    ]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    run, replay = tmp_path / "run", tmp_path / "replay"
    assert simulate_here("--workload", workload, "--output", run, "--job-overhead-ms", "2").exit_code == 0
    result = simulate_here("--from-run", run, "--output", replay, "--job-overhead-ms", "2")
    assert result.exit_code == 0, result.output
    recorded, replayed = outcome(run), outcome(replay)
    assert recorded["trajectories"]["dies"][:2] == ("failed", 1)
    assert recorded["trajectories"]["dies"][-1] == pytest.approx(0.017)  # 5 ms turn, 2 ms, 10 ms job
    assert replayed == recorded
