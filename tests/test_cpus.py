"""How many CPUs a run may use: the affinity mask and the cgroup CPU quota (``docker --cpus``), read from a
/proc and a cgroup tree made here, so that no test depends on this machine's CPUs or cgroups."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncroll import cpus
from asyncroll.outputs.receipt import host


def fake_proc(
    tmp_path: Path, cgroup: str, mountinfo: list[tuple[str, str, str, str]], files: dict[str, str]
) -> Path:
    """A /proc/self whose cgroup file is ``cgroup`` and whose mountinfo lists ``mountinfo`` (root in the
    hierarchy, mount point under tmp_path, file system type, super options); ``files``: cgroup files
    (relative to tmp_path) and their text."""
    proc = tmp_path / "proc"
    proc.mkdir()
    proc.joinpath("cgroup").write_text(cgroup)
    proc.joinpath("mountinfo").write_text(
        "".join(
            f"{30 + i} 1 0:{i} {root} {tmp_path / point} rw,relatime shared:1 - {fs} {fs} {options}\n"
            for i, (root, point, fs, options) in enumerate(mountinfo)
        )
        + "99 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
    )
    for name, text in files.items():
        tmp_path.joinpath(name).parent.mkdir(parents=True, exist_ok=True)
        tmp_path.joinpath(name).write_text(text)
    return proc


V2 = [("/", "cg", "cgroup2", "rw,nsdelegate")]


def test_a_docker_cpus_quota_on_cgroup_v2_is_the_usable_cpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``docker --cpus=2`` on a 64-CPU host: every CPU is in the affinity mask, cpu.max allows two. The
    run said 64 usable CPUs (and a sweep ran 64 cells at once on two CPUs' time)."""
    proc = fake_proc(tmp_path, "0::/\n", V2, {"cg/cpu.max": "200000 100000\n"})
    monkeypatch.setattr(cpus, "affinity_cpus", lambda: 64)
    assert cpus.quota_cpus(proc) == 2.0
    assert cpus.usable_cpus(proc) == 2


def test_a_fractional_quota_rounds_up_and_the_tightest_group_above_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quota of 1.5 CPUs lets two run (three quarters of the time each); a parent group's quota (a
    Kubernetes pod's, above its container's) binds the groups under it."""
    proc = fake_proc(
        tmp_path,
        "0::/pod/ctr\n",
        V2,
        {
            "cg/cpu.max": "max 100000\n",
            "cg/pod/cpu.max": "150000 100000\n",
            "cg/pod/ctr/cpu.max": "max 100000\n",
        },
    )
    monkeypatch.setattr(cpus, "affinity_cpus", lambda: 8)
    assert cpus.quota_cpus(proc) == 1.5
    assert cpus.usable_cpus(proc) == 2


def test_a_cgroup_v1_cfs_quota_counts_and_the_affinity_mask_when_it_is_fewer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cgroup v1 (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), the group shown through a mount of its
    own (Docker without a cgroup namespace: the mount's root is the container's group)."""
    proc = fake_proc(
        tmp_path,
        "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n",
        [("/docker/abc", "cpu", "cgroup", "rw,cpu,cpuacct")],
        {"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"},
    )
    monkeypatch.setattr(cpus, "affinity_cpus", lambda: 16)
    assert cpus.quota_cpus(proc) == 3.0
    assert cpus.usable_cpus(proc) == 3
    monkeypatch.setattr(cpus, "affinity_cpus", lambda: 1)  # taskset -c 0 inside it
    assert cpus.usable_cpus(proc) == 1


@pytest.mark.parametrize(
    "files",
    [
        {"cg/cpu.max": "max 100000\n"},
        {},  # no cpu controller enabled: no cpu.max
        {"cg/cpu.max": "garbage\n"},
    ],
)
def test_no_quota_leaves_the_affinity_mask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str]
) -> None:
    proc = fake_proc(tmp_path, "0::/\n", V2, files)
    monkeypatch.setattr(cpus, "affinity_cpus", lambda: 4)
    assert cpus.quota_cpus(proc) is None
    assert cpus.usable_cpus(proc) == 4


def test_no_proc_leaves_the_affinity_mask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpus, "affinity_cpus", lambda: 3)
    assert cpus.usable_cpus(tmp_path / "missing") == 3


def test_run_json_host_says_the_quota_and_the_cpus_it_leaves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run.json's host.usable_cpus counted the affinity mask only: under ``docker --cpus=1`` on a 2-CPU
    machine it said 2."""
    proc = fake_proc(tmp_path, "0::/\n", V2, {"cg/cpu.max": "100000 100000\n"})
    monkeypatch.setattr(cpus, "PROC", proc)
    monkeypatch.setattr(cpus, "affinity_cpus", lambda: 2)
    machine = host()
    assert machine["usable_cpus"] == 1 and machine["cpu_quota"] == 1.0


def test_a_sweep_runs_as_many_cells_at_once_as_the_quota_allows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The sweep's default --jobs is the usable CPUs: under ``docker --cpus=1`` on 8 CPUs it ran 8 cells
    at once, and ``--jobs 4`` was not lowered."""
    from asyncroll.commands.simulate_flags import sweep_jobs

    proc = fake_proc(tmp_path, "0::/\n", V2, {"cg/cpu.max": "100000 100000\n"})
    monkeypatch.setattr(cpus, "PROC", proc)
    monkeypatch.setattr(cpus, "affinity_cpus", lambda: 8)
    assert sweep_jobs(None, None) == 1
    assert sweep_jobs(None, 4) == 1
    assert "warning: --jobs 4: this process may use 1 CPU(s)" in capsys.readouterr().err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [1, 2])
def test_a_run_with_more_workers_than_usable_cpus_says_so(tmp_path: Path, workers: int) -> None:
    """``asyncroll run`` confined to one CPU (its affinity mask, as ``taskset -c`` sets it): two workers are
    noted on stderr (CPU-bound tools would take turns), one is not; the run itself is not refused."""
    import os
    import subprocess
    import sys

    from tests.cli_runs import SMOKE
    from tests.conftest import REPO

    one = min(os.sched_getaffinity(0))
    command = [sys.executable, "-m", "asyncroll.cli", "run", "--workload", str(SMOKE)]
    done = subprocess.run(
        [*command, "--output", str(tmp_path / "o"), "--cpu-workers", str(workers), "--no-progress"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=100,
        preexec_fn=lambda: os.sched_setaffinity(0, {one}),
    )
    assert done.returncode == 0, done.stderr
    noted = "note: --cpu-workers 2, but this process may use 1 CPU(s)" in done.stderr
    assert noted is (workers == 2), done.stderr


def test_the_tightest_quota_counts_and_odd_mounts_are_read_right(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Of two quotas on the way up, the tightest (1.5 under 3); a v1 ``cpuset`` mount is not the ``cpu``
    hierarchy, nor is a sibling group whose name the group's begins with; a mount point's escaped space
    is a space; a short mountinfo line is skipped; a period of 0 is no quota."""
    monkeypatch.setattr(cpus, "affinity_cpus", lambda: 8)
    for sub in "abc":
        tmp_path.joinpath(sub).mkdir()
    proc = fake_proc(
        tmp_path / "a",
        "0::/pod/ctr\n",
        V2,
        {"cg/pod/cpu.max": "150000 100000\n", "cg/pod/ctr/cpu.max": "300000 100000\n"},
    )
    assert cpus.quota_cpus(proc) == 1.5

    root = tmp_path / "b"
    for name, text in {
        "c g/cpu.cfs_quota_us": "200000\n",
        "c g/cpu.cfs_period_us": "100000\n",
        "set/cpu.cfs_quota_us": "900000\n",
        "set/cpu.cfs_period_us": "100000\n",
        "sib/cpu.cfs_quota_us": "800000\n",
        "sib/cpu.cfs_period_us": "100000\n",
    }.items():
        root.joinpath(name).parent.mkdir(parents=True, exist_ok=True)
        root.joinpath(name).write_text(text)
    proc = root / "proc"
    proc.mkdir()
    proc.joinpath("cgroup").write_text("5:cpuset:/docker/abc2\n3:cpu,cpuacct:/docker/abc2\n0::/\n")
    spaced = str(root / "c g").replace(" ", "\\040")
    proc.joinpath("mountinfo").write_text(
        "1 2 - cgroup2\n"
        f"30 1 0:1 /docker/abc2 {root / 'set'} rw - cgroup cgroup rw,cpuset\n"
        f"31 1 0:2 /docker/abc {root / 'sib'} rw - cgroup cgroup rw,cpu,cpuacct\n"
        f"32 1 0:3 /docker/abc2 {spaced} rw - cgroup cgroup rw,cpu,cpuacct\n"
    )
    assert cpus.quota_cpus(proc) == 2.0

    proc = fake_proc(tmp_path / "c", "0::/\n", V2, {"cg/cpu.max": "100000 0\n"})
    assert cpus.quota_cpus(proc) is None
