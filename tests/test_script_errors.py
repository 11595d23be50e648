"""A script's ``error`` step: a model request that fails after its ``latency_ms`` with its kind, message
and status, failing its trajectory alone — on the scripted backend, the simulated batching server and an
HTTP backend's ``--replay`` (which sends no request for it) — and what ``simulate --from-run`` writes
where the run's request failed, so that the replay fails there too instead of going on; and a tool or
submit action's ``raises``, a job's declared error in a simulation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncroll.events import ModelFailed, ModelStarted
from tests.cli_runs import load_run
from tests.conftest import VirtualRun, invoke, tool_problem, write_workload
from tests.http_backend import http_run, requests_of, serve
from tests.simulations import simulate_here

UNAVAILABLE = {
    "type": "error",
    "kind": "http_status",
    "status": 503,
    "message": "Unavailable",
    "latency_ms": 80,
}


def _failing(pid: str, step: dict[str, Any]) -> dict[str, Any]:
    """One tool call (20 ms, its model turn 50 ms), then ``step``."""
    tool = {"type": "tool", "name": "sleep_ms", "arguments": {"milliseconds": 20}, "latency_ms": 50}
    return {"id": pid, "prompt": "p", "tools": [{"name": "sleep_ms"}], "script": [tool, step]}


def _results(run: Path) -> dict[str, dict[str, Any]]:
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    return {row["id"]: row for row in rows}


def test_an_error_step_fails_its_request_after_its_latency_and_only_its_trajectory(
    virtual_run: VirtualRun,
) -> None:
    problems = [_failing("bad", UNAVAILABLE), tool_problem("ok", model_ms=50, cpu_ms=20)]
    outcome, capture, out = virtual_run(problems)
    assert outcome.summary is not None
    assert outcome.summary["counts"] | {"completed": 1, "failed": 1} == outcome.summary["counts"]
    assert outcome.summary["model"]["failed"] == {"http_status": 1}
    (failed,) = capture.of(ModelFailed)
    assert (failed.id, failed.turn, failed.latency_s) == ("bad", 1, pytest.approx(0.08))
    assert (failed.kind, failed.status, failed.error, failed.response_received) == (
        "http_status",
        503,
        "Unavailable",
        True,
    )
    bad = _results(out)["bad"]
    assert (bad["status"], bad["turns"], bad["tool_calls"]) == ("failed", 2, 1)
    assert bad["error"] == "model http_status: Unavailable"
    assert bad["duration_s"] == pytest.approx(0.05 + 0.02 + 0.08)


def test_an_error_step_with_nothing_but_its_type_says_where_it_came_from(virtual_run: VirtualRun) -> None:
    _, capture, out = virtual_run([{"id": "e", "prompt": "p", "script": [{"type": "error"}]}])
    (failed,) = capture.of(ModelFailed)
    assert (failed.kind, failed.status, failed.latency_s, failed.response_received) == (
        "scripted",
        None,
        0,
        False,
    )
    assert _results(out)["e"]["error"] == "model scripted: the script's error step at turn 0"


def test_an_error_step_on_the_batching_server_fails_after_its_own_latency(tmp_path: Path) -> None:
    """The simulated server's batch never sees the failed request: it fails after its ``latency_ms``,
    however the server's step time would have priced a reply."""
    workload = write_workload(tmp_path / "w.jsonl", [_failing("bad", UNAVAILABLE)])
    done = simulate_here("--workload", workload, "--output", tmp_path / "sim", "--server", "batching")
    assert done.exit_code == 0, done.output
    _, summary, events = load_run(tmp_path / "sim")
    (failed,) = [e for e in events if e.event == "model_failed"]
    assert (failed.turn, failed.latency_s, failed.kind) == (1, pytest.approx(0.08), "http_status")
    assert summary["counts"]["failed"] == 1


@pytest.mark.parametrize(
    ("script", "field", "message"),
    [
        (
            [{"type": "error"}, {"type": "final", "answer": 1}],
            "script[0].type",
            "an 'error' step fails its request, which ends the trajectory: it must be the script's last "
            "step, not 1 of 2",
        ),
        ([{"type": "error", "kind": "Bad Kind"}], "script[0].error.kind", "'Bad Kind' is no failure kind"),
        ([{"type": "error", "kind": "cancelled"}], "script[0].error.kind", "'cancelled' is a stopped run's"),
        (
            [{"type": "error", "status": 99}],
            "script[0].error.status",
            "Input should be greater than or equal to 100",
        ),
        ([{"type": "error", "code": 1}], "script[0].error.code", "unknown field"),
    ],
)
def test_a_malformed_error_step_is_refused_naming_its_line_and_field(
    tmp_path: Path, script: list[dict[str, Any]], field: str, message: str
) -> None:
    workload = write_workload(tmp_path / "w.jsonl", [{"id": "x", "prompt": "p", "script": script}])
    done = invoke("validate", workload)
    assert done.exit_code != 0
    assert f"{workload}:1: {field}: {message}" in done.output, done.output


def test_a_model_server_can_never_answer_with_an_error_step() -> None:
    """An error step is a script's: the actions a server's reply is read as are the three of SPEC §5."""
    from pydantic import TypeAdapter, ValidationError

    from asyncroll.workload import Action

    with pytest.raises(ValidationError):
        TypeAdapter(Action).validate_python({"type": "error"})


@pytest.mark.timeout(60)
def test_an_http_replay_sends_no_request_for_an_error_step(tmp_path: Path) -> None:
    with serve() as running:
        outcome, capture, _ = http_run(
            tmp_path, [{"id": "e", "prompt": "p", "script": [UNAVAILABLE]}], running.url, replay=True
        )
        assert requests_of(running) == []
    assert outcome.summary is not None and outcome.summary["counts"]["failed"] == 1
    (failed,) = capture.of(ModelFailed)
    assert (failed.kind, failed.status, failed.latency_s >= 0.08) == ("http_status", 503, True)
    assert len(capture.of(ModelStarted)) == 1


@pytest.mark.timeout(90)
def test_a_replay_fails_where_the_run_failed_not_on(tmp_path: Path) -> None:
    """A real HTTP run (``--replay`` against serve-sim answering 500 to a fifth of its requests, no
    retries): each failed request failed its trajectory. The replay gave those trajectories the rest of
    their scripts and counted them as "ended otherwise"; now each fails at the same turn with the same
    kind, status and message, after the latency the run measured, and nothing ends otherwise. The server
    failed them, not a script: the replay's are not marked ``scripted`` either (they were, and its
    summary.json counted ``model.scripted_failures`` the run's had none of)."""
    from asyncroll.serve_sim.config import FaultConfig

    problems = [tool_problem(f"p{i}", model_ms=0, cpu_ms=5, turns=2) for i in range(12)]
    with serve(faults=FaultConfig(rate_500=0.2), seed=3) as running:  # one at a time: the same draws
        outcome, _, run = http_run(
            tmp_path, problems, running.url, replay=True, max_retries=0, max_active_trajectories=1
        )
    assert outcome.summary is not None
    failed = outcome.summary["counts"]["failed"]
    assert 0 < failed < 12 and outcome.summary["model"]["failed"] == {"http_status": failed}
    replay = tmp_path / "replay"
    done = simulate_here("--from-run", run, "--output", replay)
    assert done.exit_code == 0, done.output
    assert "ended otherwise" not in done.stderr
    keys = ("status", "turns", "tool_calls", "error")
    assert {k: [v[x] for x in keys] for k, v in _results(replay).items()} == {
        k: [v[x] for x in keys] for k, v in _results(run).items()
    }

    def failures(folder: Path) -> list[tuple[Any, ...]]:
        events = load_run(folder)[2]
        return sorted(
            (e.id, e.turn, e.kind, e.status, e.error, e.scripted) for e in events if e.event == "model_failed"
        )

    assert failures(replay) == failures(run)
    # the server failed them, in the run and so in the replay: none is the script's own
    assert {e[-1] for e in failures(replay)} == {None}
    assert "scripted_failures" not in json.loads((replay / "summary.json").read_text())["model"]
    assert "ended_otherwise" not in json.loads((replay / "run.json").read_text())["simulation"]["replayed"]


def _recorded_failure_edited(tmp_path: Path, **fields: Any) -> tuple[Path, int]:
    """A simulated run of one trajectory whose last request fails (an error step), its ``model_failed``
    event given ``fields``: the run's folder, and that event's line in events.jsonl."""
    workload = write_workload(tmp_path / "w.jsonl", [_failing("bad", UNAVAILABLE)])
    recorded = tmp_path / "recorded"
    assert simulate_here("--workload", workload, "--output", recorded).exit_code == 0
    events = recorded / "events.jsonl"
    lines = events.read_text().splitlines()
    (at,) = [i for i, line in enumerate(lines) if '"model_failed"' in line]
    lines[at] = json.dumps(json.loads(lines[at]) | fields)
    events.write_text("\n".join(lines) + "\n")
    return recorded, at + 1


def test_a_recorded_failure_no_replay_can_fail_with_is_refused_naming_its_line(tmp_path: Path) -> None:
    recorded, line = _recorded_failure_edited(tmp_path, kind="Not A Kind")
    done = simulate_here("--from-run", recorded, "--output", tmp_path / "replay")
    assert done.exit_code == 2, done.output
    events = recorded / "events.jsonl"
    assert f"{events}:{line}: 'model_failed' has a 'kind' a replay cannot fail with" in done.output
    assert not (tmp_path / "replay").exists()


def test_a_recorded_failure_marked_scripted_otherwise_than_true_is_refused_naming_its_line(
    tmp_path: Path,
) -> None:
    """``scripted`` is true or absent in events.jsonl: any other value (a hand-edited file) would replay
    the failure as the server's or the script's by a guess."""
    recorded, line = _recorded_failure_edited(tmp_path, scripted="yes")
    done = simulate_here("--from-run", recorded, "--output", tmp_path / "replay")
    assert done.exit_code == 2, done.output
    assert (
        f"{recorded / 'events.jsonl'}:{line}: 'model_failed' has a 'scripted' other than true" in done.output
    )


def test_a_sweeps_jitter_keeps_an_error_step_with_its_latency_jittered(tmp_path: Path) -> None:
    from asyncroll.simulation.perturb import perturb_workload
    from asyncroll.workload import ErrorStep, iter_problems

    workload = write_workload(tmp_path / "w.jsonl", [_failing("bad", UNAVAILABLE)])
    assert perturb_workload(workload, tmp_path / "j.jsonl", seed=7, sigma=0.5) == 1
    ((_, _, problem),) = list(iter_problems(tmp_path / "j.jsonl"))
    step = (problem.script or [])[-1]
    assert isinstance(step, ErrorStep) and (step.kind, step.status, step.message) == (
        "http_status",
        503,
        "Unavailable",
    )
    assert step.latency_ms is not None and step.latency_ms != 80 and step.latency_ms > 0


def test_a_declared_tool_error_fails_the_simulated_job_and_a_real_worker_ignores_it(
    virtual_run: VirtualRun, tmp_path: Path
) -> None:
    """A tool action's ``raises`` (simulation only, as ``cpu_ms``): a simulated job fails with it instead
    of running, and under ``--tool-errors fail`` its trajectory fails; a real worker runs the tool."""
    from asyncroll.backends.action_schema import model_view
    from asyncroll.workload import ToolAction

    step = {"type": "tool", "name": "add", "arguments": {"a": 1, "b": 2}, "raises": "ValueError: no"}
    problem = {
        "id": "r",
        "prompt": "p",
        "tools": [{"name": "add"}],
        "script": [step, {"type": "final", "answer": 3}],
    }
    outcome, _, out = virtual_run([problem])
    assert outcome.summary is not None and outcome.summary["tools"]["errors"] == 1
    assert _results(out)["r"]["status"] == "failed" and "ValueError: no" in _results(out)["r"]["error"]
    assert "raises" not in model_view(ToolAction.model_validate(step))
    workload = write_workload(tmp_path / "real.jsonl", [problem])
    real = tmp_path / "real"
    done = invoke("run", "--workload", workload, "--output", real, "--cpu-workers", "1")
    assert done.exit_code == 0, done.output
    assert _results(real)["r"]["status"] == "completed"


@pytest.mark.timeout(60)
def test_a_scripted_run_whose_every_request_failed_by_its_script_asks_for_no_server(tmp_path: Path) -> None:
    """No model request succeeded, every failure a kind a server's outage gives: on the scripted backend
    they are the script's ``error`` steps, and there is no server to be up (it said "is the server up?")."""
    workload = write_workload(tmp_path / "w.jsonl", [{"id": "e", "prompt": "p", "script": [UNAVAILABLE]}])
    done = invoke(
        "run", "--workload", workload, "--output", tmp_path / "run", "--cpu-workers", "1", "--no-progress"
    )
    assert done.exit_code == 0, done.output
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["model"]["failed"] == {
        "http_status": 1
    }
    assert "no model request succeeded" not in done.stderr, done.stderr


def test_a_recorded_failure_with_a_status_past_599_is_replayed(tmp_path: Path) -> None:
    """HTTP/1.1 carries any three-digit status (some servers answer 999) and a run records it as it came:
    the replay of that complete run was refused ("'status' a replay cannot fail with")."""
    recorded, _ = _recorded_failure_edited(tmp_path, status=999)  # as a server answering 999 has it
    done = simulate_here("--from-run", recorded, "--output", tmp_path / "replay")
    assert done.exit_code == 0, done.output
    (failed,) = [e for e in load_run(tmp_path / "replay")[2] if e.event == "model_failed"]
    assert (failed.kind, failed.status, failed.turn) == ("http_status", 999, 1)


@pytest.mark.parametrize("kind", ["timeout", "http_status", "timeout\n", "cancelled", "cancelled_too", "Bad"])
def test_the_printed_schema_accepts_exactly_the_failure_kinds_validation_accepts(
    tmp_path: Path, kind: str
) -> None:
    """`asyncroll schema workload` is as strict as `validate` about an error step's kind: it accepted
    ``cancelled`` (a stopped run's request) and a kind with a final newline (Python's ``$``)."""
    import jsonschema

    from asyncroll.schemas import schemas

    line = {"id": "x", "prompt": "p", "script": [{"type": "error", "kind": kind}]}
    schema_ok = jsonschema.Draft202012Validator(schemas()["workload"]).is_valid(line)
    valid = invoke("validate", write_workload(tmp_path / "w.jsonl", [line])).exit_code == 0
    assert schema_ok is valid and valid is (kind in ("timeout", "http_status", "cancelled_too"))


@pytest.mark.parametrize(
    ("step", "field"),
    [
        ({"type": "error", "message": "x" * 1001}, "script[0].error.message"),
        (
            {"type": "tool", "name": "add", "arguments": {"a": 1, "b": 2}, "raises": "x" * 1001},
            "script[0].tool.raises",
        ),
    ],
)
def test_a_declared_message_is_at_most_what_an_event_keeps(
    tmp_path: Path, step: dict[str, Any], field: str
) -> None:
    """Events keep an error's first 1,000 characters, and a replay writes back what they kept: a longer
    scripted message (a 3 MB one made an 18 MB timeline) is refused, naming its field."""
    from asyncroll.events import MAX_ERROR_CHARS, CpuFailed

    assert MAX_ERROR_CHARS == 1000
    problem = {"id": "x", "prompt": "p", "tools": [{"name": "add"}], "script": [step]}
    done = invoke("validate", write_workload(tmp_path / "w.jsonl", [problem]))
    assert done.exit_code != 0
    assert f":1: {field}: String should have at most 1000 characters" in done.output, done.output
    failed = CpuFailed(
        id="t",
        job_id=1,
        worker=0,
        kind="tool",
        tool="add",
        reason="timeout",
        roundtrip_s=1.0,
        error="y" * 5000,
    )
    assert failed.error == "y" * 1000


@pytest.mark.parametrize(("field", "value"), [("raises", "boom"), ("worker_dies", "boom"), ("cpu_ms", 3000)])
def test_a_submission_that_fails_by_its_declaration_is_not_said_to_pass(
    tmp_path: Path, field: str, value: Any
) -> None:
    """A submit without ``passes`` whose evaluation fails by its script (``raises``, ``worker_dies``, a
    ``cpu_ms`` past the tool timeout) never passes: its trajectory fails there. stderr counted it among the
    submissions that "passed because their script declares no verdict" (a replay of a run whose first
    evaluation failed said "the run never evaluated them")."""
    example = Path(__file__).resolve().parents[1] / "examples" / "livecodebench" / "workload.jsonl"
    problem = json.loads(example.read_text().splitlines()[0])
    problem["script"][0][field] = value  # the first of its two submissions, neither with a verdict
    out = tmp_path / "out"
    workload = write_workload(tmp_path / "w.jsonl", [problem])
    result = simulate_here("--workload", workload, "--output", out, "--tool-timeout", "1")
    assert result.exit_code == 0, result.output
    row = _results(out)[problem["id"]]
    assert row["status"] == "failed" and ("boom" in row["error"] or "ran past 1s" in row["error"])
    assert "passed because" not in result.stderr, result.stderr


def test_a_recorded_error_longer_than_an_event_keeps_is_replayed_cut_as_events_read_it(
    tmp_path: Path,
) -> None:
    """An events.jsonl whose error texts are longer than an event keeps (edited by hand, or written by
    another tool) reads as the event models read it: its first 1,000 characters. The replay wrote them
    whole into its workload, which then refused its own line (``replay-workload.jsonl:1: ... at most
    1000 characters``) in a folder it had just removed, naming no line of the run."""
    tool = {"type": "tool", "name": "add", "arguments": {"a": 1, "b": 2}, "latency_ms": 5, "cpu_ms": 5}
    problems = [
        {"id": "t", "prompt": "p", "tools": [{"name": "add"}], "script": [{**tool, "raises": "boom"}]},
        {**_failing("m", UNAVAILABLE), "id": "m"},
    ]
    recorded = tmp_path / "recorded"
    result = simulate_here("--workload", write_workload(tmp_path / "w.jsonl", problems), "--output", recorded)
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in (recorded / "events.jsonl").read_text().splitlines()]
    for event in events:
        if event["event"] in ("model_failed", "cpu_finished") and event.get("error"):
            event["error"] = event["event"][0] * 1500
    (recorded / "events.jsonl").write_text("".join(json.dumps(event) + "\n" for event in events))
    replay = tmp_path / "replay"
    replayed = simulate_here("--from-run", recorded, "--output", replay)
    assert replayed.exit_code == 0, replayed.output
    errors = {
        e.event: e.error
        for e in load_run(replay)[2]
        if e.event in ("model_failed", "cpu_finished") and e.error
    }
    assert errors == {"model_failed": "m" * 1000, "cpu_finished": "c" * 1000}


def test_the_printed_events_schema_says_an_error_is_cut_to_what_an_event_keeps() -> None:
    """An event keeps an error's first 1,000 characters, which a script's declared message is held to;
    ``asyncroll schema events`` said only "string", as if an error's text were whole."""
    done = invoke("schema", "events")
    assert done.exit_code == 0, done.output
    defs = json.loads(done.output)["$defs"]
    for name in ("CpuFailed", "CpuFinished", "ModelFailed"):
        error = defs[name]["properties"]["error"]
        text = next(option for option in error.get("anyOf", [error]) if option["type"] == "string")
        assert text["maxLength"] == 1000 and "first 1000 characters" in text["description"], name
