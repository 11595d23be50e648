"""Which isolation layers work on this machine, found by running real probe programs, once per process.

Each layer is probed by running a small program through the real :class:`~.sandbox.Sandbox` with the
layers found so far plus the candidate, and checking what the program observes from inside:

* ``unprivileged_uid``: the program's uid is ``nobody`` (only possible when the worker is root;
  rlimits do not bind root, so this is what makes them real);
* ``rlimits``: address space, CPU, file size, open files, processes, no core files;
* ``pid_namespace``: the program is PID 2 under the harness as PID 1; the namespace (and every
  descendant, ``setsid`` or not) dies when the harness exits;
* ``private_root``: the program's ``/`` is a private tmpfs with read-only system directories, its own
  ``/proc`` and ``/tmp``: no host file (workloads, hidden tests, repositories, homes, sockets) is
  visible;
* ``net_namespace``: only the loopback interface exists;
* ``ipc_namespace``: the program's System V IPC objects and POSIX message queues are its own and
  vanish with the test (without it, shared memory a program leaves pins host memory no cgroup of the
  test bounds, and carries data to later programs);
* ``kernel_keys_denied``: the harness's seccomp filter fails the kernel-keyring calls (the ``nobody``
  user's keyring outlives a test); reported, not required (it knows x86-64 and AArch64 only);
* ``cgroup_memory`` / ``cgroup_pids``: a fresh cgroup per test caps the whole tree's memory and task
  count, root included: cgroup v1 where the host mounts v1 ``memory``/``pids`` hierarchies, else
  cgroup v2 (:mod:`~.cgroups_v2`; probing moves this process into a leaf group of its own); the
  version in force is ``cgroup_version`` in the report;
* ``bubblewrap``: reported only; the namespaces above come from ``unshare``, bwrap is not used.

Every layer that works is used. :func:`require` raises :class:`IsolationError` naming each missing
required layer unless ``allow_weak=True`` is given explicitly, so untrusted code never runs silently
unisolated. :func:`isolation_report` is the JSON-able dict the runtime records in ``run.json``;
``python -m asyncroll.evaluator.isolation`` prints it.

Probing forks with a pre-exec hook (see :mod:`~.sandbox`): call :func:`detect` before the calling
process starts threads, or from a single-threaded process such as a tool worker.
"""

from __future__ import annotations

import functools
import json
import os
import pwd
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from asyncroll.errors import AsyncrollError
from asyncroll.evaluator import cgroups_v2
from asyncroll.evaluator.cgroups import PREFIX, CgroupError, CgroupFactory, controller_root
from asyncroll.evaluator.cgroups_v2 import CONTROLLERS
from asyncroll.evaluator.execution import Execution
from asyncroll.evaluator.sandbox import Layers, Limits, Sandbox, SandboxError

REQUIRED = (
    "unprivileged_uid",
    "rlimits",
    "pid_namespace",
    "private_root",
    "net_namespace",
    "ipc_namespace",
    "cgroup_memory",
    "cgroup_pids",
)
#: What a program under test can do when a required layer is missing (said beside the probe's reason).
LOSSES = {
    "unprivileged_uid": "a program runs as this user and can read or change whatever it can",
    "rlimits": "a program's memory, CPU time, file sizes, open files and processes are unbounded",
    "pid_namespace": "a descendant that leaves the process group (setsid) can outlive its test",
    "private_root": "a program can read every file this user can: workloads, hidden tests, homes",
    "net_namespace": "a program can open network connections",
    "ipc_namespace": "shared memory or message queues a program leaves outlive its test",
    "cgroup_memory": "a tree of processes is bounded per process (its address space), not as a whole",
    "cgroup_pids": "processes are bounded per user (RLIMIT_NPROC), not per test",
}
PROBE_PROGRAM = """
import ctypes, errno, json, os, platform, resource, socket, sys
keyctl = {"x86_64": 250, "aarch64": 219}.get(platform.machine())
libc = ctypes.CDLL(None, use_errno=True)
# KEYCTL_GET_KEYRING_ID of KEY_SPEC_USER_KEYRING: refused with EPERM when the keyring calls are denied
refused = keyctl is not None and libc.syscall(keyctl, 0, -4, 0) == -1
keys_denied = refused and ctypes.get_errno() == errno.EPERM
print(json.dumps({
    "ipc": os.readlink("/proc/self/ns/ipc"), "keys_denied": keys_denied,
    "python_version": platform.python_version(),
    "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(),
    "pid": os.getpid(), "ppid": os.getppid(),
    "interfaces": sorted(name for _, name in socket.if_nameindex()),
    "tmp": sorted(os.listdir("/tmp")),
    "root": sorted(set(os.listdir("/")) - {"lib32", "lib64", "libx32", "sbin", "bin", "lib"}),
    # the harness also binds the interpreter's own prefix when it lives outside the system dirs (/opt/conda)
    "prefix_tops": sorted({p.split("/")[1] for p in (sys.base_prefix, sys.prefix, os.path.dirname(
        os.path.realpath(sys.executable)))}),
    "cgroup": open("/proc/self/cgroup").read(),
    "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[1],
    "env": sorted(os.environ),
}))
"""
_PROBE_LIMITS = Limits(time_limit_s=10.0)
ROOT = ["dev", "proc", "tmp", "usr", "var"]
"""What the program sees in ``/`` under ``private_root`` (besides the ``/bin``, ``/lib*``, ``/sbin`` that
exist on the host, and the top directory of the interpreter's prefix when it lives elsewhere: ``opt`` holding
only ``/opt/conda``)."""


class IsolationError(AsyncrollError):
    """A required isolation layer is missing and weak isolation was not explicitly allowed."""


@dataclass(frozen=True, slots=True)
class Layer:
    """One isolation layer: whether the sandbox uses it, and why (or why not), in words."""

    name: str
    active: bool
    detail: str


@dataclass(frozen=True, slots=True)
class IsolationReport:
    """The layers found at start-up and the sandbox configuration built from them."""

    layers: tuple[Layer, ...]
    config: Layers
    root: bool
    python_version: str | None = None  # the sandbox interpreter's: verdicts can depend on it

    @property
    def missing(self) -> tuple[str, ...]:
        """Required layers that are not active."""
        active = {layer.name for layer in self.layers if layer.active}
        return tuple(name for name in REQUIRED if name not in active)

    @property
    def weak(self) -> bool:
        return bool(self.missing)

    def to_dict(self) -> dict[str, Any]:
        """A plain, JSON-able dict (for ``run.json``)."""
        return {
            "weak": self.weak,
            "missing": list(self.missing),
            "root": self.root,
            "python": self.config.python,
            "python_version": self.python_version,
            "uid": self.config.uid,
            "cgroup_version": self.config.cgroup_version,
            "layers": {layer.name: {"active": layer.active, "detail": layer.detail} for layer in self.layers},
        }


PROBE_PREFIX = "asyncroll-probe-"


def _probe(layers: Layers) -> tuple[dict[str, Any] | None, str]:
    """Run :data:`PROBE_PROGRAM` under ``layers``; return what it observed, or ``None`` and why not."""
    # named by this process, like an evaluation's directory: one a kill left is removed once it is dead
    scratch = Path(tempfile.mkdtemp(prefix=f"{PROBE_PREFIX}{os.getpid()}-"))
    try:
        code = scratch / "solution.py"
        code.write_text(PROBE_PROGRAM)
        if layers.uid is not None and not layers.private_root:
            scratch.chmod(0o711)
        try:
            execution = Sandbox(layers, _PROBE_LIMITS).run(code, b"", scratch)
        except (SandboxError, CgroupError, OSError) as exc:
            return None, str(exc)
        return _facts(execution)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _facts(execution: Execution) -> tuple[dict[str, Any] | None, str]:
    done = execution.done
    if done is None or not done.get("ok"):
        error = str(done.get("error")) if done else f"the probe {execution.describe_exit()}"
        tail = execution.stderr.strip()[-500:]
        return None, f"{error.strip()[-500:]}{' | stderr: ' + tail if tail else ''}"
    try:
        facts = json.loads(execution.stdout)
    except ValueError:
        return None, f"unreadable probe output {execution.stdout[:200]!r}"
    return (facts, "") if isinstance(facts, dict) else (None, "probe output is not an object")


def _interpreters() -> list[str]:
    """Candidate interpreters for the sandbox: the runtime's own base interpreter first, then the
    system's (the runtime's may live where ``nobody`` cannot read, e.g. under /root)."""
    seen: list[str] = []
    base = getattr(sys, "_base_executable", None) or sys.executable
    for candidate in (base, sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if candidate and os.path.exists(candidate):
            real = os.path.realpath(candidate)
            if real not in seen:
                seen.append(real)
    return seen


def _nobody() -> tuple[int, int] | None:
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


def _uid_layer(root: bool, base: Layers) -> tuple[Layers, Layer]:
    if not root:
        return base, Layer(
            "unprivileged_uid",
            False,
            f"the runtime is not root (uid {os.getuid()}): programs run as the runtime's own user and "
            "can read its files",
        )
    ids = _nobody()
    if ids is None:
        return base, Layer("unprivileged_uid", False, "no 'nobody' user in the password database")
    reasons = []
    for python in _interpreters():
        candidate = replace(base, python=python, uid=ids[0], gid=ids[1])
        facts, why = _probe(candidate)
        if facts and facts["uid"] == ids[0] and facts["euid"] == ids[0] and facts["groups"] in ([], [ids[1]]):
            return candidate, Layer("unprivileged_uid", True, f"programs run as nobody ({ids[0]}:{ids[1]})")
        reasons.append(f"{python}: {why or facts}")
    return base, Layer("unprivileged_uid", False, "no interpreter runs as nobody: " + "; ".join(reasons))


def _namespace_layers(base: Layers) -> tuple[Layers, list[Layer]]:
    unshare = shutil.which("unshare")
    if unshare is None:
        why = "util-linux 'unshare' is not installed"
        names = ("pid_namespace", "private_root", "net_namespace", "ipc_namespace")
        return base, [Layer(name, False, why) for name in names]
    out: list[Layer] = []
    candidate = replace(base, unshare=unshare, pid_namespace=True, private_root=True)
    facts, why = _probe(candidate)
    if (
        facts
        and facts["pid"] == 2
        and facts["ppid"] == 1
        and facts["tmp"] == ["work"]
        and facts["root"] == sorted({*ROOT, *facts["prefix_tops"]})
    ):
        base = candidate
        out.append(Layer("pid_namespace", True, "unshare --pid --fork --kill-child --mount-proc"))
        out.append(Layer("private_root", True, "chroot into a tmpfs root with read-only system dirs"))
    else:
        without_tmp = replace(candidate, private_root=False)
        facts2, why2 = _probe(without_tmp)
        if facts2 and facts2["pid"] == 2 and facts2["ppid"] == 1:
            base = without_tmp
            out.append(Layer("pid_namespace", True, "unshare --pid --fork --kill-child --mount-proc"))
        else:
            out.append(Layer("pid_namespace", False, f"probe failed: {why2 or facts2}"))
        out.append(Layer("private_root", False, f"probe failed: {why or facts}"))
    candidate = replace(base, unshare=unshare, net_namespace=True)
    facts, why = _probe(candidate)
    if facts and facts["interfaces"] == ["lo"]:
        base = candidate
        out.append(Layer("net_namespace", True, "unshare --net: loopback only"))
    else:
        out.append(Layer("net_namespace", False, f"probe failed: {why or facts}"))
    candidate = replace(base, unshare=unshare, ipc_namespace=True)
    facts, why = _probe(candidate)
    if facts and facts["ipc"] != os.readlink("/proc/self/ns/ipc"):
        base = candidate
        out.append(Layer("ipc_namespace", True, "unshare --ipc: System V IPC and POSIX queues of its own"))
    else:
        out.append(Layer("ipc_namespace", False, f"probe failed: {why or facts}"))
    return base, out


def _cgroup_layers(base: Layers) -> tuple[Layers, list[Layer]]:
    roots = {c: controller_root(c) for c in CONTROLLERS}
    if all(root is None for root in roots.values()):
        group = cgroups_v2.own_group()
        if group is None:
            why = "no cgroup-v1 {} hierarchy and no cgroup2 mount"
            return base, [Layer(f"cgroup_{c}", False, why.format(c)) for c in CONTROLLERS]
        return _cgroup_v2_layers(base, group)
    out: dict[str, Layer] = {}
    usable: dict[str, Path] = {}
    for controller, root in roots.items():
        name = f"cgroup_{controller}"
        if root is None:
            why = f"no cgroup-v1 {controller} hierarchy (v2 is used on hosts with neither)"
            out[controller] = Layer(name, False, why)
            continue
        try:
            factory = CgroupFactory(
                root if controller == "memory" else None, root if controller == "pids" else None
            )
            factory.create(64 << 20, 8).remove(float("inf"))
        except (CgroupError, OSError) as exc:
            out[controller] = Layer(name, False, f"{root} is not writable: {exc}")
            continue
        usable[controller] = root
    candidate = replace(base, memory_cgroup=usable.get("memory"), pids_cgroup=usable.get("pids"))
    where = {c: f"cgroup v1: a fresh group per test under {root}" for c, root in usable.items()}
    return _joined(base, candidate, where, out)


def _cgroup_v2_layers(base: Layers, group: Path) -> tuple[Layers, list[Layer]]:
    """Prepare this process's v2 domain (it moves into a leaf; see :mod:`~.cgroups_v2`) and probe it."""
    domain = cgroups_v2.domain_of(group)
    try:
        active = cgroups_v2.prepare(group)
        factory = cgroups_v2.CgroupV2Factory(domain, active)
        factory.create(64 << 20, 8).remove(float("inf"))
    except (CgroupError, OSError) as exc:
        return base, [Layer(f"cgroup_{c}", False, str(exc)) for c in CONTROLLERS]
    out = {
        c: Layer(f"cgroup_{c}", False, f"cgroup v2: {domain}/cgroup.controllers does not offer {c}")
        for c in CONTROLLERS
        if c not in active
    }
    candidate = replace(base, cgroup_v2=domain, cgroup_v2_controllers=active)
    where = {c: f"cgroup v2: a fresh group per test under {domain}" for c in active}
    return _joined(base, candidate, where, out)


def _joined(
    base: Layers, candidate: Layers, where: dict[str, str], out: dict[str, Layer]
) -> tuple[Layers, list[Layer]]:
    """Probe ``candidate``; the controllers in ``where`` are active when the program ran in a test group
    (``asyncroll-<pid>-<n>``: on v2 the worker's own leaf ``asyncroll-<pid>`` does not count)."""
    if not where:
        return base, [out[c] for c in CONTROLLERS]
    facts, why = _probe(candidate)
    joined = bool(facts) and re.search(rf"{PREFIX}\d+-\d+", str(facts and facts["cgroup"])) is not None
    for controller, detail in where.items():
        name = f"cgroup_{controller}"
        if joined:
            out[controller] = Layer(name, True, detail)
        else:
            out[controller] = Layer(name, False, f"probe failed: {why or 'the program was not in the group'}")
    return (candidate if joined else base), [out[c] for c in CONTROLLERS]


@functools.cache
def detect() -> IsolationReport:
    """Probe every layer (about 0.2 s, once per process) and return the frozen report."""
    root = os.geteuid() == 0
    base = Layers(python=os.path.realpath(sys.executable))
    base, uid_layer = _uid_layer(root, base)
    layers = [uid_layer]
    binding = root is False or uid_layer.active
    layers.append(
        Layer(
            "rlimits",
            binding,
            "address space, CPU, file size, open files, processes, core"
            + ("" if binding else ": set, but they do not bind a program running as root"),
        )
    )
    base, namespace_layers = _namespace_layers(base)
    layers += namespace_layers
    base, cgroup_layers = _cgroup_layers(base)
    layers += cgroup_layers
    facts, why = _probe(base)  # everything together, as programs will run
    denied = bool(facts and facts["keys_denied"])
    detail = (
        "seccomp: add_key, request_key, keyctl fail with EPERM" if denied else f"not denied: {why or facts}"
    )
    layers.append(Layer("kernel_keys_denied", denied, detail))
    version = str(facts["python_version"]) if facts else None
    bwrap = shutil.which("bwrap")
    layers.append(
        Layer(
            "bubblewrap",
            False,
            f"installed at {bwrap}, not used: unshare provides the same namespaces"
            if bwrap
            else "not installed (not required: unshare provides the namespaces)",
        )
    )
    return IsolationReport(tuple(layers), base, root, version)


def scratch_problem() -> str | None:
    """Why no folder can be made for the probe's and the evaluations' scratch files (tempfile finds no
    usable temporary directory: a read-only /tmp, TMPDIR missing or read-only), or ``None``."""
    try:
        tempfile.gettempdir()
    except OSError as exc:
        return (
            f"untrusted code needs a folder for its scratch files: {exc.strerror or exc}; "
            "set TMPDIR to a folder this user may write in"
        )
    return None


def require(allow_weak: bool = False) -> IsolationReport:
    """The detected report; raises :class:`IsolationError` naming every missing required layer unless
    ``allow_weak`` is true, or when there is no temporary folder for the probe's and the evaluations'
    scratch files (a read-only /tmp and a TMPDIR missing or read-only: tempfile's traceback before)."""
    no_scratch = scratch_problem()
    if no_scratch is not None:
        raise IsolationError(no_scratch)
    report = detect()
    if report.missing and not allow_weak:
        details = {layer.name: layer.detail for layer in report.layers}
        lines = [
            f"  {name}: {details.get(name, 'not detected')}\n    without it: {LOSSES.get(name, 'unknown')}"
            for name in report.missing
        ]
        raise IsolationError(
            "untrusted code cannot be isolated on this machine; missing layers:\n"
            + "\n".join(lines)
            + "\nrun as root on Linux with util-linux and writable memory/pids cgroups (v1, or a v2 group of "
            "asyncroll's own), or pass --allow-weak-isolation (allow_weak_isolation=True from Python) "
            "to run with the layers that work"
        )
    return report


def isolation_report(allow_weak: bool = False) -> dict[str, Any]:
    """The report as a plain dict for ``run.json`` (``allowed_weak`` says whether weakness was accepted)."""
    report = detect()
    return {**report.to_dict(), "allowed_weak": allow_weak}


def main() -> int:
    """``python -m asyncroll.evaluator.isolation [--allow-weak]``: print the report as JSON; exit 1 when
    a required layer is missing (and weakness was not allowed)."""
    allow_weak = "--allow-weak" in sys.argv[1:]
    no_scratch = scratch_problem()
    if no_scratch is not None:
        print(f"error: {no_scratch}", file=sys.stderr)
        return 1
    report = isolation_report(allow_weak)
    print(json.dumps(report, indent=2))
    return 1 if report["weak"] and not allow_weak else 0


if __name__ == "__main__":
    sys.exit(main())
