"""comparison.json's fields as the report reads them: a number is only a number (never a bool or a
string the reader would coerce), each metric's direction, and the rule each arm's policy ran."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from asyncroll.experiment.comparison import validate_comparison
from asyncroll.experiment.report import aggregate
from asyncroll.experiment.report_markdown import markdown
from tests.fake_comparison import comparison

ROWS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"makespan_s": 2.0}, {"makespan_s": 1.0}),
    ({"makespan_s": 4.0}, {"makespan_s": 3.0}),
]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("metrics", True),  # lax reading took true as 1.0: a paired ratio of a bool
        ("metrics", "2.0"),  # and a string as its number
        ("counts", False),
        ("counts", "3"),
    ],
)
def test_a_bool_or_a_string_is_never_read_as_a_number(field: str, value: Any) -> None:
    data = comparison(ROWS)
    validate_comparison(copy.deepcopy(data))  # the file as written is read
    key = "makespan_s" if field == "metrics" else "completed"
    data["pairs"][1]["arms"]["b"][field][key] = value
    with pytest.raises(
        ValueError, match=rf"pairs\[1\]\.arms\.b\.{field}\.{key}: Input should be a valid number"
    ):
        validate_comparison(data)


def test_each_metric_says_which_direction_is_better() -> None:
    """Throughput and quality up, time and cost down; activation and coverage describe, neither."""
    directions = {m["key"]: m["higher_is_better"] for m in comparison(ROWS)["metrics"]}
    assert directions == {
        "completed_per_gpu_hour": True,
        "completed_per_wall_hour": True,
        "sampled_starvation_fraction": False,
        "sampled_starvation_s": False,
        "client_cpu_blocked_s": False,
        "cpu_s_per_completion": False,
        "makespan_s": False,
        "accuracy_exact": True,
        "pass_rate_final": True,
        "activation_rate": None,
        "server_coverage_fraction": None,
    }


def test_the_rule_an_arms_policy_ran_reaches_the_report() -> None:
    rule = {"scheduler.policy_rule": "asyncroll_repair"}
    data = comparison([(dict(r[0]), {**r[1], **rule}) for r in ROWS])
    assert [p["arms"]["b"]["policy_rule"] for p in data["pairs"]] == ["asyncroll_repair"] * 2
    assert [p["arms"]["a"]["policy_rule"] for p in data["pairs"]] == [None, None]
    agg = aggregate(data)
    assert agg["policy_rules"] == {"a": [], "b": ["asyncroll_repair"]}
    assert "| metric | a (fifo) | b (asyncroll = asyncroll_repair) |" in markdown(agg)


def test_an_asyncroll_arm_whose_rule_no_summary_recorded_says_so() -> None:
    """A comparison.json written before summaries named the rule (2026-12-03) holds no policy_rule: its
    ``asyncroll`` arm ran that day's default (asyncroll_critical), and the report labelled it bare
    ``asyncroll``, read as today's rule; it says the rule is not recorded (a rule-free name stays bare)."""
    data = comparison(ROWS)
    assert [p["arms"]["b"]["policy_rule"] for p in data["pairs"]] == [None, None]
    agg = aggregate(data)
    assert "| metric | a (fifo) | b (asyncroll = rule not recorded) |" in markdown(agg)


@pytest.mark.parametrize(("value", "read"), [(1e50, True), (1.5e50, False), (1e-50, True), (9e-51, False)])
def test_the_magnitudes_the_report_computes_with_are_bounded_where_documented(
    value: float, read: bool
) -> None:
    """0 or 1e-50 ≤ |x| ≤ 1e50 (``comparison.MAX_MAGNITUDE``): within them no statistic overflows."""
    data = comparison(ROWS)
    assert data["schema_version"] == 1  # files written by earlier versions stay readable
    data["pairs"][0]["arms"]["a"]["metrics"]["makespan_s"] = -value
    if read:
        validate_comparison(data)
    else:
        with pytest.raises(ValueError, match=r"pairs\[0\]\.arms\.a\.metrics\.makespan_s: .* is outside what"):
            validate_comparison(data)
