"""The evaluator in a real tool worker: it survives a hostile program, a worker killed mid-evaluation
leaves nothing after the next start (stale cgroups and scratch removed), and a run's tool timeout caps
the evaluation's budget."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from asyncroll.errors import WorkerTimeout
from asyncroll.evaluator import isolation
from asyncroll.evaluator.evaluate import remove_stale_scratch, scratch_prefix
from asyncroll.evaluator.sandbox import Sandbox
from asyncroll.workers import JobRequest, ProcessWorker, ToolSpec
from tests.evaluations import (
    ADD,
    ADD_PROGRAM,
    WEAK_UNLESS_ROOT,
    ZIGZAG,
    fragment_3708,
    leftovers,
    real_process,
    requires_isolation,
)
from tests.hostile_programs import FORK_BOMB


@real_process
def test_a_worker_survives_a_hostile_program_and_keeps_evaluating() -> None:
    tests, func_name = fragment_3708()

    async def main(worker_pids: list[int]) -> None:
        worker = ProcessWorker(0, (ToolSpec("lcb_evaluate"),), startup_timeout=20)
        await worker.start()
        try:
            pid = worker.pid
            assert pid is not None
            worker_pids.append(pid)
            hostile = {"code": FORK_BOMB, "tests": ADD, "time_limit_s": 1.0, **WEAK_UNLESS_ROOT}
            bomb = (await worker.call(JobRequest(1, "lcb_evaluate", hostile), timeout=30)).reply
            assert bomb.ok, bomb.error
            assert bomb.value["feedback"]["verdict"] == "time_limit_exceeded"
            good = {"code": ZIGZAG, "tests": tests, "func_name": func_name, **WEAK_UNLESS_ROOT}
            after = (await worker.call(JobRequest(2, "lcb_evaluate", good), timeout=30)).reply
            assert after.ok and after.value["passed"] and after.value["tests_run"] == 2
            bad = (
                await worker.call(JobRequest(3, "lcb_evaluate", {"code": "x", "tests": []}), timeout=30)
            ).reply
            assert not bad.ok and "tests must be a non-empty list" in (bad.error or "")
            assert worker.alive and worker.pid == pid
            assert psutil.Process(pid).children(recursive=True) == []
        finally:
            await worker.aclose()

    since = time.time()
    worker_pids: list[int] = []
    asyncio.run(asyncio.wait_for(main(worker_pids), 50))
    assert leftovers(since, *worker_pids) == []


@requires_isolation
@real_process
def test_killing_a_worker_mid_evaluation_leaves_nothing_after_the_next_start() -> None:
    """The runtime's tool timeout kills the worker's tree; the sandbox dies with it, and the next
    sandbox to start removes the dead worker's empty per-test cgroups."""
    isolation.detect()  # probe now: a probe's own start-up would remove the stale groups checked below
    worker_pids: list[int] = []

    async def main() -> None:
        worker = ProcessWorker(0, (ToolSpec("lcb_evaluate"),), startup_timeout=20)
        await worker.start()
        assert worker.pid is not None
        worker_pids.append(worker.pid)
        warm = {"code": ADD_PROGRAM, "tests": ADD}  # the first call runs the isolation probe
        assert (await worker.call(JobRequest(1, "lcb_evaluate", warm), timeout=30)).reply.value["passed"]
        forever = {"code": "while True:\n    pass\n", "tests": ADD, "time_limit_s": 30.0}
        try:
            with pytest.raises(WorkerTimeout):
                await worker.call(JobRequest(2, "lcb_evaluate", forever), timeout=3.0)
        finally:
            await worker.kill()

    since = time.time()
    asyncio.run(asyncio.wait_for(main(), 40))
    deadline = time.monotonic() + 10
    while [x for x in leftovers(since) if not x.startswith("cgroup")] and time.monotonic() < deadline:
        time.sleep(0.05)  # the kernel tears the namespace down asynchronously after the kill
    assert [x for x in leftovers(since) if not x.startswith("cgroup")] == []

    # The killed worker could not clean up: its groups and its evaluation directory (the program in it)
    # stay. Any sandbox that starts removes every dead worker's, so one the suite's other process starts
    # meanwhile may already have (seen once in a whole-suite run): only what is still here is checked.
    # Only groups from here on: the processes were checked above, with time for the kernel's teardown; a
    # second machine-wide scan for orphaned sandbox processes, without that wait, could meet one of the
    # suite's other process's hostile programs in the instant its tree is being killed (failed once in a
    # fresh-clone suite). The groups are this process's and its worker's alone.
    def groups() -> list[str]:
        return [x for x in leftovers(since, *worker_pids) if x.startswith("cgroup")]

    stale = groups()
    Sandbox(isolation.detect().config)  # a sandbox starting removes stale groups (cgroup v1 or v2)
    assert groups() == [], stale
    scratch = list(Path(tempfile.gettempdir()).glob(f"{scratch_prefix(worker_pids[0])}*"))
    assert len(scratch) <= 1
    remove_stale_scratch()
    assert not any(path.exists() for path in scratch)


@requires_isolation
@pytest.mark.timeout(150)
def test_a_run_passes_its_tool_timeout_so_a_slow_program_gets_a_verdict_not_a_killed_worker(
    tmp_path: Path,
) -> None:
    """``--tool-timeout 5`` caps the evaluator's total budget at 4 s: a program that would run its 6 s
    per-test limit gets a time-limit verdict and its repair turn; no worker is killed, nothing is left.
    (The 1 s margin is the design's; a loaded machine's sandbox overheads stay well inside it.)"""
    from tests.cli_runs import cli

    problem = {
        "id": "spins",
        "prompt": "write a program",
        "tools": [{"name": "lcb_evaluate"}],
        "script": [
            {"type": "submit", "code": "while True:\n    pass\n", "latency_ms": 5},
            {"type": "submit", "code": ADD_PROGRAM, "latency_ms": 5},
        ],
        "metadata": {
            "reference_tests": ADD,
            "prompt_metadata": {"protocol": "one_repair", "max_generations": 2},
        },
    }
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps(problem) + "\n")
    out = tmp_path / "run"
    since = time.time()
    result = cli("run", "--workload", workload, "--output", out, "--tool-timeout", "5", timeout=120)
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert [e for e in events if e["event"] == "worker_restarting"] == []
    evaluations = [e for e in events if e["event"] == "cpu_finished" and e["kind"] == "evaluate"]
    assert [e["ok"] for e in evaluations] == [True, True] and evaluations[0]["roundtrip_s"] < 5.0
    (line,) = (out / "results.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert record["status"] == "completed", record
    assert record["passed"] is True and record["repair_attempted"] is True and record["generations"] == 2
    workers = [e["pid"] for e in events if e["event"] == "worker_ready"]
    deadline = time.monotonic() + 10
    while leftovers(since, *workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leftovers(since, *workers) == []


def test_stale_scratch_of_dead_processes_is_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    """An isolation probe's directory was named without its process (``asyncroll-probe-XXXX``), so one a
    kill left behind was never removed; it is named like an evaluation's now and removed the same way."""
    from asyncroll.evaluator.evaluate import SCRATCH_PREFIX
    from asyncroll.evaluator.isolation import PROBE_PREFIX

    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, timeout=30
    )
    dead = int(done.stdout)
    assert not Path(f"/proc/{dead}").exists()
    made = {
        name: tmp_path / name
        for prefix in (SCRATCH_PREFIX, PROBE_PREFIX)
        for name in (f"{prefix}{dead}-abc", f"{prefix}{os.getpid()}-abc")
    }
    for path in made.values():
        path.mkdir()
        (path / "solution.py").write_text("print(1)\n")
    remove_stale_scratch(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for n in made if str(os.getpid()) in n)
