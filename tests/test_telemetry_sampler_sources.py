"""Which source the sampler reads and what it says of each, on the scripted rig of
``tests/test_telemetry_sampler_readings.py``: a source whose probe failed is never read (its fields are
simply absent, not null as errors), read times are kept to the microsecond, a final read that fails
otherwise than by its limit keeps its own error, and the per-read server timeout ``from_config`` sets is
max(1 s, 3 intervals) (MEASUREMENT.md)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from asyncroll.config import RunConfig
from asyncroll.event_log import EventLog
from asyncroll.telemetry.nvml import GpuSample, NvmlSource
from asyncroll.telemetry.sampler import (
    GPU_FIELDS,
    SERVER_FIELDS,
    STOP_MARGIN_S,
    TelemetrySampler,
    metrics_flavor,
    metrics_url,
)
from asyncroll.telemetry.server_metrics import MetricsUnavailable
from tests.nvml_double import fake_pynvml
from tests.test_telemetry_sampler_readings import START, PacedClock, ScriptedServer, sampled

NVML_READ_S = 0.1234567  # a read time with a seventh decimal: recorded rounded to the microsecond


class TimedNvml(NvmlSource):
    """An NVML source (over the fake bindings) whose every read holds the loop for ``NVML_READ_S``."""

    clock: PacedClock | None = None

    def read(self) -> GpuSample:
        assert self.clock is not None
        self.clock.advance(NVML_READ_S)
        return super().read()


@pytest.mark.timeout(30)
def test_a_server_that_failed_its_probe_is_not_read_while_the_gpu_is_sampled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(count=1, util_supported=True))
    server = ScriptedServer([], probe_error=MetricsUnavailable("GET refused"))
    sampler, [probe], samples = sampled(0.5, server=server, nvml=NvmlSource(0), samples=2)
    assert [(s.source, s.available) for s in probe.sources] == [("server_metrics", False), ("nvml", True)]
    assert server.started == []  # never read after its probe failed
    assert len(samples) == 3 and sampler.errors == 0
    assert sampler.stop_limit_s == STOP_MARGIN_S  # no server read to wait for
    for s in samples:
        assert s.gpu_util_pct == 37.0 and s.server_running is None
        assert s.nulls == {} and s.errors == [] and s.collection_s == {"nvml": 0.0}


@pytest.mark.timeout(30)
def test_a_gpu_that_failed_its_probe_is_not_read_while_the_server_is_sampled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(count=0, util_supported=True))
    sampler, [probe], samples = sampled(0.5, server=ScriptedServer([0.25]), nvml=NvmlSource(0), samples=1)
    assert [(s.source, s.available) for s in probe.sources] == [("server_metrics", True), ("nvml", False)]
    assert [s.server_running for s in samples] == [0.0, 1.0]
    for s in samples:
        assert s.gpu_util_pct is None and not set(GPU_FIELDS) & set(s.nulls)
        assert s.errors == [] and set(s.collection_s) == {"server_metrics"}
    assert sampler.errors == 0


@pytest.mark.timeout(30)
def test_probe_and_read_times_are_kept_to_the_microsecond(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each probe, the first server read and each NVML read take 0.1234567 s: recorded as 0.123457 (the
    probe's NVML time is that of its own first read)."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(count=1, util_supported=True))
    clock = PacedClock(start=START)
    nvml = TimedNvml(0)
    nvml.clock = clock
    server = ScriptedServer([NVML_READ_S], probe_s=NVML_READ_S)
    sampler, [probe], samples = sampled(0.5, server=server, nvml=nvml, samples=1, clock=clock)
    assert [s.collection_s for s in probe.sources] == [0.123457, 0.123457]
    assert [s.collection_s for s in samples] == [
        {"server_metrics": 0.123457, "nvml": 0.123457},
        {"server_metrics": 0.0, "nvml": 0.123457},  # the final read: past the script, instant
    ]
    assert sampler.errors == 0


@pytest.mark.timeout(30)
def test_a_late_wake_up_is_kept_to_the_microsecond() -> None:
    """The loop is held from 0.375 s for 0.2469134 s: the second sample is 0.1219134 s late, kept as
    0.121913."""
    _, _, samples = sampled(0.5, server=ScriptedServer([]), samples=2, hog=(0.375, 2 * NVML_READ_S))
    assert [s.late_s for s in samples] == [0.0, 0.121913, None]  # the final sample: no grid point


@pytest.mark.timeout(30)
def test_a_final_read_that_fails_otherwise_keeps_its_own_error() -> None:
    """Only a final read cut off by stop()'s limit is "no sample within"; one that fails by itself within
    it says its own error, as a read in the loop does."""
    server = ScriptedServer([0.0, RuntimeError("connection reset")])
    sampler, _, [first, final] = sampled(0.5, server=server, samples=1)
    assert first.errors == [] and first.server_running == 0.0
    assert final.errors == ["server_metrics: RuntimeError: connection reset"]
    assert final.nulls == dict.fromkeys(SERVER_FIELDS.values(), "error")
    assert sampler.errors == 1


@pytest.mark.parametrize(("interval", "timeout"), [(0.2, 1.0), (0.5, 1.5), (3.0, 9.0), (60.0, 10.0)])
def test_from_config_bounds_each_server_read_by_three_intervals_from_one_second_to_ten(
    tmp_path: Path, interval: float, timeout: float
) -> None:
    cfg = RunConfig(
        workload=tmp_path / "w.jsonl",
        output=tmp_path / "out",
        backend="vllm",
        model="m",
        telemetry_interval=interval,
    )
    clock = PacedClock()
    sampler = TelemetrySampler.from_config(cfg, clock, EventLog(clock))
    assert sampler.interval == interval
    server = sampler._server
    assert server is not None and server.url == "http://localhost:8000/metrics"
    assert server.setting == "vllm" and sampler._nvml is None  # no --nvml-device: no GPU source
    assert server.timeout == timeout  # at most 10 s: 180 s held a frozen server's run for minutes


@pytest.mark.parametrize(
    ("server_kind", "url", "flavor"),
    [
        ("sglang", "http://localhost:8000/metrics", "sglang"),  # declared: its names, at the endpoint
        (None, None, None),  # an undeclared server: no /metrics assumed
        ("generic", None, None),
    ],
)
def test_metrics_names_and_url_follow_the_declared_server_kind(
    tmp_path: Path, server_kind: str | None, url: str | None, flavor: str | None
) -> None:
    cfg = RunConfig.model_validate(
        {"workload": tmp_path / "w.jsonl", "output": tmp_path / "out", "backend": "openai", "model": "m"}
        | ({} if server_kind is None else {"server_kind": server_kind})
    )
    assert metrics_url(cfg) == url
    assert metrics_flavor(cfg) == (flavor or "auto")
    given = cfg.model_copy(update={"metrics_url": "http://gpu-host:9400/metrics"})
    clock = PacedClock()
    server = TelemetrySampler.from_config(given, clock, EventLog(clock))._server
    assert server is not None and server.url == "http://gpu-host:9400/metrics"
    assert server.setting == (flavor or "auto")  # the declared names, else detected


@pytest.mark.timeout(30)
def test_without_a_source_the_note_names_what_would_request_one(tmp_path: Path) -> None:
    """``--backend vllm --server-kind transformers`` assumes no /metrics (nothing is assumed of a server
    that is neither vLLM nor SGLang): the note must not send the user to the --backend vllm they gave."""
    cfg = RunConfig(
        workload=tmp_path / "w.jsonl",
        output=tmp_path / "out",
        backend="vllm",
        model="m",
        server_kind="transformers",
    )
    assert metrics_url(cfg) is None
    clock = PacedClock()
    sampler = TelemetrySampler.from_config(cfg, clock, EventLog(clock))
    asyncio.run(sampler.probe())
    note = sampler.no_source_note()
    assert note.startswith("no telemetry source requested") and "--metrics-url" in note
    assert "--server-kind vllm|sglang" in note and "--nvml-device" in note
    assert "or --backend vllm;" not in note  # what this run gave, and it did not request one


@pytest.mark.timeout(30)
def test_a_run_stopped_during_the_probe_says_so_not_that_no_source_was_requested() -> None:
    """A stop signal while the server's probe was waiting for its answer (a frozen /metrics holds the probe
    for up to 5 s) left the sampler marked as probed with no source status: summary.json's and run.json's
    telemetry note then said "no telemetry source requested (--metrics-url, …)" to a run that gave
    --metrics-url, and run.json kept its "not probed yet" as if the run were still going."""
    clock = PacedClock(start=START)
    server = ScriptedServer([], probe_s=60.0)  # its answer never comes before the stop

    async def go() -> TelemetrySampler:
        sampler = TelemetrySampler(clock, EventLog(clock), interval=0.2, server=server, gpu_off_loop=False)
        probing = asyncio.create_task(sampler.probe())
        await asyncio.sleep(1.0)  # the probe is waiting on the server
        assert server.probe_limits  # (it did start)
        probing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await probing
        return sampler

    sampler = clock.run(go())
    assert not sampler.probed  # what run.py reads to write the final receipt's telemetry section
    assert sampler.no_source_note() == "not probed: the run stopped during the probe"
    assert sampler.receipt()["note"] == "not probed: the run stopped during the probe"
    assert sampler.receipt()["sources"] == []
