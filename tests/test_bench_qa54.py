"""The bench scripts' smallest settings run to their table (bench.telemetry, bench.simspeed, …)."""

from __future__ import annotations

import sys

import pytest


@pytest.mark.timeout(60)
def test_the_telemetry_bench_runs_with_fewer_than_four_calls(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole exposition was parsed ``--calls // 4`` times: 0 for ``--calls 3``, and the bench ended on
    a StatisticsError traceback (no median for empty data) after measuring the rest."""
    from bench import telemetry

    monkeypatch.setattr(sys, "argv", ["telemetry", "--repeats", "1", "--calls", "3"])
    telemetry.main()
    out = capsys.readouterr().out
    assert "1 repeats of 3 calls (1 for prometheus_client)" in out, out
    assert "prometheus_client, whole exposition" in out and "one server sample" in out, out
