"""The experiment's statistics against SciPy (t intervals, the seeded bootstrap, paired changes with
unknown and zero baselines), unknown metrics in the report, and stage gates on unknown values."""

from __future__ import annotations

import inspect
import math
from typing import Any

import pytest

from asyncroll.experiment.comparison import build_comparison
from asyncroll.experiment.config import Gate
from asyncroll.experiment.gates import evaluate_gates
from asyncroll.experiment.report import aggregate
from asyncroll.experiment.report_markdown import markdown
from asyncroll.experiment.stats import bootstrap_interval, paired_change, t_interval, t_ppf
from tests.fake_comparison import two_arms

# --- statistics against SciPy -------------------------------------------------------------------------

DATA = [2.1, -0.4, 3.3, 1.7, 0.2, 4.0, -1.2]


def test_t_interval_matches_scipy() -> None:
    import scipy.stats as scipy_stats

    assert t_ppf(0.975, 4) == pytest.approx(2.7764451051977987, rel=1e-12)  # the textbook value
    with pytest.raises(ValueError, match="0 < q < 1"):
        t_ppf(1.0, 3)
    ours = t_interval(DATA)
    mean = sum(DATA) / len(DATA)
    low, high = scipy_stats.t.interval(0.95, len(DATA) - 1, loc=mean, scale=scipy_stats.sem(DATA))
    assert ours.mean == pytest.approx(mean) and ours.low == pytest.approx(low, rel=1e-9)
    assert ours.high == pytest.approx(high, rel=1e-9)
    assert t_interval([1.0]).low is None and t_interval([]).mean is None


def test_bootstrap_is_seeded_and_agrees_with_scipy() -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    a = bootstrap_interval(DATA, seed=7, resamples=20_000)
    assert a == bootstrap_interval(DATA, seed=7, resamples=20_000)
    assert a != bootstrap_interval(DATA, seed=8, resamples=20_000)
    assert a.low is not None and a.high is not None and a.low < a.mean < a.high  # type: ignore[operator]
    # scipy 1.15 renamed the seed's keyword rng; 1.10 (the floor) knows only random_state
    seed = "rng" if "rng" in inspect.signature(scipy_stats.bootstrap).parameters else "random_state"
    ref = scipy_stats.bootstrap(
        (DATA,),
        lambda x, axis: x.mean(axis=axis),
        n_resamples=20_000,
        method="percentile",
        confidence_level=0.95,
        **{seed: 7},
    ).confidence_interval
    assert a.low == pytest.approx(ref.low, abs=0.08) and a.high == pytest.approx(ref.high, abs=0.08)


def test_paired_change_handles_unknown_and_zero_baselines() -> None:
    out = paired_change([100.0, 200.0, None], [110.0, 190.0, 5.0], seed=0, resamples=500)
    assert out["ratios"] == [1.1, 0.95, None] and out["unknown_pairs"] == 1 and out["undefined_pairs"] == 0
    assert out["pair_notes"] == [None, None, "unknown (not measured)"]
    t = out["mean_percent_change_t95"]
    assert isinstance(t, dict) and t["mean"] == pytest.approx(2.5) and t["n"] == 2
    assert t["note"] == "1 of 3 pairs left out (pair 3: a value not measured)"  # said, never silent
    half = t_ppf(0.975, 1) * math.sqrt(((10 - 2.5) ** 2 + (-5 - 2.5) ** 2) / 1) / math.sqrt(2)
    assert t["high"] == pytest.approx(2.5 + half)
    # a measured baseline of 0: no ratio, so that pair's % change and the mean % change are undefined
    # (leaving the pair out would bias the mean); the mean difference still covers every pair
    zero = paired_change([100.0, 200.0, 0.0], [110.0, 190.0, 1.0], seed=0, resamples=500)
    assert zero["ratios"] == [1.1, 0.95, None] and zero["undefined_pairs"] == 1
    assert zero["pair_notes"] == [None, None, "undefined (baseline 0, treatment 1)"]
    for key in ("mean_percent_change_t95", "mean_percent_change_bootstrap95"):
        d = zero[key]
        assert isinstance(d, dict) and d["mean"] is None
        assert d["note"].startswith("undefined: baseline 0 in pair 3")
    diff = zero["mean_difference_t95"]
    assert isinstance(diff, dict) and diff["n"] == 3 and diff["mean"] == pytest.approx(1 / 3)


def test_report_marks_unknown_metrics() -> None:
    experiment = {
        "config": two_arms(),
        "status": "complete",
        "fingerprint": {"sha256": "f" * 64},
        "stages": {},
        "plan": [
            {"id": f"pair{p + 1}-{n}", "stage": "comparison", "pair": p, "arm": n, "policy": n, "seed": p}
            for p in range(2)
            for n in ("a", "b")
        ],
        "arms": {f"pair{p + 1}-{n}": {"status": "complete"} for p in range(2) for n in ("a", "b")},
    }

    def summary(gpu_hour: float | None, completed: int) -> dict[str, Any]:
        return {
            "throughput": {"completed_per_gpu_hour": gpu_hour, "allocated_gpu_hours": None},
            "counts": {"completed": completed, "trajectories": 4},
            "cpu_cost": {"per_completion_s": None},
        }

    summaries = {
        "pair1-a": summary(None, 4),
        "pair1-b": summary(None, 3),
        "pair2-a": summary(None, 4),
        "pair2-b": summary(None, 4),
    }
    agg = aggregate(build_comparison(experiment, summaries))
    assert agg["medians"]["a"]["completed_per_gpu_hour"] is None
    assert agg["pooled"]["b"]["completion_rate"] == pytest.approx(7 / 8)
    assert agg["pooled"]["a"]["completed_per_gpu_hour"] is None
    text = markdown(agg)
    assert "| completions per allocated GPU-hour | unknown | unknown |" in text


def test_gates_fail_on_unknown_and_on_the_threshold() -> None:
    gates = [
        Gate(metric="counts.completed", op=">=", value=3),
        Gate(metric="resources.sampled_starvation_s", op=">", value=0.5, arm="b"),
    ]
    summaries: dict[str, dict[str, Any] | None] = {
        "a": {"counts": {"completed": 3}},
        "b": {"counts": {"completed": 2}, "resources": {"sampled_starvation_s": None}},
    }
    verdicts = evaluate_gates(gates, ["a", "b"], summaries)
    assert [(v["arm"], v["observed"], v["passed"]) for v in verdicts] == [
        ("a", 3.0, True),
        ("b", 2.0, False),
        ("b", None, False),
    ]
    assert verdicts[2]["note"].startswith("unknown")
    assert evaluate_gates(gates[:1], ["a"], {"a": None})[0]["passed"] is False  # failed arm


def test_a_small_sample_bootstrap_says_it_covers_less_than_95_percent() -> None:
    """A percentile bootstrap of the mean is mean ± z·s·√((n − 1)/n)/√n in the limit of many resamples: the
    resampled means spread as the plug-in standard deviation and the quantile is normal, not t(n − 1). For
    n normal pairs its "95%" interval covers P(|T(n − 1)| ≤ 1.96·√((n − 1)/n)): 75% at 3
    (an experiment's default), 85% at 5, 90% at 10 (the figures from SciPy's t.cdf, pinned here). The
    report printed it as a 95% interval beside the t interval with only a count of distinct resamples."""
    from asyncroll.experiment.stats import percentile_bootstrap_coverage

    pinned = {3: 0.75, 4: 0.8118, 5: 0.8455, 9: 0.8982, 10: 0.9041, 20: 0.9287}
    for n, coverage in pinned.items():
        assert percentile_bootstrap_coverage(n) == pytest.approx(coverage, abs=1e-4)
    assert bootstrap_interval([1.0, 2.0, 4.0], seed=0).note == (
        "3 pairs: only 10 distinct resamples; at n=3 a percentile bootstrap's 95% interval covers the mean"
        " about 75% of the time (normal pairs): read the t interval"
    )
    assert bootstrap_interval([1.0, 2.0, 4.0, 5.0, 7.0], seed=0, resamples=100).note == (
        "at n=5 a percentile bootstrap's 95% interval covers the mean about 85% of the time (normal pairs):"
        " read the t interval"
    )
    assert bootstrap_interval([float(i) for i in range(10)], seed=0).note is None  # 90%
    # the figure is what the seeded bootstrap does: 2,000 samples of 5 normal pairs, true mean 0
    assert 0.81 <= _covered(5, seed=5) <= 0.88


def test_a_two_pair_bootstrap_interval_is_the_two_pairs_and_covers_half_the_time() -> None:
    """At 2 pairs a quarter of the resamples draw the smaller pair twice, so the 2.5% quantile is that
    pair and the "95%" interval is [smaller, larger]: it covers the mean exactly when the two pairs straddle
    it, half the time. The normal limit (P(|T(1)| ≤ 1.96·√½), 60%) does not hold there, and the report's note
    said "about 60%". At 3 pairs the same happens (1/27 > 2.5%): 1 − 2⁻², 75%."""
    from asyncroll.experiment.stats import percentile_bootstrap_coverage

    assert percentile_bootstrap_coverage(2) == 0.5
    assert percentile_bootstrap_coverage(3) == 0.75
    ci = bootstrap_interval([1.0, 4.0], seed=0)
    assert (ci.low, ci.high) == (1.0, 4.0)
    assert ci.note == (
        "2 pairs: only 3 distinct resamples; at n=2 a percentile bootstrap's 95% interval covers the mean"
        " about 50% of the time (normal pairs): read the t interval"
    )
    assert 0.46 <= _covered(2, seed=2) <= 0.54


def test_a_bootstrap_coverage_never_exceeds_the_chance_its_pairs_straddle_the_mean() -> None:
    """A percentile bootstrap interval of the mean lies within [smallest pair, largest pair], which straddle
    the mean of n symmetric pairs with probability 1 − 2¹⁻ⁿ: the normal limit overshot that at a high
    confidence (89% at 4 pairs for 99%, past 87.5%; 96% at 5 for 99.9%, past 93.75%). It is capped there,
    and still grows with n at every confidence."""
    from asyncroll.experiment.stats import percentile_bootstrap_coverage

    for confidence in (0.8, 0.9, 0.95, 0.99, 0.999):
        coverages = [percentile_bootstrap_coverage(n, confidence) for n in range(2, 30)]
        for n, coverage in enumerate(coverages, start=2):
            assert coverage <= 1.0 - 2.0 ** (1 - n), (confidence, n, coverage)
        assert coverages == sorted(coverages), confidence
    assert percentile_bootstrap_coverage(4, 0.99) == 0.875


def _covered(pairs: int, seed: int, experiments: int = 2000) -> float:
    """How often the seeded bootstrap's interval of ``pairs`` normal pairs (true mean 0) covers 0."""
    rng = __import__("numpy").random.default_rng(seed)
    covered = 0
    for k in range(experiments):
        ci = bootstrap_interval(list(rng.normal(0.0, 1.0, pairs)), seed=k, resamples=1000)
        covered += ci.low <= 0.0 <= ci.high  # type: ignore[operator]
    return covered / experiments
