"""The command line as the tests drive it: ``asyncroll`` in a real subprocess (``cli``), ``run`` parsed and
validated in this process with the run itself replaced (``run_in_process``), a run's files read back and
validated, its worker processes checked gone, and a real run signalled once its first job has started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from asyncroll.events import parse_event
from asyncroll.schemas import RunReceiptModel, SummaryModel
from tests.children import end
from tests.conftest import REPO

SMOKE = REPO / "examples" / "smoke.jsonl"


def cli(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "asyncroll.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def load_run(out: Path) -> tuple[dict[str, Any], dict[str, Any], list[Any]]:
    receipt = json.loads((out / "run.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    events = [parse_event(line) for line in (out / "events.jsonl").read_text().splitlines()]
    RunReceiptModel.model_validate(receipt)
    SummaryModel.model_validate(summary)
    return receipt, summary, events


def worker_pids(events: list[Any]) -> set[int]:
    return {e.pid for e in events if e.event == "worker_ready" and e.pid is not None}


def _running(pid: int) -> bool:
    """``pid`` runs and is no zombie; a process that exits between the two checks is not running (its
    status read raised NoSuchProcess)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_gone(pids: set[int]) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        alive = {p for p in pids if _running(p)}
        if not alive:
            return
        time.sleep(0.05)
    raise AssertionError(f"worker processes left behind: {alive}")


def run_in_process(monkeypatch: pytest.MonkeyPatch, *args: str | Path) -> tuple[Any, list[Any]]:
    """``asyncroll run`` parsed and validated in this process (no subprocess, no workers): the run itself
    is replaced by a recorder of the validated config."""
    import asyncroll.commands.run as run_command
    from tests.conftest import invoke

    seen: list[Any] = []

    def record(cfg: Any, *_: Any) -> int:
        seen.append(cfg)
        return 0

    monkeypatch.setattr(run_command, "_run", record)
    return invoke("run", *args), seen


def _wait_for(
    path: Path, needle: str, timeout: float = 30, *, writer: subprocess.Popen[Any] | None = None
) -> None:
    """Until ``needle`` is in ``path``. Given the process that writes it, while that runs, however long
    (the test's hard timeout bounds it): a run that has not started its first job after 30 s is a slow one
    on a loaded machine (imports alone took half of that), not a failed one; one that ended is."""
    deadline = time.monotonic() + timeout
    while writer is not None or time.monotonic() < deadline:
        ended = writer is not None and writer.poll() is not None  # read first: it may write, then end
        if path.exists() and needle in path.read_text():
            return
        if ended:
            assert writer is not None
            raise AssertionError(f"{needle!r} never appeared in {path}: its run ended ({writer.returncode})")
        time.sleep(0.05)
    raise AssertionError(f"{needle!r} never appeared in {path}")


def _signal_a_running_run(
    workload: Path, out: Path, sig: signal.Signals, *flags: str, wrap: list[str] | None = None
) -> tuple[int, str]:
    """``asyncroll run`` in a real process (under ``wrap``, e.g. nohup), sent ``sig`` once its first job
    has started; its exit status and stderr (killed after 60 s)."""
    command = [*(wrap or []), sys.executable, "-m", "asyncroll.cli", "run", "--workload", str(workload)]
    proc = subprocess.Popen(
        [*command, "--output", str(out), *flags],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(out / "events.jsonl", '"event":"cpu_started"', writer=proc)
        os.kill(proc.pid, sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        end(proc)
    return proc.returncode, stderr
