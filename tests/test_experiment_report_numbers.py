"""The report's numbers: undefined ratios and pairs left out named, pooled rates never a partial sum,
a damaged comparison.json refused in one line, a failed arm's cause, the bootstrap's resample count,
bench medians."""

from __future__ import annotations

import copy
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from asyncroll.errors import UsageError
from asyncroll.experiment.receipts import one_line
from asyncroll.experiment.report import aggregate, load_comparison
from asyncroll.experiment.report_markdown import markdown
from asyncroll.experiment.stats import bootstrap_interval, distinct_resamples
from tests.conftest import invoke
from tests.experiments import write_config
from tests.fake_comparison import comparison

STARVATION = "resources.sampled_starvation_fraction_of_coverage"


def test_a_zero_baseline_is_undefined_never_unknown_and_no_pair_is_dropped_silently() -> None:
    """The QA example: 0.10→0.05, 0.10→0.05, 0→0.50. Leaving pair 3 out showed a confident −50%."""
    rows: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({STARVATION: 0.1}, {STARVATION: 0.05}),
        ({STARVATION: 0.1}, {STARVATION: 0.05}),
    ]
    rows.append(({STARVATION: 0.0}, {STARVATION: 0.5}))
    for a, b in rows[:2]:
        a["makespan_s"], b["makespan_s"] = 2.0, 1.0
    rows[2][0]["makespan_s"], rows[2][1]["makespan_s"] = None, 1.0  # pair 3: not measured
    agg = aggregate(comparison(rows))
    d = agg["paired"]["b"]["sampled_starvation_fraction"]
    assert d["pair_notes"] == [None, None, "undefined (baseline 0, treatment 0.5)"]
    assert d["mean_percent_change_t95"]["mean"] is None
    assert d["mean_difference_t95"]["n"] == 3 and d["mean_difference_t95"]["mean"] == pytest.approx(0.4 / 3)
    m = agg["paired"]["b"]["makespan_s"]["mean_percent_change_t95"]
    assert m["n"] == 2 and m["note"] == "1 of 3 pairs left out (pair 3: a value not measured)"
    text = markdown(agg)
    paired = text[text.index("## Paired") :].splitlines()
    row = next(line for line in paired if line.startswith("| sampled model starvation (fraction"))
    assert "p1 0.5000, p2 0.5000, p3 undefined (baseline 0, treatment 0.5)" in row
    assert "undefined: baseline 0 in pair 3 (no ratio); see the mean difference" in row
    assert "+0.1333 [" in row and "(n=3)" in row and "unknown" not in row and "-50.00%" not in row
    makespan = next(line for line in paired if line.startswith("| makespan, s |"))
    assert "(n=2; 1 of 3 pairs left out (pair 3: a value not measured))" in makespan
    assert "| makespan, s | 2 | 1 |" in text.replace(" (n=2 of 3: pair 3 not measured)", "")
    # the baseline's median rests on the 2 pairs that measured it; the third's value is unknown, which
    # is not the starvation fraction's "undefined" (a ratio over a measured 0)
    assert "2 (n=2 of 3: pair 3 not measured)" in text


def write(tmp: Path, data: dict[str, Any], name: str = "comparison.json") -> Path:
    path = tmp / name
    path.write_text(json.dumps(data))
    return path


DAMAGE = {
    "bad_baseline": (lambda c: c.update(baseline="zzz"), "baseline: 'zzz' is not an arm"),
    "missing_arm": (lambda c: c["pairs"][0]["arms"].pop("b"), "pairs[0] (pair 1): no entry for arm(s) ['b']"),
    "no_counts": (
        lambda c: c["pairs"][0]["arms"]["a"].pop("counts"),
        "pairs[0].arms.a.counts: Field required",
    ),
    "neg_seed": (lambda c: c.update(seed=-3), "seed: Input should be greater than or equal to 0"),
    "schema99": (lambda c: c.update(schema_version=99), "schema_version: 99 is not supported"),
    "text_metric": (
        lambda c: c["pairs"][0]["arms"]["a"]["metrics"].update(makespan_s="fast"),
        "pairs[0].arms.a.metrics.makespan_s: Input should be a valid number",
    ),
    "complete_lies": (
        lambda c: c["pairs"][0].update(complete=False),
        "complete is False, but its arms' statuses",
    ),
    "kind": (lambda c: c.update(kind="asyncroll.run"), "kind: Input should be 'asyncroll.comparison'"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_comparison_is_refused_in_one_line(tmp_path: Path, damage: str) -> None:
    data = comparison([({}, {}), ({}, {})])
    load_comparison(write(tmp_path, data))  # the undamaged file is fine
    change, message = DAMAGE[damage]
    broken = copy.deepcopy(data)
    change(broken)
    path = write(tmp_path, broken, "broken.json")
    with pytest.raises(UsageError) as info:
        load_comparison(path)
    assert str(info.value).startswith(f"{path}: not a valid comparison.json: ") and "\n" not in str(
        info.value
    )
    assert message in str(info.value)
    if damage == "missing_arm":
        done = invoke("report", "--comparison", path, "--output", tmp_path / "r")
        assert done.exit_code == 2 and done.stderr.count("\n") == 1
        assert done.stderr.startswith("error: ") and not (tmp_path / "r").exists()


def test_pooled_rates_are_unknown_when_a_count_is_unknown_never_zero() -> None:
    rows: list[tuple[dict[str, Any], dict[str, Any]]] = [({}, {}), ({}, {})]
    rows[1][0].update({"counts.completed": None, "accuracy.correct": None, "scheduler.reorders": None})
    rows[1][1]["scheduler.eligible_decisions"] = 4
    rows[0][1]["scheduler.eligible_decisions"] = 4
    rows[1][1]["scheduler.reorders"] = 2
    data = comparison(rows)
    del data["pairs"][0]["arms"]["b"]["counts"]["total_cpu_s"]  # an older file without the count
    agg = aggregate(data)
    a, b = agg["pooled"]["a"], agg["pooled"]["b"]
    for rate in ("completion_rate", "completed_per_gpu_hour", "accuracy_exact", "activation_rate"):
        assert a[rate] is None, rate
    assert (
        a["cpu_s_per_completion"] is None
        and a["notes"]["completion_rate"] == "unknown (completed not measured)"
    )
    assert b["completion_rate"] == 1.0 and b["activation_rate"] == pytest.approx(2 / 8)
    assert b["cpu_s_per_completion"] is None and "total_cpu_s" not in b["totals"]  # never a partial sum
    assert b["notes"]["cpu_s_per_completion"] == "unknown (total_cpu_s not measured)"
    text = markdown(agg)
    assert "| a | unknown (correct not measured) (unknown / 6) |" in text
    assert "| a | unknown (completed not measured) | unknown (completed not measured) |" in text
    undefined = aggregate(comparison([({}, {})]))["pooled"]["a"]
    assert undefined["activation_rate"] is None
    assert undefined["notes"]["activation_rate"] == "undefined (eligible_decisions = 0)"


@pytest.mark.timeout(30)
def test_an_output_that_is_a_file_is_a_usage_error(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    done = invoke(
        "experiment", "run", "--config", write_config(tmp_path, stages={}, pairs=1), "--output", afile
    )
    assert done.exit_code == 2 and f"error: --output {afile} is a file, not a directory" in done.stderr
    path = write(tmp_path, comparison([({}, {})]))
    done = invoke("report", "--comparison", path, "--output", afile)
    assert done.exit_code == 2 and f"error: --output {afile} is a file, not a directory" in done.stderr
    done = invoke("report", "--comparison", path, "--output", afile / "sub")
    assert done.exit_code == 2 and "cannot create" in done.stderr
    assert afile.read_text() == ""
    dangling = tmp_path / "dangling"  # it said "cannot write the report: Not a directory", exit 1
    dangling.symlink_to(tmp_path / "nowhere" / "deeper")
    done = invoke("report", "--comparison", path, "--output", dangling)
    said = (
        f"error: --output {dangling} is a symbolic link to {tmp_path / 'nowhere' / 'deeper'}, which does not"
    )
    assert done.exit_code == 2 and said in done.stderr, done.stderr


@pytest.mark.timeout(30)
def test_an_output_name_too_long_is_a_usage_error(tmp_path: Path) -> None:
    # `experiment run` said "experiment failed: [Errno 36] File name too long: …; --resume continues it
    # once there is room" (exit 1): a full disk's advice, for a name that can never be made.
    long = tmp_path / ("x" * 300)
    done = invoke(
        "experiment", "run", "--config", write_config(tmp_path, stages={}, pairs=1), "--output", long
    )
    assert done.exit_code == 2, done.output
    assert done.stderr == f"error: --output {long}: cannot be used: File name too long\n"
    path = write(tmp_path, comparison([({}, {})]))
    done = invoke("report", "--comparison", path, "--output", long)
    assert done.exit_code == 2 and "File name too long" in done.stderr and done.stderr.count("\n") == 1


def test_a_failed_arms_cause_is_shown() -> None:
    tail = (
        "client exited with code 1; log tail:\n"
        "failed: 0/0 completed, 0 failed | policy fifo: 0 decisions\n"
        "outputs: /x/run\n"
        "error: run failed: warm-up request 1/1 failed: ConnectError: All connection attempts failed\n"
    )
    cause = "error: run failed: warm-up request 1/1 failed: ConnectError: All connection attempts failed"
    assert one_line(tail) == f"client exited with code 1: {cause}"
    traceback_tail = (
        "client exited with code 1; log tail:\nTraceback (most recent call last):\n  x\nKeyError: 'k'\n"
    )
    assert one_line(traceback_tail) == "client exited with code 1: KeyError: 'k'"
    assert one_line("server exited with code 3 before it was ready; log tail:\nboom\n\n") == (
        "server exited with code 3 before it was ready: boom"
    )
    assert one_line("client passed its deadline of 5s and was stopped") == (
        "client passed its deadline of 5s and was stopped"
    )
    assert one_line(None) == "unknown"
    text = markdown(aggregate(comparison([({}, {})], errors={"pair1-a": tail})))
    assert f"- `pair1-a`: client exited with code 1: {cause}" in text


def test_the_bootstrap_counts_distinct_resamples() -> None:
    for n in range(1, 6):
        multisets = sum(1 for _ in itertools.combinations_with_replacement(range(n), n))
        assert distinct_resamples(n) == multisets
    assert [distinct_resamples(n) for n in (2, 3, 4)] == [3, 10, 35]

    def first(note: str | None) -> str | None:  # the note's count of resamples (then its coverage's)
        return None if note is None else note.split("; ")[0]

    assert (
        first(bootstrap_interval([1.0, 2.0], seed=0, resamples=200).note)
        == "2 pairs: only 3 distinct resamples"
    )
    assert (
        first(bootstrap_interval([1.0, 2.0, 4.0], seed=0, resamples=200).note)
        == "3 pairs: only 10 distinct resamples"
    )
    assert "distinct" not in str(bootstrap_interval([1.0, 2.0, 4.0, 5.0, 7.0], seed=0, resamples=100).note)


def test_bench_min_median_max_uses_the_true_median() -> None:
    from bench.common import quantiles
    from bench.paired import interval, spread

    assert quantiles([3.0, 1.0]) == (1.0, 2.0, 3.0)  # for 2 seeds the median was the max
    assert quantiles([5.0, 1.0, 3.0]) == (1.0, 3.0, 5.0)
    assert quantiles([4.0, 1.0, 3.0, 2.0]) == (1.0, 2.5, 4.0)
    assert spread([-0.330, 0.466], "{:+.1%}") == "-33.0% / +6.8% / +46.6%"
    assert spread([1.0, None, 3.0]) == "unknown"  # a run without the value: missing, never 0
    assert interval([0.1, 0.2, 0.3]).endswith("(n=3)")


@pytest.mark.timeout(30)
def test_a_figure_without_matplotlib_writes_no_part_of_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`report --figure` without the figures extra is refused before anything is written."""
    path = write(tmp_path, comparison([({}, {})]))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib → ImportError
    done = invoke("report", "--comparison", path, "--output", tmp_path / "r", "--figure")
    assert done.exit_code == 2 and "pip install 'asyncroll[figures]'" in done.stderr
    assert not (tmp_path / "r").exists()


def test_requests_cancelled_by_a_stop_are_not_model_failures() -> None:
    from asyncroll.experiment.comparison import arm_values

    summary = {"model": {"failed": {"transport": 2, "cancelled": 4}}}
    assert arm_values(summary)["counts"]["model_failures"] == 2.0
    assert arm_values(None)["counts"]["model_failures"] is None


def test_an_activation_rate_over_no_eligible_decision_is_undefined_in_every_table() -> None:
    """A FIFO arm makes no eligible decision: its activation rate (reorders ÷ eligible) is 0/0 —
    undefined, as the pooled table says, never "unknown (not measured)" in the medians or pairs."""
    fifo = {"scheduler.activation_rate": None, "scheduler.eligible_decisions": 0}
    mine = {"scheduler.activation_rate": 0.5, "scheduler.eligible_decisions": 4, "scheduler.reorders": 2}
    agg = aggregate(comparison([(fifo, mine), (fifo, mine)]))
    d = agg["paired"]["b"]["activation_rate"]
    assert d["pair_notes"] == ["undefined (eligible_decisions = 0)"] * 2
    assert d["mean_percent_change_t95"]["mean"] is None and d["mean_difference_t95"]["mean"] is None
    assert (
        d["mean_difference_t95"]["note"]
        == "undefined in every pair: a value undefined (eligible_decisions = 0)"
    )
    text = markdown(agg)
    rows = [line for line in text.splitlines() if line.startswith("| activation rate")]
    assert rows and all("unknown" not in row for row in rows), rows
    assert "| activation rate (reorders / eligible) | undefined (eligible_decisions = 0) | 0.5 |" in text
    # an arm whose summary lacks the counts stays unknown
    lost = {"scheduler.activation_rate": None, "scheduler.eligible_decisions": None}
    agg = aggregate(comparison([(lost, mine), (lost, mine)]))
    assert agg["paired"]["b"]["activation_rate"]["pair_notes"] == ["unknown (not measured)"] * 2


def test_ratios_of_an_arm_with_no_completion_are_undefined_not_unknown() -> None:
    """An arm that completed nothing has no CPU-s per completion and no accuracy: 0/0, "undefined"
    (as the pooled table said), not "unknown (not measured)"; a gate on them says the same."""
    from asyncroll.experiment.config import Gate
    from asyncroll.experiment.gates import evaluate_gates

    none: dict[str, Any] = {"cpu_cost.per_completion_s": None, "accuracy.exact": None}
    none |= {"counts.completed": 0, "accuracy.denominator": 0, "accuracy.correct": 0}
    some = {"cpu_cost.per_completion_s": 2.0, "accuracy.exact": 1.0}
    agg = aggregate(comparison([(none, some), (none, some)]))
    assert agg["paired"]["b"]["cpu_s_per_completion"]["pair_notes"] == ["undefined (completed = 0)"] * 2
    assert agg["paired"]["b"]["accuracy_exact"]["pair_notes"] == ["undefined (graded = 0)"] * 2
    assert agg["median_notes"]["a"]["accuracy_exact"] == "undefined (graded = 0)"
    gate = Gate(metric="accuracy.exact", op=">=", value=0)
    summary = {"accuracy": {"exact": None, "denominator": 0}}
    assert evaluate_gates([gate], ["a"], {"a": summary})[0]["note"] == "undefined (accuracy.denominator = 0)"
    lost = {"accuracy": {"exact": None}}  # no denominator recorded: not known to be 0
    assert evaluate_gates([gate], ["a"], {"a": lost})[0]["note"].startswith("unknown")


def test_pairs_with_an_undefined_value_are_left_out_and_named() -> None:
    fifo = {"scheduler.activation_rate": None, "scheduler.eligible_decisions": 0}
    one = {"scheduler.activation_rate": 0.5, "scheduler.eligible_decisions": 4}
    two = {"scheduler.activation_rate": 0.25, "scheduler.eligible_decisions": 4}
    agg = aggregate(comparison([(fifo, one), (one, two), (one, one)]))
    d = agg["paired"]["b"]["activation_rate"]
    assert d["pair_notes"] == ["undefined (eligible_decisions = 0)", None, None]
    t95 = d["mean_percent_change_t95"]
    assert t95["n"] == 2 and t95["mean"] == pytest.approx(-25.0)
    assert "1 of 3 pairs left out (pair 1: a value undefined (eligible_decisions = 0))" in t95["note"]


def test_a_median_over_some_pairs_says_which_were_left_out_and_why() -> None:
    """A median over 2 of 3 pairs said only "(n=2 of 3)": whether the third value was unknown (not
    measured) or undefined (a ratio over a measured 0) was not said. Each left-out pair is named."""
    fifo = {"scheduler.activation_rate": 0.25, "scheduler.eligible_decisions": 4}
    idle = {"scheduler.activation_rate": None, "scheduler.eligible_decisions": 0}
    lost = {"scheduler.activation_rate": None, "scheduler.eligible_decisions": None}
    mine = {"scheduler.activation_rate": 0.5, "scheduler.eligible_decisions": 4}
    agg = aggregate(comparison([(fifo, mine), (idle, mine), (lost, mine), (fifo, mine)]))
    assert agg["median_left_out"]["a"]["activation_rate"] == (
        "pair 2 undefined (eligible_decisions = 0); pair 3 not measured"
    )
    assert "activation_rate" not in agg["median_left_out"]["b"]
    row = next(line for line in markdown(agg).splitlines() if line.startswith("| activation rate"))
    assert "0.25 (n=2 of 4: pair 2 undefined (eligible_decisions = 0); pair 3 not measured) | 0.5 |" in row


@pytest.mark.timeout(30)
def test_a_comparison_older_than_its_experiment_says_so(tmp_path: Path) -> None:
    """A resume killed outright (kill -9, the OOM killer, a reboot) leaves the comparison.json of the
    runner before it, while experiment.json beside it says running and holds the arms finished since:
    the report said 'interrupted (by SIGTERM). Pairs complete: 0 of 2' as the experiment's state, nothing
    saying that comparison.json was older. It now says so, on stderr and in REPORT.md."""
    data = comparison([({}, {}), ({}, {})])
    data["experiment_status"], data["stop_reason"] = "interrupted", "interrupted by SIGTERM"
    path = write(tmp_path, data)
    receipt = tmp_path / "experiment.json"
    receipt.write_text(
        json.dumps({"kind": "asyncroll.experiment", "status": "running", "fingerprint": {"sha256": "f" * 64}})
    )
    done = invoke("report", "--comparison", path, "--output", tmp_path / "r")
    assert done.exit_code == 0, done.output
    said = f"warning: {receipt} says the experiment is 'running', this comparison.json 'interrupted'"
    assert said in done.stderr, done.stderr
    assert "--resume" in done.stderr
    assert "says the experiment is 'running'" in (tmp_path / "r" / "REPORT.md").read_text()
    # a resume that ended but could not write its own (a full disk): not "still going or killed outright"
    receipt.write_text(
        json.dumps({"kind": "asyncroll.experiment", "status": "failed", "fingerprint": {"sha256": "f" * 64}})
    )
    done = invoke("report", "--comparison", path, "--output", tmp_path / "r")
    assert "its last runner ended ('failed') and could not write comparison.json" in done.stderr
    assert "killed outright" not in done.stderr, done.stderr
    for status, fingerprint in (("interrupted", "f" * 64), ("running", "0" * 64)):  # in step; another's
        receipt.write_text(
            json.dumps(
                {"kind": "asyncroll.experiment", "status": status, "fingerprint": {"sha256": fingerprint}}
            )
        )
        done = invoke("report", "--comparison", path, "--output", tmp_path / "r")
        assert done.exit_code == 0 and "warning" not in done.stderr, done.stderr
        assert "says the experiment is" not in (tmp_path / "r" / "REPORT.md").read_text()


def test_a_missing_comparison_beside_an_experiment_says_why_and_what_writes_it(tmp_path: Path) -> None:
    """A first run killed outright (kill -9, the OOM killer) writes no comparison.json: the report said only
    'cannot read: No such file or directory' beside an experiment.json holding the arms that finished."""
    (tmp_path / "experiment.json").write_text(
        json.dumps({"kind": "asyncroll.experiment", "status": "running"})
    )
    done = invoke("report", "--comparison", tmp_path / "comparison.json", "--output", tmp_path / "r")
    assert done.exit_code == 2, done.output
    assert "No such file or directory" in done.stderr and str(tmp_path / "experiment.json") in done.stderr
    assert "`asyncroll experiment run --resume`" in done.stderr, done.stderr
    # a runner that ended tried to write it, and could not (a full disk): not "still runs or killed"
    (tmp_path / "experiment.json").write_text(
        json.dumps(
            {"kind": "asyncroll.experiment", "status": "failed", "error": "OSError: [Errno 28] No space"}
        )
    )
    done = invoke("report", "--comparison", tmp_path / "comparison.json", "--output", tmp_path / "r")
    assert done.exit_code == 2, done.output
    assert "ended ('failed', its error: OSError: [Errno 28] No space) and could not write" in done.stderr
    assert "killed outright" not in done.stderr and "--resume" in done.stderr, done.stderr
    (tmp_path / "experiment.json").unlink()  # a path with no experiment beside it: said as before
    done = invoke("report", "--comparison", tmp_path / "comparison.json", "--output", tmp_path / "r")
    assert done.exit_code == 2 and "--resume" not in done.stderr, done.stderr
