"""What a replay reads from a recorded run's ``events.jsonl`` (:mod:`asyncroll.simulation.measured`),
on hand-written events, no run: every measured duration is kept as measured (up to the workload's own
one-day bound), a value of the wrong type is refused, and whatever does not fit the script is refused
naming the events.jsonl line, never a traceback."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from asyncroll.errors import UsageError
from asyncroll.events import SCHEMA_VERSION
from asyncroll.simulation.measured import (
    TIMEOUT_MARGIN_MS,
    Measured,
    check_against_script,
    read_measurements,
)
from asyncroll.workload import MAX_DURATION_MS, Problem
from tests.conftest import tool_problem


def _event(name: str, tid: str | None, **fields: Any) -> dict[str, Any]:
    return {"v": SCHEMA_VERSION, "t": 0.0, "event": name, "id": tid, **fields}


def _tool_turn(
    tid: str, turn: int, job_id: int, latency_s: float = 0.01, execute_s: float = 0.005
) -> list[dict[str, Any]]:
    """A model turn that returned a tool call, and its tool job (``sleep_ms``) that finished."""
    return [
        _event("model_finished", tid, turn=turn, latency_s=latency_s, action="tool"),
        _event("cpu_enqueued", tid, job_id=job_id, kind="tool", tool="sleep_ms", turn=turn),
        _event("cpu_finished", tid, job_id=job_id, kind="tool", execute_s=execute_s),
    ]


def _trajectory(
    tid: str, job_id: int = 1, *, latency_s: float = 0.01, execute_s: float = 0.005
) -> list[dict[str, Any]]:
    """A whole trajectory of :func:`_script` (``tool_problem`` with one tool call): turn 0 the tool call,
    turn 1 the final answer."""
    return [
        _event("trajectory_started", tid),
        *_tool_turn(tid, 0, job_id, latency_s, execute_s),
        _event("model_finished", tid, turn=1, latency_s=latency_s, action="final"),
        _event("trajectory_finished", tid, turns=2),
    ]


def _script(tid: str) -> Problem:
    return Problem.model_validate(tool_problem(tid, model_ms=10, cpu_ms=5))


def _measure(run: Path, events: list[dict[str, Any]], timeout_s: float = 1.0) -> Measured:
    run.mkdir(exist_ok=True)
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return read_measurements(run, timeout_s)


def _refusal(run: Path, events: list[dict[str, Any]], pid: str = "p") -> str:
    """The message of the refusal of ``events`` (read, then checked against ``pid``'s script)."""
    with pytest.raises(UsageError) as refused:
        check_against_script(_script(pid), pid, _measure(run, events))
    return str(refused.value)


def test_a_measured_duration_of_exactly_one_day_is_kept_as_the_workload_allows(tmp_path: Path) -> None:
    """The workload's bound on a scripted duration (``le`` one day) is the replay's bound: a latency or an
    execute time of exactly one day is a duration the replay can run, one just past it is refused."""
    day_s = MAX_DURATION_MS / 1000.0
    measured = _measure(tmp_path, _trajectory("p", latency_s=day_s, execute_s=day_s))
    assert measured.model[("p", 0)] == day_s and measured.cpu[("p", 0)] == MAX_DURATION_MS
    past = _trajectory("p", latency_s=day_s + 0.001)
    with pytest.raises(UsageError, match=r"events\.jsonl:2: 'model_finished' has latency_s 86400\.001"):
        _measure(tmp_path, past)


@pytest.mark.parametrize("name", ["turn", "job_id"])
def test_a_bool_where_an_integer_belongs_is_refused_not_read_as_one(tmp_path: Path, name: str) -> None:
    """``true`` is a Python int: read as turn 1 (or job 1) it would put a measurement at another turn."""
    events = _trajectory("p")
    line = 2 if name == "turn" else 3  # the model_finished of turn 0, the cpu_enqueued of its job
    events[line - 1][name] = True
    with pytest.raises(UsageError, match=rf"events\.jsonl:{line}: '\w+' lacks a valid '{name}'$"):
        _measure(tmp_path, events)


def test_a_run_dir_without_events_is_refused_saying_why_in_words(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as refused:
        read_measurements(tmp_path, 1.0)
    assert str(refused.value) == f"--from-run {tmp_path}: cannot read events.jsonl: No such file or directory"


def test_of_several_jobs_left_without_an_end_the_first_is_named(tmp_path: Path) -> None:
    """The refusal names the earliest cpu_enqueued line left open, whatever order the jobs were in."""
    events = [
        _event("trajectory_started", "a"),
        _event("trajectory_started", "b"),
        _event("cpu_enqueued", "b", job_id=7, kind="tool", tool="sleep_ms", turn=0),
        _event("cpu_enqueued", "a", job_id=3, kind="tool", tool="sleep_ms", turn=0),
    ]
    with pytest.raises(UsageError, match=r"events\.jsonl:3: tool job 7 \('sleep_ms'\) of 'b' turn 0 has no"):
        _measure(tmp_path, events)


def test_start_ups_of_replacements_still_starting_or_failed_are_replayed_as_they_were(tmp_path: Path) -> None:
    """A failed start attempt (its worker restarted again) takes nothing; a replacement still starting at
    the end of the measured window takes the rest of it, never less and never more."""
    measured = Measured(tmp_path / "events.jsonl", end=9.5)
    measured.restarts = [(2, 1), (2, 2), (3, 1)]  # worker 2's first attempt failed; its second still starts
    measured.restarted_at = {(2, 1): 2.0, (2, 2): 9.0, (3, 1): 9.2}
    measured.ready = {(2, 0): 0.1, (3, 0): 0.2, (3, 1): 0.3}
    assert measured.replacement_startup() == (0.5, 0.3)


def test_a_job_one_turn_past_the_script_is_refused_naming_its_line(tmp_path: Path) -> None:
    events = _trajectory("p")
    events[-1:-1] = [
        _event("cpu_enqueued", "p", job_id=2, kind="tool", tool="sleep_ms", turn=2),
        _event("cpu_finished", "p", job_id=2, kind="tool", execute_s=0.001),
    ]
    message = _refusal(tmp_path, events)
    assert re.search(r"events\.jsonl:6: tool job 2 \('sleep_ms'\) of 'p' turn 2 does not fit", message)
    assert "which has no action at that turn" in message


@pytest.mark.parametrize("ending", ["model_finished", "model_failed"])
def test_a_request_one_turn_past_the_script_is_refused_unless_the_script_ran_out(
    tmp_path: Path, ending: str
) -> None:
    """The run asks once past the end of a script that ran out (``script_exhausted``); any other request
    there is not the script's."""
    events = _trajectory("p")
    past = {"action": "final"} if ending == "model_finished" else {"kind": "http_error"}
    events[-1] = _event(ending, "p", turn=2, latency_s=0.01, **past)
    message = _refusal(tmp_path, events)
    assert re.search(
        r"events\.jsonl:6: 'p' turn 2 is past the end of its script in the workload \(2 a", message
    )
    events[-1]["kind"] = "script_exhausted"
    events[-1].pop("action", None)
    events[-1]["event"] = "model_failed"
    check_against_script(_script("p"), "p", _measure(tmp_path, events))


def test_a_first_turn_without_its_request_is_refused_naming_the_next(tmp_path: Path) -> None:
    events = [e for e in _trajectory("p") if not (e["event"] == "model_finished" and e["turn"] == 0)]
    message = _refusal(tmp_path, events)
    assert re.search(r"events\.jsonl:4: 'p' turn 1 is recorded but turn 0 has no model_finished", message)


def test_a_tool_turn_the_run_went_past_needs_its_job_and_a_failed_one_does_not(tmp_path: Path) -> None:
    """A tool call followed by the next turn ran a job; a request that failed at a tool turn ended the
    trajectory there, and no job exists to miss."""
    events = [e for e in _trajectory("p") if not e["event"].startswith("cpu_")]
    message = _refusal(tmp_path, events)
    assert re.search(
        r"events\.jsonl:2: 'p' turn 0 returned a 'tool' action and the run went on to turn 1", message
    )
    failed = [
        _event("trajectory_started", "p"),
        _event("model_failed", "p", turn=0, latency_s=0.02, kind="http_error"),
        _event("trajectory_finished", "p", turns=1),
    ]
    measured = _measure(tmp_path, failed)
    check_against_script(_script("p"), "p", measured)
    assert measured.model == {("p", 0): 0.02} and measured.cpu == {}


def test_a_job_whose_worker_died_is_replayed_for_as_long_as_it_ran(tmp_path: Path) -> None:
    """Its round trip (until the death) is all that was measured: kept in milliseconds as recorded, while a
    timed-out job takes just over the run's timeout whatever its round trip."""
    events = _trajectory("p")
    events[3] = _event("cpu_failed", "p", job_id=1, kind="tool", reason="worker_died", roundtrip_s=0.2504567)
    assert _measure(tmp_path, events, timeout_s=0.3).cpu == {("p", 0): 250.4567}
    events[3] = {**events[3], "reason": "timeout", "roundtrip_s": 0.3204567}
    assert _measure(tmp_path, events, timeout_s=0.3).cpu == {("p", 0): 300.001}


def test_a_timed_out_job_is_refused_where_its_replay_would_run_past_one_day(tmp_path: Path) -> None:
    """Just over the run's timeout must be a duration the replay can run: up to one day exactly."""
    events = _trajectory("p")
    events[3] = _event("cpu_failed", "p", job_id=1, kind="tool", reason="timeout", roundtrip_s=0.5)
    longest = (MAX_DURATION_MS - TIMEOUT_MARGIN_MS) / 1000.0
    assert _measure(tmp_path, events, timeout_s=longest).cpu == {("p", 0): MAX_DURATION_MS}
    with pytest.raises(UsageError, match=r"events\.jsonl:4: tool job 1 .* timed out, but run\.json's config"):
        _measure(tmp_path, events, timeout_s=100_000.0)
