"""The report's paired statistics when pairs drop out for different reasons at once, when none is left,
and the t quantile's refusals."""

from __future__ import annotations

import pytest

from asyncroll.experiment.stats import bootstrap_interval, paired_change, t_interval, t_ppf


def test_pairs_left_out_for_different_reasons_are_counted_together() -> None:
    """Pair 2 not measured, pair 3 a value undefined (a ratio over a measured 0), pair 4 a baseline of 0:
    two pairs left out of the mean difference, two undefined, one unknown."""
    change = paired_change(
        [1.0, None, 2.0, 0.0, 4.0],
        [1.5, 2.0, None, 1.0, 5.0],
        seed=0,
        resamples=200,
        undefined_values=[None, None, "eligible_decisions = 0", None, None],
    )
    assert (change["unknown_pairs"], change["undefined_pairs"]) == (1, 2)
    assert change["ratios"] == [1.5, None, None, None, 1.25]
    assert change["percent_change"] == [50.0, None, None, None, 25.0]
    assert change["pair_notes"] == [
        None,
        "unknown (not measured)",
        "undefined (eligible_decisions = 0)",
        "undefined (baseline 0, treatment 1)",
        None,
    ]
    percent = change["mean_percent_change_t95"]
    assert isinstance(percent, dict) and percent["n"] == 0
    difference = change["mean_difference_t95"]
    assert isinstance(difference, dict) and difference["n"] == 3
    assert difference["note"] == (
        "2 of 5 pairs left out (pair 2: a value not measured; "
        "pair 3: a value undefined (eligible_decisions = 0))"
    )


def test_with_no_pair_left_an_interval_says_only_that() -> None:
    change = paired_change([None, None], [1.0, 2.0], seed=0, resamples=100)
    for key in ("mean_difference_t95", "mean_percent_change_t95", "mean_percent_change_bootstrap95"):
        assert change[key] == {
            "n": 0,
            "mean": None,
            "low": None,
            "high": None,
            "note": "no pair with a known value",
        }


def test_empty_intervals_rest_on_no_pair() -> None:
    assert t_interval([]).n == bootstrap_interval([], seed=0).n == 0


@pytest.mark.parametrize(("q", "df"), [(0.0, 3.0), (1.0, 3.0), (0.5, 0.0)])
def test_the_t_quantile_refuses_what_has_none(q: float, df: float) -> None:
    with pytest.raises(ValueError, match="t_ppf needs 0 < q < 1 and df > 0"):
        t_ppf(q, df)


def test_a_value_undefined_in_every_pair_leaves_no_interval() -> None:
    change = paired_change(
        [None, 1.0], [2.0, None], seed=0, resamples=100, undefined_values=["eligible_decisions = 0"] * 2
    )
    assert (change["unknown_pairs"], change["undefined_pairs"]) == (0, 2)
    none = {
        "n": 0,
        "mean": None,
        "low": None,
        "high": None,
        "note": "undefined in every pair: a value undefined (eligible_decisions = 0)",
    }
    for key in ("mean_difference_t95", "mean_percent_change_t95", "mean_percent_change_bootstrap95"):
        assert change[key] == none
