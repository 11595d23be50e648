"""The report's tables when pairs are missing: no complete pair, an unfinished arm, a comparison.json
written before the run order was recorded."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from asyncroll.experiment.comparison import build_comparison, validate_comparison
from asyncroll.experiment.report import POOLED_RATES, aggregate
from asyncroll.experiment.report_markdown import markdown
from tests.fake_comparison import comparison, two_arms

ROWS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"makespan_s": 2.0}, {"makespan_s": 1.0}),
    ({"makespan_s": 4.0}, {"makespan_s": 3.0}),
]


def test_with_no_complete_pair_every_pooled_rate_says_so() -> None:
    data = comparison(ROWS, errors={"pair1-b": "boom", "pair2-a": "boom"})
    agg = aggregate(data)
    for arm in ("a", "b"):
        pooled = agg["pooled"][arm]
        assert pooled["pairs"] == 0 and pooled["totals"] == {}
        assert {rate: pooled[rate] for rate in POOLED_RATES} == dict.fromkeys(POOLED_RATES)
        assert pooled["notes"] == dict.fromkeys(POOLED_RATES, "unknown (no complete pair)")
    text = markdown(agg)
    row = next(line for line in text.splitlines() if line.startswith("| b | "))
    assert row == "| b | " + " | ".join(["unknown (no complete pair)"] * 4) + " |"


def test_an_unfinished_arm_is_listed_and_no_complete_arm_is() -> None:
    data = comparison(ROWS)
    arm = data["pairs"][1]["arms"]["b"]
    arm.update(status="interrupted", error="the experiment's deadline passed")
    data["pairs"][1]["complete"] = False
    validate_comparison(copy.deepcopy(data))
    agg = aggregate(data)
    assert agg["complete_pairs"] == [1]
    assert agg["failures"] == [
        {
            "pair": 2,
            "arm": "b",
            "id": "pair2-b",
            "status": "interrupted",
            "error": "the experiment's deadline passed",
        }
    ]
    text = markdown(agg)
    unfinished = text[text.index("Unfinished arms") :].strip().splitlines()[1:]
    assert unfinished == ["", "- `pair2-b`: interrupted: the experiment's deadline passed"]


def test_a_comparison_without_the_run_order_is_still_reported() -> None:
    data = comparison(ROWS)
    for pair in data["pairs"]:
        del pair["order"]  # written before the order was recorded
    agg = aggregate(data)
    assert agg["orders"] == [] and agg["pairs_complete"] == 2
    assert "Order of the arms" not in markdown(agg)


def test_pooled_rates_are_sums_over_sums_even_below_one() -> None:
    """Two pairs of 3 completions in 0.001 GPU-hour each: 6 / 0.002 = 3,000 per GPU-hour, not one pair's
    rate and not undefined for a denominator below 1."""
    b = {"counts.completed": 2, "cpu_cost.total_cpu_s": 0.5, "scheduler.eligible_decisions": 4}
    agg = aggregate(comparison([({}, b), ({}, {**b, "scheduler.reorders": 1})]))
    a, t = agg["pooled"]["a"], agg["pooled"]["b"]
    rates = ("completed_per_gpu_hour", "cpu_s_per_completion", "completion_rate", "accuracy_exact")
    assert [a[r] for r in rates] == pytest.approx([3000.0, 0.1, 1.0, 1.0]) and a["activation_rate"] is None
    unevaluated = {"pass_rate_first": "unknown (passed_first and evaluated not measured)"}
    assert a["notes"] == {**unevaluated, "activation_rate": "undefined (eligible_decisions = 0)"}
    assert [t[r] for r in (*rates, "activation_rate")] == pytest.approx([2000.0, 0.25, 4 / 6, 1.0, 1 / 8])
    assert t["notes"] == unevaluated
    rows = markdown(agg).splitlines()
    assert "| a | 1 | 3000 | 0.1 | undefined (eligible_decisions = 0) |" in rows
    assert "| b | 0.6667 | 2000 | 0.25 | 0.125 |" in rows


def test_a_comparison_without_its_bootstrap_settings_uses_and_reports_the_defaults() -> None:
    data = comparison(ROWS)
    del data["seed"], data["bootstrap_resamples"]  # optional in comparison.json: 0 and 10,000
    validate_comparison(copy.deepcopy(data))
    bootstrap = aggregate(data)["bootstrap"]
    assert (bootstrap["seed"], bootstrap["resamples"]) == (0, 10_000)


def test_the_server_versions_line_flags_a_version_that_differs_between_arms() -> None:
    data = comparison(ROWS)
    line = "Server versions seen in the arms' logs (and answered to their clients' GET /version): "
    assert line + "none parsed." in markdown(aggregate(data)).splitlines()
    data["server_versions"] = {"vllm_version": ["0.6.1", "0.6.2"], "sglang_version": ["0.4.1"]}
    assert (
        line + "vllm_version 0.6.1, 0.6.2 (**differs between arms**); sglang_version 0.4.1."
        in markdown(aggregate(data)).splitlines()
    )


def staged(qualification: str, stage: str, status: str) -> dict[str, Any]:
    """comparison.json of an experiment that ended ``status`` in its qualification stage (``stage``, its
    one arm ``qualification``), before its one pair ran."""
    plan: list[dict[str, Any]] = [
        {
            "id": "qualification-1-a",
            "stage": "qualification",
            "pair": None,
            "arm": "a",
            "policy": "a",
            "seed": 0,
        }
    ] + [
        {"id": f"pair1-{a}", "stage": "comparison", "pair": 0, "arm": a, "policy": a, "seed": 0} for a in "ab"
    ]
    experiment = {
        "config": two_arms(),
        "status": status,
        "fingerprint": {"sha256": "f" * 64},
        "stages": {
            "qualification": {"status": stage, "arms": ["qualification-1-a"], "gates": []},
            "comparison": {"status": "pending", "arms": [], "gates": []},
        },
        "plan": plan,
        "arms": {
            "qualification-1-a": {"status": qualification},
            "pair1-a": {"status": "pending"},
            "pair1-b": {"status": "pending"},
        },
    }
    data = build_comparison(experiment, {})
    validate_comparison(copy.deepcopy(data))
    return data


def test_an_arm_interrupted_in_a_stage_before_the_pairs_is_listed_as_unfinished() -> None:
    """Ctrl-C during qualification: the interrupted qualification arm is unfinished too, not only the
    pairs' arms that never started."""
    text = markdown(aggregate(staged("interrupted", "running", "interrupted")))
    unfinished = text[text.index("Unfinished arms (not failed; `--resume` runs them)") :].strip().splitlines()
    assert unfinished[2:] == [
        "- `qualification-1-a`: interrupted",
        "- `pair1-a`: pending",
        "- `pair1-b`: pending",
    ]


def test_after_a_failed_gate_the_arms_not_run_are_not_promised_to_a_resume() -> None:
    """A failed gate stops the experiment for good (``--resume`` says "stopped earlier at …" and runs
    nothing): the report must not say that ``--resume`` runs the arms left pending."""
    text = markdown(aggregate(staged("complete", "failed", "stopped")))
    assert "`--resume` runs them" not in text
    heading = "Arms not run (stage qualification failed its gate; `--resume` does not run them):"
    arms = text[text.index(heading) :].strip().splitlines()
    assert arms[2:] == ["- `pair1-a`: pending", "- `pair1-b`: pending"]


def test_a_change_that_rounds_to_zero_is_never_written_negative() -> None:
    """A mean of -0.001% printed "-0.00%" (and a difference of -0.0 "-0"): a direction the figure does not
    have at the precision shown."""
    from asyncroll.experiment.report_markdown import _interval, fmt

    assert (
        _interval({"mean": -0.001, "low": -0.004, "high": 0.002, "n": 3}) == "+0.00% [+0.00%, +0.00%] (n=3)"
    )
    assert _interval({"mean": -1.5, "low": -2.0, "high": -1.0, "n": 3}) == "-1.50% [-2.00%, -1.00%] (n=3)"
    assert _interval(
        {"mean": -0.0, "low": None, "high": None, "n": 1, "note": "one pair"}, percent=False
    ) == ("+0 (n=1; no interval: one pair)")
    assert fmt(-0.0) == "0" and fmt(-1e-9) == "-1e-09"


def test_with_no_complete_pair_the_medians_say_so_not_that_nothing_was_measured() -> None:
    """Every pair had a failed arm (one arm failing in every pair does it): the medians table said
    "unknown", which its legend defines as "a metric the run could not measure", though the other arms
    were measured; it says "no complete pair", and a line above the tables says why nothing is computed."""
    text = markdown(aggregate(comparison(ROWS, errors={"pair1-b": "boom", "pair2-b": "boom"})))
    row = next(line for line in text.splitlines() if line.startswith("| makespan, s | "))
    assert row == "| makespan, s | no complete pair | no complete pair |"
    assert "**No complete pair**: every pair has a failed or unfinished arm" in text
    assert "**No complete pair**" not in markdown(aggregate(comparison(ROWS)))


def test_the_report_says_how_its_intervals_were_computed() -> None:
    """The paired tables' headers said "[95% t]" and "[95% bootstrap]", and nothing said which bootstrap
    (percentile, over pairs), with how many resamples or which seed: all in aggregate.json, none in
    REPORT.md, so a reader could neither judge nor reproduce the interval."""
    data = comparison(ROWS)
    data["seed"], data["bootstrap_resamples"] = 7, 2000
    text = markdown(aggregate(data))
    assert (
        '"bootstrap" a bootstrap of the mean (percentile, pairs resampled; 2,000 resamples, seed 7)' in text
    )
    assert "Student's t over the pairs (n − 1 degrees of freedom)" in text
