"""How many CPUs this process may use: its affinity mask (``taskset``, a Slurm or Kubernetes cpuset) and
its cgroup's CPU quota (``docker --cpus=2``: cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), whichever is
fewer. ``os.cpu_count()`` is the host's count and says neither; a quota leaves every CPU in the mask but
lets the group run only so many CPU-seconds a second, so two processes per allowed CPU share it."""

from __future__ import annotations

import contextlib
import math
import os
import re
from pathlib import Path

PROC = Path("/proc/self")


def affinity_cpus() -> int | None:
    """CPUs in this process's affinity mask, or ``None`` where the platform has none."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return None


def _unescape(field: str) -> str:
    """A path field of mountinfo, whose spaces, tabs, newlines and backslashes are octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _group_dirs(proc: Path) -> list[tuple[str, Path, Path]]:
    """(version, this process's group directory, its mount point) for the cgroup v2 hierarchy and the v1
    hierarchy holding the ``cpu`` controller, as far as /proc tells them."""
    try:
        paths = proc.joinpath("cgroup").read_text().splitlines()
        mountinfo = proc.joinpath("mountinfo").read_text().splitlines()
    except OSError:
        return []
    own: dict[str, str] = {}  # "v2" or "v1" -> the group's path in its hierarchy
    for line in paths:
        number, controllers, path = [*line.split(":", 2), "", ""][:3]
        if number == "0" and controllers == "":
            own.setdefault("v2", path)
        elif "cpu" in controllers.split(","):
            own.setdefault("v1", path)
    out: list[tuple[str, Path, Path]] = []
    for line in mountinfo:
        fields = line.split()
        if "-" not in fields or len(fields) < 5:
            continue
        after = fields[fields.index("-") + 1 :]
        if after[:1] == ["cgroup2"]:
            version = "v2"
        elif after[:1] == ["cgroup"] and len(after) >= 3 and "cpu" in after[2].split(","):
            version = "v1"
        else:
            continue
        shown = own.get(version)
        if shown is None:
            continue
        root, point = _unescape(fields[3]), Path(_unescape(fields[4]))
        if shown == root or shown.startswith(root.rstrip("/") + "/"):
            out.append((version, point / shown[len(root.rstrip("/")) :].lstrip("/"), point))
            own.pop(version)  # the first mount that shows the group
    return out


def _read(path: Path) -> str | None:
    with contextlib.suppress(OSError, UnicodeDecodeError):
        return path.read_text().strip()
    return None


def _limit(version: str, group: Path) -> float | None:
    """The CPUs one group's quota allows (quota / period), or ``None`` for no quota or none readable."""
    try:
        if version == "v2":
            text = _read(group / "cpu.max")
            if text is None or text.split()[0] == "max":
                return None
            quota, period = (int(x) for x in text.split()[:2])
        else:
            quota_text, period_text = _read(group / "cpu.cfs_quota_us"), _read(group / "cpu.cfs_period_us")
            if quota_text is None or period_text is None:
                return None
            quota, period = int(quota_text), int(period_text)
    except (ValueError, IndexError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def quota_cpus(proc: Path | None = None) -> float | None:
    """The CPUs this process's cgroup quota allows (the tightest of its group and the groups above it,
    up to the mount), or ``None`` without one. ``proc``: /proc/self by default."""
    limits: list[float] = []
    for version, group, point in _group_dirs(proc or PROC):
        current = group
        while True:
            limit = _limit(version, current)
            if limit is not None:
                limits.append(limit)
            if current == point or point not in current.parents:
                break
            current = current.parent
    return min(limits) if limits else None


def usable_cpus(proc: Path | None = None) -> int:
    """CPUs this process may use: its affinity mask's, fewer under a cgroup quota (a quota of 1.5 CPUs is
    2: both may run, for three quarters of the time); the host's count where neither is known."""
    cpus = affinity_cpus() or os.cpu_count() or 1
    quota = quota_cpus(proc)
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return cpus
