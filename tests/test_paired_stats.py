"""The numbers that decide whether a policy helped: paired statistics against SciPy on hand-made
samples, and the report's naming of the pairs they rest on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncroll.experiment.report import aggregate
from asyncroll.experiment.report_markdown import markdown
from asyncroll.experiment.stats import bootstrap_interval, paired_change, t_interval
from asyncroll.outputs.statistics import distribution
from tests.fake_comparison import comparison

GPU_HOUR = "throughput.completed_per_gpu_hour"


@pytest.mark.parametrize(
    "values",
    [[1.0, 2.0], [-5.0, -7.0, -1.0, -2.0], [1e40, -1e40, 5e39], [0.1, 0.2, 0.3, 0.4, 0.5, 10.0]],
)
def test_the_t_interval_is_scipys_on_small_negative_and_huge_samples(values: list[float]) -> None:
    import scipy.stats as scipy_stats

    mean = float(np.mean(values))
    low, high = scipy_stats.t.interval(0.95, len(values) - 1, loc=mean, scale=scipy_stats.sem(values))
    ours = t_interval(values)
    assert ours.n == len(values) and ours.mean == pytest.approx(mean, rel=1e-12)
    assert ours.low == pytest.approx(low, rel=1e-9) and ours.high == pytest.approx(high, rel=1e-9)


def test_degenerate_samples_give_no_interval_or_a_zero_width_one() -> None:
    one = t_interval([4.0])
    assert (one.n, one.mean, one.low, one.high) == (1, 4.0, None, None)
    boot = bootstrap_interval([4.0], seed=0)
    assert (boot.n, boot.mean, boot.low, boot.high) == (1, 4.0, None, None)
    # every pair changed by the same amount: no spread, so the interval is the mean itself (SciPy's
    # scale-0 interval is NaN), and a verdict "above 0" reads it as such
    same = t_interval([2.5, 2.5, 2.5])
    assert (same.low, same.mean, same.high) == (2.5, 2.5, 2.5)
    boot = bootstrap_interval([2.5, 2.5, 2.5], seed=0, resamples=100)
    assert (boot.low, boot.high) == (2.5, 2.5)


@pytest.mark.parametrize(
    "values",
    [[5.0], [1.0, 2.0], [3.0, 1.0, 2.0], [1.0, 1.0, 2.0, 2.0], [2.0, 2.0, 2.0], [0.3, 0.1, 0.2, 9.0]],
)
def test_summary_percentiles_are_numpys_linear_ones_on_small_samples(values: list[float]) -> None:
    d = distribution(values)
    p50, p95 = np.quantile(values, [0.5, 0.95])
    assert d["count"] == len(values) and d["min"] == min(values) and d["max"] == max(values)
    assert d["p50"] == pytest.approx(float(p50), abs=1e-6) and d["p95"] == pytest.approx(float(p95), abs=1e-6)


def test_a_note_names_the_pair_it_means_after_a_failed_pair_is_excluded() -> None:
    """Pair 2 has a failed arm, so only pairs 1 and 3 are complete; pair 3's treatment value was not
    measured. The report once said "pair 2: a value not measured" (its position among the complete
    pairs), naming the failed pair instead, while the figure named p3."""
    rows: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({GPU_HOUR: 100.0}, {GPU_HOUR: 110.0}),
        ({GPU_HOUR: 100.0}, {GPU_HOUR: 90.0}),
        ({GPU_HOUR: 100.0}, {GPU_HOUR: None}),
    ]
    agg = aggregate(comparison(rows, errors={"pair2-b": "boom"}))
    assert agg["pairs_complete"] == 2
    d = agg["paired"]["b"]["completed_per_gpu_hour"]
    assert d["pair_numbers"] == [1, 3] and d["ratios"] == [1.1, None]
    assert d["mean_percent_change_t95"]["note"].startswith("1 of 2 pairs left out (pair 3: a value not")
    row = next(line for line in markdown(agg).splitlines() if line.startswith("| completions per alloc"))
    assert "p1 1.1000, p3 unknown (not measured)" in markdown(agg)
    assert "pair 2" not in row


def test_undefined_baselines_are_named_by_their_pair_number() -> None:
    out = paired_change([100.0, 0.0, 50.0], [110.0, 1.0, None], seed=0, resamples=50, numbers=[2, 4, 7])
    assert out["pair_numbers"] == [2, 4, 7]
    t95 = out["mean_percent_change_t95"]
    assert isinstance(t95, dict) and t95["note"].startswith("undefined: baseline 0 in pair 4 (no ratio)")
    diff = out["mean_difference_t95"]
    assert isinstance(diff, dict) and diff["note"] == "1 of 3 pairs left out (pair 7: a value not measured)"
    with pytest.raises(ValueError, match="2 pair numbers for 3 pairs"):
        paired_change([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], seed=0, numbers=[1, 2])


def test_the_figure_names_a_ratio_over_zero_undefined_as_the_report_does(tmp_path: Path) -> None:
    """Arm a completed nothing in pair 1: its CPU-s per completion is 0/0. The report says
    "undefined (completed = 0)"; the figure said "unknown: p1 (a)", and without a baseline median
    its panel lost the median's legend."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from asyncroll.experiment import figure

    none = {"cpu_cost.per_completion_s": None, "counts.completed": 0}
    some = {"cpu_cost.per_completion_s": 2.0}
    lost = {"cpu_cost.per_completion_s": None}  # no count recorded: not known to be 0
    data = comparison([(none, some), (some, some), (lost, some)])
    agg = aggregate(data)
    said = "2 (n=1 of 3: pair 1 undefined (completed = 0); pair 3 not measured)"
    assert f"| client+worker CPU-s per completion | {said} | 2 |" in markdown(agg)
    complete = [p for p in data["pairs"] if p["complete"]]
    undefined = figure.undefined_values(complete, ["a", "b"], "cpu_s_per_completion")
    assert undefined == {(1, "a"): "completed = 0"}
    _, partial = figure.pair_values(complete, ["a", "b"], "cpu_s_per_completion")
    note = figure.unknown_note(partial, ["a", "b"], undefined)
    assert note == "unknown: p3 (a); undefined (completed = 0): p1 (a)"

    def drawn(data: dict[str, Any], name: str) -> Any:
        """The figure ``draw`` made, kept open to read back what it plotted."""
        kept: list[Any] = []
        close = plt.close
        try:
            plt.close = kept.append  # type: ignore[assignment]
            figure.draw(data, aggregate(data), tmp_path / name)
        finally:
            plt.close = close
        return kept[0]

    fig = drawn(data, "figure")
    assert figure.fit_note(note) == "unknown: p3 (a);\nundefined (completed = 0): p1 (a)"  # two lines
    note = figure.fit_note(note)
    assert note in [t.get_text() for t in fig.axes[2].texts]
    # the note is under the panel (it sat inside, over its lowest points: pair 1's 0.011 in a real run)
    fig.canvas.draw()
    [text] = [t for t in fig.axes[2].texts if t.get_text() == note]
    assert text.get_window_extent().y1 <= fig.axes[2].get_window_extent().y0
    plt.close(fig)
    # no baseline median: the treatment's bar still carries the legend's "median"
    fig = drawn(comparison([(none, some), (none, some)]), "figure1")
    legend = fig.axes[2].get_legend()
    assert legend is not None and [t.get_text() for t in legend.get_texts()] == ["median"]
    plt.close(fig)
    # every value undefined: the panel says so, not "unknown (not measured …)"
    fig = drawn(comparison([(none, none), (none, none)]), "figure2")
    assert "undefined\n(completed = 0 in every complete pair)" in [t.get_text() for t in fig.axes[2].texts]
    plt.close(fig)


def test_the_failure_table_says_it_counts_complete_pairs_only() -> None:
    """Arm a failed 2 trajectories in pair 1 (complete) and 5 in pair 2, whose arm b failed: the table
    shows 2, so it must say that it sums complete pairs only, or a reader takes 2 for a's total."""
    rows: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({"counts.failed": 2}, {"counts.failed": 0}),
        ({"counts.failed": 5}, {"counts.failed": 0}),
    ]
    text = markdown(aggregate(comparison(rows, errors={"pair2-b": "boom"})))
    failures = text[text.index("## Failures") :]
    assert "| a | 2 |" in failures
    assert "sums over the complete pairs" in failures and "`pair2-b`: boom" in failures
    assert "## Quality (sums over complete pairs)" in text


def test_report_numbers_are_written_whole_not_in_exponent_form() -> None:
    """Completions per hour read 67,050, not 6.705e+04; small values keep four significant digits."""
    from asyncroll.experiment.report_markdown import fmt

    assert fmt(67_050.3) == "67,050" and fmt(-12_345.6) == "-12,346"
    assert fmt(1.23456) == "1.235" and fmt(0.5) == "0.5" and fmt(None) == "unknown"
    assert fmt(3.0, ".0f") == "3"


def test_the_report_says_in_which_order_each_pair_ran_and_when_it_never_changed() -> None:
    """An experiment with ``order: fixed`` ran the baseline first in every pair: a drift or warm-up
    effect between the positions is then inside every paired change, and REPORT.md did not say the
    order at all (comparison.json has it per pair)."""
    rows: list[tuple[dict[str, Any], dict[str, Any]]] = [({GPU_HOUR: 100.0}, {GPU_HOUR: 110.0})] * 3
    fixed = comparison(rows)  # every pair a → b
    text = markdown(aggregate(fixed))
    assert "Order of the arms in each pair (as run, or planned): p1 a → b; p2 a → b; p3 a → b." in text
    assert "Every complete pair ran in the same order" in text
    alternating = comparison(rows)
    alternating["pairs"][1]["order"] = ["b", "a"]
    text = markdown(aggregate(alternating))
    assert "Order of the arms in each pair (as run, or planned): p1 a → b; p2 b → a; p3 a → b." in text
    assert "the same order" not in text


def test_a_gate_on_a_ratio_over_no_event_reads_undefined_in_the_report_as_in_its_verdict() -> None:
    """A gate on exact accuracy of an arm that graded nothing: the verdict's note says "undefined
    (accuracy.denominator = 0)", the report's stage table said "unknown" (its own header calls unknown
    a value not measured)."""
    from asyncroll.experiment.config import Gate
    from asyncroll.experiment.gates import evaluate_gates, gate_text

    gate = Gate(metric="accuracy.exact", op=">=", value=0.5)
    summary = {"accuracy": {"exact": None, "denominator": 0}}
    verdicts = evaluate_gates([gate], ["a"], {"a": summary})
    assert verdicts[0]["note"] == "undefined (accuracy.denominator = 0)"
    assert gate_text(verdicts, []) == " (accuracy.exact[a] = undefined (accuracy.denominator = 0) >= 0.5: no)"
    stages = {"qualification": {"status": "failed", "gates": verdicts}}
    text = markdown(aggregate(comparison([({}, {})], stages=stages)))
    row = next(line for line in text.splitlines() if line.startswith("| qualification |"))
    assert "accuracy.exact[a] = undefined (accuracy.denominator = 0) >= 0.5: FAIL" in row
    unmeasured = evaluate_gates([gate], ["a"], {"a": None})
    text = markdown(
        aggregate(comparison([({}, {})], stages={"qualification": {"status": "failed", "gates": unmeasured}}))
    )
    assert "accuracy.exact[a] = unknown (arm failed or its summary unreadable) >= 0.5: FAIL" in text


def test_a_gate_on_a_null_metric_says_why_it_is_null() -> None:
    """A metric null in a complete arm's summary was "unknown (arm failed or metric not measured)", though
    the arm had not failed and the summary said why (QA): the summary's own reason beside the value, else
    that it was null, else that the summary has no such value."""
    from asyncroll.experiment.config import Gate
    from asyncroll.experiment.gates import evaluate_gates

    def note(metric: str, summary: dict[str, Any]) -> str:
        return evaluate_gates([Gate(metric=metric, op=">=", value=1)], ["a"], {"a": summary})[0]["note"]

    empty = {"completed_per_wall_hour": None, "per_wall_hour_reason": "the measured window never opened"}
    assert note("throughput.completed_per_wall_hour", {"throughput": empty}) == (
        "unknown (the measured window never opened)"
    )
    pearson = "scheduler.prediction.pearson_log_repairs"
    reasons = {"pearson_log_repairs": "2 pairs (3 are needed)"}
    prediction = {"pearson_log_repairs": None, "pearson_null_reasons": reasons}
    assert note(pearson, {"scheduler": {"prediction": prediction}}) == "unknown (2 pairs (3 are needed))"
    bare = {"scheduler": {"prediction": {"pearson_log_repairs": None}}}
    assert note(pearson, bare) == "unknown (null: not measured in this run)"
    assert note(pearson, {"scheduler": {"prediction": {}}}) == "unknown (not in the arm's summary.json)"
    text = {"scheduler": {"prediction": {"pearson_log_repairs": "x"}}}
    assert note(pearson, text) == "unknown (not a number: str)"


@pytest.mark.parametrize(
    ("op", "threshold", "observed", "report", "console"),
    [
        (">=", 0.9, 0.89996, "0.89996 >= 0.9: FAIL", "0.89996 >= 0.9: no"),
        (">=", 0.9, 0.8999996, "0.8999996 >= 0.9: FAIL", "0.8999996 >= 0.9: no"),
        ("<=", 0.05, 0.0500004, "0.0500004 <= 0.05: FAIL", "0.0500004 <= 0.05: no"),
        ("==", 1.0, 1.00000001, "1.00000001 == 1: FAIL", "1.00000001 == 1: no"),
        (">=", 0.9, 0.91, "0.91 >= 0.9: pass", "0.91 >= 0.9: ok"),
        (">=", 3, 12344.0, "12,344 >= 3: pass", "12344 >= 3: ok"),
    ],
)
def test_a_gate_verdict_never_contradicts_its_values_as_written(
    op: str, threshold: float, observed: float, report: str, console: str
) -> None:
    """A coverage gate of 0.89996 >= 0.9 failed, and REPORT.md's stage table wrote it "0.9 >= 0.9:
    FAIL" (four significant digits), the runner's line "0.9 >= 0.9: no" past six: a verdict its own
    numbers contradict. The values are written with as many digits as it takes to read as the verdict."""
    from asyncroll.experiment.config import Gate
    from asyncroll.experiment.gates import evaluate_gates, gate_text

    metric = "resources.server_coverage_fraction"
    verdicts = evaluate_gates(
        [Gate(metric=metric, op=op, value=threshold)],  # type: ignore[arg-type]
        ["a"],
        {"a": {"resources": {"server_coverage_fraction": observed}}},
    )
    assert gate_text(verdicts, []) == f" ({metric}[a] = {console})"
    stages = {"qualification": {"status": "failed", "gates": verdicts}}
    text = markdown(aggregate(comparison([({}, {})], stages=stages)))
    row = next(line for line in text.splitlines() if line.startswith("| qualification |"))
    assert f"{metric}[a] = {report} |" in row


def test_a_long_unknown_note_is_wrapped_and_the_figure_keeps_its_layout(tmp_path: Path) -> None:
    """Starvation not measured in any of 12 pairs (a server without /metrics): the panel's note named
    every pair on one line, far wider than the panel; matplotlib's constrained layout collapsed ('axes
    sizes collapsed to zero' UserWarning, so `report --figure` under -W error crashed), and without the
    layout the notes were drawn below the figure's edge, cut off."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from asyncroll.experiment import figure
    from tests.fake_comparison import drawn

    starved = "resources.sampled_starvation_fraction_of_coverage"
    data = comparison([({GPU_HOUR: 100.0, starved: None}, {GPU_HOUR: 110.0, starved: None})] * 20)
    fig = drawn(data, tmp_path / "figure")
    [note] = [t for t in fig.axes[1].texts if t.get_text().startswith("unknown: p1 (a, b)")]
    lines = note.get_text().splitlines()
    assert 1 < len(lines) <= figure.NOTE_LINES and all(len(line) <= figure.NOTE_WIDTH for line in lines)
    assert lines[-1] == "… and 9 more (REPORT.md names each)", lines  # p1-p11 named
    box, page = note.get_window_extent(), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0  # on the page, not cut off
    plt.close(fig)
    # a short note is left as it was; what fits on the last line is named, not counted
    assert figure.fit_note("unknown: p3 (a); p4 (b)") == "unknown: p3 (a); p4 (b)"
    twelve = figure.fit_note("unknown: " + "; ".join(f"p{i} (a, b)" for i in range(1, 13)))
    assert twelve.splitlines()[-1] == "p12 (a, b)"


def test_a_long_arm_name_is_broken_on_its_tick_and_the_figure_keeps_its_layout(tmp_path: Path) -> None:
    """Arm names have no length limit (letters, digits, _ . -, no spaces): a 60-character one as the x tick
    label made matplotlib's constrained layout give up ('axes sizes collapsed to zero' UserWarning: the
    panels drawn over each other, and `report --figure` under -W error crashed)."""
    pytest.importorskip("matplotlib")
    import warnings

    from asyncroll.experiment import figure

    long = "asyncroll_repair_active32_inflight16_workers8_aging30s_weight0.02"
    data = comparison([({GPU_HOUR: 100.0}, {GPU_HOUR: 110.0})] * 3)
    data["arms"] = [long if a == "b" else a for a in data["arms"]]
    data["policies"] = {(long if a == "b" else a): p for a, p in data["policies"].items()}
    for pair in data["pairs"]:
        pair["order"] = [long if a == "b" else a for a in pair["order"]]
        pair["arms"] = {(long if a == "b" else a): v for a, v in pair["arms"].items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        paths = figure.draw(data, aggregate(data), tmp_path / "figure")
    assert all(path.stat().st_size > 5000 for path in paths)
    label = figure.tick_label(long, "asyncroll = asyncroll_repair")
    assert label.splitlines() == [long[:30], long[30:60], long[60:], "(asyncroll = asyncroll_repair)"]
    assert figure.tick_label("fifo", "fifo") == "fifo\n(fifo)"


def test_a_note_naming_long_arms_is_broken_within_its_entries_and_the_figure_keeps_its_layout(
    tmp_path: Path,
) -> None:
    """An entry of the unknown note names the pair's arms: with two arms of about 60 characters (as long as
    the one a tick broke) one entry was a line of 140, never broken (the note broke only between entries),
    and the layout collapsed again ('axes sizes collapsed to zero': `report --figure` under -W error
    crashed)."""
    pytest.importorskip("matplotlib")
    import json
    import warnings

    from asyncroll.experiment import figure

    a = "fifo_active32_inflight16_workers8_baseline_repeat_2026_12_06"
    b = "asyncroll_repair_active32_inflight16_workers8_aging30s_weight0.02"
    starved = "resources.sampled_starvation_fraction_of_coverage"
    data = comparison([({GPU_HOUR: 100.0, starved: None}, {GPU_HOUR: 110.0, starved: None})] * 3)
    data = json.loads(json.dumps(data).replace('"a"', json.dumps(a)).replace('"b"', json.dumps(b)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        paths = figure.draw(data, aggregate(data), tmp_path / "figure")
    assert all(path.stat().st_size > 5000 for path in paths)
    note = figure.fit_note(f"unknown: p1 ({a}, {b}); p2 ({a}, {b}); p3 ({a}, {b})")
    lines = note.splitlines()
    assert len(lines) <= figure.NOTE_LINES and all(len(line) <= figure.NOTE_WIDTH for line in lines), lines
    assert lines[0].startswith("unknown: p1 (fifo_") and lines[-1] == "… and 2 more (REPORT.md names each)", (
        lines
    )
