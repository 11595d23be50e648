"""Reading a process's inherited environment (:func:`asyncroll.proctree.environ`): an empty one is read
again only while the process may still be in the ``exec`` that started it. Real processes, killed and
reaped by pid even when a test fails."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncroll import proctree

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")


@pytest.fixture
def bare() -> Iterator[subprocess.Popen[bytes]]:
    """A ``sleep`` started with an empty environment (``env -i``, a sandboxed program), past its exec."""
    proc = subprocess.Popen(["/bin/sleep", "60"], env={})
    try:
        deadline = time.monotonic() + 30
        while not Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"/bin/sleep"):
            assert time.monotonic() < deadline, "the child never exec'd"
            time.sleep(0.01)
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


def test_a_process_long_past_its_exec_with_no_environment_is_read_at_once(
    bare: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every empty read waited 0.2 s: a kernel thread, a zombie or an `env -i` helper of the same user.
    # `experiment run --resume` as root looked for a dead runner's orphans among every process on the
    # host (hundreds of kernel threads: a minute or more per role), and a pool's sweep stalled the run's
    # event loop 0.2 s per such adopted child, at every look.
    time.sleep(2 * proctree.EXEC_WINDOW_S)  # older than any exec under way: nothing is worth waiting for
    waits: list[float] = []
    monkeypatch.setattr(proctree.time, "sleep", waits.append)
    assert proctree.environ(bare.pid) == {}
    assert waits == []
