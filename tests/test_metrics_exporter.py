"""``--metrics-port`` in-process: what a scrape says before measurement and with no run ended yet, the
snapshot taken on the run's own event-loop thread, the port released on stop, and the exact reasons a
port cannot be used. Real loopback sockets, each test under a hard timeout."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import threading
import urllib.error

import pytest

from asyncroll.errors import AsyncrollError
from asyncroll.runtime.progress import RunSnapshot
from asyncroll.telemetry import exporter as exporter_module
from asyncroll.telemetry.exporter import MetricsExporter, RuntimeCollector, listen_error
from tests.test_live_view import _scrape, snap


class _Fixed:
    """A view that answers one snapshot and records the thread and running loop of each call."""

    def __init__(self, snapshot: RunSnapshot) -> None:
        self._snapshot = snapshot
        self.threads: list[int] = []
        self.loops: list[asyncio.AbstractEventLoop | None] = []

    def snapshot(self) -> RunSnapshot:
        self.threads.append(threading.get_ident())
        try:
            self.loops.append(asyncio.get_running_loop())
        except RuntimeError:
            self.loops.append(None)
        return self._snapshot


def _values(collector: RuntimeCollector) -> dict[str, float]:
    values: dict[str, float] = {}
    for family in collector.collect():
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return values


def test_a_scrape_before_measurement_with_nothing_ended_says_so() -> None:
    """Before the measurement clock starts the elapsed gauge has no sample (it was -1, a stand-in a
    dashboard would plot; its help says so); completed and failed are always exported, 0 until one ends;
    other statuses appear as they occur; no info, no info family."""
    early = _values(RuntimeCollector(_Fixed(snap({}, None))))  # type: ignore[arg-type]
    assert "asyncroll_measurement_elapsed_seconds" not in early
    assert early["asyncroll_trajectories_finished_total{status=completed}"] == 0
    assert early["asyncroll_trajectories_finished_total{status=failed}"] == 0
    assert (
        early["asyncroll_trajectories_completed_total"] == early["asyncroll_trajectories_failed_total"] == 0
    )
    assert not any(name.startswith("asyncroll_run_info") for name in early)
    later = _values(RuntimeCollector(_Fixed(snap({"completed": 2, "max_turns": 1}, 0.0))))  # type: ignore[arg-type]
    assert later["asyncroll_measurement_elapsed_seconds"] == 0
    assert later["asyncroll_trajectories_finished_total{status=max_turns}"] == 1
    assert later["asyncroll_trajectories_finished_total{status=completed}"] == 2
    assert later["asyncroll_trajectories_finished_total{status=failed}"] == 0


@pytest.mark.timeout(20)
def test_the_snapshot_is_taken_on_the_loop_thread_wherever_the_scrape_comes_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A scrape from the HTTP thread hands the snapshot to the run's loop (one consistent instant of every
    limiter); a scrape on the loop's own thread reads it at once (waiting on itself would never end)."""
    monkeypatch.setattr(exporter_module, "SNAPSHOT_TIMEOUT_S", 2.0)
    view = _Fixed(snap({"completed": 1}, 1.0))
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    collector = RuntimeCollector(view, loop)  # type: ignore[arg-type]
    try:
        assert _values(collector)["asyncroll_trajectories_completed_total"] == 1  # from this (foreign) thread
        assert view.threads[-1] == runner.ident and view.loops[-1] is loop

        async def on_the_loop() -> float:
            return _values(collector)["asyncroll_trajectories_completed_total"]

        assert asyncio.run_coroutine_threadsafe(on_the_loop(), loop).result(timeout=10) == 1
        assert view.threads[-1] == runner.ident and len(view.threads) == 2
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(timeout=5)
        loop.close()
    assert _values(collector)["asyncroll_trajectories_completed_total"] == 1  # a closed loop: read here
    assert view.threads[-1] == threading.get_ident()


@pytest.mark.timeout(20)
def test_stop_releases_the_port_at_once_and_twice_is_harmless() -> None:
    exporter = MetricsExporter(RuntimeCollector(_Fixed(snap({}, 1.0))), 0).start()  # type: ignore[arg-type]
    try:
        port = exporter.port
        assert port is not None and _scrape(exporter.url)["asyncroll_workload_trajectories"] == 10
    finally:
        exporter.stop()
    assert listen_error("127.0.0.1", port) is None  # free again, in this very process
    with pytest.raises(urllib.error.URLError):
        _scrape(exporter.url)
    exporter.stop()


@pytest.mark.timeout(20)
def test_why_a_port_cannot_be_used_is_said_exactly() -> None:
    """The reason is the system's own words without create_server's "(while attempting to bind ...)"; only
    a port in use gets the advice to stop its holder or choose another port. The exporter's own bind (a
    port taken between the check and the start) names the flag too."""
    hint = "; stop what holds it, or choose another --metrics-port (0 picks a free one)"
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert listen_error("127.0.0.1", port) == os.strerror(errno.EADDRINUSE) + hint
        exporter = MetricsExporter(RuntimeCollector(_Fixed(snap({}, 1.0))), port)  # type: ignore[arg-type]
        with pytest.raises(AsyncrollError) as caught:
            exporter.start()
    assert str(caught.value) == (
        f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}: {os.strerror(errno.EADDRINUSE)}"
    )
    # TEST-NET-1 (RFC 5737): never a local address, refused at once, no name lookup
    assert listen_error("192.0.2.1", 0) == os.strerror(errno.EADDRNOTAVAIL)
    # an IPv6 host is written in brackets: "cannot listen on ::1:8000" read as no address at all
    v6 = MetricsExporter(RuntimeCollector(_Fixed(snap({}, 1.0))), 1, host="2001:db8::1")  # type: ignore[arg-type]
    with pytest.raises(AsyncrollError) as caught:
        v6.start()  # RFC 3849's documentation prefix: never local, refused at once
    assert str(caught.value).startswith("--metrics-port 1: cannot listen on [2001:db8::1]:1: "), caught.value


def test_only_counters_are_named_total() -> None:
    """Prometheus keeps the ``_total`` suffix for counters: the gauge of the workload's size was
    ``asyncroll_trajectories_total``, which any tool reads as a counter."""
    from prometheus_client.core import GaugeMetricFamily

    collector = RuntimeCollector(_Fixed(snap({}, None)))  # type: ignore[arg-type]
    gauges = [f.name for f in collector.describe() if isinstance(f, GaugeMetricFamily)]
    assert "asyncroll_workload_trajectories" in gauges
    assert not [name for name in gauges if name.endswith("_total")]
