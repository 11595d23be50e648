"""The sandbox's pre-exec hook: what the forked child of :class:`~.sandbox.Sandbox` does between ``fork``
and ``exec`` — arm its death signal, join the test's cgroups, set the rlimits. Python runs there, which is
safe because tool workers are single-threaded."""

from __future__ import annotations

import math
import os
import resource
import signal
from typing import TYPE_CHECKING

from asyncroll.proctree import libc

if TYPE_CHECKING:
    from asyncroll.evaluator.cgroups import TestGroup
    from asyncroll.evaluator.sandbox import Limits

_PR_SET_PDEATHSIG = 1


class PreExec:
    """Runs in the forked child before ``exec``: death signal, cgroup membership, rlimits."""

    def __init__(self, limits: Limits, group: TestGroup | None, tasks_in_use: int = 0) -> None:
        """``tasks_in_use``: the tasks the program's user already has (:func:`tasks_of`), added to the
        ``RLIMIT_NPROC`` of a program that runs as the runtime's own user (weak isolation): that limit
        counts every process and thread of the user, so 64 alone failed the harness's own fork, and
        so every program, for a user whose session already ran 64."""
        cpu = math.ceil(limits.time_limit_s) + 1
        nproc = limits.processes * (limits.nproc_headroom if group is not None else 1) + tasks_in_use
        hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        if hard != resource.RLIM_INFINITY:  # a non-root process cannot raise its hard limit
            nproc = min(nproc, hard)
        self.rlimits = [
            (resource.RLIMIT_AS, limits.address_space_bytes, limits.address_space_bytes),
            (resource.RLIMIT_CPU, cpu, cpu + 1),
            (resource.RLIMIT_FSIZE, limits.file_size_bytes, limits.file_size_bytes),
            (resource.RLIMIT_NOFILE, limits.open_files, limits.open_files),
            (resource.RLIMIT_NPROC, nproc, nproc),
            (resource.RLIMIT_CORE, 0, 0),
        ]
        self.join_files = group.join_files if group is not None else ()
        self.libc = libc()

    def __call__(self) -> None:
        self.libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        pid = str(os.getpid()).encode()
        for path in self.join_files:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)
        for which, soft, hard in self.rlimits:
            resource.setrlimit(which, (soft, hard))


def tasks_of(uid: int) -> int:
    """The tasks (processes and their threads) whose real user is ``uid`` now: what ``RLIMIT_NPROC``
    counts for a process of that user."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as status:
                lines = status.read().splitlines()
        except OSError:  # gone meanwhile
            continue
        fields = dict(line.split(b":", 1) for line in lines if line.startswith((b"Uid:", b"Threads:")))
        if b"Uid" in fields and int(fields[b"Uid"].split()[0]) == uid:
            count += int(fields.get(b"Threads", b"1"))
    return count
