"""The report's figure as a reader sees it: tick labels that do not run into each other, y axes from 0, and
a panel that says why it has nothing to draw."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import pytest

from tests.fake_comparison import comparison, drawn

GPU_HOUR = "throughput.completed_per_gpu_hour"
STARVED = "resources.sampled_starvation_fraction_of_coverage"


def with_arm(data: dict[str, Any], name: str, policy: str, like: str = "b") -> dict[str, Any]:
    """``data`` with a further arm ``name``, whose every pair's values are arm ``like``'s."""
    data = copy.deepcopy(data)
    data["arms"].append(name)
    data["policies"][name] = policy
    for pair in data["pairs"]:
        pair["arms"][name] = {**copy.deepcopy(pair["arms"][like]), "id": f"pair{pair['pair']}-{name}"}
        pair["order"].append(name)
    return data


def test_three_arms_tick_labels_do_not_run_into_each_other(tmp_path: Path) -> None:
    """Three arms (fifo, asyncroll, a long-named copy of fifo): each tick's policy line
    "(asyncroll = asyncroll_repair)" was never broken and the 30-character lines of the ticks overlapped
    their neighbours', unreadable (seen in a serve-sim experiment of three arms)."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    data = comparison([({GPU_HOUR: 100.0}, {GPU_HOUR: 110.0})] * 2)
    data = with_arm(data, "fifo_identical_to_baseline_with_a_rather_long_arm_name_for_ticks", "fifo")
    data = with_arm(data, "a_fourth_arm_named_at_length_too", "asyncroll")
    for arms in (3, 4):
        trimmed = copy.deepcopy(data)
        dropped = trimmed["arms"][arms:]
        trimmed["arms"] = trimmed["arms"][:arms]
        for pair in trimmed["pairs"]:
            pair["order"] = [a for a in pair["order"] if a not in dropped]
            for a in dropped:
                del pair["arms"][a]
        fig = drawn(trimmed, tmp_path / f"figure{arms}")
        for ax in fig.axes:
            boxes = [t.get_window_extent() for t in ax.get_xticklabels()]
            assert len(boxes) == arms
            for left, right in itertools.pairwise(boxes):
                assert left.x1 < right.x0, [t.get_text() for t in ax.get_xticklabels()]
        plt.close(fig)


def test_every_panel_starts_at_zero_so_a_small_change_looks_small(tmp_path: Path) -> None:
    """A 1% change (100 → 101 completions per GPU-hour) filled the panel from bottom to top, as a change of
    100% would: the y axis was fitted to the data. All three metrics are never negative: from 0, with a
    margin below so that a point at 0 (no starvation) is drawn whole, not cut in half at the edge."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    cpu = "cpu_cost.per_completion_s"
    data = comparison(
        [({GPU_HOUR: 100.0, STARVED: 0.0, cpu: 0.1}, {GPU_HOUR: 101.0, STARVED: 0.0, cpu: 0.1})] * 3
    )
    fig = drawn(data, tmp_path / "figure")
    for ax in fig.axes:
        low, high = ax.get_ylim()
        assert low < 0 and -low <= 0.05 * high, (low, high)
    assert fig.axes[0].get_ylim()[1] > 101
    plt.close(fig)


def test_a_panel_with_no_complete_pair_says_so_not_that_nothing_was_measured(tmp_path: Path) -> None:
    """One arm failed in every pair: both other arms were measured, yet every panel said "unknown (not
    measured in any complete pair)"; no pair is complete, and the panel says that."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    data = comparison(
        [({GPU_HOUR: 100.0}, {GPU_HOUR: 110.0})] * 2, errors={"pair1-b": "boom", "pair2-b": "x"}
    )
    fig = drawn(data, tmp_path / "figure")
    for ax in fig.axes:
        assert "no complete pair\n(each has a failed or unfinished arm)" in [t.get_text() for t in ax.texts]
    plt.close(fig)


def test_past_a_few_pairs_the_lines_are_not_labelled_over_each_other(tmp_path: Path) -> None:
    """20 pairs: each line's label ("p1" … "p20") was drawn at the last arm's tick, all within a few points
    of each other, a blot no one could read; past :data:`figure.PAIR_LABELS` pairs none is drawn (REPORT.md
    names each pair's ratio), below it each still is."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from asyncroll.experiment import figure

    def labels(pairs: int) -> list[str]:
        fig = drawn(comparison([({GPU_HOUR: 100.0}, {GPU_HOUR: 110.0})] * pairs), tmp_path / f"f{pairs}")
        texts = [t.get_text() for t in fig.axes[0].texts]
        plt.close(fig)
        return [t for t in texts if t.startswith("p")]

    assert labels(20) == []
    assert labels(figure.PAIR_LABELS) == [f"p{k}" for k in range(1, figure.PAIR_LABELS + 1)]


def test_pair_names_at_one_value_are_spread_apart_not_printed_over_each_other(tmp_path: Path) -> None:
    """Four pairs ending at the same value named themselves at one place (two at +5 pt, two at -5 pt), and
    a line under the median's bar had its name hidden by it: the names are spread at least LABEL_GAP
    points apart, right of the bar."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from asyncroll.experiment import figure

    fig = drawn(comparison([({GPU_HOUR: 100.0}, {GPU_HOUR: 110.0})] * 4), tmp_path / "f")
    try:
        ax = fig.axes[0]
        names = sorted((t for t in ax.texts if t.get_text().startswith("p")), key=lambda t: t.get_text())
        boxes = [t.get_window_extent() for t in names]
        bar_end = ax.transData.transform((1 + figure.MEDIAN_HALF_WIDTH, 0))[0]
        gap = figure.LABEL_GAP * fig.dpi / 72
    finally:
        plt.close(fig)
    assert [t.get_text() for t in names] == ["p1", "p2", "p3", "p4"]
    centres = sorted((b.y0 + b.y1) / 2 for b in boxes)
    assert all(b - a >= gap - 0.01 for a, b in itertools.pairwise(centres))
    assert all(b.x0 > bar_end for b in boxes)


def test_spread_moves_only_what_overlaps_and_centres_each_run() -> None:
    from asyncroll.experiment.figure import spread

    assert spread([0.0, 100.0], 8.0) == [0.0, 100.0]
    assert spread([10.0, 10.0, 10.0], 8.0) == [2.0, 10.0, 18.0]
    assert spread([30.0, 0.0, 2.0], 8.0) == [30.0, -3.0, 5.0]  # the order given is kept
    # 0 and 4 make a run at -2 and 6, which reaches 10: the three make one, centred on their mean (14 / 3)
    assert spread([0.0, 4.0, 10.0], 8.0) == pytest.approx([14 / 3 - 8, 14 / 3, 14 / 3 + 8])
