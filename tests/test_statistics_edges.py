"""summary.json's descriptive statistics at their edges: nothing to describe, values to the µs, a null
correlation's stated reason for two pairs and for a spread too small to square."""

from __future__ import annotations

from asyncroll.outputs.statistics import distribution, pearson, pearson_missing, ratio


def test_an_empty_distribution_counts_nothing_and_has_no_values() -> None:
    assert distribution([]) == {"count": 0, "mean": None, "min": None, "p50": None, "p95": None, "max": None}


def test_a_distribution_is_given_to_the_microsecond() -> None:
    """mean, p50 and p95 rounded to 6 decimals (seconds to the µs); min and max as measured."""
    assert distribution([0.000001, 0.000002, 0.000003]) == {
        "count": 3,
        "mean": 0.000002,
        "min": 0.000001,
        "p50": 0.000002,
        "p95": 0.000003,
        "max": 0.000003,
    }
    assert distribution([1.0000001, 1.0000002, 1.0000004]) == {
        "count": 3,
        "mean": 1.0,
        "min": 1.0000001,
        "p50": 1.0,
        "p95": 1.0,
        "max": 1.0000004,
    }


def test_two_pairs_are_too_few_whatever_their_values() -> None:
    assert pearson([1.0, 2.0], [1.0, 3.0]) is None
    assert pearson_missing([1.0, 2.0], [1.0, 3.0]) == "fewer than 3 pairs (2)"


def test_a_spread_whose_squares_underflow_is_no_variance_not_a_division_by_zero() -> None:
    """Values 1e-170 apart differ, but their squared deviations are 0.0 in floats: no correlation, and
    the null says why."""
    tiny = [0.0, 1e-170, 2e-170]
    assert pearson(tiny, [1.0, 2.0, 3.0]) is None and pearson([1.0, 2.0, 3.0], tiny) is None
    assert pearson_missing(tiny, [1.0, 2.0, 3.0]) == "no variance"
    assert pearson_missing([1.0, 2.0, 3.0], tiny) == "no variance"


def test_a_ratio_is_given_to_six_decimals_and_missing_over_nothing() -> None:
    assert (ratio(1.0, 3.0), ratio(2.0, 3.0), ratio(0.0, 5.0), ratio(1.0, 0.0)) == (
        0.333333,
        0.666667,
        0.0,
        None,
    )


def test_a_correlation_rounded_to_zero_is_never_negative_zero() -> None:
    """An r between -0.00005 and 0 rounded to four places was ``-0.0`` in summary.json."""
    ys = [0.037158, 0.189529, 0.953229, 0.716225, 0.678945, 0.645058, 0.79212, 0.284097, 0.036567, 0.506291]
    r = pearson(list(range(10)), ys)
    assert r == 0 and str(r) == "0.0"
