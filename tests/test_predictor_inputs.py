"""What the runtime hands the predictor as a job's sizes: bytes (UTF-8), as the features are documented,
not characters — the two differ for any non-ASCII code, test input or answer."""

from __future__ import annotations

from typing import Any

import pytest

from asyncroll.events import CpuEnqueued
from asyncroll.policies import JobView
from asyncroll.policies.predictor import DurationPredictor
from tests.conftest import VirtualRun
from tests.test_one_repair import _code_problem

CODE = "print('héllo wörld ✓')"  # 22 characters, 26 bytes
TEST_INPUT = "ü" * 50  # 50 characters, 100 bytes
ANSWER = "naïve ✓"  # 7 characters, 10 bytes


def test_evaluation_and_grade_sizes_are_bytes(
    virtual_run: VirtualRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncroll.policies.predictor as predictor

    seen: list[JobView] = []
    real = predictor.features

    def record(job: JobView, bucket: int | None = None) -> list[float]:
        seen.append(job)
        return real(job, bucket)

    code: dict[str, Any] = _code_problem("code", [False, True])
    for action in code["script"]:
        action["code"] = CODE
    code["metadata"]["reference_tests"] = [{"input": TEST_INPUT, "output": "1", "testtype": "stdin"}] * 2
    graded = {
        "id": "graded",
        "prompt": "answer",
        "reference_answer": ANSWER,
        "script": [{"type": "final", "answer": ANSWER, "latency_ms": 10}],
    }
    monkeypatch.setattr(predictor, "features", record)
    outcome, cap, _ = virtual_run([code, graded, code | {"id": "code2"}], policy="asyncroll", cpu_workers=1)
    assert outcome.status == "complete"
    evaluations = [j for j in seen if j.kind == "evaluate"]
    assert evaluations and {(j.code_bytes, j.arg_bytes, j.test_bytes) for j in evaluations} == {(26, 26, 200)}
    enqueued = {(e.kind, e.arg_bytes) for e in cap.of(CpuEnqueued)}
    assert enqueued == {("evaluate", 26), ("grade", 10)}


def _evaluation(job_id: int, n_tests: int) -> JobView:
    return JobView(
        job_id, f"t{job_id}", "evaluate", "lcb_evaluate", 0, 0.0, 2000, False, n_tests, 10_000, 2000
    )


def test_more_tests_scale_an_evaluation_like_a_size_not_an_exponential() -> None:
    """Five evaluations of 50 tests took 0.5 s each. The test count was a raw feature of a model of log
    seconds, so a 200-test evaluation was predicted at 43.5 s (87x for 4x the tests: exponential in the
    count) and clamped at 60 s a little further; a count enters like the sizes, as a log."""
    p = DurationPredictor()
    for i in range(5):
        p.observe(_evaluation(i, 50), 0.5)
    same, more = p.predict([_evaluation(10, 50), _evaluation(11, 200)])
    assert same.source == more.source == "ridge" and abs(same.seconds - 0.5) < 0.05
    assert 0.5 < more.seconds < 0.5 * 16  # more tests cost more, by less than the count squared


def test_tool_argument_sizes_are_utf8_bytes(virtual_run: VirtualRun) -> None:
    """A tool call's ``arg_bytes`` (the predictor's feature and ``cpu_enqueued``'s field) counted the JSON
    text with every non-ASCII character escaped: ``ü`` as 6 bytes (``\\u00fc``), an emoji as 12, where
    its UTF-8 takes 2 and 4 — the same argument weighed 2-3x more in any script but Latin."""
    import json

    arguments = {"text": "grüße ✓ 🙂" * 10}
    problem = {
        "id": "p",
        "prompt": "p",
        "tools": [{"name": "echo", "inputs": {"text": "str"}, "implementation": "t.py"}],
        "script": [
            {"type": "tool", "name": "echo", "arguments": arguments, "latency_ms": 5, "cpu_ms": 5},
            {"type": "final", "answer": "x", "latency_ms": 5},
        ],
    }
    tool_files = {"t.py": "def echo(text: str) -> str:\n    return text\n"}
    outcome, cap, _ = virtual_run([problem], tool_files=tool_files, cpu_workers=1)
    assert outcome.status == "complete"
    (enqueued,) = cap.of(CpuEnqueued)
    assert enqueued.arg_bytes == len(json.dumps(arguments, ensure_ascii=False).encode())
