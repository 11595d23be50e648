"""The bench scripts' smallest settings run to their table (bench.telemetry, bench.simspeed, …)."""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

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


def _main(module: Any, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", [module.__name__, *argv])
    module.main()


def test_the_simulation_speed_bench_states_its_settings(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench.simspeed printed the machine and its tables, not the repeats or the limits it ran at."""
    from bench import simspeed

    figures = {"window_cpu_s": 1.0, "cpu_s": 2.0, "rss_mb": 100.0, "growth_mb": 1.0}
    monkeypatch.setattr(simspeed, "one", lambda *args, **kwargs: {**figures, "virtual_makespan_s": 9.0})
    _main(simspeed, ["--sizes", "5,7", "--repeats", "2"], monkeypatch)
    out = capsys.readouterr().out
    assert "sizes 5,7, 2 repeats, each in a fresh process" in out, out
    assert "64 active / 16 inflight / 4 workers" in out, out


def test_the_decision_bench_states_its_settings(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench.decision printed no repeats and no count of the calls each median is over."""
    from bench import decision

    monkeypatch.setattr(decision, "warm_import", lambda: None)
    monkeypatch.setattr(decision, "one_repeat", lambda seed: (float(seed),) * 8)
    _main(decision, ["--repeats", "2"], monkeypatch)
    out = capsys.readouterr().out
    assert "2 repeats (seeds 0–1) of 2000 timed calls per measure (50 refits); 64 queued jobs" in out, out


def test_the_scaling_bench_states_its_workers(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """RESULTS.md says "2 workers"; the bench's own header did not say how many."""
    from bench import scaling

    monkeypatch.setattr(scaling, "one", lambda n, inflight, latency: (1.0, [], Counter()))
    _main(scaling, ["--trajectories", "3", "--repeats", "1"], monkeypatch)
    assert "3 active, 2 (idle) workers" in capsys.readouterr().out


def test_the_client_bench_states_its_throughput_requests(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench import client

    class Stopped:
        stdout = None

        def terminate(self) -> None:
            pass

        def wait(self, timeout: float | None = None) -> int:
            return 0

        def poll(self) -> int:
            return 0

    async def sequential(url: str, n: int) -> dict[str, float]:
        return dict.fromkeys(("wall_ms", "client_cpu_us", "httpx_cpu_us", "asyncroll_cpu_us"), 1.0)

    async def throughput(url: str, inflight: int, n: int) -> float:
        return 100.0

    monkeypatch.setattr(client, "start_server", lambda: (Stopped(), "http://127.0.0.1:9"))
    monkeypatch.setattr(client, "in_process", lambda n: 150.0)
    monkeypatch.setattr(client, "sequential", sequential)
    monkeypatch.setattr(client, "throughput", throughput)
    _main(client, ["--repeats", "1", "--requests", "7", "--sequential", "3"], monkeypatch)
    out = capsys.readouterr().out
    assert "sequential requests per repeat: 3; requests per throughput measurement: 7" in out, out
