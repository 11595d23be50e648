"""A bench stopped mid-run by a stop signal (Ctrl-C; SIGTERM from ``timeout`` or ``kill``; SIGHUP) ends
with exit 130 and one line on stderr, its scratch directory removed and no process of its runs left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_bench_stopped_by_a_signal_removes_its_scratch_and_says_so(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """SIGTERM killed the process outright: its scratch directory (hundreds of MB for a map) stayed in
    the temporary directory; Ctrl-C printed a KeyboardInterrupt traceback. bench.paired is stopped
    during its real runs (worker processes up), after its machine line (its scratch made)."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.paired", "--seeds", "1000", "--n", "40", "--points", "4/2/1"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(BENCH.parent), "TMPDIR": str(temp), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group, signalled as a terminal's Ctrl-C signals one
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert first.startswith("machine:"), first
        assert any(p.name.startswith("asyncroll-bench-") for p in temp.iterdir())
        deadline = time.monotonic() + 30
        while not (workers := _children(process.pid)):  # a run's worker up: the signal lands in a run
            assert time.monotonic() < deadline, "no worker process started"
            time.sleep(0.05)
        os.killpg(process.pid, sig)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    assert process.returncode == 130, err[-2000:]
    assert err.strip().splitlines() == [
        f"bench.paired: interrupted by {sig.name}; what it printed above is whole, the rest was not measured"
    ]
    assert list(temp.iterdir()) == []
    # an exited worker may stay a zombie for a moment, until init reaps it: only a running one counts,
    # and one that is still ending (its pipe closed) gets a few seconds
    deadline = time.monotonic() + 5
    while left := [pid for pid in workers if _running(pid)]:
        assert time.monotonic() < deadline, f"a run's worker process outlived the bench: {left}"
        time.sleep(0.05)


def _children(pid: int) -> list[str]:
    listed = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return listed.stdout.split()


def _running(pid: str) -> bool:
    """Whether the process is there and not a zombie (an exited child its new parent has not reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_every_bench_runs_its_main_under_the_stop_signal_guard() -> None:
    """Each ``python -m bench.X`` that measures goes through ``run_main`` (tested above on bench.paired):
    one still calling ``main()`` was killed outright by SIGTERM, its scratch directory left behind."""
    bench = Path(__file__).resolve().parents[1] / "bench"
    unguarded = [
        path.name
        for path in sorted(bench.glob("*.py"))
        if 'if __name__ == "__main__":' in (text := path.read_text(encoding="utf-8"))
        and f'run_main("bench.{path.stem}", main' not in text
    ]
    assert unguarded == []
