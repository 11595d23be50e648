"""A replay (``simulate --from-run``) against the workload's script: every measurement of the run fits the
script, or the replay is refused naming the events.jsonl line; a run that ran out of script or turns
still replays exactly, a killed one is refused for its status; a trajectory that ends otherwise than in
the run is counted, and a workload refused is named by the run's own workload lines. The recorded run
to edit is simulated once for the module (``two_tools``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncroll.clock import VirtualClock
from asyncroll.config import build_config
from asyncroll.errors import WorkerDied
from asyncroll.runtime.run import Run, prepare
from asyncroll.runtime.virtual_worker import VirtualWorker, builtin_duration, virtual_factory
from asyncroll.workers.process import CallResult
from asyncroll.workers.protocol import JobRequest
from tests.cli_runs import load_run
from tests.conftest import tool_problem, write_workload
from tests.simulations import _edit_json, simulate_here


@pytest.fixture(scope="module")
def two_tools(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A completed run of two problems, each two tool calls then a final (turns 0, 1: tool; 2: final)."""
    tmp = tmp_path_factory.mktemp("fits")
    problems = [tool_problem(f"p{i}", model_ms=10, cpu_ms=5 + i, turns=2) for i in range(2)]
    workload = write_workload(tmp / "w.jsonl", problems)
    result = simulate_here("--workload", workload, "--output", tmp / "run")
    assert result.exit_code == 0, result.output
    return tmp / "run"


Edit = tuple[list[dict[str, Any]], int]  # the edited events, and the line (1-based) the refusal names


def _line(events: list[dict[str, Any]], kind: str, **match: Any) -> int:
    """The index of the one event of ``kind`` whose fields include ``match``."""
    found = [
        i for i, e in enumerate(events) if e["event"] == kind and all(e.get(k) == v for k, v in match.items())
    ]
    assert len(found) == 1, (kind, match, found)
    return found[0]


def _job(events: list[dict[str, Any]], tid: str, turn: int) -> int:
    return int(events[_line(events, "cpu_enqueued", id=tid, turn=turn)]["job_id"])


def _no_cpu_finished(events: list[dict[str, Any]]) -> Edit:
    del events[_line(events, "cpu_finished", job_id=_job(events, "p0", 1))]
    return events, _line(events, "cpu_enqueued", id="p0", turn=1) + 1


def _cancelled(events: list[dict[str, Any]]) -> Edit:
    i = _line(events, "cpu_finished", job_id=_job(events, "p0", 1))
    e = events[i]
    events[i] = {
        key: e[key] for key in ("v", "t", "id", "job_id", "worker", "kind", "tool", "roundtrip_s")
    } | {"event": "cpu_failed", "reason": "cancelled", "error": "the run was stopped"}
    return events, i + 1


def _turn_past_the_script(events: list[dict[str, Any]]) -> Edit:
    i = _line(events, "model_finished", id="p0", turn=2)
    events[i]["turn"] = 5
    return events, i + 1


def _turns_swapped(events: list[dict[str, Any]]) -> Edit:
    first, last = (
        _line(events, "model_finished", id="p0", turn=0),
        _line(events, "model_finished", id="p0", turn=2),
    )
    events[first]["turn"], events[last]["turn"] = 2, 0
    return events, last + 1  # now turn 0, returning the final the script has at turn 2


def _job_at_a_wrong_turn(events: list[dict[str, Any]]) -> Edit:
    i = _line(events, "cpu_enqueued", id="p0", turn=1)
    events[i]["turn"] = 2
    return events, i + 1


def _a_turn_without_its_request(events: list[dict[str, Any]]) -> Edit:
    del events[_line(events, "model_finished", id="p0", turn=1)]
    return events, _line(events, "model_finished", id="p0", turn=2) + 1


def _a_turn_gone_past_without_its_job(events: list[dict[str, Any]]) -> Edit:
    job = _job(events, "p0", 0)
    events = [e for e in events if not (e["event"].startswith("cpu_") and e.get("job_id") == job)]
    return events, _line(events, "model_finished", id="p0", turn=0) + 1


def _last_request_missing(events: list[dict[str, Any]]) -> Edit:
    del events[_line(events, "model_finished", id="p0", turn=2)]
    return events, _line(events, "trajectory_finished", id="p0") + 1


def _of_a_trajectory_never_started(events: list[dict[str, Any]]) -> Edit:
    i = _line(events, "model_finished", id="p0", turn=1)
    events[i]["id"] = "p9"
    return events, i + 1


def _cut_short_at_a_line_boundary(events: list[dict[str, Any]]) -> Edit:
    last = max(i for i, e in enumerate(events) if e["event"] == "model_finished")
    return events[:last], _line(events, "trajectory_started", id=events[last]["id"]) + 1


MISFITS: list[tuple[Any, str]] = [
    (
        _no_cpu_finished,
        r"tool job \d+ \('sleep_ms'\) of 'p0' turn 1 has no cpu_finished or cpu_failed event",
    ),
    (_cancelled, r"tool job \d+ \('sleep_ms'\) of 'p0' turn 1 was cancelled while it ran"),
    (_turn_past_the_script, r"'p0' turn 5 is past the end of its script in the workload \(3 actions\)"),
    (_turns_swapped, r"'p0' turn 0 returned a 'final' action where the workload's script has 'tool'"),
    (
        _job_at_a_wrong_turn,
        r"tool job \d+ \('sleep_ms'\) of 'p0' turn 2 does not fit the workload's script, "
        r"which has a 'final' action at that turn",
    ),
    (
        _a_turn_without_its_request,
        r"'p0' turn 2 is recorded but turn 1 has no model_finished or model_failed",
    ),
    (
        _a_turn_gone_past_without_its_job,
        r"'p0' turn 0 returned a 'tool' action and the run went on to turn 1, "
        r"but no job of turn 0 was recorded",
    ),
    (
        _last_request_missing,
        r"'p0' finished after 3 model turns, but 2 have a model_finished or model_failed",
    ),
    (
        # the last request's measurement and every later event gone: its turn took the script's latency
        _cut_short_at_a_line_boundary,
        r"trajectory 'p\d' started, but it has no trajectory_finished event",
    ),
    (
        _of_a_trajectory_never_started,
        r"'model_finished' of 'p9', which no trajectory_started before it names",
    ),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("edit", "message"),
    [pytest.param(edit, message, id=edit.__name__.strip("_")) for edit, message in MISFITS],
)
def test_a_measurement_that_does_not_fit_the_script_is_refused_naming_its_line(
    two_tools: Path, tmp_path: Path, edit: Any, message: str
) -> None:
    """A job without cpu_finished was replayed at the script's cost, and a request or job recorded at
    another turn than the script's left the turn it measured at the script's timing: silently, either
    way (the replay exited 0). Each is refused naming the events.jsonl line, nothing written."""
    import re
    import shutil

    source = tmp_path / "source"
    shutil.copytree(two_tools, source)
    path = source / "events.jsonl"
    events, line = edit([json.loads(text) for text in path.read_text().splitlines()])
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    out = tmp_path / "out"
    result = simulate_here("--from-run", source, "--output", out)
    assert result.exit_code == 2, result.output
    assert re.search(rf"^error: --from-run {re.escape(str(path))}:{line}: {message}", result.stderr), (
        result.stderr
    )
    assert "Traceback" not in result.output and not out.exists()


@pytest.mark.timeout(60)
def test_a_run_that_ran_out_of_script_or_turns_still_replays_exactly(tmp_path: Path) -> None:
    """Nothing measured is missing where a trajectory ran out of script (its last request failed with
    script_exhausted, past the script's end) or of --max-turns (its last tool job ran, no turn followed)."""
    out_of_script = tool_problem("short", model_ms=10, cpu_ms=5, turns=1)
    out_of_script["script"].pop()  # no final: turn 1 asks past the end of the script
    problems = [
        tool_problem("whole", model_ms=10, cpu_ms=5),
        out_of_script,
        tool_problem("long", model_ms=10, cpu_ms=5, turns=4),
    ]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    run = tmp_path / "run"
    assert simulate_here("--workload", workload, "--output", run, "--max-turns", "3").exit_code == 0
    statuses = {
        row["id"]: row["status"] for row in map(json.loads, (run / "results.jsonl").read_text().splitlines())
    }
    assert statuses == {"whole": "completed", "short": "failed", "long": "max_turns"}
    replay = tmp_path / "replay"
    result = simulate_here("--from-run", run, "--output", replay)
    assert result.exit_code == 0, result.output
    _, source, _ = load_run(run)
    _, summary, _ = load_run(replay)
    assert summary["makespan_s"] == source["makespan_s"] and summary["counts"] == source["counts"]


@pytest.mark.timeout(60)
def test_a_killed_run_is_refused_for_its_status_not_for_the_job_it_left_running(
    two_tools: Path, tmp_path: Path
) -> None:
    """A run killed mid-job leaves run.json 'running' and a job without an end: that job never finished,
    so no duration exists to replay. ``optimum`` still bounds such a run from the steps it did record;
    a replay would have to invent the rest, so it refuses, saying why and what can read the run."""
    import shutil

    source = tmp_path / "source"
    shutil.copytree(two_tools, source)
    _edit_json(source / "run.json", lambda r: {**r, "status": "running"})
    (source / "summary.json").unlink(missing_ok=True)
    lines = (source / "events.jsonl").read_text().splitlines(keepends=True)
    events = [json.loads(text) for text in lines]
    killed_at = _line(events, "cpu_started", job_id=_job(events, "p0", 1))
    (source / "events.jsonl").write_text("".join(lines[: killed_at + 1]))
    out = tmp_path / "out"
    result = simulate_here("--from-run", source, "--output", out)
    assert result.exit_code == 2, result.output
    assert "the run's status is 'running', not 'complete' (killed, or still going" in result.stderr
    assert "`asyncroll optimum` still bounds the work it did record" in result.stderr
    assert "has no cpu_finished" not in result.stderr and not out.exists()


def _recorded_virtually(tmp_path: Path, problems: list[dict[str, Any]], **settings: Any) -> Path:
    """A run of ``problems`` on a virtual clock with virtual workers (each job its declared time): its
    folder, to replay."""
    workload = write_workload(tmp_path / "w.jsonl", problems)
    recorded = tmp_path / "recorded"
    cfg = build_config({"workload": workload, "output": recorded, **settings})
    clock = VirtualClock()
    run = Run(prepare(cfg, ["test"]), clock, worker_factory=virtual_factory(clock, builtin_duration))
    assert clock.run(run.execute()).status == "complete"
    return recorded


@pytest.mark.parametrize(
    ("final", "change"), [(True, "failed → completed"), (False, "failed → failed (other turns)")]
)
def test_a_trajectory_that_failed_in_the_run_and_otherwise_in_the_replay_is_counted(
    tmp_path: Path, final: bool, change: str
) -> None:
    """A tool's error ended a trajectory in the run (``--tool-errors fail``); replayed with ``--tool-errors
    observe`` it goes on with the script's timings, and completes, or runs out of script and fails anew
    after other turns. It said nothing: now stderr and run.json count the trajectories that ended
    otherwise (first only those whose status changed), and say which setting changed where they end."""
    (tmp_path / "boom.py").write_text("def boom(x):\n    raise ValueError(x)\n")
    tool = {"name": "boom", "inputs": {"x": "int"}, "implementation": "boom.py"}
    script: list[dict[str, Any]] = [
        {"type": "tool", "name": "boom", "arguments": {"x": 1}, "latency_ms": 10, "cpu_ms": 5},
        {"type": "tool", "name": "boom", "arguments": {"x": 2}, "latency_ms": 10},  # never run for real
    ]
    script += [{"type": "final", "answer": "1", "latency_ms": 10}] if final else []  # else it runs out
    problems = [{"id": "boom", "prompt": "p", "tools": [tool], "script": script}]
    ok = tool_problem("ok", model_ms=5, cpu_ms=5)
    recorded = _recorded_virtually(tmp_path, [*problems, ok], tool_errors="fail")
    replay = tmp_path / "replay"
    result = simulate_here("--from-run", recorded, "--output", replay, "--tool-errors", "observe")
    assert result.exit_code == 0, result.output
    assert f"1 trajectory ended otherwise than in the run (1 {change})" in result.stderr
    assert "the replay's --tool-errors observe (the run's: fail) changed where they end" in result.stderr
    if final:  # the job the run never ran has no measured cost: said so, without advising the replay it is
        assert "1 CPU job(s) took 0 s (boom.py::boom ×1) because the run never ran them" in result.stderr
        assert "simulate --from-run a real run" not in result.stderr
    receipt = json.loads((replay / "run.json").read_text())
    assert receipt["simulation"]["replayed"]["ended_otherwise"] == {change: 1}


class _DiesOnBoom(VirtualWorker):
    """A virtual worker whose process "dies" holding a ``boom`` job (the runtime's real path: a
    WorkerDied, the job's cpu_failed ``worker_died``, a replacement)."""

    async def call(self, request: JobRequest, timeout: float, *, large: bool = False) -> CallResult:  # noqa: ASYNC109
        if request.tool.rpartition(":")[2] == "boom":  # a file tool's key: path:name
            await self._clock.sleep(0.004)
            await self.kill()
            raise WorkerDied(f"worker {self.index} died holding job {request.job_id}")
        return await super().call(request, timeout, large=large)


def test_a_job_whose_worker_died_in_the_run_dies_in_the_replay(tmp_path: Path) -> None:
    """A worker died holding a job and its trajectory failed (``--tool-errors fail``). The replay ran the
    job to success: the trajectory completed, "ended otherwise", and the replacement the run started was
    missing. The job's action now says ``worker_dies`` (the death's message, after the time it ran): the
    replay fails the trajectory with the same error and replaces the worker as the run did."""
    tool = {"name": "boom", "inputs": {"x": "int"}, "implementation": "boom.py"}
    (tmp_path / "boom.py").write_text("def boom(x):\n    return x\n")
    script: list[dict[str, Any]] = [
        {"type": "tool", "name": "boom", "arguments": {"x": 1}, "latency_ms": 10},
        {"type": "final", "answer": "1", "latency_ms": 10},
    ]
    problems = [{"id": "boom", "prompt": "p", "tools": [tool], "script": script}]
    workload = write_workload(tmp_path / "w.jsonl", [*problems, tool_problem("ok", model_ms=5, cpu_ms=5)])
    recorded = tmp_path / "recorded"
    cfg = build_config({"workload": workload, "output": recorded, "tool_errors": "fail"})
    clock = VirtualClock()

    def factory(index: int, generation: int) -> VirtualWorker:
        return _DiesOnBoom(index, generation, clock, builtin_duration, simulate_tools=True)

    assert (
        clock.run(Run(prepare(cfg, ["test"]), clock, worker_factory=factory).execute()).status == "complete"
    )
    replay = tmp_path / "replay"
    result = simulate_here("--from-run", recorded, "--output", replay)
    assert result.exit_code == 0, result.output
    assert "ended otherwise" not in result.stderr and "not replayed" not in result.stderr, result.stderr

    def outcome(folder: Path) -> tuple[Any, ...]:
        rows = {r["id"]: r for r in map(json.loads, (folder / "results.jsonl").read_text().splitlines())}
        events = load_run(folder)[2]
        died = [(e.reason, e.error, e.roundtrip_s) for e in events if e.event == "cpu_failed"]
        restarts = [e.reason for e in events if e.event == "worker_restarting"]
        return rows["boom"]["status"], rows["boom"]["error"], died, restarts

    assert outcome(replay) == outcome(recorded)
    assert outcome(recorded)[0] == "failed" and outcome(recorded)[3] == ["died"]


@pytest.mark.parametrize("tool_errors", ["fail", "observe"])
def test_a_tool_that_raised_in_the_run_raises_in_the_replay(tmp_path: Path, tool_errors: str) -> None:
    """A tool's error ended its trajectory in the run (``--tool-errors fail``, the default) or was shown
    to the model (``observe``). The replay ran the job as if it succeeded: the trajectory completed there,
    "ended otherwise", and the tool-error count was lost. The job's action now ``raises`` the run's error:
    the replay fails where the run did, with the same error, and counts the same tool errors."""
    (tmp_path / "boom.py").write_text("def boom(x):\n    raise ValueError(x)\n")
    tool = {"name": "boom", "inputs": {"x": "int"}, "implementation": "boom.py"}
    script: list[dict[str, Any]] = [
        {"type": "tool", "name": "boom", "arguments": {"x": 1}, "latency_ms": 10, "cpu_ms": 5},
        {"type": "final", "answer": "1", "latency_ms": 10},
    ]
    problems = [{"id": "boom", "prompt": "p", "tools": [tool], "script": script}]
    recorded = _recorded_virtually(
        tmp_path, [*problems, tool_problem("ok", model_ms=5, cpu_ms=5)], tool_errors=tool_errors
    )
    replay = tmp_path / "replay"
    result = simulate_here("--from-run", recorded, "--output", replay)
    assert result.exit_code == 0, result.output
    assert "ended otherwise" not in result.stderr

    def outcome(folder: Path) -> tuple[Any, ...]:
        rows = {r["id"]: r for r in map(json.loads, (folder / "results.jsonl").read_text().splitlines())}
        _, summary, events = load_run(folder)
        errors = [e.error for e in events if e.event == "cpu_finished" and not e.ok]
        return rows["boom"]["status"], rows["boom"]["error"], summary["tools"]["errors"], errors

    assert outcome(replay) == outcome(recorded)
    assert outcome(recorded)[0] == ("failed" if tool_errors == "fail" else "completed")


@pytest.mark.parametrize(
    ("stalled_s", "fraction", "warned"), [(0.6, 0.2, True), (0.2, 0.2, False), (None, None, False)]
)
def test_a_replay_of_a_run_whose_loop_stalled_says_its_latencies_hold_the_stalls(
    tmp_path: Path, stalled_s: float | None, fraction: float | None, warned: bool
) -> None:
    """A request the run's client measured across a stall of its event loop counts the stall as model
    latency, and the replay takes it as such: said when the run's summary.json says its loop stalled 5%
    of the makespan and 0.5 s or more (as ``run`` warns), not otherwise (nor for a run not watched)."""
    recorded = _recorded_virtually(tmp_path, [tool_problem("p", model_ms=5, cpu_ms=5)])
    summary = json.loads((recorded / "summary.json").read_text())
    summary["event_loop"] |= {"stalled_s": stalled_s, "fraction_of_makespan": fraction}
    (recorded / "summary.json").write_text(json.dumps(summary))
    result = simulate_here("--from-run", recorded, "--output", tmp_path / "replay")
    assert result.exit_code == 0, result.output
    said = "warning: the run's event loop stalled 0.600 s (20% of its makespan; summary.json: event_loop)"
    assert (said in result.stderr) is warned, result.stderr


def test_a_replay_of_a_run_both_stopped_and_stalled_says_both(tmp_path: Path) -> None:
    """A stop of the run's process (Ctrl-Z, SIGSTOP) is counted apart from its loop's stalls
    (``event_loop.stopped_s``), but a request measured across it holds it just the same: said. A run so
    stopped whose loop also stalled past the warning's thresholds: the replay warned of the stop alone,
    and the stalls inside its latencies went unsaid (before stops were told apart, they were one
    warning)."""
    recorded = _recorded_virtually(tmp_path, [tool_problem("p", model_ms=5, cpu_ms=5)])
    summary = json.loads((recorded / "summary.json").read_text())
    summary["event_loop"] |= {"stalled_s": 2.0, "fraction_of_makespan": 0.4, "stops": 1, "stopped_s": 3.0}
    (recorded / "summary.json").write_text(json.dumps(summary))
    result = simulate_here("--from-run", recorded, "--output", tmp_path / "replay")
    assert result.exit_code == 0, result.output
    assert "warning: the run's process was stopped (job control) for 3.000 s" in result.stderr, result.stderr
    said = "warning: the run's event loop stalled 2.000 s (40% of its makespan"
    assert said in result.stderr, result.stderr


def test_endings_changed_by_a_replays_own_settings_are_put_down_to_them(
    two_tools: Path, tmp_path: Path
) -> None:
    """A replay with a lower --max-turns ends the run's completed trajectories at max_turns. The warning
    put that down to a model error, a tool error or a worker death that the script could not replay, of
    which the run had none: it now names the setting that changed, the run's value beside it."""
    result = simulate_here("--from-run", two_tools, "--output", tmp_path / "replay", "--max-turns", "2")
    assert result.exit_code == 0, result.output
    assert "2 trajectories ended otherwise than in the run (2 completed → max_turns)" in result.stderr
    assert "the replay's --max-turns 2 (the run's: 8) changed where they end" in result.stderr
    assert "worker death" not in result.stderr


def test_turns_a_replay_goes_on_to_past_the_runs_max_turns_are_said_to_be_scripted(
    tmp_path: Path,
) -> None:
    """A run stopped at ``--max-turns 1`` measured one turn per trajectory; a replay with a higher limit
    runs the rest at the script's timings, which the warning did not say (only that the limit changed)."""
    problems = [tool_problem(f"p{i}", model_ms=10, cpu_ms=5, turns=2) for i in range(2)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    run = tmp_path / "run"
    assert simulate_here("--workload", workload, "--output", run, "--max-turns", "1").exit_code == 0
    result = simulate_here("--from-run", run, "--output", tmp_path / "replay", "--max-turns", "8")
    assert result.exit_code == 0, result.output
    assert "(2 max_turns → completed): the replay's --max-turns 8 (the run's: 1) changed" in result.stderr
    assert (
        "the turns past the run's --max-turns 1 took the script's timings (never measured)" in result.stderr
    )


def test_a_replay_with_no_room_to_record_its_changed_endings_still_says_them(
    two_tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the replay is written, its run.json is rewritten to record the endings that changed: with no
    room for that copy (a full disk), the command ended in an OSError traceback after a good replay."""
    import errno

    import asyncroll.outputs.receipt as receipt_module
    import asyncroll.simulation.replay_changes as replay_changes

    compared: list[bool] = []
    real_compare, real_write = replay_changes.ended_otherwise, receipt_module.write_json_atomic

    def compare(*args: Any) -> Any:
        compared.append(True)
        return real_compare(*args)

    def write(path: Path, data: Any) -> None:
        if compared:  # the rewrite after the replay: the disk is full by then
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(path, data)

    monkeypatch.setattr(replay_changes, "ended_otherwise", compare)
    monkeypatch.setattr(receipt_module, "write_json_atomic", write)
    replay = tmp_path / "replay"
    result = simulate_here("--from-run", two_tools, "--output", replay, "--max-turns", "2")
    assert result.exit_code == 0, result.output
    assert (
        f"warning: {replay / 'run.json'}: cannot record what follows (No space left on device)"
        in result.stderr
    )
    assert "2 trajectories ended otherwise than in the run (2 completed → max_turns)" in result.stderr
    assert json.loads((replay / "run.json").read_text())["status"] == "complete"  # whole, as it was


def test_a_replay_refused_for_its_workload_names_the_runs_workload_lines(tmp_path: Path) -> None:
    """A tool file gone since the run refused the replay with lines of OUT/replay-workload.jsonl, a file
    removed with the refused output: the error now names the run's own workload, file and line."""
    (tmp_path / "tools.py").write_text("def double(x: int) -> int:\n    return 2 * x\n")
    tool = {"name": "double", "description": "2x", "inputs": {"x": "int"}, "implementation": "tools.py"}
    script = [
        {"type": "tool", "name": "double", "arguments": {"x": 2}, "latency_ms": 20, "cpu_ms": 5},
        {"type": "final", "answer": "4", "latency_ms": 10},
    ]
    problems = [{"id": f"p{i}", "prompt": "double 2", "tools": [tool], "script": script} for i in range(2)]
    plain = {"id": "plain", "prompt": "hi", "script": [{"type": "final", "answer": "4", "latency_ms": 5}]}
    workload = write_workload(tmp_path / "w.jsonl", [plain, *problems])
    recorded = tmp_path / "recorded"
    assert simulate_here("--workload", workload, "--output", recorded).exit_code == 0
    (tmp_path / "tools.py").unlink()
    replay = tmp_path / "replay"
    result = simulate_here("--from-run", recorded, "--output", replay)
    assert result.exit_code == 2, result.output
    assert f"{workload}:2: tools[0].implementation: 'tools.py' does not exist" in result.stderr
    assert f"{workload}:3: " in result.stderr and "replay-workload" not in result.stderr
    assert not replay.exists()
