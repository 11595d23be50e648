"""Every subprocess a test starts is ended with its pipes closed, also when the test fails half-way:
otherwise the "unclosed file" ResourceWarning comes from the garbage collector, later, in another test."""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import tests.cli_runs as cli_runs
from tests.children import end


def unclosed_after(action: object) -> list[str]:
    """The ResourceWarnings raised while ``action()`` runs (it must raise AssertionError) and the
    garbage collector frees what it dropped."""
    assert callable(action)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            action()
        except AssertionError:
            pass
        else:
            pytest.fail("the action was to fail")
        gc.collect()
    return [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)]


@pytest.mark.timeout(60)
def test_end_kills_reaps_and_closes_every_pipe() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    end(proc)
    assert proc.returncode == -signal.SIGKILL
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    assert proc.stdin.closed and proc.stdout.closed and proc.stderr.closed
    end(proc)  # again: nothing left to do, nothing raised


@pytest.mark.timeout(60)
def test_a_signal_test_that_fails_before_the_signal_leaves_no_pipe_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cli_runs's helper, failing while it waits for the run's first job (as on a loaded machine): its
    process was killed and reaped but its stdout and stderr pipes were left to the garbage collector."""

    def never(path: Path, needle: str, timeout: float = 30, *, writer: object = None) -> None:
        raise AssertionError(f"{needle!r} never appeared in {path}")

    monkeypatch.setattr(cli_runs, "_wait_for", never)
    workload = tmp_path / "w.jsonl"
    workload.write_text("")

    def signal_a_run() -> None:
        cli_runs._signal_a_running_run(workload, tmp_path / "run", signal.SIGTERM)

    assert unclosed_after(signal_a_run) == []
