"""What the sampler records, on scripted sources whose reads take exact times: the fixed grid (a late
wake-up is ``late_s``, an overrun skips the missed slots), each source's read time, the NVML readings
and what NVML refused, and why a source was not read (its own probe failing, not zeros)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

import pytest

from asyncroll.clock import VirtualClock
from asyncroll.event_log import EventCapture, EventLog
from asyncroll.events import ResourceProbe, ResourceSample
from asyncroll.telemetry.nvml import GpuSample, NvmlSource
from asyncroll.telemetry.sampler import GPU_FIELDS, SERVER_FIELDS, TelemetrySampler
from asyncroll.telemetry.server_metrics import ServerMetricsSource, ServerSample
from tests.nvml_double import fake_pynvml

START = 100.0  # not zero: a duration taken as a sum of two clock readings would show


class PacedClock(VirtualClock):
    """Virtual time the sampler takes for a real clock: a scripted read takes exactly its seconds (a
    real run's reads take real time; the sampler refuses a clock that says it is virtual)."""

    virtual = False


class ScriptedServer(ServerMetricsSource):
    """A ``/metrics`` source without a server: the probe takes ``probe_s`` (or raises ``probe_error``),
    read n takes ``reads[n]`` seconds (0 past the script) and gives ``running = n`` (or raises)."""

    def __init__(
        self, reads: list[float | Exception], probe_s: float = 0.0, probe_error: Exception | None = None
    ) -> None:
        super().__init__("http://scripted.invalid/metrics", flavor="vllm", model="sim", timeout=1.0)
        self.reads, self.probe_s, self.probe_error = reads, probe_s, probe_error
        self.started: list[float] = []  # the clock at the start of each read
        self.probe_limits: list[float] = []

    async def probe(self, limit_s: float) -> dict[str, Any]:
        self.probe_limits.append(limit_s)
        await asyncio.sleep(self.probe_s)
        if self.probe_error is not None:
            raise self.probe_error
        return {"url": self.url, "flavor": "vllm"}

    async def read(self, now: Callable[[], float]) -> ServerSample:
        n = len(self.started)
        self.started.append(now())
        step = self.reads[n] if n < len(self.reads) else 0.0
        if isinstance(step, Exception):
            raise step
        await asyncio.sleep(step)
        return ServerSample(running=float(n), waiting=0.0, nulls={"kv_cache_usage": "missing"})


def sampled(
    interval: float,
    *,
    server: ServerMetricsSource | None = None,
    nvml: NvmlSource | None = None,
    samples: int,
    hog: tuple[float, float] | None = None,
    clock: PacedClock | None = None,
    before_run_s: float = 0.0,
) -> tuple[TelemetrySampler, list[ResourceProbe], list[ResourceSample]]:
    """Probe, start the measurement, sample until ``samples`` were taken, stop (one more sample).
    ``hog=(at, for_s)``: at ``at`` s into the measurement the loop is blocked for ``for_s`` s.
    ``clock``: a fresh one at ``START`` unless given (a source that takes time on it needs it).
    ``before_run_s``: the loop is held that long between the measurement's start and the sampler's
    first run (a real run's trajectories take the loop first)."""
    clock = PacedClock(start=START) if clock is None else clock

    async def go() -> tuple[TelemetrySampler, EventCapture]:
        events = EventLog(clock)
        capture = EventCapture()
        events.subscribe(capture)
        enough = asyncio.Event()
        events.subscribe(lambda e: enough.set() if len(capture.of(ResourceSample)) >= samples else None)
        sampler = TelemetrySampler(
            clock, events, interval=interval, server=server, nvml=nvml, gpu_off_loop=False
        )
        await sampler.probe()
        events.start_measurement()
        clock.advance(before_run_s)

        async def hogging(at: float, for_s: float) -> None:
            await asyncio.sleep(at)
            clock.advance(for_s)  # a callback that held the loop

        async with asyncio.TaskGroup() as tg:
            if hog is not None:
                tg.create_task(hogging(*hog))
            tg.create_task(sampler.run())
            if samples:
                await enough.wait()
            await sampler.stop()
        return sampler, capture

    sampler, capture = clock.run(go())
    return sampler, capture.of(ResourceProbe), capture.of(ResourceSample)


@pytest.mark.timeout(30)
def test_samples_keep_to_the_grid_and_a_late_or_overrunning_one_is_recorded_not_shifted() -> None:
    """Interval 0.5 s. Sample 1 reads 0.25 s; the loop is held from 0.375 s to 0.625 s, so sample 2 is
    0.125 s late; its read takes 1.5 s (to 2.125 s), so slots 1.0, 1.5 and 2.0 are skipped and sample 3
    is at 2.5 s, on the grid; its read ends exactly at the next slot (3.0 s), which is still taken."""
    server = ScriptedServer([0.25, 1.5, 0.5, 0.0])
    sampler, _, samples = sampled(0.5, server=server, samples=4, hog=(0.375, 0.25))
    assert [round(t - START, 6) for t in server.started] == [0.0, 0.625, 2.5, 3.0, 3.0]  # then the final
    assert [s.late_s for s in samples] == [0.0, 0.125, 0.0, 0.0, None]  # the final one: off the grid
    assert [s.collection_s for s in samples] == [{"server_metrics": d} for d in (0.25, 1.5, 0.5, 0.0, 0.0)]
    assert [s.t for s in samples] == [0.25, 2.125, 3.0, 3.0, 3.0]
    assert [s.server_running for s in samples] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert all(s.nulls == {"kv_cache_usage": "missing"} and s.errors == [] for s in samples)
    assert sampler.errors == 0 and not sampler.failed


@pytest.mark.timeout(30)
def test_the_grid_starts_at_the_measurement_start_and_a_late_first_sample_says_so() -> None:
    """The sample at measurement start whose task first ran 0.3 s after it is 0.3 s late, and the
    grid stays on the measurement's multiples of the interval (0.5, 1.0 s), not shifted by the 0.3 s
    (a loaded real run's first sample began 12.5 ms after t = 0 and said 3 µs late)."""
    server = ScriptedServer([0.0, 0.0, 0.0])
    _, _, samples = sampled(0.5, server=server, samples=3, before_run_s=0.3)
    assert [round(t - START, 6) for t in server.started] == [0.3, 0.5, 1.0, 1.0]  # then the final
    assert [s.late_s for s in samples] == [0.3, 0.0, 0.0, None]


@pytest.mark.timeout(30)
def test_gpu_readings_reach_the_sample_and_a_refused_one_is_null_with_its_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = fake_pynvml(count=1, util_supported=False)  # a MIG slice: no utilisation
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    sampler, [probe], samples = sampled(0.5, nvml=NvmlSource(0), samples=2)
    [status] = probe.sources
    assert status.source == "nvml" and status.available and status.reason is None
    assert status.detail["uuid"] == "GPU-1234" and status.collection_s == 0.0
    assert len(samples) == 3 and sampler.errors == 3  # every sample says what NVML refused
    for s in samples:
        assert (s.gpu_util_pct, s.gpu_mem_util_pct) == (None, None)
        assert (s.gpu_mem_used_bytes, s.gpu_mem_total_bytes) == (10 * 2**30, 80 * 2**30)
        assert s.nulls == {"gpu_util_pct": "invalid", "gpu_mem_util_pct": "invalid"}
        assert s.errors == ["nvml: utilisation: Not Supported"] and s.collection_s == {"nvml": 0.0}
        assert s.server_running is None and "server_running" not in s.nulls  # not requested
    assert fake.calls == ["init", "shutdown"]  # stop() closed it


@pytest.mark.timeout(30)
def test_a_failing_gpu_read_nulls_every_gpu_field_and_the_server_is_still_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(count=1, util_supported=True))

    class Broken(NvmlSource):
        reads = 0

        def read(self) -> GpuSample:
            self.reads += 1
            if self.reads == 1:
                return super().read()  # the probe's own read
            raise RuntimeError("bindings went away")

    server = ScriptedServer([0.25])
    sampler, [probe], samples = sampled(0.5, server=server, nvml=Broken(0), samples=1)
    assert [(s.source, s.available) for s in probe.sources] == [("server_metrics", True), ("nvml", True)]
    [first, final] = samples
    assert first.server_running == 0.0 and final.server_running == 1.0
    for s in samples:
        assert s.nulls == {"kv_cache_usage": "missing", **dict.fromkeys(GPU_FIELDS, "error")}
        assert s.errors == ["nvml: RuntimeError: bindings went away"]
    assert first.collection_s == {"server_metrics": 0.25, "nvml": 0.0}
    assert sampler.errors == 2


@pytest.mark.timeout(30)
def test_a_probe_that_raises_is_unavailable_with_the_exception_and_its_time() -> None:
    """A source bug at the probe (not a MetricsUnavailable) is reported with its type, after the time it
    took; the source is then never read and no sample is taken."""
    server = ScriptedServer([], probe_s=0.25, probe_error=RuntimeError("parser bug"))
    sampler, [probe], samples = sampled(0.5, server=server, samples=0)
    [status] = probe.sources
    assert not status.available and status.reason == "RuntimeError: parser bug"
    assert status.collection_s == 0.25 and status.detail == {"url": server.url}
    assert probe.interval_s == 0.5 and not sampler.sampling
    assert samples == [] and server.started == []
    assert server.probe_limits == [5.0]  # a first scrape may be slow: at least PROBE_TIMEOUT_S


@pytest.mark.timeout(30)
def test_the_final_read_is_bounded_and_a_long_error_is_cut_not_lost() -> None:
    """The loop's read fails with a 600-character message: written cut to 500 characters, all the
    server's fields null as errors. The final read (after stop) outlasts stop()'s limit: cut off there,
    and the sample says within how long no sample came."""
    server = ScriptedServer([RuntimeError("x" * 600), 3600.0])
    sampler, _, [failed, final] = sampled(0.5, server=server, samples=1)
    assert failed.errors == [("server_metrics: RuntimeError: " + "x" * 600)[:500]]
    limit = sampler.stop_limit_s
    assert final.errors == [f"server_metrics: no sample within {limit:g} s"]
    assert final.collection_s == {"server_metrics": limit}
    for s in (failed, final):
        assert s.server_running is None and s.kv_cache_usage is None
        assert set(s.nulls) == set(SERVER_FIELDS.values()) and set(s.nulls.values()) == {"error"}
    assert sampler.errors == 2


def _sample_for(
    seconds: float, server: ServerMetricsSource, first: Callable[[Any], None] | None = None
) -> tuple[TelemetrySampler, list[ResourceSample]]:
    """Probe ``server`` (interval 0.5 s), start the measurement, let the sampler run ``seconds`` of
    (virtual) time, stop it. ``first``: a subscriber that sees each event before the capture does."""
    clock = PacedClock(start=START)

    async def go() -> tuple[TelemetrySampler, EventCapture]:
        events = EventLog(clock)
        if first is not None:
            events.subscribe(first)
        capture = EventCapture()
        events.subscribe(capture)
        sampler = TelemetrySampler(clock, events, interval=0.5, server=server)
        await sampler.probe()
        events.start_measurement()
        task = asyncio.create_task(sampler.run())
        await asyncio.sleep(seconds)
        await sampler.stop()
        await task
        return sampler, capture

    sampler, capture = clock.run(go())
    return sampler, capture.of(ResourceSample)


@pytest.mark.timeout(30)
def test_a_sampling_loop_that_breaks_says_so_in_the_final_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug that ends the sampling loop (here: its second sample raises) left only a gap in the samples,
    with no reason anywhere a user could see; the final sample's errors now say what broke and where."""
    original = TelemetrySampler._sample
    calls = 0

    async def second_breaks(self: TelemetrySampler, late: float, **kwargs: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("a bug")
        await original(self, late, **kwargs)

    monkeypatch.setattr(TelemetrySampler, "_sample", second_breaks)
    sampler, [first, final] = _sample_for(2.0, ScriptedServer([0.0]))
    assert (first.seq, first.errors) == (1, [])
    assert final.seq == 2 and final.t == 2.0 and final.server_running == 1.0  # the final read still happened
    assert final.errors == [
        "sampler: the sampling loop broke after sample 1 (RuntimeError: a bug): "
        "no sample between that one and this last one"
    ]
    assert sampler.failed and sampler.errors == 2  # the break, and the final sample's note


@pytest.mark.timeout(30)
def test_samples_that_could_not_be_recorded_are_counted_in_the_final_sample() -> None:
    """A subscriber that raises on the second and third samples: those two are lost, sampling goes on,
    and the final sample says how many were lost."""
    seen = 0

    def failing(event: Any) -> None:
        nonlocal seen
        if isinstance(event, ResourceSample):
            seen += 1
            if seen in (2, 3):
                raise RuntimeError("subscriber bug")

    sampler, samples = _sample_for(1.75, ScriptedServer([0.0]), first=failing)
    assert [s.seq for s in samples] == [1, 4, 5]  # 2 and 3 lost; the loop took 1 to 4, stop() took 5
    assert [s.errors for s in samples[:-1]] == [[], []]
    assert samples[-1].errors == ["sampler: 2 sample(s) could not be recorded (emitting the event failed)"]
    assert not sampler.failed and sampler.errors == 3 and sampler.samples == 3  # recorded ones only
