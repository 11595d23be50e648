"""REPORT.md's "Did it help?": each arm's verdict on its headline throughput, and each directed metric's
verdict in its paired table, read off the 95% t interval (better / worse only when it excludes 0), and the
same headline printed by ``asyncroll report``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncroll.experiment.report import aggregate
from asyncroll.experiment.report_markdown import markdown
from asyncroll.experiment.verdict import BETTER, NO_EVIDENCE, NO_VERDICT, SAME, WORSE, read
from tests.conftest import invoke
from tests.fake_comparison import comparison, drawn

WALL = "throughput.completed_per_wall_hour"
GPU = "throughput.completed_per_gpu_hour"


def pairs(key: str, base: list[float], arm: list[float], **more: tuple[list[float], list[float]]) -> Any:
    """comparison.json of pairs whose arms have these values of ``key`` (and of each key in ``more``)."""
    rows = []
    for i, (a, b) in enumerate(zip(base, arm, strict=True)):
        left, right = {key: a}, {key: b}
        for other, (xs, ys) in more.items():
            left[other.replace("__", ".")], right[other.replace("__", ".")] = xs[i], ys[i]
        rows.append((left, right))
    return comparison(rows)


def verdict(data: dict[str, Any], key: str) -> dict[str, Any]:
    return dict(aggregate(data)["verdicts"]["b"]["metrics"][key])


def test_a_throughput_gain_whose_interval_excludes_0_is_better_and_is_the_headline() -> None:
    agg = aggregate(pairs(WALL, [100, 100, 90, 110], [105, 104, 95, 114]))
    record = agg["verdicts"]["b"]
    assert record["headline"] == "completed_per_wall_hour"  # no dedicated GPU: per GPU-hour unmeasured
    assert record["metrics"]["completed_per_wall_hour"]["verdict"] == BETTER
    text = markdown(agg)
    assert (
        "- `b` (asyncroll) vs `a` (fifo): **better**: completions per wall hour +4.55% [+3.14%, +5.96%] "
        "(n=4), a 95% t interval over the complete pairs that excludes 0." in text
    )
    # the section comes before the tables it summarises
    assert text.index("## Did it help?") < text.index("## Stages") < text.index("## Paired: b vs a")


def test_per_gpu_hour_is_the_headline_where_it_was_measured() -> None:
    data = pairs(GPU, [10, 10, 10], [9, 9.5, 9.2], throughput__completed_per_wall_hour=([1, 1, 1], [2, 2, 2]))
    record = aggregate(data)["verdicts"]["b"]
    assert record["headline"] == "completed_per_gpu_hour"
    assert record["metrics"]["completed_per_gpu_hour"]["verdict"] == WORSE  # lower throughput: worse
    assert record["metrics"]["completed_per_wall_hour"]["verdict"] == BETTER


def test_an_interval_that_spans_0_is_no_evidence_either_way() -> None:
    assert verdict(pairs(WALL, [100, 100, 100], [103, 98, 101]), "completed_per_wall_hour")["verdict"] == (
        NO_EVIDENCE
    )


def test_a_lower_is_better_metric_that_fell_is_better() -> None:
    v = verdict(pairs("makespan_s", [10, 12, 11], [9, 11, 10.2]), "makespan_s")
    assert v["verdict"] == BETTER and v["high"] < 0


def test_a_baseline_of_0_reads_the_mean_difference() -> None:
    """No CPU-blocked time in the baseline: the % change is undefined, the difference is read."""
    key = "resources.client_cpu_blocked_s"
    v = verdict(pairs(key, [0.0, 0.0, 0.0], [1.0, 1.5, 1.2]), "client_cpu_blocked_s")
    assert v["scale"] == "difference" and v["verdict"] == WORSE
    row = next(
        line
        for line in markdown(aggregate(pairs(key, [0.0] * 3, [1.0, 1.5, 1.2]))).splitlines()
        if line.startswith("| client CPU-blocked, s | p1")
    )
    assert row.endswith("| **worse** (on the difference) |")


def test_one_pair_has_no_verdict_and_says_why() -> None:
    agg = aggregate(pairs(WALL, [100], [120]))
    v = agg["verdicts"]["b"]["metrics"]["completed_per_wall_hour"]
    assert v["verdict"] == NO_VERDICT and v["why"] == "an interval needs at least 2 pairs"
    assert "**no verdict**: completions per wall hour +20.00% (n=1; an interval needs at least 2 pairs)" in (
        markdown(agg)
    )


def test_no_complete_pair_has_no_verdict() -> None:
    data = comparison([({WALL: 1.0}, {WALL: 2.0})], errors={"pair1-b": "boom"})
    assert "## Did it help?\n\nNo verdict: no complete pair." in markdown(aggregate(data))


def test_a_metric_with_no_better_direction_has_no_verdict_column_value() -> None:
    row = next(
        line
        for line in markdown(aggregate(pairs(WALL, [1, 2], [1, 2]))).splitlines()
        if line.startswith("| activation rate (reorders / eligible) | p1")
    )
    assert row.endswith("| - |")


def _paired(t: tuple[float, float], boot: tuple[float, float], n: int) -> dict[str, Any]:
    return {
        "mean_percent_change_t95": {"n": n, "mean": sum(t) / 2, "low": t[0], "high": t[1], "note": None},
        "mean_percent_change_bootstrap95": {"n": n, "mean": sum(t) / 2, "low": boot[0], "high": boot[1]},
        "mean_difference_t95": {"n": n, "mean": 1.0, "low": 0.5, "high": 1.5, "note": None},
    }


def test_a_bootstrap_that_disagrees_is_said_only_where_it_can_be_trusted() -> None:
    """At 12 pairs a percentile bootstrap covers about as it claims: its disagreement is worth saying; at 3
    it covers 75% of the time, and the report already says to read the t interval."""
    assert read(_paired((0.5, 3.0), (-0.1, 2.9), 12), higher_is_better=True)["bootstrap_disagrees"] is True
    assert read(_paired((0.5, 3.0), (-0.1, 2.9), 3), higher_is_better=True)["bootstrap_disagrees"] is False
    assert read(_paired((0.5, 3.0), (0.4, 2.9), 12), higher_is_better=True)["bootstrap_disagrees"] is False


def test_asyncroll_report_prints_each_arms_headline_after_the_files(tmp_path: Path) -> None:
    path = tmp_path / "comparison.json"
    path.write_text(json.dumps(pairs(WALL, [100, 100, 90, 110], [105, 104, 95, 114])))
    done = invoke("report", "--comparison", path, "--output", tmp_path / "report")
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines[0].startswith("wrote ")
    assert lines[1:] == [
        "b (asyncroll) vs a (fifo): better: completions per wall hour +4.55% [+3.14%, +5.96%] (n=4), a 95% t "
        "interval over the complete pairs that excludes 0"
    ]
    saved = json.loads((tmp_path / "report" / "aggregate.json").read_text())
    assert saved["verdicts"]["b"]["metrics"]["completed_per_wall_hour"]["verdict"] == BETTER


def test_the_figure_says_each_panels_verdict_under_the_arm(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    data = pairs(GPU, [100, 100, 90, 110], [105, 104, 95, 114])
    fig = drawn(data, tmp_path / "figure")
    try:
        ticks = [[t.get_text() for t in ax.get_xticklabels()] for ax in fig.axes]
    finally:
        plt.close(fig)
    assert ticks[0] == [
        "a\n(fifo)\nbaseline",
        "b\n(asyncroll = rule not\nrecorded)\n+4.55% [+3.14%, +5.96%]\nbetter",
    ]
    assert ticks[1][1].endswith("\n(asyncroll = rule not\nrecorded)\nno verdict")  # starvation: not measured


def test_no_change_in_any_pair_is_the_same_not_no_evidence() -> None:
    """Neither arm starved in any pair: the difference is exactly 0 each time ([0, 0]), which is more than
    'no evidence of a change'."""
    key = "resources.sampled_starvation_fraction_of_coverage"
    v = verdict(pairs(key, [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]), "sampled_starvation_fraction")
    assert v["verdict"] == SAME and v["scale"] == "difference"
