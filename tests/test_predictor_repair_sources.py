"""Where a resubmission's prediction comes from in the real runtime (virtual clock, exact times): a repair's
evaluation from its trajectory's first evaluation — not from a tool call made before the first submission,
which does not make that submission a resubmission — a re-call after a timeout from the censored timeout,
and a re-call after a worker died not from its first run (the dead worker's job was never observed)."""

from __future__ import annotations

from typing import Any

from asyncroll.events import CpuEnqueued, CpuSelected
from tests.conftest import VirtualRun


def _code_problem_with_a_tool_first() -> dict[str, Any]:
    """A sleep_ms call (30 ms), then a failing submission (200 ms to evaluate), then its repair (210 ms)."""
    return {
        "id": "code",
        "prompt": "write a program",
        "tools": [{"name": "lcb_evaluate"}, {"name": "sleep_ms"}],
        "script": [
            {"type": "tool", "name": "sleep_ms", "arguments": {"milliseconds": 30}, "latency_ms": 10},
            {"type": "submit", "code": "print(0)", "latency_ms": 10, "cpu_ms": 200, "passes": False},
            {"type": "submit", "code": "print(1)", "latency_ms": 10, "cpu_ms": 210, "passes": True},
        ],
        "metadata": {
            "reference_tests": [{"input": "1", "output": "1", "testtype": "stdin"}],
            "prompt_metadata": {"protocol": "one_repair", "max_generations": 2},
        },
    }


def test_a_tool_call_before_the_first_submission_is_not_what_its_repair_is_predicted_by(
    virtual_run: VirtualRun,
) -> None:
    outcome, cap, _ = virtual_run([_code_problem_with_a_tool_first()], policy="asyncroll", cpu_workers=1)
    assert outcome.status == "complete"
    enqueued = [(e.kind, e.resubmission) for e in cap.of(CpuEnqueued)]
    assert enqueued == [("tool", False), ("evaluate", False), ("evaluate", True)]
    selected = cap.of(CpuSelected)
    assert [(e.prediction_source, e.observations) for e in selected] == [
        ("prior", 0),
        ("ridge", 1),
        ("same_problem_first_evaluation", 2),
    ]
    assert selected[2].predicted_s == 0.2  # the first evaluation's 200 ms, not the tool call's 30 ms
    prediction = outcome.summary["scheduler"]["prediction"] if outcome.summary else {}
    assert (prediction["pairs_first"], prediction["pairs_repairs"]) == (2, 1)


def _tool_problem(pid: str, first: dict[str, Any]) -> dict[str, Any]:
    again = {"type": "tool", "name": "sleep_ms", "arguments": {"milliseconds": 20}, "latency_ms": 10}
    final = {"type": "final", "answer": "x", "latency_ms": 10}
    return {"id": pid, "prompt": pid, "tools": [{"name": "sleep_ms"}], "script": [first, again, final]}


def test_a_recall_after_a_timeout_is_predicted_by_the_timeout_and_after_a_death_not_by_its_first_run(
    virtual_run: VirtualRun,
) -> None:
    slow = {"type": "tool", "name": "sleep_ms", "arguments": {"milliseconds": 5000}, "latency_ms": 10}
    dies = {**slow, "arguments": {"milliseconds": 50}, "worker_dies": "killed", "latency_ms": 20}
    outcome, cap, _ = virtual_run(
        [_tool_problem("slow", slow), _tool_problem("dies", dies)],
        policy="fifo",
        cpu_workers=2,
        tool_timeout=1.0,
        tool_errors="observe",
    )
    assert outcome.status == "complete"
    recalls = {e.id: e for e in cap.of(CpuSelected) if e.job_id in _resubmissions(cap)}
    # the timed-out first call was observed censored at the 1 s timeout: the re-call's prior
    assert (recalls["slow"].prediction_source, recalls["slow"].predicted_s) == (
        "same_problem_first_evaluation",
        1.0,
    )
    # the dead worker's job was not observed: no first run stands for the re-call, which comes before the
    # timeout's observation at 1 s, so nothing was observed at all
    assert (recalls["dies"].prediction_source, recalls["dies"].observations) == ("prior", 0)


def _resubmissions(cap: Any) -> set[int]:
    return {e.job_id for e in cap.of(CpuEnqueued) if e.resubmission}
