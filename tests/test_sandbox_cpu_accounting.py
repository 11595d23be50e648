"""The CPU time of what the sandbox kills or reaps (a program killed alive, a child a finished program
left spinning) reaches the worker's account: with every layer as root, with those that work (no PID
namespace) as another user."""

from __future__ import annotations

import os
import time
from pathlib import Path

from asyncroll.evaluator import isolation
from asyncroll.evaluator.sandbox import Limits, Sandbox
from tests.evaluations import leftovers, real_process

SPENDS_CPU_THEN_FLOODS = """
import sys, time
while time.process_time() < 0.3:
    pass
sys.stdout.write("x" * 65536)
sys.stdout.flush()
time.sleep(1000)
"""


@real_process
def test_a_killed_programs_cpu_time_reaches_the_workers_account(tmp_path: Path) -> None:
    """A program still running when its test ends is killed before its harness: the init of a PID
    namespace reaps what still runs when it exits without adding that CPU time to its own, so a killed
    program's CPU time was missing from the worker's (the job's ``cpu_s``) in about 3 runs of 4. Here the
    program provably spends 0.3 s of CPU, then floods stdout past the cap and is killed alive."""
    scratch = tmp_path / "eval"
    scratch.mkdir(mode=0o700)
    code = scratch / "solution.py"
    code.write_text(SPENDS_CPU_THEN_FLOODS)
    sandbox = Sandbox(isolation.detect().config)
    since = time.time()
    for _ in range(5):
        before = os.times()
        execution = sandbox.run(code, b"", scratch, wall_s=30.0, limits=Limits(output_bytes=1024))
        after = os.times()
        assert execution.output_exceeded, execution
        counted = after.children_user + after.children_system - before.children_user - before.children_system
        assert counted >= 0.3, counted
    assert leftovers(since) == []


LEAVES_A_SPINNER = """
import os, time
r, w = os.pipe()
if os.fork() == 0:
    while time.process_time() < 0.3:
        pass
    os.write(w, b"spent")
    while True:
        pass
os.read(r, 5)
print(3)
"""


@real_process
def test_the_cpu_time_of_what_a_finished_program_left_running_reaches_the_workers_account(
    tmp_path: Path,
) -> None:
    """The program answers and exits, leaving a child that has spent 0.3 s of CPU still spinning: the
    harness kills and reaps it before it exits. (Left to the kernel's clean-up of the namespace, its CPU
    time was never counted.)"""
    scratch = tmp_path / "eval"
    scratch.mkdir(mode=0o700)
    code = scratch / "solution.py"
    code.write_text(LEAVES_A_SPINNER)
    sandbox = Sandbox(isolation.detect().config)
    since = time.time()
    for _ in range(3):  # the first run of a process was sometimes counted even so
        before = os.times()
        execution = sandbox.run(code, b"", scratch, wall_s=30.0)
        after = os.times()
        assert execution.done == {"kind": "done", "ok": True} and execution.stdout == b"3\n", execution
        counted = after.children_user + after.children_system - before.children_user - before.children_system
        assert counted >= 0.3, counted
    assert leftovers(since) == []
