"""A final answer against its ``reference_answer`` (docs/WORKLOADS.md, MEASUREMENT.md "Rates"):
whitespace-normalised exact match, and an answer that is not a string compared as its JSON text."""

from __future__ import annotations

import json
from typing import Any

import pytest

from asyncroll.grading import grade
from tests.conftest import VirtualRun


@pytest.mark.parametrize(
    ("answer", "reference", "correct"),
    [("  4 \n", "4", True), ("a  b", "a b", True), ("a b", "ab", False), ("", " ", True)],
)
def test_grade_collapses_whitespace_only(answer: str, reference: str, correct: bool) -> None:
    assert grade(answer, reference) is correct


# docs/CONVERTERS.md (ToolMATH): no MATH-style answer equivalence. Each pair is right under the MATH
# benchmark's ``is_equiv`` (it canonicalises both sides) but wrong here, or wrong under both (last two).
@pytest.mark.parametrize(
    ("answer", "reference"),
    [
        ("0.5", r"\frac{1}{2}"),
        ("1/2", r"\frac{1}{2}"),
        (r"\dfrac{1}{2}", r"\frac{1}{2}"),
        (r"\frac12", r"\frac{1}{2}"),
        (r"\frac {1}{2}", r"\frac{1}{2}"),
        ("x=3", "3"),
        (r"5\text{ cm}", "5"),
        ("50", r"50\%"),
        ("(1, 2)", "(1,2)"),
        (r"\sqrt2", r"\sqrt{2}"),
        ("3.0", "3"),
        ("1,000", "1000"),
    ],
)
def test_grade_has_no_math_answer_equivalence(answer: str, reference: str) -> None:
    assert grade(answer, reference) is False


@pytest.mark.timeout(60)
def test_an_answer_that_is_not_a_string_is_graded_on_its_json_text(virtual_run: VirtualRun) -> None:
    """``true`` matches "true", ``1.0`` does not match "1", ``null`` is "null" (not Python's "None"), and
    an object is its JSON text with ", " and ": " between items, as docs/WORKLOADS.md and MEASUREMENT.md
    say."""
    cases: list[tuple[Any, str, bool]] = [
        (True, "true", True),
        (1.0, "1", False),
        (1, "1", True),
        (None, "None", False),
        (None, "null", True),
        ({"a": [1, 2]}, '{"a": [1, 2]}', True),
        ("x", "x", True),
    ]
    problems = [
        {
            "id": f"p{i}",
            "prompt": "p",
            "reference_answer": reference,
            "script": [{"type": "final", "answer": answer, "latency_ms": 1}],
        }
        for i, (answer, reference, _) in enumerate(cases)
    ]
    outcome, _, out = virtual_run(problems)
    assert outcome.status == "complete"
    results = {r["id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert [results[f"p{i}"]["correct"] for i in range(len(cases))] == [c for _, _, c in cases]
    assert [results[f"p{i}"]["answer"] for i in range(len(cases))] == [a for a, _, _ in cases]
