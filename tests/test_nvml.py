"""The NVML source: unavailable here with its reason, the extra named without the package, and the
bindings' calls against a binding-level double (no GPU on this machine)."""

from __future__ import annotations

import sys
import threading
import types
from pathlib import Path

import pytest

from asyncroll.events import ResourceProbe, ResourceSample
from asyncroll.telemetry import nvml as nvml_module
from asyncroll.telemetry.nvml import NvmlSource, NvmlUnavailable
from tests.conftest import tool_problem
from tests.metrics_loopback import real_clock_run
from tests.nvml_double import FakeNVMLError, fake_pynvml


@pytest.mark.timeout(60)
def test_nvml_unavailable_on_this_machine_is_reported_with_its_reason(tmp_path: Path) -> None:
    """No NVIDIA driver here (the GPU path itself can only be checked on a GPU host)."""
    outcome, capture, summary = real_clock_run(
        tmp_path, [tool_problem("p1", model_ms=5, cpu_ms=5)], nvml_device=0
    )
    assert outcome.status == "complete"
    [status] = capture.of(ResourceProbe)[0].sources
    assert status.source == "nvml" and not status.available
    assert status.reason is not None and (
        "NVML could not initialise" in status.reason or "nvidia-ml-py" in status.reason
    )
    assert capture.of(ResourceSample) == []
    assert summary["resources"]["cpu_idle_candidate_s"] is None
    assert summary["telemetry"]["sources"]["nvml"]["reason"] == status.reason


def test_nvml_without_the_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(NvmlUnavailable, match=r"asyncroll\[telemetry\]"):
        NvmlSource(0).probe()


def test_nvml_without_a_driver_says_so() -> None:
    pytest.importorskip("pynvml")
    with pytest.raises(NvmlUnavailable, match="NVML could not initialise"):
        NvmlSource(0).probe()


def test_nvml_reads_through_the_bindings_and_nulls_what_the_device_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The calls and the handling of their answers, against a binding-level double: the values reach the
    sample, an unsupported reading is null with its error, an unknown index is refused. (On a real GPU
    this code calls the same functions of nvidia-ml-py; that path is not exercised on this machine.)"""
    fake = fake_pynvml(count=2, util_supported=True)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    source = NvmlSource(1)
    detail = source.probe()
    assert detail == {"index": 1, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-1234", "driver": "550.54"}
    sample = source.read()
    assert (sample.util_pct, sample.mem_util_pct, sample.mem_used_bytes) == (37.0, 12.0, 10 * 2**30)
    assert sample.nulls == {} and sample.error is None
    source.close()
    source.close()
    assert fake.calls == ["init", "shutdown"]

    with pytest.raises(NvmlUnavailable, match=r"NVML sees 2 device\(s\), physical indices 0\.\.1 \("):
        NvmlSource(2).probe()

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(count=1, util_supported=False))
    mig = NvmlSource(0)
    assert mig.probe()["unsupported_at_probe"] == ["gpu_mem_util_pct", "gpu_util_pct"]
    sample = mig.read()
    assert sample.util_pct is None and sample.nulls["gpu_util_pct"] == "invalid"
    assert sample.mem_total_bytes == 80 * 2**30 and "Not Supported" in (sample.error or "")
    assert nvml_module.EXTRA_HINT in str(NvmlUnavailable(nvml_module.EXTRA_HINT))


@pytest.mark.timeout(60)
def test_a_hung_nvml_read_holds_neither_the_run_nor_its_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU that fell off the bus can block NVML calls for minutes (nvidia-smi hangs with it). The first
    read after the probe hangs 2 s here: it is given up after the read limit, the samples while it hangs
    say so without starting another read, and once it has returned the GPU is read again. Read on the
    event loop, it held the whole run for those 2 s (a loop stall of ~2 s)."""
    from asyncroll.events import LoopStalled

    fake = fake_pynvml(count=1, util_supported=True)
    reads, released = [0], threading.Event()

    def utilization(handle: object) -> object:
        reads[0] += 1
        if reads[0] == 2:  # the first read after the probe's own
            released.wait(2.0)
        return types.SimpleNamespace(gpu=37, memory=12)

    fake.nvmlDeviceGetUtilizationRates = utilization  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(nvml_module, "READ_LIMIT_S", 0.3)
    try:
        outcome, capture, _ = real_clock_run(
            tmp_path,
            [tool_problem("p1", model_ms=1500, cpu_ms=5)],
            nvml_device=0,
            telemetry_interval=0.1,
        )
    finally:
        released.set()
    assert outcome.status == "complete"
    assert [e.late_s for e in capture.of(LoopStalled) if e.late_s >= 1.0] == []
    samples = capture.of(ResourceSample)
    first = samples[0]
    assert first.errors == ["nvml: no reading within 0.3 s: NVML did not return"]
    assert first.gpu_util_pct is None and set(first.nulls.values()) == {"error"}
    stuck = [s for s in samples if any("has still not returned; not read again" in e for e in s.errors)]
    assert stuck, [s.errors for s in samples]
    assert samples[-1].errors == [] and samples[-1].gpu_util_pct == 37.0  # read again once it returned
    assert reads[0] == 2 + len(samples) - 1 - len(stuck)  # no read started while one hung


@pytest.mark.timeout(60)
def test_a_hung_nvml_probe_is_given_up_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML's first calls (nvmlInit, the device's name) hang on a GPU that fell off the bus as its reads
    do. The probe runs off the loop too: given up after its limit, the source unavailable with the reason,
    never shut down while its init is stuck, and the run goes on. On the loop, it held the run's start (and
    its Ctrl-C) until NVML returned, then sampled a GPU that hung every read."""
    fake = fake_pynvml(count=1, util_supported=True)
    released = threading.Event()
    calls: list[str] = fake.calls  # type: ignore[attr-defined]

    def init() -> None:
        calls.append("init")
        released.wait(3.0)

    fake.nvmlInit = init  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(nvml_module, "PROBE_LIMIT_S", 0.3, raising=False)
    try:
        outcome, capture, _ = real_clock_run(
            tmp_path, [tool_problem("p1", model_ms=5, cpu_ms=5)], nvml_device=0, telemetry_interval=0.1
        )
        shut_down_while_stuck = "shutdown" in calls
    finally:
        released.set()
    assert outcome.status == "complete"
    [status] = capture.of(ResourceProbe)[0].sources
    assert status.source == "nvml" and not status.available, status
    assert status.reason == "NVML did not answer within 0.3 s (its init or the device's first read hung)"
    assert status.collection_s < 2.0
    assert capture.of(ResourceSample) == []
    assert not shut_down_while_stuck


@pytest.mark.timeout(30)
def test_nvml_is_not_shut_down_under_a_read_still_stuck_in_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """close() after a read was given up leaves NVML to the process's exit while that read hangs (the
    shutdown would hang on the same driver), and shuts it down once no read is pending."""
    import asyncio

    from asyncroll.telemetry.nvml import NvmlStuck

    fake = fake_pynvml(count=1, util_supported=True)
    calls: list[str] = fake.calls  # type: ignore[attr-defined]
    hang, returned = threading.Event(), threading.Event()

    def utilization(handle: object) -> object:
        if hang.is_set():
            returned.wait(10.0)
        return types.SimpleNamespace(gpu=37, memory=12)

    fake.nvmlDeviceGetUtilizationRates = utilization  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    stuck, fine = NvmlSource(0), NvmlSource(0)
    stuck.probe()
    fine.probe()
    assert asyncio.run(fine.read_off_loop(limit=5.0)).util_pct == 37.0
    hang.set()
    try:
        with pytest.raises(NvmlStuck, match=r"no reading within 0\.1 s"):
            asyncio.run(stuck.read_off_loop(limit=0.1))
        stuck.close()
        assert calls.count("shutdown") == 0
    finally:
        returned.set()
    fine.close()
    fine.close()  # once
    assert calls.count("shutdown") == 1


def test_a_refused_probe_shuts_nvml_down_and_every_read_error_is_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A probe that fails after NVML initialised (an unknown index, a device call that errs) shuts it down
    again; a read whose every call fails says each error."""
    fake = fake_pynvml(count=1, util_supported=False)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with pytest.raises(NvmlUnavailable, match="NVML sees 1 device"):
        NvmlSource(1).probe()
    assert fake.calls == ["init", "shutdown"]

    def gone(*_: object) -> object:
        raise FakeNVMLError("GPU is lost")

    fake.__dict__.update(nvmlDeviceGetName=gone)
    with pytest.raises(NvmlUnavailable, match="--nvml-device 0: GPU is lost"):
        NvmlSource(0).probe()
    assert fake.calls == ["init", "shutdown"] * 2

    fake.__dict__.update(nvmlDeviceGetName=lambda h: "GPU")
    source = NvmlSource(0)
    source.probe()
    fake.__dict__.update(nvmlDeviceGetMemoryInfo=gone)
    sample = source.read()
    assert sample.error == "utilisation: Not Supported; memory: GPU is lost"


@pytest.mark.timeout(20)
def test_a_read_off_the_loop_keeps_its_limit_its_error_and_a_stuck_nvml(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``read_off_loop``: its ``limit`` is the wait (not the default's); an error of the read itself is
    raised as it is, not as a read that never returned; a hung read runs in a daemon thread (the exit does
    not wait for it), and ``close`` leaves NVML to the exit while it is stuck."""
    import asyncio

    fake = fake_pynvml(count=1, util_supported=True)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(nvml_module, "READ_LIMIT_S", 30.0)
    source = NvmlSource(0)
    source.probe()

    def broken(handle: object) -> object:
        raise RuntimeError("bindings broke")

    fake.__dict__.update(nvmlDeviceGetUtilizationRates=broken)
    with pytest.raises(RuntimeError, match="bindings broke"):
        asyncio.run(source.read_off_loop())

    release, arrived = threading.Event(), threading.Event()
    hung: list[threading.Thread] = []

    def hang(handle: object) -> object:
        hung.append(threading.current_thread())
        arrived.set()
        release.wait(10)
        return types.SimpleNamespace(gpu=1, memory=1)

    fake.__dict__.update(nvmlDeviceGetUtilizationRates=hang)
    try:
        with pytest.raises(nvml_module.NvmlStuck, match=r"no reading within 0\.05 s"):
            asyncio.run(source.read_off_loop(0.05))
        # on a loaded machine the read's thread may reach NVML only after the 0.05 s ran out
        assert arrived.wait(10)
        assert [t.daemon for t in hung] == [True]
        source.close()
        assert fake.calls == ["init"]  # no shutdown while the read is stuck in NVML
    finally:
        release.set()


def test_stop_waits_for_a_gpu_read_off_the_loop_as_long_as_it_may_take(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sample reads the GPU off the loop for up to READ_LIMIT_S: stop() waits that long (and its
    margin) before it calls the sampling loop stuck; without the GPU (or reading it on the loop) only the
    margin."""
    import asyncio

    from asyncroll.clock import SystemClock
    from asyncroll.event_log import EventLog
    from asyncroll.telemetry.sampler import STOP_MARGIN_S, TelemetrySampler

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(count=1, util_supported=True))
    clock = SystemClock()

    async def limits() -> list[float]:
        found = []
        for off_loop in (True, False):
            sampler = TelemetrySampler(
                clock, EventLog(clock), interval=1.0, nvml=NvmlSource(0), gpu_off_loop=off_loop
            )
            await sampler.probe()
            found.append(sampler.stop_limit_s)
            await sampler.aclose()
        return found

    assert asyncio.run(limits()) == [nvml_module.READ_LIMIT_S + STOP_MARGIN_S, STOP_MARGIN_S]
