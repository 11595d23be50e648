"""The one-repair protocol (SPEC §2, §5) on a virtual clock: submit → evaluate → on failure one repair
turn with the feedback → evaluate. Verdicts are declared by the script (``passes``), so no untrusted
code runs here but in ``test_bundled_livecodebench_example_repairs_for_real``, the real evaluator end to
end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncroll.backends.base import ModelRequest
from asyncroll.events import CpuEnqueued, CpuSelected, TrajectoryFinished
from asyncroll.runtime.virtual_worker import builtin_duration
from asyncroll.workers.protocol import JobRequest
from asyncroll.workload import scan_workload
from tests.conftest import VirtualRun, write_workload
from tests.evaluations import ISOLATED

SECRET_INPUT = "hidden-input-7fd3"


def _code_problem(pid: str, verdicts: list[bool | None], **meta: Any) -> dict[str, Any]:
    return {
        "id": pid,
        "prompt": f"write a program for {pid}",
        "tools": [{"name": "lcb_evaluate"}],
        "script": [
            {"type": "submit", "code": f"print({i})", "latency_ms": 10, "cpu_ms": 40, "passes": v}
            for i, v in enumerate(verdicts)
        ],
        "metadata": {
            "reference_tests": [
                {"input": SECRET_INPUT, "output": "1", "testtype": "stdin"},
                {"input": "2", "output": "2", "testtype": "stdin"},
            ],
            "prompt_metadata": {"protocol": "one_repair", "max_generations": 2, **meta},
        },
    }


def _results(out: Path) -> dict[str, dict[str, Any]]:
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return {r["id"]: r for r in rows}


def test_failed_submission_gets_one_repair_then_passes(virtual_run: VirtualRun) -> None:
    outcome, cap, out = virtual_run(
        [
            _code_problem("fixed", [False, True]),
            _code_problem("first", [True]),
            _code_problem("bad", [False, False]),
        ]
    )
    assert outcome.status == "complete"
    results = _results(out)
    assert results["fixed"]["passed"] is True and results["fixed"]["repair_attempted"] is True
    assert results["fixed"]["generations"] == 2 and results["fixed"]["correct"] is True
    assert results["first"]["passed"] is True and results["first"]["repair_attempted"] is False
    assert results["bad"]["passed"] is False and results["bad"]["generations"] == 2
    assert results["bad"]["status"] == "completed" and results["bad"]["correct"] is False
    assert results["fixed"]["tests_total"] == 2
    # Evaluations are CPU jobs of kind "evaluate"; the repair's is a resubmission (the predictor's feature).
    evaluations = [e for e in cap.of(CpuEnqueued) if e.id == "fixed"]
    assert [(e.kind, e.resubmission) for e in evaluations] == [("evaluate", False), ("evaluate", True)]
    assert outcome.summary is not None and outcome.summary["accuracy"]["correct"] == 2
    one_repair = outcome.summary["accuracy"]["one_repair"]
    assert one_repair["evaluated"] == 3 and one_repair["passed_first"] == 1
    assert one_repair["repairs_attempted"] == 2 and one_repair["passed_after_repair"] == 1
    assert one_repair["pass_rate_final"] == pytest.approx(2 / 3)
    # Exact virtual timing: 10 ms model, 40 ms evaluation, 10 ms repair, 40 ms evaluation.
    finished = {e.id: e for e in cap.of(TrajectoryFinished)}
    assert finished["fixed"].turns == 2
    # A submission is not a tool call: results, events and the summary agree (generations count them).
    assert {r["tool_calls"] for r in results.values()} == {0} and finished["fixed"].tool_calls == 0
    tools = outcome.summary["tools"]
    assert tools["calls"] == 0 and tools["jobs_by_kind"]["evaluate"] == 5


def test_hidden_tests_never_reach_results_summary_or_events(virtual_run: VirtualRun) -> None:
    _, cap, out = virtual_run([_code_problem("fixed", [False, True])])
    for name in ("results.jsonl", "summary.json", "events.jsonl"):
        assert SECRET_INPUT not in (out / name).read_text(), name
    assert all(SECRET_INPUT not in e.model_dump_json() for e in cap.of(CpuSelected))


def test_repair_turn_carries_instruction_and_feedback(
    virtual_run: VirtualRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    from asyncroll.backends import scripted

    seen: list[list[dict[str, Any]]] = []
    original = scripted.scripted_step

    def spy(request: ModelRequest) -> Any:
        seen.append(list(request.messages))
        return original(request)

    monkeypatch.setattr(scripted, "scripted_step", spy)
    virtual_run([_code_problem("fixed", [False, True], repair_instruction="FIX IT")])
    assert len(seen) == 2  # the first submission and the repair
    repair_turn = seen[-1]
    assert repair_turn[-1]["role"] == "user"
    assert repair_turn[-1]["content"].startswith("FIX IT\n\n(simulated)")


def test_evaluator_limits_reach_every_evaluation_and_the_receipt(virtual_run: VirtualRun) -> None:
    """The run's evaluator settings are bound to every ``lcb_evaluate`` job, the repair's included, next
    to the hidden tests, and recorded in run.json's config."""
    jobs: list[dict[str, Any]] = []

    def duration(request: JobRequest) -> float:
        if request.tool == "lcb_evaluate":
            jobs.append(request.arguments)
        return builtin_duration(request)

    settings = {"test_timeout": 2.0, "evaluation_timeout": 30.0, "test_memory_mb": 512, "tool_timeout": 40.0}
    outcome, _, out = virtual_run([_code_problem("fixed", [False, True])], duration, **settings)
    assert outcome.status == "complete" and len(jobs) == 2
    for arguments in jobs:
        assert arguments["tests"][0]["input"] == SECRET_INPUT
        limits = {k: arguments[k] for k in ("time_limit_s", "total_time_limit_s", "memory_limit_mb")}
        assert limits == {"time_limit_s": 2.0, "total_time_limit_s": 30.0, "memory_limit_mb": 512}
        assert arguments["tool_timeout_s"] == 40.0
    config = json.loads((out / "run.json").read_text())["config"]
    assert {k: config[k] for k in ("test_timeout", "evaluation_timeout", "test_memory_mb")} == {
        "test_timeout": 2.0,
        "evaluation_timeout": 30.0,
        "test_memory_mb": 512,
    }


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda p: p["metadata"].pop("reference_tests"), "metadata.reference_tests"),
        (lambda p: p.update(tools=[]), "tools"),
        (lambda p: p["metadata"]["prompt_metadata"].update(max_generations=0), "max_generations"),
        (lambda p: p["metadata"].update(func_name="not an identifier"), "metadata.func_name"),
        (lambda p: p["metadata"]["reference_tests"].append({"input": 3}), "reference_tests[2]"),
    ],
)
def test_loader_rejects_broken_one_repair_problems(tmp_path: Path, change: Any, field: str) -> None:
    problem = _code_problem("x", [True])
    change(problem)
    workload = write_workload(tmp_path / "w.jsonl", [problem])
    scan = scan_workload(workload, tmp_path, scripted=True)
    assert any(field in p and ":1:" in p for p in scan.problems), scan.problems


@pytest.mark.parametrize("tests", [[], 5, {"input": "1", "output": "1"}, "1 1"])
def test_reference_tests_that_are_not_a_non_empty_list_are_refused(tmp_path: Path, tests: Any) -> None:
    # An empty list would run a submission against no test at all (and "pass" it); anything but a list is
    # not a list of tests, whatever its truthiness.
    problem = _code_problem("x", [True])
    problem["metadata"]["reference_tests"] = tests
    workload = write_workload(tmp_path / "w.jsonl", [problem])
    scan = scan_workload(workload, tmp_path, scripted=True)
    needs = "metadata.reference_tests: the one-repair protocol needs a non-empty list of tests"
    assert scan.problems == [f"{workload}:1: {needs}"], scan.problems


@pytest.mark.parametrize(("generations", "valid"), [(1, True), (10, True), (0, False), (11, False)])
def test_max_generations_runs_from_1_to_10(tmp_path: Path, generations: int, valid: bool) -> None:
    problem = _code_problem("x", [True], max_generations=generations)
    workload = write_workload(tmp_path / "w.jsonl", [problem])
    scan = scan_workload(workload, tmp_path, scripted=True)
    refused = f"{workload}:1: metadata.prompt_metadata.max_generations: must be an integer from 1 to 10"
    assert scan.problems == ([] if valid else [refused]), scan.problems


def test_the_protocol_defaults_to_one_repair_and_its_default_instruction() -> None:
    from asyncroll.workload import Problem
    from asyncroll.workload.models import DEFAULT_REPAIR_INSTRUCTION

    problem = _code_problem("x", [False, True])
    del problem["metadata"]["prompt_metadata"]["max_generations"]
    settings = Problem.model_validate(problem).one_repair
    assert settings is not None and settings.max_generations == 2  # a first answer and one repair
    assert settings.repair_instruction == DEFAULT_REPAIR_INSTRUCTION


@pytest.mark.timeout(180)
def test_bundled_livecodebench_example_repairs_for_real(tmp_path: Path) -> None:
    """The scripted example end to end: real workers, the real sandboxed evaluator, one repair each."""
    from tests.cli_runs import cli
    from tests.conftest import REPO, invoke

    workload = REPO / "examples" / "livecodebench" / "workload.jsonl"
    out = tmp_path / "run"
    # The evaluator's limits as flags: their names reach the real evaluator, which refuses unknown ones.
    limits = ["--test-timeout", "5", "--evaluation-timeout", "50", "--test-memory-mb", "1024"]
    limits += [] if ISOLATED else ["--allow-weak-isolation"]  # a non-root developer's machine
    result = cli(
        "run", "--workload", workload, "--output", out, "--policy", "asyncroll", *limits, timeout=150
    )
    assert result.returncode == 0, result.stderr
    # allowed, weak isolation is said on stderr too, not only in run.json (a config file's setting)
    weak = (
        "warning: untrusted code runs with weak isolation (--allow-weak-isolation): missing unprivileged_uid"
    )
    assert (weak in result.stderr) is not ISOLATED, result.stderr
    rows = _results(out)
    assert len(rows) == 4
    assert all(r["passed"] and r["repair_attempted"] and r["generations"] == 2 for r in rows.values())
    assert all(r["tests_run"] == r["tests_total"] > 0 for r in rows.values())
    hidden = [
        t["input"]
        for line in workload.read_text().splitlines()
        for t in json.loads(line)["metadata"]["reference_tests"]
        if len(t["input"]) > 8
    ]
    names = ("results.jsonl", "summary.json", "events.jsonl")
    published = "".join((out / name).read_text() for name in names)
    assert hidden and not any(h in published for h in hidden)
    receipt = json.loads((out / "run.json").read_text())
    assert receipt["status"] == "complete"
    assert (receipt["config"]["test_timeout"], receipt["config"]["evaluation_timeout"]) == (5, 50)
    assert receipt["config"]["test_memory_mb"] == 1024
    sandbox = receipt["isolation"]["untrusted_code"]  # which isolation was in force, as probed
    assert sandbox["weak"] is not ISOLATED and sandbox["layers"]["unprivileged_uid"]["active"] is ISOLATED
    assert sandbox["allowed_weak"] is not ISOLATED
    # Replaying the run in simulation repairs exactly where the run did, with no code executed.
    replay = tmp_path / "replay"
    replayed_run = invoke("simulate", "--from-run", out, "--output", replay, "--policy", "fifo")
    assert replayed_run.exit_code == 0, replayed_run.output
    replayed = _results(replay)
    assert {k: (r["generations"], r["passed"]) for k, r in replayed.items()} == {
        k: (r["generations"], r["passed"]) for k, r in rows.items()
    }


def test_repair_feedback_is_readable_text() -> None:
    """The first failing case reaches the model as labelled blocks with its real lines, not as a Python
    dict repr with escaped newlines."""
    from asyncroll.runtime.trajectory import format_feedback

    feedback = {
        "test": 0,
        "verdict": "wrong_answer",
        "input": "2\nab\nba\n",
        "expected": "YES\nNO\n",
        "got": "",
        "detail": "mismatched output length: got 0 lines, expected 2",
    }
    assert format_feedback(feedback) == (
        "Failed test #0: wrong_answer\ninput:\n2\nab\nba\nexpected:\nYES\nNO\ngot: (empty)\n"
        "detail: mismatched output length: got 0 lines, expected 2"
    )
    crashed = {
        "test": 3,
        "verdict": "runtime_error",
        "input": "[1]",
        "expected": "2",
        "error": "Trace\nZeroDivisionError",
    }
    assert format_feedback(crashed).endswith("error:\nTrace\nZeroDivisionError")
    assert format_feedback("(simulated) text") == "(simulated) text" and format_feedback(None) == ""


def test_a_repair_whose_evaluation_fails_is_recorded_as_attempted(virtual_run: VirtualRun) -> None:
    """The repair was submitted, then its evaluation failed (here: it ran past ``--tool-timeout``; a
    worker crash reads the same): the trajectory fails and keeps its first verdict, but says a repair
    was attempted — it said ``repair_attempted: false``, as if the model had never resubmitted."""
    evaluations = 0

    def duration(request: JobRequest) -> float:
        nonlocal evaluations
        if request.tool == "lcb_evaluate":
            evaluations += 1
            if evaluations == 2:
                return 100.0  # the repair's evaluation: past the 5 s tool timeout
        return builtin_duration(request)

    outcome, _, out = virtual_run([_code_problem("fixed", [False, True])], duration, tool_timeout=5.0)
    row = _results(out)["fixed"]
    assert row["status"] == "failed" and "evaluation failed" in row["error"]
    assert (row["passed"], row["repair_attempted"], row["generations"]) == (False, True, 1)
    assert outcome.summary is not None


def test_an_evaluation_is_sent_as_a_large_request_and_a_tool_call_is_not(
    virtual_run: VirtualRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An evaluation's tests are pickled a slice at a time (the loop running between); a tool call, a few
    hundred bytes, is encoded in one piece as before (no pause added to every job)."""
    from asyncroll.runtime.virtual_worker import VirtualWorker
    from tests.conftest import tool_problem

    sent: list[tuple[str, bool]] = []
    real = VirtualWorker.call

    async def call(self: VirtualWorker, request: JobRequest, timeout: float, *, large: bool = False) -> Any:  # noqa: ASYNC109
        sent.append((request.tool, large))
        return await real(self, request, timeout, large=large)

    monkeypatch.setattr(VirtualWorker, "call", call)
    outcome, _, _ = virtual_run(
        [_code_problem("code", [False, True]), tool_problem("t", model_ms=1, cpu_ms=2, turns=1)]
    )
    assert outcome.status == "complete"
    assert sorted(sent) == [("lcb_evaluate", True), ("lcb_evaluate", True), ("sleep_ms", False)]


def test_a_problems_test_sizes_are_measured_once_not_at_every_evaluation(
    virtual_run: VirtualRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-repair settings, with the tests' byte size (a predictor feature, which walks every test on
    the event loop: 0.16 s for 1,000,000 tests), are made once per problem; they were made again at
    every evaluation, the repair's included."""
    from asyncroll.workload import models

    made: list[int] = []

    class Counted(models.OneRepair):
        __slots__ = ()

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(models, "OneRepair", Counted)
    outcome, cap, _ = virtual_run([_code_problem("code", [False, True])], cpu_workers=1)
    assert outcome.status == "complete" and len(cap.of(CpuEnqueued)) == 2  # the first answer, the repair
    assert len(made) == 1
