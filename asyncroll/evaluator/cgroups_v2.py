"""Per-test cgroup-v2 groups: the same ``memory`` + ``pids`` caps and kill list as :mod:`~.cgroups`,
on the unified hierarchy, for hosts with no cgroup-v1 ``memory``/``pids`` hierarchy.

**Placement.** cgroup v2 lets a non-root group hand a controller to its children (write it to
``cgroup.subtree_control``) only while the group has no processes of its own (the "no internal
process" rule; the root group is exempt). A process cannot put per-test groups with limits directly
under the group it runs in, so the first asyncroll process in a group ``D`` (its *domain*: the group it
was started in) prepares it once (:func:`prepare`):

1. ``D/cgroup.controllers`` must list ``memory``/``pids`` (else :class:`ControllerUnavailable`: the
   controller is bound to a v1 hierarchy, or was not delegated to ``D``);
2. it creates the leaf ``D/asyncroll-<pid>`` and moves itself into it;
3. if any other process is still in ``D`` (``D`` is not the root group), it moves itself back, removes
   the leaf and raises :class:`SubtreeNotUsable` naming them: a shell's session scope is shared, so run
   asyncroll in a group of its own (on systemd, ``systemd-run --scope -p Delegate=yes -- asyncroll ...``
   or a service with ``Delegate=yes``); a read-only or not delegated ``D`` raises it too;
4. it enables the controllers in ``D/cgroup.subtree_control``. They stay enabled (other asyncroll
   processes of the run rely on them); the kernel then refuses to place any process directly in ``D``.

Processes it starts later (the tool workers) begin life in its leaf: a process whose group is an
``asyncroll-<pid>`` leaf takes that leaf's parent as its domain and moves nowhere. ``asyncroll run``
probes isolation (so prepares) before it starts any worker; ``asyncroll experiment run`` prepares
before it starts any arm (:func:`prepare_for_children`), its clients being asyncroll processes too.

**Per test** (:class:`CgroupV2Factory`): a fresh ``D/asyncroll-<pid>-<n>``, a sibling of the leaves,
with ``memory.max`` (the test's cap), ``memory.swap.max`` = 0 and ``pids.max``; the sandboxed process
joins it by writing ``cgroup.procs`` before it execs, like v1. ``memory.swap.max`` is a limit on swap
alone (v1's ``memory.memsw.limit_in_bytes`` capped memory *plus* swap), so 0 is what keeps the total at
the cap: the same cap as on v1, never twice it. :class:`TestGroupV2` kills with ``cgroup.kill``
(Linux 5.14+; the SIGKILL loop of v1 before that), reads a memory-limit hit from ``memory.events``
(``max``, ``oom``, ``oom_kill``) and is removed with ``rmdir``. Empty leaves and groups of dead asyncroll
processes are removed as on v1 (same names, same rule).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from asyncroll.evaluator.cgroups import (
    PREFIX,
    CgroupError,
    TestGroup,
    _remove_stale,
    fresh_name,
    v1_roots,
)

CONTROLLERS = ("memory", "pids")
LEAF = re.compile(rf"{PREFIX}\d+")  # a process leaf; a per-test group is asyncroll-<pid>-<n>


class ControllerUnavailable(CgroupError):
    """None of the wanted controllers is listed in the domain's ``cgroup.controllers``."""


class SubtreeNotUsable(CgroupError):
    """The domain cannot hold per-test groups: read-only, not delegated, or shared with other processes."""


def _unescape(field: str) -> str:
    """A path field of /proc/self/mountinfo, whose spaces, tabs, newlines and backslashes are octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounts() -> list[tuple[Path, str]]:
    """Every cgroup2 mount: (mount point, the hierarchy path it shows), from /proc/self/mountinfo."""
    out: list[tuple[Path, str]] = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        if len(fields) > dash + 1 and fields[dash + 1] == "cgroup2" and len(fields) > 4:
            out.append((Path(_unescape(fields[4])), _unescape(fields[3])))
    return out


def own_path(pid: int | str = "self") -> str | None:
    """This process's path in the v2 hierarchy (the ``0::/path`` line of /proc/<pid>/cgroup)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:]
    return None


def own_group(mount: Path | None = None) -> Path | None:
    """The directory of this process's own v2 group under ``mount`` (by default the first cgroup2
    mount that shows it), or ``None`` without a cgroup2 mount."""
    path = own_path()
    if path is None:
        return None
    for point, root in mounts() if mount is None else [(mount, "/")]:
        if path == root or path.startswith(root.rstrip("/") + "/"):
            return point / path[len(root.rstrip("/")) :].lstrip("/")
    return None


def domain_of(group: Path) -> Path:
    """Where a process in ``group`` creates its test groups: the parent of an asyncroll leaf (the
    process, or the one that started it, already prepared it), else the group itself."""
    return group.parent if LEAF.fullmatch(group.name) else group


def _words(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except OSError as exc:
        raise SubtreeNotUsable(f"cgroup v2: cannot read {path}: {exc}") from exc


def _write(path: Path, text: str) -> None:
    """Write an existing interface file (never create one: a missing file is FileNotFoundError)."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _move(pid: int, group: Path) -> None:
    _write(group / "cgroup.procs", str(pid))


def prepare(group: Path, wanted: tuple[str, ...] = CONTROLLERS, pid: int | None = None) -> tuple[str, ...]:
    """Make ``domain_of(group)`` hold per-test groups with ``wanted`` controllers (see the module's
    doc), moving ``pid`` (this process) into its leaf if it is not in one yet. Returns the controllers
    in force: those of ``wanted`` the domain offers. Raises :class:`ControllerUnavailable` when it
    offers none of them, :class:`SubtreeNotUsable` when it cannot be used."""
    pid = os.getpid() if pid is None else pid
    domain = domain_of(group)
    usable = tuple(c for c in wanted if c in _words(domain / "cgroup.controllers"))
    if wanted and not usable:
        raise ControllerUnavailable(
            f"cgroup v2: {domain}/cgroup.controllers offers none of {', '.join(wanted)} (bound to a "
            "cgroup-v1 hierarchy, or not delegated to this group)"
        )
    missing = [c for c in usable if c not in _words(domain / "cgroup.subtree_control")]
    leaf = None
    if group == domain:
        leaf = domain / f"{PREFIX}{pid}"
        try:
            leaf.mkdir(exist_ok=True)
            _move(pid, leaf)
        except OSError as exc:
            with contextlib.suppress(OSError):
                leaf.rmdir()
            raise SubtreeNotUsable(
                f"cgroup v2: cannot create and enter {leaf} (a read-only cgroup mount, or a group not "
                f"delegated to this user): {exc}"
            ) from exc
    if not missing:
        return usable
    others = _words(domain / "cgroup.procs") - {str(pid)}
    try:
        if others and (domain / "cgroup.events").exists():  # only the root group has no cgroup.events
            raise OSError(errno.EBUSY, "the group has processes of its own")
        _write(domain / "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))
    except OSError as exc:
        if exc.errno == errno.EBUSY and not others:  # one entered since: the kernel refused
            others = _words(domain / "cgroup.procs") - {str(pid)}
        if leaf is not None:
            with contextlib.suppress(OSError):
                _move(pid, domain)
                leaf.rmdir()
        if exc.errno == errno.EBUSY:
            pids = sorted(int(p) for p in others if p.isdigit())
            raise SubtreeNotUsable(
                f"cgroup v2: {domain} has processes of its own ({', '.join(map(str, pids[:10]))}), and "
                "v2 enables controllers only in a group without any: run asyncroll in a cgroup of its "
                "own (systemd: systemd-run --scope -p Delegate=yes -- asyncroll ...)"
            ) from exc
        raise SubtreeNotUsable(f"cgroup v2: cannot enable {' '.join(missing)} in {domain}: {exc}") from exc
    return usable


def prepare_for_children() -> None:
    """For a process that starts others which run untrusted code (the experiment runner, whose clients
    are ``asyncroll run`` processes): on a host whose per-test groups are v2, prepare this process's
    domain now (it moves into its leaf), so that the processes it starts begin in that leaf and find the
    domain prepared. A client started while this process still sat in the domain found the domain
    shared (with this process) and refused it, even in a cgroup of asyncroll's own. Best effort: a
    domain that cannot be used is left as it is, for the client's own probe to report why."""
    if v1_roots():
        return
    group = own_group()
    if group is not None:
        with contextlib.suppress(OSError):  # CgroupError (ControllerUnavailable, ...) is an OSError
            prepare(group)


def write_limits(group: Path, controllers: tuple[str, ...], memory_bytes: int, max_pids: int) -> None:
    """Write a test group's caps for the controllers in force (see the module's doc for swap)."""
    if "memory" in controllers:
        _write(group / "memory.max", str(memory_bytes))
        with contextlib.suppress(FileNotFoundError):  # no swap accounting: nothing to cap
            _write(group / "memory.swap.max", "0")
    if "pids" in controllers:
        _write(group / "pids.max", str(max_pids))


@dataclass(frozen=True, slots=True)
class TestGroupV2(TestGroup):
    """One test's v2 group (a single directory); joined, listed and removed as a v1 group is."""

    def memory_limit_hit(self) -> bool:
        """True when the group met ``memory.max`` (``max``), failed an allocation (``oom``) or its
        out-of-memory killer killed a member (``oom_kill``), per ``memory.events``."""
        for d in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                lines = (d / "memory.events").read_text().splitlines()
                fields = dict(line.split() for line in lines if line.strip())
                if any(int(fields.get(key, "0")) > 0 for key in ("max", "oom", "oom_kill")):
                    return True
        return False

    def kill_all(self, deadline: float) -> None:
        """``cgroup.kill`` (every member and every process it forks meanwhile gets SIGKILL), then wait
        until the group is empty; without ``cgroup.kill`` (before Linux 5.14) the SIGKILL loop of v1.
        Raises :class:`CgroupError` past ``deadline``."""
        for d in self.dirs:
            try:
                _write(d / "cgroup.kill", "1")
            except FileNotFoundError:
                if not d.exists():
                    continue
                TestGroup.kill_all(self, deadline)
                return
            except OSError as exc:
                raise CgroupError(f"could not kill {d}: {exc}") from exc
        while members := self.members():
            if time.monotonic() > deadline:
                raise CgroupError(f"processes {sorted(members)} survived cgroup.kill in {self.dirs[0]}")
            time.sleep(0.001)


class CgroupV2Factory:
    """Creates one :class:`TestGroupV2` per test in a prepared domain (see :func:`prepare`)."""

    def __init__(self, domain: Path, controllers: tuple[str, ...]) -> None:
        self.domain = domain
        self.controllers = controllers
        _remove_stale(domain)

    def create(self, memory_bytes: int, max_pids: int) -> TestGroupV2:
        """A fresh group with its limits written; raises :class:`CgroupError`."""
        d = self.domain / fresh_name([self.domain])
        try:
            d.mkdir()
        except OSError as exc:
            raise CgroupError(f"could not create cgroup {d}: {exc}") from exc
        try:
            write_limits(d, self.controllers, memory_bytes, max_pids)
        except OSError as exc:
            with contextlib.suppress(OSError):
                d.rmdir()
            raise CgroupError(f"could not set up cgroup {d}: {exc}") from exc
        return TestGroupV2((d,))


def group_roots() -> list[Path]:
    """Where this process's test groups live, without preparing anything: the v1 ``memory`` and
    ``pids`` directories, or on a host with neither, the v2 domain (for stale clean-up and checks)."""
    roots = v1_roots()
    if roots:
        return roots
    group = own_group()
    return [] if group is None else [domain_of(group)]
