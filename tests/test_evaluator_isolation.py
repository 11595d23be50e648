"""The sandbox's isolation layers on this machine: detected and reported, missing ones refused unless
weak isolation is allowed, and what a program cannot see, keep or reach (processes, IPC, kernel keys,
secrets, host paths, earlier hidden inputs), also with only the last-resort layer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from asyncroll.evaluator import isolation, sandbox
from asyncroll.evaluator.isolation import IsolationError, IsolationReport, Layer
from asyncroll.evaluator.preexec import tasks_of
from asyncroll.evaluator.sandbox import Layers, Sandbox
from tests.conftest import REPO, invoke
from tests.evaluations import (
    HOST_ROOT_LINKS,
    ROW_1873_A,
    evaluate,
    leftovers,
    real_process,
    requires_isolation,
)
from tests.hostile_programs import HOLDS_STDOUT, NESTED_ESCAPE, SETSID_ESCAPE


def test_missing_layers_are_refused_unless_weak_isolation_is_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    layers = tuple(Layer(name, name != "cgroup_pids", "probe said so") for name in isolation.REQUIRED)
    weak = IsolationReport(layers, Layers(python="/usr/bin/python3"), root=True)
    monkeypatch.setattr(isolation, "detect", lambda: weak)
    with pytest.raises(IsolationError, match="cgroup_pids: probe said so") as caught:
        isolation.require()
    # a CLI user is told the flag first (the Python argument came first, the flag in brackets)
    assert "or pass --allow-weak-isolation (allow_weak_isolation=True from Python)" in str(caught.value)
    # and what a program could do without the layer, not only the probe's reason ("unshare failed: …")
    assert "cgroup_pids: probe said so\n    without it: processes are bounded per user" in str(caught.value)
    assert set(isolation.LOSSES) == set(isolation.REQUIRED)
    assert isolation.require(allow_weak=True) is weak
    recorded = isolation.isolation_report(allow_weak=True)
    assert recorded["weak"] is True and recorded["missing"] == ["cgroup_pids"] and recorded["allowed_weak"]


def test_an_interpreter_outside_the_system_dirs_keeps_the_private_root(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As root with the runtime's Python under ``/opt`` (conda's ``/opt/conda``, or a copy of 3.12.1 there,
    readable by nobody), the harness binds that prefix into the private root, so the probe's ``/`` held
    ``opt`` too: the check wanted exactly :data:`~.isolation.ROOT`, and full isolation was refused
    (an IsolationError, unless weak isolation was allowed, which then ran without a private root)."""
    seen: dict[str, object] = {"pid": 2, "ppid": 1, "tmp": ["work"], "interfaces": ["lo"], "ipc": "ipc:[1]"}
    seen |= {"root": sorted([*isolation.ROOT, "opt"]), "prefix_tops": ["opt"]}
    monkeypatch.setattr(isolation, "_probe", lambda layers: (seen, ""))
    monkeypatch.setattr(isolation.shutil, "which", lambda name: "/usr/bin/unshare")
    _, layers = isolation._namespace_layers(Layers(python="/opt/conda/bin/python3.12"))
    assert {layer.name: layer.active for layer in layers}["private_root"]
    seen["root"] = sorted([*isolation.ROOT, "home", "opt"])  # anything more in sight is still refused
    _, layers = isolation._namespace_layers(Layers(python="/opt/conda/bin/python3.12"))
    assert not {layer.name: layer.active for layer in layers}["private_root"]
    # the probe names the top directories of the prefixes the harness binds: here the runtime's own
    probe = subprocess.run(
        [sys.executable, "-I", "-c", isolation.PROBE_PROGRAM], capture_output=True, text=True, timeout=30
    )
    tops = {
        p.split("/")[1]
        for p in (sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable)))
    }
    assert json.loads(probe.stdout)["prefix_tops"] == sorted(tops), probe.stderr


@requires_isolation
@real_process
def test_the_isolation_report_prints_from_the_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "asyncroll.evaluator.isolation"], capture_output=True, text=True, timeout=50
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["missing"] == []


@requires_isolation
@real_process
def test_every_layer_is_detected_and_the_report_is_json() -> None:
    report = isolation.isolation_report()
    assert json.loads(json.dumps(report)) == report
    assert report["weak"] is False and report["missing"] == []
    for name in isolation.REQUIRED:
        assert report["layers"][name]["active"], (name, report["layers"][name])
    assert report["uid"] not in (None, 0)
    assert "bubblewrap" in report["layers"]
    assert report["layers"]["kernel_keys_denied"]["active"], report["layers"]["kernel_keys_denied"]
    # verdicts can depend on the sandbox's interpreter (its recursion limits): the receipt says which
    version = subprocess.run(
        [report["python"], "-I", "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert report["python_version"] == version


THREAD_POOL = """
import threading
started, go = [], threading.Event()
def work():
    started.append([bytearray(64) for _ in range(8)])  # this thread's first allocations: its malloc arena
    go.wait()
threads = [threading.Thread(target=work) for _ in range(32)]
for thread in threads:
    thread.start()
go.set()
for thread in threads:
    thread.join()
print(len(started))
"""


@real_process
def test_a_program_with_a_pool_of_threads_runs_under_the_address_space_limit() -> None:
    """glibc reserved 64 MiB of address space for each thread's malloc arena, so under the 768 MiB limit a
    program could start 13 threads: a pool of 32 failed "can't start new thread" here, while LiveCodeBench
    (no memory limit) runs it."""
    result, _ = evaluate(THREAD_POOL, [{"input": "", "output": "32"}])
    assert result["passed"], result["feedback"]


@requires_isolation
@real_process
def test_the_program_sees_an_unprivileged_empty_world() -> None:
    probe = """
import json, os, socket
print(json.dumps([os.getuid(), os.getpid(), os.getppid(), sorted(os.environ), os.listdir("/tmp"),
                  [name for _, name in socket.if_nameindex()],
                  sorted(int(p) for p in os.listdir("/proc") if p.isdigit()), sorted(os.listdir("/"))]))
"""
    result, _ = evaluate(probe, [{"input": "", "output": "?"}])
    seen = json.loads(result["feedback"]["got"])
    assert seen[0] == isolation.detect().config.uid
    assert seen[1:3] == [2, 1]  # the program's process is PID 2 under the harness as PID 1
    assert seen[3] == ["HOME", "LANG", "LC_ALL", "MALLOC_ARENA_MAX", "PATH", "TMPDIR"]
    assert seen[4] == ["work"] and seen[5] == ["lo"]
    assert seen[7] == sorted(["dev", "proc", "tmp", "usr", "var", *HOST_ROOT_LINKS])
    assert seen[6] == [1, 2]  # /proc shows the namespace only: no host process, no secret to read


IPC_AND_KEYS = """
import ctypes, errno, os, platform
libc = ctypes.CDLL(None, use_errno=True)
libc.shmget.restype = ctypes.c_int
key, size = 0x5A5A17, 1 << 20
shm = libc.shmget(key, size if MODE == "leave" else 0, (0o1000 | 0o600) if MODE == "leave" else 0)
add_key = {"x86_64": 248, "aarch64": 217}[platform.machine()]
libc.syscall.restype = ctypes.c_long
keyed = libc.syscall(add_key, b"user", b"asyncroll-test", b"secret", 6, -4)  # KEY_SPEC_USER_KEYRING
print(MODE, shm >= 0, keyed >= 0 or errno.errorcode[ctypes.get_errno()])
"""


@requires_isolation
@real_process
def test_ipc_objects_and_kernel_keys_do_not_outlive_a_test() -> None:
    """Without an IPC namespace a program's System V shared memory outlived its test (pinning host
    memory no test cgroup bounds, readable by the next program), and ``nobody``'s kernel keyring still
    does: the harness's seccomp filter refuses the keyring calls."""
    leave, _ = evaluate("MODE = 'leave'\n" + IPC_AND_KEYS, [{"input": "", "output": "leave True EPERM"}])
    assert leave["passed"], leave  # the segment was made, inside the test's own namespace
    with open("/proc/sysvipc/shm") as host:
        assert not [line for line in host.read().splitlines()[1:] if int(line.split()[0]) == 0x5A5A17]
    find, _ = evaluate("MODE = 'find'\n" + IPC_AND_KEYS, [{"input": "", "output": "find False EPERM"}])
    assert find["passed"], find  # the next test's namespace does not have it


@requires_isolation
@real_process
def test_the_runtimes_secrets_are_out_of_reach(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither the runtime's environment nor files with hidden tests (this repository's fixtures, a
    workload) can be read by the program."""
    monkeypatch.setenv("ASYNCROLL_TEST_SECRET", "s3cr3t-token")
    program = f"""
import glob, os
leaks = [k for k, v in os.environ.items() if "s3cr3t" in v]
for path in [{str(ROW_1873_A)!r}, {str(Path(__file__).resolve())!r}, "/proc/1/root/{ROW_1873_A.name}"]:
    try:
        open(path).read()
        leaks.append(path)
    except OSError:
        pass
for path in glob.glob("/proc/*/environ"):
    try:
        if b"s3cr3t" in open(path, "rb").read():
            leaks.append(path)
    except OSError:
        pass
try:
    leaks += ["parent"] if b"s3cr3t" in open(f"/proc/{{os.getppid()}}/environ", "rb").read() else []
except OSError:
    pass
print(leaks)
"""
    result, _ = evaluate(program, [{"input": "", "output": "[]"}])
    assert result["passed"], result


@requires_isolation
@real_process
def test_writes_outside_the_private_directory_fail_or_vanish(tmp_path: Path) -> None:
    target = tmp_path / "escape.txt"
    shared_tmp = Path("/tmp") / f"asyncroll-escape-{os.getpid()}"
    repo_file = Path(__file__).parent / "escape.txt"
    program = f"""
results = []
for path in [{str(target)!r}, {str(repo_file)!r}, {str(shared_tmp)!r}, "../../escape.txt", "scratch.txt"]:
    try:
        with open(path, "w") as f:
            f.write("x")
        results.append("wrote")
    except OSError as exc:
        results.append(type(exc).__name__)
print(results)
"""
    result, _ = evaluate(program, [{"input": "", "output": "?"}])
    seen = json.loads(result["feedback"]["got"].replace("'", '"'))
    # Host paths do not exist in the program's private root; "/" is read-only to it; its /tmp is its own.
    assert seen == ["FileNotFoundError", "FileNotFoundError", "wrote", "PermissionError", "wrote"]
    assert not target.exists() and not repo_file.exists() and not shared_tmp.exists()


@requires_isolation
@real_process
@pytest.mark.parametrize(
    "program", [SETSID_ESCAPE, HOLDS_STDOUT, NESTED_ESCAPE], ids=["setsid", "stdout-holder", "nested"]
)
def test_without_namespaces_or_cgroups_the_subreaper_sweep_still_kills_escapees(
    program: str, tmp_path: Path
) -> None:
    """The last-resort layer alone (uid switch, rlimits, worker as child subreaper, psutil sweep): an
    escaped descendant is re-parented to this process and killed, and the read does not hang."""
    full = isolation.detect().config
    weak = Layers(python=full.python, uid=full.uid, gid=full.gid)
    scratch = tmp_path / "eval"
    scratch.mkdir(mode=0o711)
    code = scratch / "solution.py"
    code.write_text(program)
    since = time.time()
    began = time.monotonic()
    execution = Sandbox(weak).run(code, b"", scratch, wall_s=2.0)
    assert time.monotonic() - began < 2.0
    assert execution.done == {"kind": "done", "ok": True} and execution.stdout == b"3\n"
    assert leftovers(since) == []


READS_EARLIER_INPUTS = """
found = 0
for run in range(1, 20000):
    try:
        with open(f"../input-{run}", "rb") as f:
            found += f.read().startswith(b"hidden-earlier-test")
    except OSError:
        pass
print(found)
"""


@requires_isolation
@real_process
def test_without_a_private_root_the_sandbox_uid_cannot_read_the_hidden_inputs_in_scratch() -> None:
    """Without the private root the work directory lies inside the evaluation's scratch directory (0711
    so the sandbox uid reaches it): every test's input file there was 0644, so a program read the
    hidden inputs of the earlier tests by name. The worker opens a test's stdin itself: they are 0600."""
    full = isolation.detect().config
    weak = Layers(python=full.python, uid=full.uid, gid=full.gid)
    scratch = Path(tempfile.mkdtemp(prefix="qa-scratch-"))
    try:
        scratch.chmod(0o711)
        code = scratch / "solution.py"
        sandbox = Sandbox(weak)
        code.write_text("print(input())\n")
        first = sandbox.run(code, b"hidden-earlier-test\n", scratch, wall_s=5.0)
        assert first.stdout == b"hidden-earlier-test\n"  # the program's own stdin still works
        code.write_text(READS_EARLIER_INPUTS)
        since = time.time()
        second = sandbox.run(code, b"", scratch, wall_s=10.0)
        assert second.done == {"kind": "done", "ok": True}, second
        assert second.stdout == b"0\n"
        assert leftovers(since) == []
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@real_process
def test_a_program_run_as_the_runtime_s_own_user_gets_its_processes_beyond_the_user_s_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RLIMIT_NPROC counts every task (process or thread) of the user: a program that runs as the
    runtime's own user (weak isolation, no uid switch) may start its 64 on top of those the user has.
    With 64 in all, a user whose session already ran 64 tasks (any desktop) had the harness's own fork
    fail in every test: each program, a correct one too, was judged a runtime error."""
    assert tasks_of(os.getuid()) >= threading.active_count()
    assert tasks_of(2**31 - 5) == 0  # no such user
    monkeypatch.setattr(sandbox, "tasks_of", lambda uid: 5000)  # the user's session: 5000 tasks
    scratch = tmp_path / "eval"
    scratch.mkdir(mode=0o700)
    code = scratch / "solution.py"
    code.write_text("import resource\nprint(resource.getrlimit(resource.RLIMIT_NPROC)[0])\n")
    execution = Sandbox(Layers(python=sys.executable)).run(code, b"", scratch, wall_s=10.0)
    assert execution.stdout == b"5064\n", execution


def test_no_usable_temporary_directory_is_refused_naming_tmpdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A container with a read-only root (no emptyDir on /tmp) and a TMPDIR that is missing or read-only:
    the probe's scratch folder could not be made, and `asyncroll run` on a code workload ended in
    tempfile's FileNotFoundError traceback, nothing saying to set TMPDIR."""
    missing = tmp_path / "missing"
    monkeypatch.setattr(tempfile, "tempdir", None)  # tempfile looks again, and finds no candidate usable
    monkeypatch.setattr(tempfile, "_candidate_tempdir_list", lambda: [str(missing)])
    monkeypatch.setenv("TMPDIR", str(missing))
    with pytest.raises(IsolationError, match="set TMPDIR to a folder this user may write in"):
        isolation.require(allow_weak=True)
    monkeypatch.setattr(sys, "argv", ["isolation"])  # `python -m asyncroll.evaluator.isolation` says so too
    assert isolation.main() == 1
    said = capsys.readouterr()
    assert said.out == "" and said.err.startswith("error: untrusted code needs a folder for its scratch")
    out = tmp_path / "run"
    workload = REPO / "examples" / "livecodebench" / "workload.jsonl"
    done = invoke("run", "--workload", workload, "--output", out, "--allow-weak-isolation", "--no-progress")
    assert done.exit_code == 2, done.stderr
    assert "untrusted code needs a folder for its scratch files: No usable temporary directory" in done.stderr
    assert str(missing) in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()
