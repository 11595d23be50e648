"""The benches' quantiles and medians use summary.json's definitions (MEASUREMENT.md): percentiles by
linear interpolation between ranks, and the true median (the mean of the two middle values for an even
count, never the upper one)."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from asyncroll.outputs.statistics import distribution


def test_the_transformers_bench_reads_summary_quantiles_not_a_floor_rank() -> None:
    """32 finished requests of 1..32 s: linear p95 is 30.45 s (numpy's default); the bench printed
    the 30th smallest, 30 s."""
    from bench.transformers_serve import client_figures, table_row

    latencies = [float(k) for k in range(1, 33)]
    events: list[dict[str, Any]] = [
        {"event": "model_finished", "latency_s": x, "completion_tokens": 4} for x in latencies
    ]
    summary = {"makespan_s": 16.0, "latency": {"model_latency_s": distribution(latencies)}}
    row = client_figures(summary, events)
    assert row["latency_p95_s"] == pytest.approx(float(np.quantile(latencies, 0.95))) == 30.45
    assert row["latency_p50_s"] == pytest.approx(float(np.median(latencies)))
    assert row["requests"] == 32 and row["requests_per_s"] == 2.0
    # two repeats: the median requests/s is the mean of both, not the larger one
    rows = [
        {**row, "summary": {"counts": {"completed": 16}}, "requests_per_s": rate, "latency_p95_s": p95}
        for rate, p95 in ((2.0, 30.0), (3.0, 31.0))
    ]
    assert table_row(4, rows, 16) == "| 4 | 16 / 16 | 2.0 / 2.5 / 3.0 | 16.500 | 30.500 |"
    # a repeat with no finished request has no latency: unknown, never a number over the others
    rows[1] = {**rows[1], "latency_p95_s": None, "requests_per_s": None}
    assert table_row(4, rows, 16).endswith("| unknown | 16.500 | unknown |")


def test_the_evaluator_bench_takes_the_true_median_of_an_even_count(monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.evaluator as evaluator

    ticks = iter([0.0, 0.001, 1.0, 1.002, 2.0, 2.003, 3.0, 3.010])  # 1, 2, 3 and 10 ms
    monkeypatch.setattr(evaluator, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
    assert evaluator._command_ms([sys.executable, "-c", "pass"], 4) == pytest.approx(2.5)


def test_the_optimum_map_gives_no_share_of_a_gap_within_rounding_of_the_proven_bound() -> None:
    """FIFO on the proven optimum but for float rounding printed "1.000" and "gap closed 0%" (a policy a
    little behind it, an absurd "-50000%"); the pressure map says "n/a" there."""
    from bench.optimum_map import gap_closed

    assert gap_closed(1.0000002, 1.0000002) == "n/a"
    assert gap_closed(1.0000002, 1.0001) == "n/a"
    assert gap_closed(1.0, 1.0) == "n/a"
    assert gap_closed(1.2, 1.1) == "50%"
