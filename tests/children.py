"""The tests' own subprocesses, ended on every path: killed if still running, reaped, pipes closed.

A ``Popen`` whose pipes are left open when a test fails half-way (a wait that timed out, an assertion
before ``communicate``) is closed only when the garbage collector finds it: its ``ResourceWarning``
("unclosed file") then lands in whichever test runs at that moment, and the suite's
``filterwarnings = error`` fails that one instead."""

from __future__ import annotations

import contextlib
import subprocess
from typing import Any


def end(proc: subprocess.Popen[Any], timeout: float = 10) -> None:
    """Kill ``proc`` unless it has exited, reap it (``timeout`` seconds at most) and close its pipes."""
    try:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout)
    finally:
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):  # stdin: a flush to a dead reader
                    stream.close()


def python_with_open_files(script: str, limit: int, timeout: float = 50) -> subprocess.CompletedProcess[str]:
    """``python -c script`` under ``ulimit -n limit`` (the soft limit; the hard one kept)."""
    import resource
    import sys

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, preexec_fn=low_limit
    )
