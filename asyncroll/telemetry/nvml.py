"""GPU utilisation and memory through NVML (``nvidia-ml-py``, the ``telemetry`` extra).

``--nvml-device`` is NVML's *physical* index on the client's host, the order ``nvidia-smi`` lists; it
ignores ``CUDA_VISIBLE_DEVICES``, which renumbers devices only inside a CUDA process. The package is
imported lazily (``asyncroll --help`` must stay fast, and most hosts running the client have no GPU).

Without the package, without a driver, or with an index NVML does not know, the source is
*unavailable* with that reason, before the measurement clock starts; the run goes on without it.
A reading that NVML refuses (``NotSupported`` on a MIG slice, a GPU that fell off the bus) is ``null``
with its error, never zero.

Utilisation is NVML's ``utilization.gpu``: the percentage of the driver's last sample period (1/6 s
to 1 s, by GPU) during which at least one kernel ran. It says nothing about how full the GPU was.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

EXTRA_HINT = "pip install 'asyncroll[telemetry]'"


class NvmlUnavailable(Exception):
    """NVML cannot be used on this host for this device; the message says why."""


@dataclass(slots=True)
class GpuSample:
    """What one NVML read contributes to a ``resource_sample``."""

    util_pct: float | None = None
    mem_util_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    nulls: dict[str, str] = field(default_factory=dict)
    error: str | None = None


def _text(value: Any) -> str:
    """NVML strings are bytes in old bindings and str in new ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlSource:
    """One physical GPU, read through NVML. ``probe`` first; ``read`` many times; ``close`` once."""

    name = "nvml"

    def __init__(self, index: int) -> None:
        self.index = index
        self._nvml: ModuleType | None = None
        self._handle: Any = None

    def probe(self) -> dict[str, Any]:
        """Initialise NVML and open the device. Raises :class:`NvmlUnavailable` with the reason."""
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlUnavailable(
                f"the nvidia-ml-py package (module pynvml) is not installed: {EXTRA_HINT}"
            ) from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(
                f"NVML could not initialise ({_text(exc)}): is an NVIDIA driver installed on this host?"
            ) from exc
        try:
            count = pynvml.nvmlDeviceGetCount()
            if self.index >= count:
                raise NvmlUnavailable(
                    f"--nvml-device {self.index}: NVML sees {count} device(s), physical indices "
                    f"0..{count - 1} (CUDA_VISIBLE_DEVICES does not renumber them)"
                )
            handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            detail: dict[str, Any] = {
                "index": self.index,
                "name": _text(pynvml.nvmlDeviceGetName(handle)),
                "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
                "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
            }
        except pynvml.NVMLError as exc:
            pynvml.nvmlShutdown()
            raise NvmlUnavailable(f"--nvml-device {self.index}: {_text(exc)}") from exc
        except NvmlUnavailable:
            pynvml.nvmlShutdown()
            raise
        self._nvml, self._handle = pynvml, handle
        first = self.read()
        if first.nulls:
            detail["unsupported_at_probe"] = sorted(first.nulls)
        return detail

    def read(self) -> GpuSample:
        """Utilisation and memory now. NVML calls take microseconds; they run on the event loop."""
        nvml, handle = self._nvml, self._handle
        assert nvml is not None, "read() before a successful probe()"
        sample = GpuSample()
        errors: list[str] = []
        try:
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            sample.util_pct, sample.mem_util_pct = float(rates.gpu), float(rates.memory)
        except nvml.NVMLError as exc:
            sample.nulls.update(gpu_util_pct="invalid", gpu_mem_util_pct="invalid")
            errors.append(f"utilisation: {_text(exc)}")
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            sample.mem_used_bytes, sample.mem_total_bytes = int(memory.used), int(memory.total)
        except nvml.NVMLError as exc:
            sample.nulls.update(gpu_mem_used_bytes="invalid", gpu_mem_total_bytes="invalid")
            errors.append(f"memory: {_text(exc)}")
        if errors:
            sample.error = "; ".join(errors)
        return sample

    def close(self) -> None:
        """Shut NVML down once (idempotent)."""
        nvml, self._nvml = self._nvml, None
        if nvml is not None:
            # The driver may have gone away under us: then there is nothing left to release.
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()
