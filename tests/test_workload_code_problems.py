"""Code problems in a workload (the one-repair protocol and its ``lcb_evaluate``): reached only by
``submit``, and test records checked by validation as the evaluator would check them at run time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncroll.json_depth import TOO_DEEP
from asyncroll.workload.models import Problem
from tests.workload_scans import _problems


def test_submit_without_one_repair_protocol_is_rejected(tmp_path: Path) -> None:
    line = json.dumps({"id": 1, "prompt": "p", "script": [{"type": "submit", "code": "print(1)"}]})
    problems = _problems(tmp_path, [line])
    assert any("script[0].type" in p and "one_repair" in p for p in problems)


def test_the_evaluator_is_reached_only_by_submit(tmp_path: Path) -> None:
    """``lcb_evaluate`` needs the problem's hidden tests, which only the one-repair protocol gives it: a
    tool call of it (a TypeError at run time), its declaration outside the protocol (a model could call
    it) and a ``final`` answer to a code problem (never tested, left out of the pass rates) are refused."""
    meta = {"prompt_metadata": {"protocol": "one_repair"}, "reference_tests": [{"input": "", "output": "1"}]}
    evaluator = [{"name": "lcb_evaluate"}]
    call = {"type": "tool", "name": "lcb_evaluate", "arguments": {"code": "print(1)"}}
    lines = [
        {
            "id": "ok",
            "prompt": "p",
            "tools": evaluator,
            "metadata": meta,
            "script": [{"type": "submit", "code": "x"}],
        },
        {
            "id": "final",
            "prompt": "p",
            "tools": evaluator,
            "metadata": meta,
            "script": [{"type": "final", "answer": "1"}],
        },
        {"id": "call", "prompt": "p", "tools": evaluator, "metadata": meta, "script": [call]},
        {"id": "plain", "prompt": "p", "tools": evaluator, "script": [{"type": "final", "answer": "1"}]},
    ]
    problems = _problems(tmp_path, [json.dumps(line) for line in lines])
    assert [p.split(": ")[0].rsplit(":", 1)[1] for p in problems] == ["2", "3", "4"], problems
    assert "script[0].type" in problems[0] and "would never be tested" in problems[0]
    assert "script[0].name" in problems[1] and "cannot be called as a tool" in problems[1]
    assert "tools[0].name" in problems[2] and "cannot be called as a tool" in problems[2]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"testtype": "weird"}, "metadata.reference_tests[0].testtype: must be 'stdin' or 'functional'"),
        ({"testtype": "functional"}, "metadata.reference_tests[0]: is functional but no func_name"),
        ({"input": 3}, "metadata.reference_tests[0].input: must be a string"),
    ],
)
def test_one_repair_test_records_get_the_evaluators_own_checks(
    tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    """A test record the evaluator would refuse at run time (failing every trajectory) is reported by
    validation, with its field."""
    meta = {
        "prompt_metadata": {"protocol": "one_repair"},
        "reference_tests": [{"input": "1", "output": "1"} | change],
    }
    line = {"id": "c", "prompt": "p", "tools": [{"name": "lcb_evaluate"}], "metadata": meta}
    problems = _problems(tmp_path, [json.dumps(line)], scripted=False)
    assert len(problems) == 1 and field in problems[0], problems


def test_functional_test_records_must_be_json(tmp_path: Path) -> None:
    tests = [
        {"input": "not json", "output": "[1]", "testtype": "functional"},
        {"input": "1", "output": "1", "testtype": "stdin"},
    ]
    meta = {"prompt_metadata": {"protocol": "one_repair"}, "reference_tests": tests, "func_name": "solve"}
    line = {"id": "c", "prompt": "p", "tools": [{"name": "lcb_evaluate"}], "metadata": meta}
    problems = _problems(tmp_path, [json.dumps(line)], scripted=False)
    assert "metadata.reference_tests[0].input: line 1 is not a JSON value" in problems[0], problems
    assert "metadata.reference_tests[1]: is a stdin test but func_name 'solve' was given" in problems[1], (
        problems
    )


def test_functional_tests_nested_too_deeply_are_named_errors_not_crashes(tmp_path: Path) -> None:
    """A functional test whose input line or output nests past Python's recursion limit ended
    ``validate`` (and ``run``) in a RecursionError traceback from the evaluator's own check."""
    deep = "[" * 5000 + "]" * 5000
    lines = [
        json.dumps(
            {
                "id": f"p{i}",
                "prompt": "x",
                "tools": [{"name": "lcb_evaluate"}],
                "script": [{"type": "submit", "code": "pass"}],
                "metadata": {
                    "func_name": "f",
                    "prompt_metadata": {"protocol": "one_repair"},
                    "reference_tests": [{**test, "testtype": "functional"}],
                },
            }
        )
        for i, test in enumerate([{"input": deep, "output": "1"}, {"input": "1", "output": deep}])
    ]
    problems = _problems(tmp_path, lines)
    assert len(problems) == 2, problems
    assert ":1: metadata.reference_tests[0].input: line 1 is not a JSON value: " + TOO_DEEP in problems[0]
    assert ":2: metadata.reference_tests[0].output: is not a JSON value: " + TOO_DEEP in problems[1]


def test_tests_too_large_for_a_workers_message_are_refused(tmp_path: Path, monkeypatch: Any) -> None:
    """Every evaluation sends the tests to a worker in one message of at most MAX_FRAME (1 GiB): a problem
    of more passed validation and then failed the whole run at its first evaluation ('run failed:
    ProtocolError: frame of N bytes exceeds the 1073741824-byte limit'), every other trajectory with it.
    The limit (half the message, leaving room for the program) counts UTF-8 bytes."""
    from asyncroll.workers.protocol import MAX_FRAME
    from asyncroll.workload import checks

    assert checks.MAX_TESTS_BYTES == MAX_FRAME // 2
    monkeypatch.setattr(checks, "MAX_TESTS_BYTES", 100)
    tests = [{"input": "é" * 25, "output": "x" * 25}, {"input": "", "output": "1"}]
    meta = {"prompt_metadata": {"protocol": "one_repair"}, "reference_tests": tests}
    line = {"id": "c", "prompt": "p", "tools": [{"name": "lcb_evaluate"}], "metadata": meta}
    assert _problems(tmp_path, [json.dumps(line)], scripted=False) == []  # 76 bytes
    tests[1]["output"] = "1" * 25  # 100 bytes: at the limit
    assert _problems(tmp_path, [json.dumps(line)], scripted=False) == []
    tests[1]["output"] += "1"
    problems = _problems(tmp_path, [json.dumps(line)], scripted=False)
    assert problems == [
        f"{tmp_path / 'w.jsonl'}:1: metadata.reference_tests: 101 bytes of test inputs and outputs (UTF-8): "
        "at most 100, half of the largest message a worker takes (each evaluation sends them to its worker "
        "with the program)"
    ], problems


def test_a_copy_with_other_metadata_has_its_own_protocol_not_the_originals() -> None:
    meta = {"prompt_metadata": {"protocol": "one_repair"}, "reference_tests": [{"input": "1", "output": "1"}]}
    problem = Problem(prompt="p", metadata=meta)
    assert problem.one_repair is not None and problem.one_repair.test_bytes == 1  # made and cached
    tests = [{"input": "12345", "output": "1"}]
    other = problem.model_copy(update={"metadata": {**meta, "reference_tests": tests}})
    assert other.one_repair is not None and other.one_repair.tests == tests
    assert other.one_repair.test_bytes == 5
    assert problem.model_copy(update={"metadata": {}}).one_repair is None
    assert problem.model_copy(deep=True).one_repair == problem.one_repair
