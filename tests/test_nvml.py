"""The NVML source: unavailable here with its reason, the extra named without the package, and the
bindings' calls against a binding-level double (no GPU on this machine)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from asyncroll.events import ResourceProbe, ResourceSample
from asyncroll.telemetry import nvml as nvml_module
from asyncroll.telemetry.nvml import NvmlSource, NvmlUnavailable
from tests.conftest import tool_problem
from tests.metrics_loopback import real_clock_run
from tests.nvml_double import fake_pynvml


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
