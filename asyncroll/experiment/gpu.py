"""The declared GPU's identity and idleness, checked before every arm (NVML first, ``nvidia-smi`` second).

An arm that shares its GPU with a leftover server or another job measures the wrong thing. A declared GPU
that is unreadable or not the declared model fails the arm (kept and reported, not retried); one that
stays busy (:class:`GpuBusyError`) is not the arm's failure: the arm is not run, the experiment stops,
and ``--resume`` runs it once the GPU is idle.
Without a declared GPU nothing is read and the receipt says so. A quantity the GPU does not report
(utilisation on a MIG-partitioned GPU: NVML's ``NotSupported``, nvidia-smi's ``[N/A]``) is missing, its
check is skipped, and the receipt names what was not checked.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from typing import Any

from asyncroll.experiment.config import GpuSpec


class GpuCheckError(RuntimeError):
    """The declared GPU cannot be read, is not the declared one, or is not idle."""


class GpuBusyError(GpuCheckError):
    """The declared GPU stayed busy for ``idle_wait_s`` (another job holds it): nothing was measured."""


def _read_nvml(index: int) -> dict[str, Any]:
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        try:
            utilization: float | None = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except pynvml.NVMLError as exc:
            if exc.value != pynvml.NVML_ERROR_NOT_SUPPORTED:
                raise
            utilization = None  # e.g. a MIG-partitioned GPU
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        return {
            "source": "nvml",
            "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
            "name": _text(name),
            "uuid": _text(uuid),
            "memory_used_mib": mem.used / 2**20,
            "memory_total_mib": mem.total / 2**20,
            "utilization_pct": utilization,
            "compute_pids": [int(p.pid) for p in procs],
        }
    finally:
        pynvml.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _reported(text: str) -> float | None:
    """An nvidia-smi number; ``[N/A]`` / ``[Not Supported]`` (a quantity this GPU does not report) is
    missing, anything else unreadable is an error."""
    if text.startswith("[") and text.endswith("]"):
        return None
    return float(text)


def _read_smi(index: int) -> dict[str, Any]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise GpuCheckError("nvidia-smi not found")
    fields = "name,uuid,memory.used,memory.total,utilization.gpu,driver_version"
    out = subprocess.run(
        [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-i", str(index)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if out.returncode != 0:
        raise GpuCheckError(f"nvidia-smi exited {out.returncode}: {out.stderr.strip()[:300]}")
    name, uuid, used, total, util, driver = (v.strip() for v in out.stdout.strip().split(","))
    apps = subprocess.run(
        [exe, "--query-compute-apps=pid", "--format=csv,noheader", "-i", str(index)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    pids = [int(p) for p in apps.stdout.split() if p.strip().isdigit()]
    return {
        "source": "nvidia-smi",
        "driver": driver,
        "name": name,
        "uuid": uuid,
        "memory_used_mib": _reported(used),
        "memory_total_mib": _reported(total),
        "utilization_pct": _reported(util),
        "compute_pids": pids,
    }


def read_gpu(index: int) -> dict[str, Any]:
    """Read the GPU through NVML, falling back to nvidia-smi; GpuCheckError naming both failures."""
    errors = []
    try:
        return _read_nvml(index)
    except Exception as exc:  # noqa: BLE001 - pynvml raises its own NVMLError tree (or ImportError)
        errors.append(f"NVML: {type(exc).__name__}: {exc}")
    try:
        return _read_smi(index)
    except (GpuCheckError, OSError, ValueError, subprocess.SubprocessError) as exc:
        errors.append(f"nvidia-smi: {exc}")
    raise GpuCheckError(f"GPU {index} declared but unreadable ({'; '.join(errors)})")


def check_gpu(spec: GpuSpec | None) -> dict[str, Any]:
    """The receipt's ``gpu`` record; raises GpuCheckError when a declared GPU is wrong or stays busy.

    A busy GPU is polled for up to ``idle_wait_s`` (a stopped server's memory can take a moment to be
    released); a wrong identity or an unreadable GPU fails at once.
    """
    if spec is None:
        return {
            "declared": False,
            "checked": False,
            "note": "no GPU declared; identity and idleness not checked",
        }
    deadline = time.monotonic() + spec.idle_wait_s
    while True:
        reading = read_gpu(spec.index)
        wrong = []
        if spec.name_contains and spec.name_contains.lower() not in reading["name"].lower():
            wrong.append(f"name {reading['name']!r} does not contain {spec.name_contains!r}")
        if spec.uuid and spec.uuid != reading["uuid"]:
            wrong.append(f"uuid {reading['uuid']} is not the declared {spec.uuid}")
        if wrong:
            raise GpuCheckError(f"GPU {spec.index}: " + "; ".join(wrong))
        busy, unchecked = [], []
        used, utilization = reading["memory_used_mib"], reading["utilization_pct"]
        if used is None:
            unchecked.append("memory in use (not reported by this GPU)")
        elif used > spec.max_memory_used_mib:
            busy.append(f"{used:.0f} MiB in use (> {spec.max_memory_used_mib:g} MiB)")
        if utilization is None:
            unchecked.append("utilisation (not reported by this GPU)")
        elif utilization > spec.max_utilization_pct:
            busy.append(f"utilisation {utilization:g}% (> {spec.max_utilization_pct:g}%)")
        if reading["compute_pids"]:
            busy.append(f"compute processes already running: {reading['compute_pids']}")
        if not busy:
            return {
                "declared": True,
                "checked": True,
                "index": spec.index,
                **reading,
                "not_checked": unchecked,
            }
        if time.monotonic() >= deadline:
            raise GpuBusyError(f"GPU {spec.index} not idle after {spec.idle_wait_s:g}s: " + "; ".join(busy))
        time.sleep(1.0)
