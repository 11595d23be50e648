"""The telemetry sampler: it survives a failing source and records every failure, and its stop is
bounded when a read trickles or hangs."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from asyncroll.clock import SystemClock
from asyncroll.event_log import EventCapture, EventLog
from asyncroll.events import ResourceSample
from asyncroll.telemetry.sampler import TelemetrySampler
from asyncroll.telemetry.server_metrics import ServerMetricsSource, ServerSample
from tests.metrics_loopback import MetricsServer, idle_vllm, trickle_metrics


@pytest.mark.timeout(30)
def test_the_sampler_survives_a_failing_source_and_records_every_failure(
    metrics_server: Callable[..., MetricsServer],
) -> None:
    """An exception inside a source (a bug, not a bad server) is caught, counted and written into that
    sample; sampling goes on, and stop() takes the final sample and closes the sources."""
    from asyncroll.event_log import EventLog
    from asyncroll.telemetry.sampler import TelemetrySampler
    from asyncroll.telemetry.server_metrics import ServerMetricsSource

    server = metrics_server(idle_vllm)

    class Flaky(ServerMetricsSource):
        calls = 0

        async def read(self, now: Callable[[], float]) -> Any:
            Flaky.calls += 1
            if Flaky.calls in (2, 3):
                raise RuntimeError(f"boom {Flaky.calls}")
            return await super().read(now)

    async def main() -> list[ResourceSample]:
        clock = SystemClock()
        events = EventLog(clock)
        capture = EventCapture()
        events.subscribe(capture)
        enough = asyncio.Event()
        events.subscribe(lambda e: enough.set() if len(capture.of(ResourceSample)) >= 5 else None)
        source = Flaky(server.url, model="sim", timeout=1.0)
        sampler = TelemetrySampler(clock, events, interval=0.01, server=source)
        await sampler.probe()
        events.start_measurement()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(sampler.run())
            await enough.wait()
            await sampler.stop()
        assert sampler.errors == 2 and source._client is None  # closed
        return capture.of(ResourceSample)

    samples = asyncio.run(main())
    assert len(samples) >= 6  # five, then the final one
    broken = [s for s in samples if s.errors]
    assert [s.errors for s in broken] == [
        ["server_metrics: RuntimeError: boom 2"],
        ["server_metrics: RuntimeError: boom 3"],
    ]
    assert all(s.server_running is None and s.nulls["server_running"] == "error" for s in broken)
    assert all(s.server_running == 0.0 for s in samples if not s.errors)
    assert [s.seq for s in samples] == list(range(1, len(samples) + 1))


def _sampler_until_stopped(
    source: ServerMetricsSource, reading: threading.Event, hard_limit_s: float
) -> tuple[float, list[ResourceSample]]:
    """Probe, sample every 50 ms, and once ``reading`` is set (a sample is inside its read) stop():
    how long stop() took, and the samples."""

    async def go() -> tuple[float, list[ResourceSample]]:
        clock = SystemClock()
        events = EventLog(clock)
        capture = EventCapture()
        events.subscribe(capture)
        sampler = TelemetrySampler(clock, events, interval=0.05, server=source)
        await sampler.probe()
        assert sampler.sampling
        events.start_measurement()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(sampler.run())
            assert await asyncio.to_thread(reading.wait, 5)
            began = time.monotonic()
            async with asyncio.timeout(hard_limit_s):
                await sampler.stop()
            took = time.monotonic() - began
        assert source._client is None  # closed
        return took, capture.of(ResourceSample)

    return asyncio.run(go())


@pytest.mark.timeout(30)
def test_stop_is_bounded_when_the_metrics_trickle_after_the_probe(
    metrics_server: Callable[..., MetricsServer],
) -> None:
    """The probe is answered, every later scrape trickles: the loop's sample and the final one each end
    at the read's deadline, so a finished run ends (D7: it hung, and SIGTERM could not end it)."""
    trickling = threading.Event()

    def after_the_probe(handler: BaseHTTPRequestHandler, n: int, closing: threading.Event) -> bool:
        if n == 1:
            return False
        trickling.set()
        return trickle_metrics(handler, closing)

    server = metrics_server(idle_vllm, after_the_probe)
    # a 1 s per-phase timeout, 50 times the trickle's 20 ms: with 0.1 s, the trickling thread held off a
    # loaded machine's CPU for 0.1 s made a read's error a per-phase 'no response within 0.1 s'
    source = ServerMetricsSource(server.url, flavor="vllm", model="sim", timeout=1.0)
    took, samples = _sampler_until_stopped(source, trickling, hard_limit_s=12)
    assert took < 2 * 1.5 + 3.0  # two reads, each ending at its 1.5 s deadline (slack: a loaded machine)
    assert len(samples) == 2  # the loop's one, then the final one
    assert all(
        s.errors == [f"server_metrics: GET {server.url}: no complete response within 1.5 s"]
        and s.nulls["server_running"] == "error"
        for s in samples
    )


@pytest.mark.timeout(30)
def test_stop_cancels_a_sampling_loop_stuck_past_its_deadline(
    metrics_server: Callable[..., MetricsServer],
) -> None:
    """A source that hangs beyond its own deadline (a bug): stop() cancels the loop after the read's
    deadline plus a margin, and the final sample says so instead of reading the stuck source again."""
    server = metrics_server(idle_vllm)
    reading = threading.Event()

    class Stuck(ServerMetricsSource):
        async def read(self, now: Callable[[], float]) -> ServerSample:
            reading.set()
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

    source = Stuck(server.url, flavor="vllm", model="sim", timeout=0.1)
    took, samples = _sampler_until_stopped(source, reading, hard_limit_s=6)
    assert 1.0 < took < 3.5  # the 0.6 s deadline + the 0.5 s margin, then no read (slack: load)
    [final] = samples
    assert final.errors == [
        "server_metrics: sampling did not stop within 1.1 s (a read hung); cancelled, not read again"
    ]
    assert final.nulls["server_running"] == "error"


def test_token_rates_are_timed_from_each_get_s_start_not_its_body_s_arrival() -> None:
    """The server reads its counters as it handles the GET; its body then travels for a time that varies
    (here 1 ms, 40 ms, 1 ms). Rates of a steady 1,000 tokens/s over the bodies' arrivals read
    1,000 × 100 ÷ 139 ≈ 719, then ≈ 1,639; over the GETs' starts, 100 ms apart, 1,000 both times."""
    clock = [0.0]
    travel = iter([0.001, 0.001, 0.040, 0.001])

    class Travelling(ServerMetricsSource):
        async def _get(self, limit_s: float) -> bytes:
            generated = 1000.0 * clock[0]  # read by the server as it handles the GET
            clock[0] += next(travel)
            return (
                "# TYPE vllm:num_requests_running gauge\n"
                'vllm:num_requests_running{model_name="sim"} 1.0\n'
                'vllm:num_requests_waiting{model_name="sim"} 0.0\n'
                'vllm:kv_cache_usage_perc{model_name="sim"} 0.5\n'
                "# TYPE vllm:prompt_tokens_total counter\n"
                'vllm:prompt_tokens_total{model_name="sim"} 0.0\n'
                "# TYPE vllm:generation_tokens_total counter\n"
                f'vllm:generation_tokens_total{{model_name="sim"}} {generated}\n'
            ).encode()

    async def main() -> list[ServerSample]:
        source = Travelling("http://127.0.0.1:9/metrics", model="sim", timeout=1.0)
        await source.probe(1.0)
        samples = []
        for start in (1.0, 1.1, 1.2):
            clock[0] = start
            samples.append(await source.read(lambda: clock[0]))
        return samples

    samples = asyncio.run(main())
    assert samples[0].generation_tokens_per_s is None  # the first reading: no rate yet
    assert [s.generation_tokens_per_s for s in samples[1:]] == [pytest.approx(1000.0)] * 2
