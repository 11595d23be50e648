"""When the environment's I/O fails under a command: a full disk under a sweep or a replay, a closed
stdout, a server program that cannot even be looked at. Each ends with a clear one-line error naming
the file and the documented exit code: never a traceback, never an error lost.

A full disk is made for real with ``RLIMIT_FSIZE`` in the child (see ``test_disk_full.py``): a file
cannot grow past the limit (``EFBIG``), as a full file system refuses with ``ENOSPC``."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.timeout(60)
SMOKE = REPO / "examples" / "smoke.jsonl"


def asyncroll(
    *args: str | Path, limit_bytes: int | None = None, stdout: int | None = subprocess.PIPE
) -> subprocess.CompletedProcess[str]:
    """``asyncroll ARGS`` in a new interpreter; files past ``limit_bytes`` cannot grow (a full disk)."""

    def limited() -> None:
        if limit_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run(
        [sys.executable, "-m", "asyncroll.cli", *map(str, args)],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=45,
        preexec_fn=limited,
    )


@pytest.mark.parametrize(
    ("limit_bytes", "named"),
    [(3000, "sweep.json"), (300, "workloads/seed-0.jsonl")],  # the tables, then a seed's workload
)
def test_a_sweep_whose_disk_fills_up_names_the_file_without_a_traceback(
    tmp_path: Path, limit_bytes: int, named: str
) -> None:
    # Both were an OSError traceback (the second one twice, chained), exit 1 by accident.
    out = tmp_path / "sweep"
    args = ("simulate", "--sweep", "--workload", SMOKE, "--output", out, "--seeds", "1", "--jobs", "1")
    proc = asyncroll(*args, limit_bytes=limit_bytes)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"error: {out / named}: cannot write (File too large)"), proc.stderr
    assert len(proc.stderr.splitlines()) == 1
    assert not list(out.rglob(".*.tmp"))  # no temporary file left behind
    for seeded in (out / "workloads").iterdir():  # no workload cut short that a cell could be run from
        for line in seeded.read_text().splitlines():
            json.loads(line)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A completed (simulated) run of the smoke workload, to replay."""
    from tests.conftest import invoke

    run = tmp_path_factory.mktemp("recorded") / "run"
    result = invoke("simulate", "--workload", SMOKE, "--output", run)
    assert result.exit_code == 0, result.output
    return run


def test_a_replay_with_no_room_for_its_workload_names_it_and_leaves_nothing(
    recorded: Path, tmp_path: Path
) -> None:
    # It blamed the recorded run ("--from-run RUN: cannot replay it: OSError: [Errno 27] File too
    # large"), with exit 2, a usage error.
    out = tmp_path / "replay"
    proc = asyncroll("simulate", "--from-run", recorded, "--output", out, limit_bytes=100)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == (
        f"error: {out / 'replay-workload.jsonl'}: cannot write (File too large); nothing written, {out} "
        "removed\n"
    )
    assert not out.exists()


def test_a_replay_with_no_room_for_its_receipt_leaves_nothing_behind(recorded: Path, tmp_path: Path) -> None:
    # The replay workload fit, run.json did not: the directory was left holding the replay workload
    # alone, and the same command given again once there was room was refused ("already exists").
    out = tmp_path / "replay"
    size = len(SMOKE.read_bytes())
    proc = asyncroll("simulate", "--from-run", recorded, "--output", out, limit_bytes=2 * size)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.endswith(
        f"error: run failed: run.json: cannot write (File too large); nothing written, {out} removed\n"
    ), proc.stderr
    assert not out.exists()
