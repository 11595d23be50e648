"""This process's children as the kernel lists them, and the child-subreaper flag: what the sandbox needs
to find and kill orphans of code it ran."""

from __future__ import annotations

import contextlib
import ctypes
import os
from pathlib import Path

import psutil

PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37


def libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def children() -> set[int]:
    """Pids of this process's children, zombies included (from /proc, without psutil's filtering)."""
    pids: set[int] = set()
    try:
        for task in Path(f"/proc/{os.getpid()}/task").iterdir():
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in (task / "children").read_text().split())
    except OSError:
        return {p.pid for p in psutil.Process().children()}
    return pids


def set_subreaper(on: bool) -> None:
    """Make this process adopt its descendants' orphans (Linux ``prctl``; a no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        libc().prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)


def is_subreaper() -> bool:
    """Whether this process adopts its descendants' orphans (a tool worker always does, on Linux)."""
    flag = ctypes.c_int(0)
    with contextlib.suppress(OSError, AttributeError):
        libc().prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
    return bool(flag.value)
