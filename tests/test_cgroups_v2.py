"""cgroup-v2 per-test groups (:mod:`asyncroll.evaluator.cgroups_v2`) on the real kernel where it can be
used, on a temporary file tree only where it cannot.

The kernel part mounts a private cgroup2 hierarchy in a temporary directory and works in a fresh group
of its own in it, removed and unmounted after every test. This machine binds ``memory`` and ``pids`` to
cgroup-v1 hierarchies, so in v2 it offers neither: creation, joining, listing, ``cgroup.kill``,
removal, stale clean-up, the move into a leaf and the "controller unavailable" / "not writable" paths
run for real; ``memory.max``, ``memory.swap.max``, ``pids.max``, ``memory.events`` and enabling
controllers in ``cgroup.subtree_control`` are checked on plain files. The pytest process itself is
never moved: a stand-in process plays the asyncroll process that :func:`prepare` moves.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from asyncroll.evaluator import cgroups, cgroups_v2, isolation
from asyncroll.evaluator.cgroups import PREFIX, CgroupError, remove_stale_groups
from asyncroll.evaluator.cgroups_v2 import (
    CgroupV2Factory,
    ControllerUnavailable,
    SubtreeNotUsable,
    prepare,
)
from asyncroll.evaluator.sandbox import Layers, Sandbox
from asyncroll.proctree import is_subreaper, set_subreaper
from tests.children import end

real_process = pytest.mark.timeout(60)


def _cgroup2_unusable() -> str | None:
    if os.geteuid() != 0:
        return "mounting a private cgroup2 hierarchy needs root"
    with contextlib.suppress(OSError):
        if "cgroup2" in Path("/proc/filesystems").read_text():
            return None
    return "the kernel has no cgroup2 file system"


def _mount(point: Path, *options: str) -> None:
    done = subprocess.run(
        ["mount", "-t", "cgroup2", *options, "none", str(point)], capture_output=True, text=True, timeout=10
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount cgroup2 here: {done.stderr.strip()}")


def _remove_tree(group: Path, deadline: float) -> None:
    """Kill everything in ``group`` and remove it and its children, deepest first."""
    with contextlib.suppress(OSError):
        (group / "cgroup.kill").write_text("1")
    for child in sorted((d for d in group.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
        _rmdir(child, deadline)
    _rmdir(group, deadline)


def _rmdir(d: Path, deadline: float) -> None:
    while True:
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@pytest.fixture
def base(tmp_path: Path) -> Iterator[Path]:
    """A fresh group of this test's own in a private cgroup2 mount; killed, removed and unmounted after."""
    why = _cgroup2_unusable()
    if why:
        pytest.skip(why)
    point = tmp_path / "cgroup2"
    point.mkdir()
    _mount(point)
    group = point / f"qa-cgroups-v2-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
        yield group
    finally:
        try:
            _remove_tree(group, time.monotonic() + 10)
        finally:
            subprocess.run(["umount", str(point)], capture_output=True, timeout=10, check=True)


@pytest.fixture
def stand_in(base: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process standing in for an asyncroll worker, placed in ``base`` (it waits on its stdin)."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        (base / "cgroup.procs").write_text(str(proc.pid))
        yield proc
    finally:
        end(proc)


def _where(pid: int, base: Path) -> Path:
    """The directory of ``pid``'s v2 group, under the same mount as ``base``."""
    path = cgroups_v2.own_path(pid)
    assert path is not None
    mount = base.parent
    return mount / path.lstrip("/")


# --- the real kernel (a private cgroup2 mount) ----------------------------------------------------------


@real_process
def test_prepare_moves_the_process_into_a_leaf_that_its_children_keep(
    base: Path, stand_in: subprocess.Popen[bytes]
) -> None:
    assert _where(stand_in.pid, base) == base
    assert prepare(base, (), stand_in.pid) == ()
    leaf = base / f"{PREFIX}{stand_in.pid}"
    assert _where(stand_in.pid, base) == leaf
    assert cgroups_v2.domain_of(leaf) == base
    # A process started later (a tool worker) begins in the leaf and moves nowhere: its domain is base.
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        (leaf / "cgroup.procs").write_text(str(child.pid))
        assert prepare(leaf, (), child.pid) == ()
        assert _where(child.pid, base) == leaf
        assert not (base / f"{PREFIX}{child.pid}").exists()
    finally:
        end(child)


ESCAPEE = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        print(os.getpid(), flush=True)
        time.sleep(600)
    os._exit(0)
os.wait()
"""


@real_process
def test_a_test_group_is_joined_before_exec_lists_a_setsid_double_forked_tree_and_cgroup_kill_ends_it(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_fallback(self: object, deadline: float) -> None:
        pytest.fail("Linux 5.14+ has cgroup.kill: the v1 SIGKILL loop must not be needed")

    monkeypatch.setattr(cgroups.TestGroup, "kill_all", no_fallback)
    group = CgroupV2Factory(base, ()).create(64 << 20, 8)
    assert isinstance(group, cgroups_v2.TestGroupV2) and group.dirs[0].parent == base
    assert group.dirs[0].name.startswith(f"{PREFIX}{os.getpid()}-")
    was_subreaper = is_subreaper()
    set_subreaper(True)  # the escapee is re-parented to this process, which reaps it below
    try:

        def join() -> None:
            for path in group.join_files:
                Path(path).write_text(str(os.getpid()))

        proc = subprocess.Popen([sys.executable, "-c", ESCAPEE], stdout=subprocess.PIPE, preexec_fn=join)
        try:
            assert proc.stdout is not None
            escapee = int(proc.stdout.readline())
            assert proc.wait(timeout=20) == 0  # its parent is gone: only the group still knows the escapee
        finally:
            end(proc)
        assert group.members() == {escapee}
        assert _where(escapee, base) == group.dirs[0]
        group.kill_all(time.monotonic() + 10)  # cgroup.kill
        assert group.members() == set()
        _, status = os.waitpid(escapee, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        assert group.memory_limit_hit() is False  # no memory controller, no memory.events: no hit
        group.remove(time.monotonic() + 10)
        assert not group.dirs[0].exists()
    finally:
        set_subreaper(was_subreaper)


@real_process
def test_groups_of_dead_asyncroll_processes_are_removed_and_live_ones_kept(base: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    dead_pid = int(dead.stdout)
    stale = [base / f"{PREFIX}{dead_pid}", base / f"{PREFIX}{dead_pid}-7"]
    live = [base / f"{PREFIX}{os.getpid()}", base / f"{PREFIX}{os.getpid()}-99999", base / "someone-else"]
    for d in stale + live:
        d.mkdir()
    CgroupV2Factory(base, ())  # a factory starting removes what dead workers left
    assert [d.exists() for d in stale] == [False, False]
    assert all(d.exists() for d in live)
    (base / f"{PREFIX}{dead_pid}-8").mkdir()
    remove_stale_groups([base], wait_s=5.0)  # what the runtime calls when a run's pool has closed
    assert not (base / f"{PREFIX}{dead_pid}-8").exists()


@real_process
def test_memory_and_pids_missing_from_cgroup_controllers_is_a_named_error_and_nothing_moves(
    base: Path, stand_in: subprocess.Popen[bytes]
) -> None:
    offered = set((base / "cgroup.controllers").read_text().split())
    if offered & {"memory", "pids"}:
        pytest.skip("this host offers memory/pids to cgroup v2; the unavailable path needs one that does not")
    with pytest.raises(ControllerUnavailable, match=r"cgroup.controllers offers none of memory, pids"):
        prepare(base, ("memory", "pids"), stand_in.pid)
    assert _where(stand_in.pid, base) == base
    assert not (base / f"{PREFIX}{stand_in.pid}").exists()
    # The isolation probe turns it into two missing layers, naming why (this process does not move).
    plain = Layers(python=sys.executable)
    config, layers = isolation._cgroup_v2_layers(plain, base)
    assert config == plain
    assert [(layer.name, layer.active) for layer in layers] == [
        ("cgroup_memory", False),
        ("cgroup_pids", False),
    ]
    assert all("offers none of memory, pids" in layer.detail for layer in layers)


@real_process
def test_a_read_only_cgroup2_mount_is_a_named_error(tmp_path: Path) -> None:
    why = _cgroup2_unusable()
    if why:
        pytest.skip(why)
    point = tmp_path / "cgroup2-ro"
    point.mkdir()
    _mount(point, "-o", "ro")
    try:
        with pytest.raises(SubtreeNotUsable, match=r"cannot create and enter .*read-only cgroup mount"):
            prepare(point, (), os.getpid())  # refused before anything moves
    finally:
        subprocess.run(["umount", str(point)], capture_output=True, timeout=10, check=True)


@real_process
def test_the_sandbox_runs_a_program_in_a_v2_test_group_and_removes_it(base: Path, tmp_path: Path) -> None:
    """The whole sandbox, every other isolation layer of this machine on, with per-test v2 groups."""
    detected = isolation.detect().config
    layers = replace(detected, memory_cgroup=None, pids_cgroup=None, cgroup_v2=base, cgroup_v2_controllers=())
    code = tmp_path / "solution.py"
    code.write_text("print(open('/proc/self/cgroup').read().split('0::')[1].strip())\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o711)
    result = Sandbox(layers).run(code, b"", scratch)
    assert result.done is not None and result.done.get("ok"), (result.done, result.stderr)
    path = result.stdout.decode().strip()
    assert path.startswith(f"/{base.name}/{PREFIX}{os.getpid()}-"), path
    assert [d.name for d in base.iterdir() if d.is_dir()] == []  # the test group is gone


# --- plain files, where the kernel here cannot be used (memory/pids are bound to v1) -------------------


def test_limits_are_written_for_the_controllers_in_force_with_swap_capped_at_zero(tmp_path: Path) -> None:
    """Plain files: this kernel offers no memory/pids controller to cgroup v2."""
    for name in ("memory.max", "memory.swap.max", "pids.max"):
        (tmp_path / name).write_text("max\n")
    cgroups_v2.write_limits(tmp_path, ("memory", "pids"), 300 << 20, 64)
    assert (tmp_path / "memory.max").read_text() == str(300 << 20)
    assert (tmp_path / "memory.swap.max").read_text() == "0"  # swap alone: 0 keeps the total at the cap
    assert (tmp_path / "pids.max").read_text() == "64"
    (tmp_path / "memory.swap.max").unlink()  # no swap accounting: nothing to cap, not an error
    cgroups_v2.write_limits(tmp_path, ("memory",), 1 << 20, 1)
    assert not (tmp_path / "memory.swap.max").exists() and (tmp_path / "pids.max").read_text() == "64"


@pytest.mark.parametrize(
    ("events", "hit"),
    [
        ("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n", False),
        ("low 0\nhigh 0\nmax 12\noom 0\noom_kill 0\n", True),
        ("low 0\nhigh 0\nmax 0\noom 1\noom_kill 0\n", True),
        ("low 0\nhigh 0\nmax 0\noom 0\noom_kill 2\n", True),
    ],
)
def test_a_memory_limit_hit_is_read_from_memory_events(tmp_path: Path, events: str, hit: bool) -> None:
    """Plain files: this kernel offers no memory controller to cgroup v2."""
    (tmp_path / "memory.events").write_text(events)
    assert cgroups_v2.TestGroupV2((tmp_path,)).memory_limit_hit() is hit


def _fake_domain(root: Path, procs: str) -> Path:
    domain = root / "service"
    domain.mkdir()
    for name, text in [
        ("cgroup.controllers", "cpu io memory pids\n"),
        ("cgroup.subtree_control", ""),
        ("cgroup.procs", procs),
        ("cgroup.events", "populated 1\nfrozen 0\n"),  # a non-root group
    ]:
        (domain / name).write_text(text)
    return domain


def _fake_leaf(domain: Path, pid: int) -> None:
    leaf = domain / f"{PREFIX}{pid}"
    leaf.mkdir()
    (leaf / "cgroup.procs").write_text("")


def test_prepare_enables_the_offered_controllers_once_after_leaving_the_domain(tmp_path: Path) -> None:
    """Plain files: a real non-root group cannot be given memory/pids on this kernel (bound to v1), so
    the writes are checked on a file tree (a plain file's "move" leaves the domain's list as it was)."""
    domain = _fake_domain(tmp_path, "4242\n")
    _fake_leaf(domain, 4242)
    assert prepare(domain, ("memory", "pids", "hugetlb"), 4242) == ("memory", "pids")
    assert (domain / f"{PREFIX}4242" / "cgroup.procs").read_text() == "4242"
    assert (domain / "cgroup.subtree_control").read_text() == "+memory +pids"
    (domain / "cgroup.subtree_control").write_text("memory pids\n")  # as the kernel shows it
    leaf = domain / f"{PREFIX}4242"
    (leaf / "cgroup.procs").write_text("4243")
    assert prepare(leaf, ("memory", "pids"), 4243) == ("memory", "pids")  # a worker in the leaf
    assert (domain / "cgroup.subtree_control").read_text() == "memory pids\n"  # not written again


def test_a_domain_shared_with_other_processes_is_refused_naming_them_and_the_move_undone(
    tmp_path: Path,
) -> None:
    """Plain files (see above). The kernel would refuse the write with EBUSY; prepare checks first."""
    domain = _fake_domain(tmp_path, "4242\n777\n")
    _fake_leaf(domain, 4242)
    with pytest.raises(SubtreeNotUsable, match=r"has processes of its own \(777\).*Delegate=yes"):
        prepare(domain, ("memory", "pids"), 4242)
    assert (domain / "cgroup.procs").read_text() == "4242"  # moved back (the kernel's rmdir of the leaf
    # cannot be shown on plain files: it holds its cgroup.procs)
    assert (domain / "cgroup.subtree_control").read_text() == ""


def test_a_runner_prepares_its_domain_before_its_clients_so_they_can_use_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain files (see above). ``asyncroll experiment run`` starts each arm's client, an ``asyncroll
    run``, as its child: in the runner's domain beside the runner, which the client's own prepare refused
    as shared, so a code workload's arms failed isolation even in a cgroup of asyncroll's own. Prepared
    first, the runner sits in its leaf, where its clients begin and find the domain prepared."""
    runner, client = os.getpid(), 4243
    alone = tmp_path / "before"
    alone.mkdir()
    shared = _fake_domain(alone, f"{runner}\n{client}\n")  # the runner never prepared
    _fake_leaf(shared, client)
    with pytest.raises(SubtreeNotUsable, match=rf"has processes of its own \({runner}\)"):
        prepare(shared, ("memory", "pids"), client)

    domain = _fake_domain(tmp_path, f"{runner}\n")
    _fake_leaf(domain, runner)
    monkeypatch.setattr(cgroups_v2, "v1_roots", lambda: [])
    monkeypatch.setattr(cgroups_v2, "own_group", lambda mount=None: domain)
    cgroups_v2.prepare_for_children()
    leaf = domain / f"{PREFIX}{runner}"
    assert (leaf / "cgroup.procs").read_text() == str(runner)
    assert (domain / "cgroup.subtree_control").read_text() == "+memory +pids"
    (domain / "cgroup.subtree_control").write_text("memory pids\n")  # as the kernel shows it
    (domain / "cgroup.procs").write_text("")  # the runner moved out (a plain file does not follow)
    (leaf / "cgroup.procs").write_text(f"{runner}\n{client}\n")  # the client starts in the leaf
    assert prepare(leaf, ("memory", "pids"), client) == ("memory", "pids")


def test_a_runner_on_a_v1_host_or_in_an_unusable_domain_moves_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    domain = _fake_domain(tmp_path, f"{os.getpid()}\n777\n")
    monkeypatch.setattr(cgroups_v2, "own_group", lambda mount=None: domain)
    _fake_leaf(domain, os.getpid())
    monkeypatch.setattr(cgroups_v2, "v1_roots", lambda: [tmp_path / "memory"])
    cgroups_v2.prepare_for_children()  # v1 in force: nothing moved, nothing enabled
    assert (domain / f"{PREFIX}{os.getpid()}" / "cgroup.procs").read_text() == ""
    assert (domain / "cgroup.subtree_control").read_text() == ""
    monkeypatch.setattr(cgroups_v2, "v1_roots", lambda: [])
    cgroups_v2.prepare_for_children()  # shared with pid 777: refused, moved back, left for the client
    assert (domain / "cgroup.subtree_control").read_text() == ""
    assert (domain / "cgroup.procs").read_text() == str(os.getpid())


def test_a_probe_program_in_the_workers_own_leaf_is_not_in_a_test_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On v2 a worker's own group is named ``asyncroll-<pid>`` too: a program that failed to join its
    test group would sit there, and only a per-test ``asyncroll-<pid>-<n>`` group counts as joined."""
    plain = Layers(python=sys.executable)
    candidate = replace(plain, cgroup_v2=Path("/sys/fs/cgroup/x"), cgroup_v2_controllers=("memory", "pids"))
    seen = {"cgroup": f"0::/x/{PREFIX}123\n"}
    monkeypatch.setattr(isolation, "_probe", lambda layers: (seen, ""))
    where = {c: "cgroup v2: here" for c in ("memory", "pids")}
    config, layers = isolation._joined(plain, candidate, where, {})
    assert config == plain and not any(layer.active for layer in layers)
    seen["cgroup"] = f"0::/x/{PREFIX}123-4\n"
    config, layers = isolation._joined(plain, candidate, where, {})
    assert config == candidate and all(layer.active for layer in layers)


def _recorded_version(layers: Layers) -> object:
    """The cgroup version ``run.json``'s isolation record names for a sandbox configured as ``layers``."""
    return isolation.IsolationReport((), layers, root=True).to_dict()["cgroup_version"]


def test_the_isolation_record_names_the_cgroup_version_in_force() -> None:
    plain = Layers(python=sys.executable)
    assert _recorded_version(plain) is None
    assert _recorded_version(replace(plain, memory_cgroup=Path("/m"), pids_cgroup=Path("/p"))) == 1
    assert _recorded_version(replace(plain, cgroup_v2=Path("/d"), cgroup_v2_controllers=("pids",))) == 2


def test_a_failed_kill_names_the_group(tmp_path: Path) -> None:
    """Plain files: ``cgroup.kill`` is a directory here, so the write fails as no kernel file would."""
    (tmp_path / "cgroup.kill").mkdir()
    with pytest.raises(CgroupError, match="could not kill"):
        cgroups_v2.TestGroupV2((tmp_path,)).kill_all(time.monotonic() + 1)


@real_process
def test_without_v1_hierarchies_the_probe_uses_cgroup_v2_and_names_the_missing_controllers() -> None:
    """A host with no v1 ``memory``/``pids`` mount, made for real: a private mount namespace (the
    host's mounts are untouched) where both are unmounted and the cgroup2 mount is left. The probe
    must pick cgroup v2, find that it offers neither controller here (the host binds them to v1) and
    report both layers missing with that reason, instead of claiming v1 or crashing."""
    why = _cgroup2_unusable()
    if why:
        pytest.skip(why)
    v1 = [p for p in (Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup/pids")) if p.is_mount()]
    group = cgroups_v2.own_group()
    if group is None:
        pytest.skip("no cgroup2 mount on this host")
    if {"memory", "pids"} & set((group / "cgroup.controllers").read_text().split()):
        pytest.skip("this host offers memory/pids to cgroup v2: the probe would prepare a domain for real")
    script = " && ".join(
        [*(f"umount {p}" for p in v1), f"exec {sys.executable} -m asyncroll.evaluator.isolation"]
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=50,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
    )
    assert done.returncode == 1, done.stderr  # weak isolation, not allowed: exit 1
    report = json.loads(done.stdout)
    assert report["missing"] == ["cgroup_memory", "cgroup_pids"] and report["cgroup_version"] is None
    for name in ("cgroup_memory", "cgroup_pids"):
        assert report["layers"][name]["detail"].startswith("cgroup v2: "), report["layers"][name]
    assert all(p.is_mount() for p in v1)  # the host's own mounts are as they were


def test_a_stale_group_this_user_may_not_remove_is_left_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group a dead root run left where an ordinary user's runs make theirs (``/sys/fs/cgroup/pids``
    itself) cannot be removed by that user: the clean-up at the end of every run of a code workload
    retried it for its whole ``wait_s``, 2 s on the event loop, as if the kernel were still emptying
    it. Only a busy group is waited for."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    roots = stale, busy = [tmp_path / "root", tmp_path / "busy"]
    for root in roots:
        (root / f"{PREFIX}{int(dead.stdout)}-1").mkdir(parents=True)
    refusals = {stale: errno.EACCES, busy: errno.EBUSY}
    removable = Path.rmdir

    def rmdir(path: Path) -> None:
        if path.parent in refusals:
            raise OSError(refusals[path.parent], os.strerror(refusals[path.parent]), str(path))
        removable(path)

    monkeypatch.setattr(Path, "rmdir", rmdir)

    def sleep(seconds: float) -> None:
        raise AssertionError(f"waited for a group it may not remove ({seconds} s)")

    monkeypatch.setattr(cgroups.time, "sleep", sleep)
    remove_stale_groups([stale], wait_s=60.0)
    assert (stale / f"{PREFIX}{int(dead.stdout)}-1").is_dir()
    assert cgroups._remove_stale(busy) == 1  # still waited for, as before
    del refusals[busy]
    assert cgroups._remove_stale(busy) == 0 and not any(busy.iterdir())
