"""A problem's test records as the evaluator takes them: one :class:`Case` per record, checked.

The checks live apart from the evaluator (which imports the sandbox) so that workload validation can run
exactly them, cheaply: a record the evaluator would refuse is reported before a run, not by a failed
trajectory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from asyncroll.evaluator.compare import parse_expected
from asyncroll.evaluator.lcb_json import lcb_loads


@dataclass(frozen=True, slots=True)
class Case:
    """One validated test: stdin bytes and the expected stdout text, or the expected JSON value."""

    input: str
    output: str
    expected_value: Any = None


def check_tests(tests: Any, func_name: str | None) -> list[Case]:
    """The evaluator's checks of a problem's test records (``func_name`` already checked); raises
    ``ValueError`` naming ``tests[i]`` and the field."""
    if not isinstance(tests, list) or not tests:
        raise ValueError("tests must be a non-empty list of {input, output} records")
    return [check_test(i, test, func_name) for i, test in enumerate(tests)]


def check_test(i: int, test: Any, func_name: str | None) -> Case:
    """One test record as the evaluator checks it (the workload validation runs this too, so that a
    record the evaluator would refuse is reported before a run); ``ValueError`` names ``tests[i]``."""
    if not isinstance(test, dict):
        raise ValueError(f"tests[{i}] must be an object, got {type(test).__name__}")
    for key in ("input", "output"):
        if not isinstance(test.get(key), str):
            raise ValueError(f"tests[{i}].{key} must be a string")
    testtype = test.get("testtype")
    if testtype not in (None, "stdin", "functional"):
        raise ValueError(f"tests[{i}].testtype must be 'stdin' or 'functional', got {testtype!r}")
    if testtype == "functional" and func_name is None:
        raise ValueError(f"tests[{i}] is functional but no func_name was given")
    if testtype == "stdin" and func_name is not None:
        raise ValueError(f"tests[{i}] is a stdin test but func_name {func_name!r} was given")
    expected = None
    if func_name is not None:
        for n, line in enumerate(test["input"].split("\n"), start=1):
            if line.strip():
                try:
                    lcb_loads(line)
                except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply (JsonTooDeep)
                    raise ValueError(f"tests[{i}].input line {n} is not a JSON value: {exc}") from None
        try:
            expected = parse_expected(test["output"])
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"tests[{i}].output is not a JSON value: {exc}") from None
    return Case(test["input"], test["output"], expected)
