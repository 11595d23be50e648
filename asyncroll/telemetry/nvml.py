"""GPU utilisation and memory through NVML (``nvidia-ml-py``, the ``telemetry`` extra).

``--nvml-device`` is NVML's *physical* index on the client's host, the order ``nvidia-smi`` lists; it
ignores ``CUDA_VISIBLE_DEVICES``, which renumbers devices only inside a CUDA process. The package is
imported lazily (``asyncroll --help`` must stay fast, and most hosts running the client have no GPU).

Without the package, without a driver, or with an index NVML does not know, the source is
*unavailable* with that reason, before the measurement clock starts; the run goes on without it.
A reading that NVML refuses (``NotSupported`` on a MIG slice, a GPU that fell off the bus) is ``null``
with its error, never zero.

A run reads NVML off its event loop (:meth:`NvmlSource.read_off_loop`): NVML calls take microseconds,
but on a GPU that fell off the bus they can block for minutes, as ``nvidia-smi`` does, and a read on the
loop held the whole run (its requests, its timers, its Ctrl-C) for as long.

Utilisation is NVML's ``utilization.gpu``: the percentage of the driver's last sample period (1/6 s
to 1 s, by GPU) during which at least one kernel ran. It says nothing about how full the GPU was.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

_T = TypeVar("_T")

EXTRA_HINT = "pip install 'asyncroll[telemetry]'"
#: The longest a sample waits for an NVML read before giving it up.
READ_LIMIT_S = 2.0
#: The longest the probe waits for NVML (its init, the device's first read) before giving the source up:
#: an init takes seconds on a host of many GPUs without the persistence daemon, minutes when one hangs.
PROBE_LIMIT_S = 30.0


class NvmlUnavailable(Exception):
    """NVML cannot be used on this host for this device; the message says why."""


class NvmlStuck(Exception):
    """An NVML read did not return in time (or an earlier one still has not); the message says which."""


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
        self._pending: concurrent.futures.Future[Any] | None = None  # the probe or read off the loop
        self._pending_since = 0.0

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

    async def probe_off_loop(self, limit: float | None = None) -> dict[str, Any]:
        """:meth:`probe` in a daemon thread of its own, waited for at most ``limit`` s (default
        :data:`PROBE_LIMIT_S`): NVML's first calls hang on a GPU that fell off the bus as its reads do.
        Given up, the source is :class:`NvmlUnavailable` and never shut down (:meth:`close`) while the
        probe is stuck; should it return later, NVML is left to the process's exit."""
        limit = PROBE_LIMIT_S if limit is None else limit
        try:
            async with asyncio.timeout(limit):
                return await asyncio.wrap_future(self._off_loop(self.probe))
        except TimeoutError:
            raise NvmlUnavailable(
                f"NVML did not answer within {limit:g} s (its init or the device's first read hung)"
            ) from None

    def _off_loop(self, call: Callable[[], _T]) -> concurrent.futures.Future[_T]:
        """``call()`` in a daemon thread of its own, begun now: the pending call (one at a time)."""
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()

        def work() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except BaseException as exc:  # noqa: BLE001 - handed to the awaiting caller
                    future.set_exception(exc)

        self._pending, self._pending_since = future, time.monotonic()
        threading.Thread(target=work, name="asyncroll-nvml-read", daemon=True).start()
        return future

    async def read_off_loop(self, limit: float | None = None) -> GpuSample:
        """:meth:`read` in a daemon thread of its own, waited for at most ``limit`` s (default
        :data:`READ_LIMIT_S`): a hung NVML call
        holds neither the event loop nor the interpreter's exit (a pool's worker thread would be joined
        at exit). One read at a time: while one has not returned, the next raises :class:`NvmlStuck` at
        once instead of starting another thread that would hang as well."""
        pending = self._pending
        if pending is not None and not pending.done():
            waited = time.monotonic() - self._pending_since
            raise NvmlStuck(f"the read begun {waited:.1f} s ago has still not returned; not read again")
        future = self._off_loop(self.read)
        limit = READ_LIMIT_S if limit is None else limit
        try:
            async with asyncio.timeout(limit):
                return await asyncio.wrap_future(future)
        except TimeoutError:
            raise NvmlStuck(f"no reading within {limit:g} s: NVML did not return") from None

    def read(self) -> GpuSample:
        """Utilisation and memory now (blocking: NVML calls take microseconds, but may hang)."""
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
        """Shut NVML down once (idempotent); not while a read is stuck in it (the shutdown would wait on
        the same driver: NVML is left to the process's exit)."""
        nvml, self._nvml = self._nvml, None
        if nvml is not None and (self._pending is None or self._pending.done()):
            # The driver may have gone away under us: then there is nothing left to release.
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()
