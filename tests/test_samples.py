"""A run's samples: exact up to EXACT_SAMPLES values, then a quantile sketch whose memory stops growing, its
p50/p95 within RELATIVE_ACCURACY of the exact ones; a correlation's pairs folded into running co-moments."""

from __future__ import annotations

import json
import math
import random
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncroll.outputs import samples
from asyncroll.outputs.samples import EXACT_SAMPLES, RELATIVE_ACCURACY, Pairs, QuantileSketch, Samples
from asyncroll.outputs.statistics import distribution, pearson
from asyncroll.schemas import SummaryModel
from tests.conftest import VirtualRun, tool_problem


def close(sketched: float | None, exact: float | None) -> bool:
    """Within the sketch's relative accuracy, plus the 6-decimal rounding both are written with."""
    assert sketched is not None and exact is not None
    return abs(sketched - exact) <= RELATIVE_ACCURACY * abs(exact) + 2e-6


durations = st.lists(
    st.one_of(st.just(0.0), st.floats(min_value=1e-6, max_value=1e5, allow_nan=False)),
    min_size=1,
    max_size=300,
)


@settings(max_examples=200, deadline=None)
@given(durations)
def test_a_sketched_quantile_is_within_its_relative_accuracy_of_the_exact_one(values: list[float]) -> None:
    sketch = QuantileSketch()
    sketch.add(array("d", values))
    got, want = sketch.distribution(), distribution(values)
    assert (got["count"], got["min"], got["max"]) == (want["count"], want["min"], want["max"])
    assert close(got["p50"], want["p50"]) and close(got["p95"], want["p95"])
    assert math.isclose(got["mean"], want["mean"] or 0.0, rel_tol=1e-9, abs_tol=2e-6)
    assert got["approximate"] == {"relative_accuracy": RELATIVE_ACCURACY, "exact_up_to": EXACT_SAMPLES}


def test_a_metric_is_exact_up_to_the_limit_then_sketched_in_bounded_memory() -> None:
    rng = random.Random(7)
    values = [0.0 if rng.random() < 0.1 else rng.lognormvariate(-2, 1.5) for _ in range(EXACT_SAMPLES - 1)]
    kept = Samples()
    for value in values:
        kept.append(value)
    assert kept.distribution() == distribution(values)  # below the limit: the exact distribution, as before
    assert "approximate" not in kept.distribution()
    for _ in range(3 * EXACT_SAMPLES):  # past it: batches go into the sketch, the exact buffer restarts
        value = rng.lognormvariate(-2, 1.5)
        values.append(value)
        kept.append(value)
    assert len(kept) == len(values) and len(kept._values) < EXACT_SAMPLES
    sketch = kept._sketch
    assert sketch is not None
    # a bucket per ≈1% step of value, however many samples: these span about 12 orders of e
    assert len(sketch.buckets) <= math.log(max(values) / min(v for v in values if v > 0)) / math.log(1.01) + 1
    got, want = kept.distribution(), distribution(values)
    assert close(got["p50"], want["p50"]) and close(got["p95"], want["p95"])
    assert (got["min"], got["max"], got["count"]) == (want["min"], want["max"], want["count"])
    assert math.isclose(kept.total(), math.fsum(values), rel_tol=1e-12)
    assert got["approximate"]["exact_up_to"] == EXACT_SAMPLES


def test_mostly_zero_waits_give_a_zero_median() -> None:
    sketch = QuantileSketch()
    sketch.add(array("d", [0.0] * 80 + [0.5] * 20))
    got = sketch.distribution()
    assert got["p50"] == 0.0 and got["min"] == 0.0 and close(got["p95"], 0.5)


def test_pairs_past_the_limit_give_the_exact_correlation() -> None:
    rng = random.Random(3)
    xs = [rng.gauss(0, 1) for _ in range(2 * EXACT_SAMPLES + 123)]
    ys = [0.8 * x + rng.gauss(0, 0.6) for x in xs]
    pairs = Pairs()
    for x, y in zip(xs, ys, strict=True):
        pairs.append(x, y)
    assert pairs.xs is None and len(pairs) == len(xs)
    r = pearson(xs, ys)
    assert r is not None and abs(pairs.pearson() - r) <= 1e-4  # type: ignore[operator]
    assert pairs.missing() is None


def test_folded_pairs_without_variance_say_why() -> None:
    pairs = Pairs()
    for i in range(EXACT_SAMPLES + 5):
        pairs.append(-2.0, float(i % 7))
    assert pairs.pearson() is None
    assert pairs.missing() == "no variance: every predicted time is the same"


def test_a_run_past_the_limit_writes_approximate_distributions_close_to_the_exact_ones(
    virtual_run: VirtualRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(11)
    problems = [
        tool_problem(
            f"p{i}", model_ms=rng.uniform(50, 400), cpu_ms=rng.uniform(10, 900), turns=rng.choice((1, 2, 3))
        )
        for i in range(60)
    ]
    settings_ = {"max_active_trajectories": 8, "max_inflight_model_requests": 4, "cpu_workers": 2}
    _, exact_events, exact_out = virtual_run(problems, simulate_tools=True, **settings_)
    monkeypatch.setattr(samples, "EXACT_SAMPLES", 16)
    _, sketched_events, sketched_out = virtual_run(problems, simulate_tools=True, **settings_)
    exact = json.loads((exact_out / "summary.json").read_text())
    sketched = json.loads((sketched_out / "summary.json").read_text())
    SummaryModel.model_validate(sketched)
    same = [e.model_dump(exclude={"wall_time"}) for e in exact_events.events]
    assert [e.model_dump(exclude={"wall_time"}) for e in sketched_events.events] == same
    for name, want in exact["latency"].items():
        got = sketched["latency"][name]
        assert "approximate" not in want
        assert got["approximate"] == {"relative_accuracy": RELATIVE_ACCURACY, "exact_up_to": 16}, name
        assert (got["count"], got["min"], got["max"]) == (want["count"], want["min"], want["max"]), name
        assert close(got["p50"], want["p50"]) and close(got["p95"], want["p95"]), name
        assert math.isclose(got["mean"], want["mean"], abs_tol=2e-6), name
    assert sketched["phases"] == exact["phases"]  # their sums are the same, added in the same order
    prediction, exact_prediction = sketched["scheduler"]["prediction"], exact["scheduler"]["prediction"]
    assert prediction["pairs"] == exact_prediction["pairs"] > 16
    assert abs(prediction["pearson_log"] - exact_prediction["pearson_log"]) <= 1e-4


def test_the_printed_summary_schema_describes_an_approximate_distribution() -> None:
    schema = SummaryModel.model_json_schema()
    assert set(schema["$defs"]["Approximate"]["required"]) == {"relative_accuracy", "exact_up_to"}
    assert "approximate" not in schema["$defs"]["Distribution"]["required"]


def test_a_metric_of_exactly_the_limit_is_exact_and_the_next_value_sketches_it() -> None:
    """MEASUREMENT.md says exact "up to 65,536" samples: the 65,536th value keeps the distribution exact,
    the 65,537th makes it approximate; so for a correlation's pairs."""
    rng = random.Random(5)
    values = [rng.lognormvariate(-2, 1.5) for _ in range(EXACT_SAMPLES)]
    kept, pairs = Samples(), Pairs()
    for value in values:
        kept.append(value)
        pairs.append(value, value * value)
    assert kept.distribution() == distribution(values)
    assert pairs.pearson() == pearson(values, [v * v for v in values]) and pairs.xs is not None
    kept.append(1.0)
    pairs.append(1.0, 1.0)
    assert kept.distribution()["approximate"]["exact_up_to"] == EXACT_SAMPLES
    assert pairs.pearson() is not None and pairs.xs is None and len(pairs) == EXACT_SAMPLES + 1


def near(sketched: float | None, values: list[float], p: float) -> bool:
    """Within the sketch's accuracy of the exact ``p`` quantile of ``values`` (linear interpolation between
    two ranks): each rank's value is within α of its own, so their interpolation is within α of their
    magnitudes' interpolation — which is α of the quantile itself only where both have one sign."""
    assert sketched is not None
    xs = sorted(values)
    pos = p * (len(xs) - 1)
    lo, hi, f = xs[math.floor(pos)], xs[math.ceil(pos)], pos - math.floor(pos)
    exact = lo + (hi - lo) * f
    slack = RELATIVE_ACCURACY * (abs(lo) * (1 - f) + abs(hi) * f) + 1e-12 * max(abs(lo), abs(hi))
    return abs(sketched - exact) <= slack + 2e-6  # and the 6-decimal rounding


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(st.just(0.0), st.floats(min_value=-1e300, max_value=1e300, allow_nan=False)),
        min_size=1,
        max_size=60,
    )
)
def test_any_finite_values_sketch_within_the_accuracy_negative_ones_too(values: list[float]) -> None:
    """Durations are never negative, but a sketch given negative values ranks them below the zeros (it put
    them with the zeros, and gave 0.0 for every one: p50 above the max when all were negative). Between a
    negative and a positive rank the bound is on their magnitudes (:func:`near`): the floors' hypothesis
    draw [6.04e16, -9.06e14] was off by 0.5% of the p50 itself, within 0.5% of the ranks'."""
    sketch = QuantileSketch()
    sketch.add(array("d", values))
    got, want = sketch.distribution(), distribution(values)
    assert (got["count"], got["min"], got["max"]) == (want["count"], want["min"], want["max"])
    assert near(got["p50"], values, 0.5) and near(got["p95"], values, 0.95)


@pytest.mark.parametrize("values", [[1.79e308, 1e308, 1.5e308], [1.5e308, 1.6e308, 1.7e308, 1.0]])
def test_values_near_the_largest_float_sketch_within_the_accuracy(values: list[float]) -> None:
    """A bucket's value 2γ^k/(γ+1) overflowed: 2γ^k from half the largest float (then clamped to the max,
    2% off), γ^k itself within 1% of it (an OverflowError: no summary.json)."""
    sketch = QuantileSketch()
    sketch.add(array("d", values))
    got = sketch.distribution()
    assert near(got["p50"], values, 0.5) and near(got["p95"], values, 0.95)
