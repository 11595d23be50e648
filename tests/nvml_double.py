"""A binding-level double of ``pynvml`` (no GPU on this machine): the calls ``NvmlSource`` makes."""

from __future__ import annotations

import types
from typing import Any


class FakeNVMLError(Exception):
    pass


def fake_pynvml(*, count: int, util_supported: bool) -> types.ModuleType:
    """A stand-in for the ``pynvml`` bindings with the calls NvmlSource makes (no GPU here)."""
    fake = types.ModuleType("pynvml")
    fake.NVMLError = FakeNVMLError  # type: ignore[attr-defined]
    calls: list[str] = []

    def utilization(handle: object) -> Any:
        if not util_supported:
            raise FakeNVMLError("Not Supported")
        return types.SimpleNamespace(gpu=37, memory=12)

    fake.__dict__.update(
        calls=calls,
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: count,
        nvmlDeviceGetHandleByIndex=lambda i: ("handle", i),
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetUUID=lambda h: "GPU-1234",
        nvmlSystemGetDriverVersion=lambda: "550.54",
        nvmlDeviceGetUtilizationRates=utilization,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=10 * 2**30, total=80 * 2**30, free=0),
    )
    return fake
