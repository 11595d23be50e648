"""What a killed asyncroll process leaves behind must not break a later one on the same host.

A run killed outright (SIGKILL, an OOM kill) leaves its workers' per-test cgroups
``asyncroll-<worker pid>-<n>`` behind until the next clean-up, which removes only those whose worker pid
no process holds. Pids are reused (``kernel.pid_max`` is 32768 on many hosts), so a later worker may get
the pid of a dead one: its clean-up keeps the dead namesake's groups (the pid is alive: its own), and
its own numbering starts at 1 again. A real child process plays that worker: the groups of a dead
process with its pid are planted before it creates any."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from asyncroll.evaluator.cgroups import PREFIX
from tests.children import end
from tests.conftest import REPO

pytestmark = pytest.mark.timeout(60)

_WORKER = """
import json, sys
from pathlib import Path
from asyncroll.evaluator.cgroups import CgroupFactory
from asyncroll.evaluator.cgroups_v2 import CgroupV2Factory
print("ready", flush=True)
kind, *roots = sys.stdin.readline().split()
paths = [Path(r) for r in roots]
try:
    factory = CgroupFactory(*paths) if kind == "v1" else CgroupV2Factory(paths[0], ())
    names = [[d.name for d in factory.create(256 << 20, 32).dirs] for _ in range(3)]
    print(json.dumps({"names": names}), flush=True)
except OSError as exc:
    print(json.dumps({"error": str(exc)}), flush=True)
"""


def _groups_of_a_namesake(kind: str, roots: list[Path]) -> tuple[int, dict[str, object]]:
    """Start the stand-in worker, plant a dead namesake's groups 1 and 2 (and 3 in the last root only)
    under ``roots``, then let it start its factory and create three groups."""
    for root in roots:
        root.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", _WORKER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline() == "ready\n"
        for n in (1, 2):
            for root in roots:
                (root / f"{PREFIX}{proc.pid}-{n}").mkdir()
        (roots[-1] / f"{PREFIX}{proc.pid}-3").mkdir()
        proc.stdin.write(" ".join([kind, *map(str, roots)]) + "\n")
        proc.stdin.flush()
        out, _ = proc.communicate(timeout=30)
        return proc.pid, json.loads(out)
    finally:
        end(proc)


@pytest.mark.parametrize("kind", ["v1", "v2"])
def test_a_worker_with_a_dead_workers_pid_skips_the_groups_that_one_left(tmp_path: Path, kind: str) -> None:
    roots = [tmp_path / "memory", tmp_path / "pids"] if kind == "v1" else [tmp_path / "domain"]
    pid, result = _groups_of_a_namesake(kind, roots)
    assert "error" not in result, result["error"]  # was: could not set up cgroup ...: File exists
    names = result["names"]
    assert isinstance(names, list)
    taken = {f"{PREFIX}{pid}-{n}" for n in (1, 2, 3)}
    fresh = [group[0] for group in names]
    assert len(set(fresh)) == 3 and not taken & set(fresh)
    assert all(len(set(group)) == 1 for group in names)  # one name in every root
    for root in roots:  # the namesake's leftovers are not taken over (nor removed: its pid is alive)
        assert (root / f"{PREFIX}{pid}-1").is_dir()
