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

    def __init__(self, limits: Limits, group: TestGroup | None) -> None:
        cpu = math.ceil(limits.time_limit_s) + 1
        nproc = limits.processes * (limits.nproc_headroom if group is not None else 1)
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
