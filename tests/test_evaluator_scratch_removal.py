"""An evaluation's directory is removed whatever the program did to the modes of what it made there."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

from asyncroll.evaluator.evaluate import remove_tree

NOBODY = 65534


def _lock_and_remove(base: Path) -> int:
    """As the program's user would leave it: a tree with an unreadable and an unwritable directory, and a
    link to a directory outside that must keep its mode. 0 when ``remove_tree`` removed it all."""
    scratch, outside = base / "asyncroll-eval-1-x", base / "outside"
    (scratch / "a" / "b" / "c").mkdir(parents=True)
    (scratch / "input-1").write_text("hidden test")
    (scratch / "a" / "b" / "c" / "f").write_text("x")
    outside.mkdir(mode=0o500)
    (scratch / "a" / "link").symlink_to(outside)
    (scratch / "a" / "b").chmod(0o000)
    (scratch / "a").chmod(0o500)
    shutil.rmtree(scratch, ignore_errors=True)
    if not scratch.exists():
        return 2  # nothing to show: rmtree alone removed it (this user ignores modes)
    remove_tree(scratch)
    return int(scratch.exists() or (outside.stat().st_mode & 0o777) != 0o500)


@pytest.mark.timeout(30)
def test_a_directory_the_program_locked_is_removed_with_everything_in_it() -> None:
    """Under weak isolation as a non-root user the program owns its work directory: a subdirectory it made
    unreadable kept ``shutil.rmtree(ignore_errors=True)`` out, and the evaluation's directory (the program,
    the hidden test inputs) stayed in the temporary folder. Root ignores modes: there the tree is made and
    removed by a child running as nobody."""
    base = Path(tempfile.mkdtemp(prefix="asyncroll-test-"))
    try:
        if os.geteuid() != 0:
            assert _lock_and_remove(base) == 0
            return
        base.chmod(0o777)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 3
            try:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                code = _lock_and_remove(base)
            finally:
                os._exit(code)
        deadline = time.monotonic() + 20
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        if done[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the removal did not end")
        assert os.waitstatus_to_exitcode(done[1]) == 0
    finally:
        shutil.rmtree(base, ignore_errors=True)
