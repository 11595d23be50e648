"""The evaluator's arguments (no process): bad ones refused naming the field, the default total budget
scaled like LiveCodeBench's below the tool timeout, feedback fields cut."""

from __future__ import annotations

from typing import Any

import pytest

from asyncroll.evaluator.evaluate import FIELD_LIMIT, cut, lcb_evaluate
from tests.evaluations import ADD_PROGRAM


def test_feedback_fields_are_cut_to_1000_characters() -> None:
    assert cut("x" * FIELD_LIMIT) == "x" * FIELD_LIMIT
    head = cut("a" * 600 + "b" * 600)
    tail = cut("a" * 600 + "b" * 600, keep_tail=True)
    assert len(head) == len(tail) == FIELD_LIMIT
    assert head.startswith("a") and tail.endswith("b")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"code": 3}, "code must be a string"),
        ({"tests": []}, "tests must be a non-empty list"),
        ({"tests": [{"input": "1"}]}, "tests[0].output must be a string"),
        ({"tests": [{"input": "1", "output": "2", "testtype": "x"}]}, "tests[0].testtype must be"),
        ({"tests": [{"input": "1", "output": "2", "testtype": "functional"}]}, "no func_name was given"),
        ({"func_name": "not an id"}, "func_name must be a Python identifier"),
        ({"func_name": "f", "tests": [{"input": "[1]\nnope", "output": "1"}]}, "tests[0].input line 2"),
        ({"func_name": "f", "tests": [{"input": "[1]", "output": "{"}]}, "tests[0].output is not a JSON"),
        ({"time_limit_s": 0}, "time_limit_s must be a number"),
        ({"total_time_limit_s": -1}, "total_time_limit_s must be a number"),
        ({"memory_limit_mb": 8}, "memory_limit_mb must be an integer in [64, 1048576]"),
        ({"memory_limit_mb": 2**21}, "memory_limit_mb must be an integer in [64, 1048576]"),
        ({"tool_timeout_s": 0}, "tool_timeout_s must be a positive number"),
        ({"tool_timeout_s": float("inf")}, "tool_timeout_s must be a positive number"),
        (  # an explicit budget is not capped: past the cap the worker would be killed before the verdict
            {"total_time_limit_s": 55, "tool_timeout_s": 60},
            "total_time_limit_s 55 does not fit under tool_timeout_s 60: at most 54s",
        ),
    ],
)
def test_bad_arguments_raise_errors_naming_the_field(kwargs: dict[str, Any], message: str) -> None:
    arguments: dict[str, Any] = {"code": ADD_PROGRAM, "tests": [{"input": "1 2", "output": "3"}], **kwargs}
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        lcb_evaluate(**arguments)


def test_the_default_total_budget_scales_like_livecodebench_below_the_tool_timeout() -> None:
    from asyncroll.evaluator.evaluate import tool_timeout_cap, total_budget

    assert tool_timeout_cap(60) == 54 and tool_timeout_cap(180) == 162  # a 10% margin
    assert tool_timeout_cap(3) == 2 and tool_timeout_cap(1) == 0.5  # at least 1 s, at most half
    budget, why = total_budget(6.0, 12, 180.0)
    assert budget == (6 + 1) * 12 + 5 and "as LiveCodeBench" in why  # QA's 12 slow tests fit
    budget, why = total_budget(6.0, 12, 60.0)
    assert budget == 54 and "--tool-timeout of 60s" in why
    assert total_budget(6.0, 12, None)[0] == 50  # a call that names no tool timeout: the old cap
    assert total_budget(6.0, 1, None)[0] == total_budget(6.0, 1, 60.0)[0] == 12
