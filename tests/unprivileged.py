"""Run a command's process bound by file permissions as an ordinary user is, where the suite runs as root
(as CI does).

What only binds an ordinary user — a umask that leaves a new folder unusable to its owner — was tested
only where the suite ran as one: under root those tests skipped, so CI never exercised them. Under root,
:func:`as_user` drops the capabilities that let root pass permission checks (``CAP_DAC_OVERRIDE``,
``CAP_DAC_READ_SEARCH``, ``CAP_FOWNER``) from the child's bounding set before it starts the command:
the command and everything it starts then meet each file's mode as its owner would, and still read the
interpreter wherever root keeps it. Where that cannot be done (no ``CAP_SETPCAP``),
:func:`skip_unless_bound` skips, saying so. (``ulimit -u`` binds no process of root's whatever its
capabilities: those tests still need the suite run as an ordinary user.)
"""

from __future__ import annotations

import ctypes
import functools
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

ROOT = os.geteuid() == 0
PR_CAPBSET_DROP = 24
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER = 1, 2, 3


#: Exits 0 where a folder of mode 0500 is not writable to the process.
PROBE = """import os, tempfile
folder = tempfile.mkdtemp()
os.chmod(folder, 0o500)
try:
    raise SystemExit(3 if os.access(folder, os.W_OK) else 0)
finally:
    os.rmdir(folder)
"""


#: Looked up here, not in the forked child: a dlopen there could wait for ever on a lock another thread held
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl


def _drop_permission_capabilities() -> None:
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER):
        if _PRCTL(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"cannot drop capability {cap} from the bounding set")


def as_user(then: Callable[[], None] | None = None) -> Callable[[], None] | None:
    """A ``preexec_fn``: under root, drop the capabilities that bypass file permissions, then run ``then``;
    for any other user ``then`` alone."""
    if not ROOT:
        return then

    def drop() -> None:
        _drop_permission_capabilities()
        if then is not None:
            then()

    return drop


@functools.cache
def why_not() -> str | None:
    """Why a command cannot be run here bound by file permissions, or None."""
    if not ROOT:
        return None
    probe = subprocess.run(
        [sys.executable, "-c", PROBE],
        preexec_fn=as_user(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["a folder of mode 0500 stayed writable"])[-1]
        return f"the suite runs as root and file permissions cannot be made to bind a command: {last}"
    return None


def skip_unless_bound() -> None:
    """Skip the test where a command cannot be run bound by file permissions (:func:`why_not`)."""
    reason = why_not()
    if reason is not None:
        pytest.skip(reason)
