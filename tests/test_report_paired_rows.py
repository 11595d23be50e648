"""REPORT.md's rows as a reader sees them: every section under its heading, a paired row's % changes
with their intervals, one pair (no interval), values written as whole numbers in comparison.json."""

from __future__ import annotations

from typing import Any

from asyncroll.experiment.report import aggregate
from asyncroll.experiment.report_markdown import fmt, markdown
from tests.fake_comparison import comparison

ROWS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"makespan_s": 2.0}, {"makespan_s": 1.0}),
    ({"makespan_s": 4.0}, {"makespan_s": 3.0}),
]
HEADINGS = [
    "## Stages",
    "| stage | status | gates |",
    "## Per-policy medians (complete pairs)",
    "| metric | a (fifo) | b (asyncroll = rule not recorded) |",
    "## Paired: b vs a",
    "## Pooled rates (sums over complete pairs)",
    "| arm | completion rate | completions per GPU-hour | CPU-s per completion | activation rate |",
    "## Quality (sums over complete pairs)",
    "## Failures",
    "| arm | failed trajectories | max_turns | model failures | worker restarts "
    "| client event loop stalled, s | client process stopped, s |",
    "Failed arms (kept, never re-run):",
]


def rows(text: str, start: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(start)]


def test_every_table_is_under_its_heading_in_order() -> None:
    lines = markdown(aggregate(comparison(ROWS))).splitlines()
    at = [lines.index(heading) for heading in HEADINGS]
    assert at == sorted(at)


def test_a_paired_row_gives_each_pairs_ratio_and_the_mean_change_in_percent() -> None:
    """Ratios 0.5 and 0.75: -50% and -25%, a mean of -37.5%; the difference is -1 s in both pairs."""
    assert rows(markdown(aggregate(comparison(ROWS))), "| makespan, s |") == [
        "| makespan, s | 3 | 2 |",
        "| makespan, s | p1 0.5000, p2 0.7500 | -37.50% [-196.33%, +121.33%] (n=2) "
        "| -37.50% [-50.00%, -25.00%] (n=2; 2 pairs: only 3 distinct resamples; at n=2 a percentile "
        "bootstrap's 95% interval covers the mean about 50% of the time (normal pairs): read the t "
        "interval) | -1 [-1, -1] (n=2) | no evidence of a change |",
    ]


def test_one_pair_of_whole_numbers_has_its_values_and_no_interval() -> None:
    data = comparison(ROWS[:1])
    for arm in data["pairs"][0]["arms"].values():  # a comparison.json may hold 2, not 2.0
        arm["metrics"]["makespan_s"] = int(arm["metrics"]["makespan_s"])
    why = "(n=1; no interval: an interval needs at least 2 pairs)"
    assert rows(markdown(aggregate(data)), "| makespan, s |") == [
        "| makespan, s | 2 | 1 |",
        f"| makespan, s | p1 0.5000 | -50.00% {why} | -50.00% {why} | -1 {why} | no verdict |",
    ]


def test_a_metric_no_pair_measured_is_unknown_in_every_column() -> None:
    unknown = "unknown (no pair with a known value)"
    assert rows(markdown(aggregate(comparison(ROWS))), "| completions per wall hour |") == [
        "| completions per wall hour | unknown | unknown |",
        "| completions per wall hour | p1 unknown (not measured), p2 unknown (not measured) "
        f"| {unknown} | {unknown} | {unknown} | no verdict |",
    ]


def test_the_failures_table_sums_the_clients_loop_stalls_where_every_pair_measured_them() -> None:
    """An arm whose client's event loop stalled (summary.json ``event_loop.stalled_s``) says for how long in
    all, summed over the complete pairs; an arm with a pair that did not watch its loop (an older client)
    says unknown, not the sum of the others."""
    stalled = [
        ({"event_loop.stalled_s": 0.25}, {"event_loop.stalled_s": 1.5}),
        ({"event_loop.stalled_s": 0.0}, {}),
    ]
    assert rows(markdown(aggregate(comparison(stalled))), "| a |")[-1].endswith(
        "| unknown | 0.25 | unknown |"
    )
    assert rows(markdown(aggregate(comparison(stalled))), "| b |")[-1].endswith(
        "| unknown | unknown | unknown |"
    )


def test_the_failures_table_sums_the_clients_stops_apart_from_their_stalls() -> None:
    """A client stopped by job control (summary.json ``event_loop.stopped_s``, counted apart from its
    stalls) says for how long in all, summed over the complete pairs, in a column of its own."""
    stopped = [
        ({"event_loop.stalled_s": 0.0, "event_loop.stopped_s": 2.0}, {"event_loop.stalled_s": 0.5}),
        ({"event_loop.stalled_s": 0.0, "event_loop.stopped_s": 1.5}, {"event_loop.stalled_s": 0.0}),
    ]
    text = markdown(aggregate(comparison(stopped)))
    assert rows(text, "| a |")[-1].endswith("| 0 | 3.5 |"), rows(text, "| a |")
    assert rows(text, "| b |")[-1].endswith("| 0.5 | unknown |"), rows(text, "| b |")


def test_the_same_order_is_flagged_from_two_complete_pairs_not_one() -> None:
    flag = "**Every complete pair ran in the same order**"
    assert flag in markdown(aggregate(comparison(ROWS)))
    one = markdown(aggregate(comparison(ROWS, errors={"pair2-b": "boom"})))
    assert "p1 a → b; p2 a → b." in one and flag not in one


def test_a_value_that_rounds_to_ten_thousand_is_written_whole_not_as_1e04() -> None:
    """Four significant digits of 9,999.7 are 1e+04: it was printed so, the one exponent a large value
    still got (a mean difference of +9,999.7 s read ``+1e+04``)."""
    assert [fmt(x) for x in (10_000.0, 9_999.7, 9_999.5, 9_999.4, -9_999.7, 2)] == [
        "10,000",
        "10,000",
        "10,000",
        "9999",
        "-10,000",
        "2",
    ]
    data = comparison([({"makespan_s": 1.0}, {"makespan_s": 10_000.7})])
    row = rows(markdown(aggregate(data)), "| makespan, s |")[1]
    assert "| +10,000 (n=1; " in row and "e+" not in row


def test_a_huge_percent_change_is_written_with_thousands_separators() -> None:
    """A ratio of 10,001: +1,000,000% (it was printed ``+1000000.00%``, unlike every other large value)."""
    data = comparison([({"makespan_s": 1.0}, {"makespan_s": 10_001.0})])
    row = rows(markdown(aggregate(data)), "| makespan, s |")[1]
    assert "| +1,000,000.00% (n=1; " in row


def test_a_quality_rate_neither_of_whose_counts_was_measured_says_so_once() -> None:
    """Nothing was evaluated: the first-pass rate's note alone, not followed by ``(unknown / unknown)``;
    a rate with its counts known keeps them."""
    quality = rows(markdown(aggregate(comparison(ROWS))), "| a |")[1]
    assert quality == ("| a | 1 (6 / 6) | unknown (passed_first and evaluated not measured) |")


def test_a_ratio_too_small_for_four_decimals_is_not_written_as_zero() -> None:
    """Starvation of 3 s cut to 0.1 ms: a ratio of 3.3e-05, written "p1 0.0000", as if the treatment had
    measured 0; a ratio of 0 is still 0.0000."""
    data = comparison(
        [
            ({"resources.sampled_starvation_s": 3.0}, {"resources.sampled_starvation_s": 0.0001}),
            ({"resources.sampled_starvation_s": 2.0}, {"resources.sampled_starvation_s": 0.0}),
        ]
    )
    row = rows(markdown(aggregate(data)), "| sampled model starvation, s |")[1]
    assert row.startswith("| sampled model starvation, s | p1 3.333e-05, p2 0.0000 |")


def test_counts_are_written_as_integers() -> None:
    """comparison.json's counts and aggregate.json's pooled totals were floats (``"completed": 3.0``),
    which a strictly typed reader (Go's ``int``, serde's ``u64``) refuses; a float count (GPU-hours, CPU-s)
    stays a float."""
    import json

    from asyncroll.experiment.comparison import arm_values

    values = arm_values({"counts": {"completed": 3}, "model": {"failed": {"transport": 2, "cancelled": 1}}})
    assert (
        json.dumps(values["counts"]["completed"]) == "3"
        and json.dumps(values["counts"]["model_failures"]) == "2"
    )
    totals = aggregate(comparison(ROWS))["pooled"]["a"]["totals"]
    assert json.dumps(totals["completed"]) == "6" and json.dumps(totals["total_cpu_s"]) == "0.6"


def test_an_older_comparisons_float_counts_are_pooled_as_integers() -> None:
    """A comparison.json written before counts were integers (175efe0 wrote ``"completed": 3.0``) reported
    by this version gave aggregate.json pooled totals of ``6.0``, which the strictly typed reader this
    version writes integers for refuses; a count is a whole number whichever version wrote it, and a float
    count (GPU-hours, CPU-s, stalled seconds) stays a float."""
    import json

    data = comparison(ROWS)
    for pair in data["pairs"]:
        for entry in pair["arms"].values():
            entry["counts"] = {k: None if v is None else float(v) for k, v in entry["counts"].items()}
    totals = aggregate(data)["pooled"]["a"]["totals"]
    assert json.dumps(totals["completed"]) == "6" and json.dumps(totals["trajectories"]) == "6"
    assert json.dumps(totals["total_cpu_s"]) == "0.6"


def test_an_arm_that_never_completed_a_run_is_labelled_so_not_as_a_rule_not_recorded() -> None:
    """A policy none of whose arms completed a run (each failed, or the experiment stopped before) was
    headed "b (asyncroll = rule not recorded)", as if its runs were older than the rule's record."""
    errors = {"pair1-b": "server died", "pair2-b": "server died"}
    agg = aggregate(comparison(ROWS, errors=errors))
    assert agg["complete_runs"] == {"a": 2, "b": 0}
    text = markdown(agg)
    assert "| metric | a (fifo) | b (asyncroll; no run completed) |" in text, text
    assert "rule not recorded" not in text
