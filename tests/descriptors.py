"""A file this process holds open, made to refuse every later write, as a full disk or a failed device would
(a test's way into a run's "no room" paths without filling a disk)."""

from __future__ import annotations

import os
from pathlib import Path


def make_writes_fail(path: Path) -> None:
    """Every descriptor of this process open on ``path`` now refers to /dev/null opened read-only: a later
    write through it fails (EBADF), a later read reads nothing."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
        if target == str(path):
            read_only = os.open(os.devnull, os.O_RDONLY)
            os.dup2(read_only, int(fd))
            os.close(read_only)
