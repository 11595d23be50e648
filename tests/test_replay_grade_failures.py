"""A replay (``simulate --from-run``) of a run whose grade job failed: a grade job is implicit in the
workload (no action carries its cost or its worker's death), so the replay grades the final answer in
0 s. Its worker's replacement is said and recorded as not replayed, named by what it followed (a grade
job's timeout or death, not a death while idle), and the trajectory that failed in the run, completed in
the replay, is put down to that grade job, not to a setting the replay changed. The recorded run is a
real one (real workers, a grade job past a 10 µs tool timeout), made once for the module."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from asyncroll.commands.simulate_flags import why_ended_otherwise
from tests.conftest import invoke
from tests.simulations import _edit_lines, simulate_here

GRADED = {
    "id": "g",
    "prompt": "p",
    "reference_answer": "42",
    "script": [{"type": "final", "answer": "42", "latency_ms": 5}],
}
TOOL = {
    "id": "t",
    "prompt": "p",
    "tools": [{"name": "sleep_ms"}],
    "script": [
        {"type": "tool", "name": "sleep_ms", "arguments": {"milliseconds": 5}, "latency_ms": 5},
        {"type": "final", "answer": "x", "latency_ms": 5},
    ],
}


@pytest.fixture(scope="module")
def grade_timed_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run under a 10 µs tool timeout: ``g``'s grade job and ``t``'s tool job both time out (no
    real worker answers that soon), each worker replaced; ``g`` fails, ``t`` observes its error."""
    tmp = tmp_path_factory.mktemp("grade")
    workload = tmp / "w.jsonl"
    workload.write_text("".join(json.dumps(p) + "\n" for p in (GRADED, TOOL)))
    args = ["--tool-timeout", "0.00001", "--tool-errors", "observe", "--cpu-workers", "2", "--no-progress"]
    result = invoke("run", "--workload", workload, "--output", tmp / "run", *args)  # real workers, here
    assert result.exit_code == 0, result.stderr
    failed = [json.loads(line) for line in (tmp / "run" / "events.jsonl").read_text().splitlines()]
    failed = [e for e in failed if e["event"] == "cpu_failed"]
    assert sorted((e["kind"], e["reason"]) for e in failed) == [("grade", "timeout"), ("tool", "timeout")]
    return tmp / "run"


def _replayed(run: Path, out: Path, *args: str) -> tuple[str, dict[str, Any]]:
    result = simulate_here("--from-run", run, "--output", out, *args)
    assert result.exit_code == 0, result.output
    return result.stderr, json.loads((out / "run.json").read_text())["simulation"]["replayed"]


@pytest.mark.timeout(120)
def test_a_grade_jobs_timeout_is_said_not_replayed_and_ends_its_trajectory_otherwise(
    grade_timed_out: Path, tmp_path: Path
) -> None:
    """The grade job's timeout and its worker's replacement were not replayed, and nothing said so (a
    timeout was left out as always replayed); the trajectory it failed completed in the replay, put down to
    "later turns" the replay did not reproduce (it has none)."""
    stderr, replayed = _replayed(grade_timed_out, tmp_path / "replay")
    assert replayed["restarts_not_replayed"] == {"timeout": 1}
    assert replayed["ended_otherwise"] == {"failed → completed": 1}
    assert (
        "1 worker replacement(s) of the run not replayed (timeout: 1), nor their start-up: after a " in stderr
    )
    assert "a grade job's timeout ×1" in stderr and "killed from outside" not in stderr
    assert (
        "1 failed in the run when the grade job of its final answer failed (timeout ×1), which the replay "
        "cannot reproduce: it graded the answer" in stderr
    )
    assert "later turns" not in stderr, stderr


@pytest.mark.timeout(120)
def test_a_longer_tool_timeout_is_not_said_to_end_a_failed_grade_otherwise(
    grade_timed_out: Path, tmp_path: Path
) -> None:
    """Under a longer --tool-timeout the tool job finishes: its replacement is the setting's doing, not
    counted; the grade job's still is. The failed grade's trajectory was put down to the setting alone."""
    stderr, replayed = _replayed(grade_timed_out, tmp_path / "replay", "--tool-timeout", "5")
    assert replayed["restarts_not_replayed"] == {"timeout": 1}
    assert "changed where they end" not in stderr, stderr
    assert "grade job of its final answer failed (timeout ×1), which the replay cannot reproduce" in stderr


@pytest.mark.timeout(120)
def test_a_death_holding_a_grade_job_is_not_said_to_be_a_death_while_idle(
    grade_timed_out: Path, tmp_path: Path
) -> None:
    """The grade job's worker died holding it (its events edited so): the warning said the replacement
    followed "a worker's death while idle (killed from outside) or memory replacement"."""
    run = tmp_path / "run"
    shutil.copytree(grade_timed_out, run)

    def died(lines: list[str]) -> list[str]:
        out, worker = [], None
        for line in lines:
            event = json.loads(line)
            if event["event"] == "cpu_failed" and event["kind"] == "grade":
                event["reason"], worker = "worker_died", event["worker"]
            elif event["event"] == "worker_restarting" and event["worker"] == worker:
                event["reason"], worker = "died", None
            out.append(json.dumps(event) + "\n")
        return out

    _edit_lines(run / "events.jsonl", died)
    stderr, replayed = _replayed(run, tmp_path / "replay")
    assert replayed["restarts_not_replayed"] == {"died": 1}
    assert "after a death holding a grade job ×1" in stderr and "idle" not in stderr, stderr
    assert "grade job of its final answer failed (worker_died ×1)" in stderr


def test_a_change_a_changed_max_turns_cannot_explain_is_said_not_reproduced() -> None:
    """Under a changed --max-turns, only the setting was named, also for a trajectory that went from
    failed to completed (which no --max-turns does): now the rest is said not reproduced, counted."""
    changes = {"completed → max_turns": 2, "failed → completed": 1}
    why = why_ended_otherwise(changes, {"max_turns": 8}, {"max_turns": 2})
    assert why.startswith("the replay's --max-turns 2 (the run's: 8) changed where they end; ")
    assert "did not reproduce how the run ended 1 of them (--max-turns changes only an ending at" in why
    alone = why_ended_otherwise({"completed → max_turns": 2}, {"max_turns": 8}, {"max_turns": 2})
    assert alone == "the replay's --max-turns 2 (the run's: 8) changed where they end"
    nothing = why_ended_otherwise({"failed → completed": 1}, {"max_turns": 8}, {"max_turns": 8})
    assert nothing.startswith("the replay did not reproduce how the run ended them, so")


@pytest.mark.timeout(120)
def test_a_grade_jobs_timeout_is_not_hidden_by_a_replays_own_tool_timeouts(
    grade_timed_out: Path, tmp_path: Path
) -> None:
    """The tool job finished in 5 ms in the run (its events edited so); a replay under a 1 µs
    --tool-timeout times it out instead: one timeout each, yet the grade job's is still not replayed."""
    run = tmp_path / "run"
    shutil.copytree(grade_timed_out, run)

    def finished(lines: list[str]) -> list[str]:
        out, worker = [], None
        for line in lines:
            event = json.loads(line)
            if event["event"] == "cpu_failed" and event["kind"] == "tool":
                worker = event["worker"]
                kept = {k: event[k] for k in ("v", "t", "id", "job_id", "worker", "kind", "tool")}
                event = {**kept, "event": "cpu_finished", "ok": True, "execute_s": 0.005, "cpu_s": None}
                event["roundtrip_s"] = 0.006
            elif worker is not None and event.get("worker") == worker and event.get("generation") == 1:
                continue  # its worker's replacement: it was never replaced
            out.append(json.dumps(event) + "\n")
        return out

    _edit_lines(run / "events.jsonl", finished)
    stderr, replayed = _replayed(run, tmp_path / "replay", "--tool-timeout", "0.000001")
    assert replayed["restarts_not_replayed"] == {"timeout": 1}
    assert "after a grade job's timeout ×1" in stderr, stderr


def test_a_failed_grade_the_replay_never_reached_is_not_put_down_to_its_grade(tmp_path: Path) -> None:
    """Under a lower --max-turns the replay stopped the trajectory before its final answer (failed →
    max_turns): it never graded that answer, yet the grade job's failure was named as why it ended
    otherwise ("it graded the answer"), besides the setting that did end it."""
    from asyncroll.simulation.replay_changes import grade_failures

    run, replay = tmp_path / "run", tmp_path / "replay"
    for folder, status, turns in ((run, "failed", 3), (replay, "max_turns", 2)):
        folder.mkdir()
        (folder / "results.jsonl").write_text(
            json.dumps({"id": "g", "status": status, "turns": turns}) + "\n"
        )
    failed = {"v": 1, "t": 1.0, "event": "cpu_failed", "id": "g", "job_id": 1, "worker": 0, "kind": "grade"}
    failed |= {"tool": "__grade__", "reason": "timeout", "roundtrip_s": 1.0, "error": "ran past"}
    (run / "events.jsonl").write_text(json.dumps(failed) + "\n")
    assert grade_failures(run, replay) == {}
    why = why_ended_otherwise({"failed → max_turns": 1}, {"max_turns": 8}, {"max_turns": 2}, {})
    assert why == "the replay's --max-turns 2 (the run's: 8) changed where they end"
    (replay / "results.jsonl").write_text(json.dumps({"id": "g", "status": "completed", "turns": 3}) + "\n")
    assert grade_failures(run, replay) == {"timeout": 1}  # graded in the replay: its grade is why


#: A tool job's timeout as a worker says it: a real one names its process (``pid``) and says its tree was
#: killed; a virtual one (a replay's) has neither, and says so. The rest is the same words.
TIMED_OUT = re.compile(
    r"worker \d+ \((?P<who>pid \d+|virtual: no process)\) job \d+ \(sleep_ms\) ran past 1e-05s; "
    r"(?P<killed>its process tree|the worker) was killed"
)


@pytest.mark.timeout(120)
def test_a_tool_jobs_timeout_reads_in_the_replay_as_in_the_run(grade_timed_out: Path, tmp_path: Path) -> None:
    """The run's worker said "worker N (pid P) job J (sleep_ms) ran past 1e-05s; its process tree was
    killed"; the replay's virtual worker said "job J (sleep_ms) exceeded the 1e-05s tool timeout", so
    failures grouped by their text fell apart into two groups between run and replay. It now says the
    run's words but for what a virtual worker lacks (a pid, a process tree)."""
    _replayed(grade_timed_out, tmp_path / "replay")

    def timeouts(run: Path) -> list[re.Match[str] | None]:
        events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
        return [
            TIMED_OUT.fullmatch(e["error"])
            for e in events
            if e["event"] == "cpu_failed" and e["kind"] == "tool"
        ]

    (recorded,) = timeouts(grade_timed_out)
    (replayed,) = timeouts(tmp_path / "replay")
    assert recorded is not None and recorded["who"].startswith("pid "), recorded
    assert recorded["killed"] == "its process tree"
    assert replayed is not None, replayed
    assert (replayed["who"], replayed["killed"]) == ("virtual: no process", "the worker")
