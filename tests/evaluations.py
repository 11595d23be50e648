"""Helpers for the sandboxed ``lcb_evaluate`` evaluator's tests: the real LiveCodeBench fixtures, the
markers for tests that run a program or need full isolation, and an evaluation that checks afterwards that
nothing it started is left: no process of the sandbox uid started since the test began, no descendant of
this process, no per-test cgroup."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import pickle
import time
import zlib
from pathlib import Path
from typing import Any

import psutil
import pytest

from asyncroll.evaluator import isolation
from asyncroll.evaluator.cgroups import PREFIX
from asyncroll.evaluator.cgroups_v2 import group_roots
from asyncroll.evaluator.evaluate import lcb_evaluate
from asyncroll.evaluator.sandbox import CLEANUP_S

FIXTURES = Path(__file__).parent / "fixtures"
ROW_1873_A = FIXTURES / "livecodebench_code_generation_lite_1873_A.jsonl"
FRAGMENT_3708 = FIXTURES / "livecodebench_functional_fragment_3708.json"
ADD = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]
ADD_PROGRAM = "a, b = map(int, input().split())\nprint(a + b)\n"
#: How long past its time limit an evaluation may take to end on a loaded 2-core machine: 3 s for its
#: start-up (cgroup, namespaces, the harness's exec) and the sandbox's own bounds on ending a test (the
#: program's kill and the pipes' drain, 1 s each; the cgroup's kill and the clean-up, CLEANUP_S each). A
#: verdict of time_limit_exceeded already says the wall-clock deadline ended the program; this catches an end
#: that waited for something else. (3 s alone was a guess at the load: a 1 s loop took 4.6 s at a load of 8.)
SLACK_S = 3.0 + 2 * 1.0 + 2 * CLEANUP_S
HOST_ROOT_LINKS = [d for d in ("bin", "sbin", "lib", "lib32", "lib64", "libx32") if os.path.lexists(f"/{d}")]

ISOLATED = os.geteuid() == 0
#: Tests of containment itself (escapes, bombs, cgroups, namespaces) skip without root.
requires_isolation = pytest.mark.skipif(
    not ISOLATED, reason="full isolation needs root (uid switch, namespaces, cgroups)"
)
#: Tests of verdicts run everywhere: fully isolated as root, and as a non-root developer with the
#: layers that work there (rlimits, process-group kill), which is what ``--allow-weak-isolation`` gives.
WEAK_UNLESS_ROOT: dict[str, bool] = {} if ISOLATED else {"allow_weak_isolation": True}
real_process = pytest.mark.timeout(60)


class _RefuseGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing global {module}.{name}")


def real_1873_a() -> tuple[list[dict[str, str]], str]:
    """The real Codeforces row's public + private tests, decoded safely, and its statement."""
    row = json.loads(ROW_1873_A.read_text().splitlines()[0])
    private = _RefuseGlobals(io.BytesIO(zlib.decompress(base64.b64decode(row["private_test_cases"])))).load()
    return json.loads(row["public_test_cases"]) + json.loads(private), row["question_content"]


def fragment_3708() -> tuple[list[dict[str, str]], str]:
    fragment = json.loads(FRAGMENT_3708.read_text())
    return json.loads(fragment["public_test_cases"]), json.loads(fragment["metadata"])["func_name"]


ZIGZAG = """
class Solution:
    def zigzagTraversal(self, grid: List[List[int]]) -> List[int]:
        cells = []
        for i, row in enumerate(grid):
            cells.extend(row if i % 2 == 0 else reversed(row))
        return cells[::2]
"""


def _orphaned(proc: psutil.Process, uid: int) -> bool:
    """True when the first ancestor of ``proc`` not running as ``uid`` is init or this process: a
    sandboxed process that outlived its launcher. (A live sandbox of another session on this machine
    has that session's ``unshare`` or worker as its first privileged ancestor.)"""
    current = proc
    while True:
        parent = current.parent()
        if parent is None or parent.pid == 1:
            return True
        if parent.uids().real != uid:
            return parent.pid == os.getpid()
        current = parent


def leftovers(since: float, *owners: int) -> list[str]:
    """What an evaluation that started at ``since`` (``time.time()``) left behind: orphaned processes of
    the sandbox uid, descendants of this process, per-test cgroups of this process or of ``owners``
    (workers)."""
    uid = isolation.detect().config.uid
    found = []
    for proc in psutil.process_iter(["pid", "uids", "create_time", "cmdline", "status"]):
        info = proc.info
        if uid is None or not info["uids"] or info["uids"].real != uid or info["create_time"] < since - 1:
            continue
        with contextlib.suppress(psutil.Error):
            if _orphaned(proc, uid):
                found.append(f"pid {info['pid']} ({info['status']}): {(info['cmdline'] or [''])[:3]}")
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.create_time() >= since - 1:
                found.append(f"descendant {child.pid}: {child.cmdline()[:3]}")
    for root in group_roots():  # v1 memory and pids, or the v2 domain (its process leaves don't count)
        if root.exists():
            prefixes = tuple(f"{PREFIX}{pid}-" for pid in (os.getpid(), *owners))
            mine = [d.name for d in root.iterdir() if d.name.startswith(prefixes)]
            found += [f"cgroup {root}/{name}" for name in mine]
    return found


def evaluate(
    code: str, tests: list[dict[str, Any]] | None = None, **kwargs: Any
) -> tuple[dict[str, Any], float]:
    """Run ``lcb_evaluate`` and assert it left nothing behind; return its result and wall seconds."""
    since = time.time()
    began = time.monotonic()
    result = lcb_evaluate(code, ADD if tests is None else tests, **{**WEAK_UNLESS_ROOT, **kwargs})
    elapsed = time.monotonic() - began
    assert leftovers(since) == []
    assert set(result) == {"passed", "tests_run", "tests_total", "feedback", "timed_out"}
    return result, elapsed


def verdict(result: dict[str, Any]) -> str | None:
    return None if result["feedback"] is None else result["feedback"]["verdict"]
