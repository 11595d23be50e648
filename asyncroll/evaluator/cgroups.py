"""Per-test cgroup-v1 ``memory`` and ``pids`` groups: aggregate caps that bind every uid, root included.

Rlimits are per process (``RLIMIT_AS``) or per uid (``RLIMIT_NPROC``) and root ignores them; a cgroup
caps the sum over every process placed in it, whatever its uid, and lists every member even after it
called ``setsid`` or was re-parented. That makes it both a limit and a reliable kill list.

Each test gets a fresh group named ``asyncroll-<worker pid>-<n>``, created *under the worker's own
cgroup* of each controller (so the machine's own limits on the worker still apply), joined by the
sandboxed process before it execs, emptied and removed after the test. Groups left behind by a dead
worker are removed the next time a :class:`CgroupFactory` starts; those of a dead worker whose pid
is alive again (reused) stay, and a worker with that pid skips their names (:func:`fresh_name`).

This module is cgroup v1. On a host with neither a v1 ``memory`` nor a v1 ``pids`` hierarchy (a pure
cgroup-v2 host), :mod:`~.cgroups_v2` provides the same groups on the unified hierarchy, with a
:class:`TestGroup` of its own behind the same interface.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PREFIX = "asyncroll-"
_COUNTER = itertools.count(1)  # process-wide: two factories in one process never share a name


class CgroupError(OSError):
    """A cgroup could not be created, configured, emptied or removed; the message names the path."""


def _v1_mounts() -> dict[str, Path]:
    """Controller name → mount point of every cgroup-v1 hierarchy (from /proc/self/mounts)."""
    out: dict[str, Path] = {}
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "cgroup":
            for option in parts[3].split(","):
                out.setdefault(option, Path(parts[1]))
    return out


def _own_paths() -> dict[str, str]:
    """Controller name → this process's cgroup path in that v1 hierarchy (from /proc/self/cgroup)."""
    out: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            if controller:
                out[controller] = path
    return out


def controller_root(controller: str) -> Path | None:
    """The directory under which this process may create child groups of ``controller``, or ``None``
    when there is no cgroup-v1 hierarchy for it."""
    mount = _v1_mounts().get(controller)
    own = _own_paths().get(controller)
    if mount is None or own is None:
        return None
    return mount / own.lstrip("/")


@dataclass(frozen=True, slots=True)
class TestGroup:
    """The groups one test's processes live in (one directory per controller)."""

    dirs: tuple[Path, ...]

    @property
    def join_files(self) -> tuple[str, ...]:
        """The ``cgroup.procs`` files a process writes its pid into to join every group."""
        return tuple(str(d / "cgroup.procs") for d in self.dirs)

    def members(self) -> set[int]:
        """Pids of every process in any of the groups (threads are listed under their process)."""
        pids: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(FileNotFoundError):
                pids.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        return pids

    def memory_limit_hit(self) -> bool:
        """True when the memory group refused an allocation (``memory.failcnt`` > 0) or its out-of-memory
        killer killed a member (``oom_kill`` in ``memory.oom_control``, Linux 4.13+): some kernels leave
        the fail count at 0 while the killer fires."""
        for d in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                failcnt = d / "memory.failcnt"
                if failcnt.exists() and int(failcnt.read_text()) > 0:
                    return True
            with contextlib.suppress(OSError, ValueError):
                control = d / "memory.oom_control"
                if control.exists():
                    fields = dict(line.split() for line in control.read_text().splitlines() if line.strip())
                    if int(fields.get("oom_kill", "0")) > 0:
                        return True
        return False

    def kill_all(self, deadline: float) -> None:
        """SIGKILL every member until the groups are empty; raise :class:`CgroupError` past ``deadline``.

        A member may fork between the read and the kill; the ``pids`` limit bounds how often that can
        happen, and the loop reads the list again until nothing is left.
        """
        while True:
            members = self.members()
            if not members:
                return
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise CgroupError(f"processes {sorted(members)} survived SIGKILL in {self.dirs[0]}")
            time.sleep(0.001)

    def remove(self, deadline: float) -> None:
        """Remove the (empty) groups, retrying while the kernel finishes tearing members down."""
        for d in self.dirs:
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise CgroupError(f"could not remove {d}: {exc}") from exc
                    time.sleep(0.001)


def fresh_name(roots: list[Path]) -> str:
    """A test group name of this process's (``asyncroll-<pid>-<n>``) that none of ``roots`` holds yet.
    The counter never repeats a name in one process, so one that exists was left by a dead process that
    had this pid (a run killed outright; pids are reused): kept by the clean-up (the pid is alive) and
    skipped here, never taken over."""
    while True:
        name = f"{PREFIX}{os.getpid()}-{next(_COUNTER)}"
        if not any((root / name).exists() for root in roots):
            return name


class CgroupFactory:
    """Creates one :class:`TestGroup` per test under the worker's own ``memory`` and ``pids`` groups."""

    def __init__(self, memory_root: Path | None, pids_root: Path | None) -> None:
        self.memory_root = memory_root
        self.pids_root = pids_root
        for root in self._roots():
            _remove_stale(root)

    def _roots(self) -> Iterator[Path]:
        yield from (r for r in (self.memory_root, self.pids_root) if r is not None)

    def create(self, memory_bytes: int, max_pids: int) -> TestGroup:
        """A fresh group per controller with its limit written; raises :class:`CgroupError`."""
        name = fresh_name(list(self._roots()))
        made: list[Path] = []
        try:
            if self.memory_root is not None:
                d = self.memory_root / name
                d.mkdir()
                made.append(d)
                (d / "memory.limit_in_bytes").write_text(str(memory_bytes))
                # Without swap accounting the limit could be met by swapping; cap memory+swap too.
                with contextlib.suppress(OSError):
                    (d / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
            if self.pids_root is not None:
                d = self.pids_root / name
                d.mkdir()
                made.append(d)
                (d / "pids.max").write_text(str(max_pids))
        except OSError as exc:
            for d in made:
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise CgroupError(f"could not set up cgroup {name}: {exc}") from exc
        return TestGroup(tuple(made))


def v1_roots() -> list[Path]:
    """The v1 ``memory`` and ``pids`` directories this process's test groups live under (none on a
    pure cgroup-v2 host)."""
    return [r for r in (controller_root(c) for c in ("memory", "pids")) if r is not None]


def remove_stale_groups(roots: list[Path] | None = None, wait_s: float = 2.0) -> None:
    """Remove the groups dead workers of this process left in ``roots`` (default: under its own v1
    ``memory`` and ``pids`` groups; a worker's groups live under its cgroup, which it inherits from the
    runtime). A group still busy (the kernel is reaping a killed program) is retried for up to
    ``wait_s``."""
    roots = v1_roots() if roots is None else roots
    deadline = time.monotonic() + wait_s
    while sum(_remove_stale(root) for root in roots) and time.monotonic() < deadline:
        time.sleep(0.01)


def _remove_stale(root: Path) -> int:
    """Remove empty groups a dead worker left behind (name ``asyncroll-<pid>-<n>``, pid not running);
    returns how many could not be removed yet (still busy). One this user may not remove (another
    user's, root's say) is left alone, not waited for."""
    left = 0
    with contextlib.suppress(OSError):
        for d in root.iterdir():
            if not d.name.startswith(PREFIX) or not d.is_dir():
                continue
            owner = d.name[len(PREFIX) :].split("-", 1)[0]
            if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                try:
                    d.rmdir()
                except OSError as exc:
                    if exc.errno == errno.EBUSY:  # its last process is still being torn down
                        left += 1
    return left
