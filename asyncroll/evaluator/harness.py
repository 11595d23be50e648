"""The harness that runs inside the sandbox: one program on one test, verdict facts on a status pipe.

Not imported by asyncroll: :mod:`asyncroll.evaluator.sandbox` passes this file's *source* to
``python -I -c`` with one JSON argument, so the sandboxed interpreter needs no access to the package
(which may live where the unprivileged user cannot read) and imports nothing from it. Stdlib only; it
must run on the sandbox's interpreter, which may be a different 3.x than the runtime's.

Steps, in order:

1. read the program (still root when the sandbox switches uid, so the file can stay private);
2. in a fresh mount namespace, build a private root (a tmpfs with read-only system directories, a
   fresh ``/proc``, a minimal ``/dev``, a writable ``/tmp``) and ``chroot`` into it, working in
   ``/tmp/work``: the program sees no host file outside the system directories, can write only to
   its tmpfs, and whatever it writes vanishes with the namespace;
3. drop to the unprivileged uid/gid (supplementary groups cleared);
4. fork the program's process and wait for it. In a PID namespace the harness is PID 1, so the
   program cannot kill it; once that process has ended the harness kills and reaps every process left
   in the namespace (so their CPU time is counted), and when the harness exits the kernel kills
   whatever remains — descendants that called ``setsid`` included;
5. the program's process runs the code with the modules LiveCodeBench's harness pre-imports in scope,
   its recursion limit (50,000) and its limit on int ↔ str conversion (50,000 digits, which
   LiveCodeBench's metrics module sets) — as ``__main__`` in stdin mode (a script; LiveCodeBench
   wraps its statements in a function instead, see :mod:`~asyncroll.evaluator.evaluate` for what that
   changes), as the module ``tmp_sol`` in functional mode (LiveCodeBench execs a call-based solution
   in a ``tmp_sol`` module, so an ``if __name__ == "__main__":`` test block in it does not run, and calls
   ``Solution().<func_name>`` when the program's text holds ``class Solution``, else its module-level
   function ``<func_name>``, as LiveCodeBench's ``compile_code`` does) — and reports one ``done``
   record; the harness writes an ``exit`` record with the program process's wait status on an fd of
   its own, which the program's process closes before running any code, so a program running as
   another uid (the uid switch) cannot forge how it ended. (Under weak isolation, without the switch, a
   program of the worker's own uid could still reopen the worker's end of that pipe through ``/proc``.)
   Records are JSON lines on those fds, never on stdout, because stdout is the program's answer.
   Before the code runs, a seccomp filter refuses the kernel-keyring calls (``add_key``,
   ``request_key``, ``keyctl``): the ``nobody`` user's keyring outlives a test, so it would otherwise
   carry data from one program to another (IPC objects do not: the sandbox gives each test its own
   IPC namespace). The records' format: :mod:`~asyncroll.evaluator.execution`, which reads them.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

# The names LiveCodeBench's harness puts in scope before running a solution (its ``import_string``).
_PRELUDE = "string re datetime collections heapq bisect copy math random statistics itertools functools"
PRELUDE_MODULES = (*_PRELUDE.split(), "operator", "io", "sys", "json", "builtins", "typing")
# The names its header then binds to the modules themselves (``import m``): neither ``builtins`` nor
# ``typing``, so a program naming ``typing.List`` without importing it fails there and here alike.
PRELUDE_MODULE_NAMES = tuple(name for name in PRELUDE_MODULES if name not in ("builtins", "typing"))
RECURSION_LIMIT = 50000
#: LiveCodeBench's metrics module raises Python's limit on int <-> str conversion (4,300 digits) to this
#: before it runs any test, so a program may print or parse ints of up to 50,000 digits there.
INT_MAX_STR_DIGITS = 50000
FUNCTIONAL_MODULE = "tmp_sol"  # LiveCodeBench's module name for a call-based solution
ERROR_LIMIT = 4000
WRITE_CHUNK = 1 << 20  # bytes of a record written at a time (see _write)
TRACE_FRAMES = 64  # innermost frames formatted: a runaway recursion has ~RECURSION_LIMIT of them
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
#: Per machine: the seccomp audit architecture and the numbers of add_key, request_key and keyctl.
KEY_SYSCALLS = {"x86_64": (0xC000003E, (248, 249, 250)), "aarch64": (0xC00000B7, (217, 218, 219))}


def _prelude(namespace: dict[str, Any]) -> None:
    """``from m import *`` for each prelude module, then ``import m`` for those of
    :data:`PRELUDE_MODULE_NAMES`, as LiveCodeBench does."""
    import importlib

    for name in PRELUDE_MODULES:
        module = importlib.import_module(name)
        public = getattr(module, "__all__", None)
        if public is None:
            public = [n for n in vars(module) if not n.startswith("_")]
        for attr in public:
            if hasattr(module, attr):
                namespace[attr] = getattr(module, attr)
    for name in PRELUDE_MODULE_NAMES:
        namespace[name] = sys.modules[name]
    sys.setrecursionlimit(RECURSION_LIMIT)


def _set_digit_limit(digits: int) -> None:
    """Python's limit on int <-> str conversion (an interpreter older than the limit has none to set)."""
    setter = getattr(sys, "set_int_max_str_digits", None)
    if setter is not None:
        setter(digits)


def _write(fd: int, line: str) -> None:
    """Write one record (its JSON text) and a newline to ``fd``, a slice at a time: a functional result's
    record may be hundreds of MiB, and a whole copy of it (with its newline, then as bytes) could take
    the address space that the program's value and its JSON left (a MemoryError here, outside the
    program's verdict). The JSON is ASCII, so no character is split between slices."""
    for start in range(0, len(line), WRITE_CHUNK):
        data = line[start : start + WRITE_CHUNK].encode()
        while data:
            data = data[os.write(fd, data) :]
    os.write(fd, b"\n")


def _mount(
    libc: Any, source: str | None, target: str, fstype: str | None, flags: int, data: str = ""
) -> None:
    import ctypes

    encoded = [x.encode() if x is not None else None for x in (source, target, fstype)]
    if libc.mount(encoded[0], encoded[1], encoded[2], flags, data.encode() or None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def _private_root(size: int, uid: int | None, gid: int | None) -> None:
    """Build a fresh root in a tmpfs and ``chroot`` into it (we are root in a private mount namespace).

    The new root holds read-only binds of the system directories the interpreter needs (and of its
    prefix when it lives elsewhere), a fresh ``/proc`` of the PID namespace, a minimal ``/dev`` and a
    writable ``/tmp`` with the work directory. Nothing else of the host — repositories, workloads with
    hidden tests, home directories, sockets under ``/run`` — is reachable once the uid is dropped
    (leaving a ``chroot`` needs a privilege the program does not have).
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    new = "/tmp"
    _mount(libc, "tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=755")
    binds = [d for d in SYSTEM_DIRS if os.path.lexists(d)]
    for prefix in {sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))}:
        real = os.path.realpath(prefix)
        if not any(real == d or real.startswith(d + "/") for d in binds):
            binds.append(real)
    for path in binds:
        target = new + path
        if os.path.islink(path):
            os.symlink(os.readlink(path), target)
            continue
        os.makedirs(target, exist_ok=True)
        _mount(libc, path, target, None, MS_BIND | MS_REC)
        _mount(libc, None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.mkdir(new + "/proc")
    _mount(libc, "proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.mkdir(new + "/dev")
    for device in ("null", "zero", "full", "random", "urandom"):
        with open(f"{new}/dev/{device}", "w"):
            pass
        _mount(libc, f"/dev/{device}", f"{new}/dev/{device}", None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):  # fmt: skip
        os.symlink(target, f"{new}/dev/{name}")
    for path in ("/tmp", "/dev/shm", "/var/tmp"):
        os.makedirs(new + path, exist_ok=True)
        os.chmod(new + path, 0o1777)
    os.mkdir(new + "/tmp/work", 0o700)
    if uid is not None and gid is not None:
        os.chown(new + "/tmp/work", uid, gid)
    os.chroot(new)
    os.chdir("/tmp/work")


def _plain(value: Any) -> Any:
    """``value`` as JSON if it can equal a JSON-decoded value under ``==``; else raise ``TypeError``."""
    kind = type(value)
    if value is None or kind in (bool, str, int, float):
        return value
    # A subclass (``IntEnum``, ``Counter``, ``class S(str)``) equals its plain content under LCB's ``==``:
    # sent as read by the base type's own methods, as that ``==`` reads it (not an overridden ``__int__``).
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, list):
        return [_plain(v) for v in list.__iter__(value)]
    if isinstance(value, dict) and all(isinstance(k, str) for k in dict.__iter__(value)):
        plain = {str.__str__(k): _plain(dict.__getitem__(value, k)) for k in dict.__iter__(value)}
        if len(plain) != dict.__len__(value):  # keys that only their own __eq__/__hash__ kept apart
            raise TypeError(kind.__name__)
        return plain
    from collections import UserDict, UserList, UserString  # only here: _plain runs once per element
    from numbers import Number  # Fraction, Decimal, complex; numpy's bool_ is none, yet == True

    if isinstance(value, (UserList, UserDict, UserString)):  # a tuple: the sandbox's Python may be older
        return _plain(value.data)  # what their ``==`` compares
    for plain_type in (int, float) if isinstance(value, Number) or kind.__module__ == "numpy" else ():
        try:  # a NaN or infinity as an int, a signalling NaN, a registered Number without .real: not sent
            if plain_type is int and getattr(value, "adjusted", int)() >= INT_MAX_STR_DIGITS:  # a Decimal
                continue  # past the digit limit: as an int, Decimal('1e1000000') took 34 s to convert
            candidate = plain_type(value.real)  # a complex's real part; the others' own value
        except Exception:  # noqa: BLE001 - whatever the program's own methods raise: judged wrong, not an error
            continue
        if candidate == value:  # exactly, as LiveCodeBench's ``==`` compares it with the expected value
            return candidate
    raise TypeError(kind.__name__)


def _shown(value: Any) -> str:
    """``repr(value)`` cut to :data:`ERROR_LIMIT`, or what it is when even that fails: an int past the
    interpreter's digit limit for str conversion (at any depth) has no ``repr`` and no JSON text. No JSON
    value the worker reads can hold such an int either, so the result can never match."""
    try:
        return repr(value)[:ERROR_LIMIT]
    except ValueError as exc:
        return f"<{type(value).__name__} that cannot be shown: {exc}>"


def _error(exc: BaseException) -> str:
    """The traceback without the harness's own frames (its code has the file name ``<string>``), its
    innermost :data:`TRACE_FRAMES` frames only: formatting the ~50,000 frames of a runaway recursion took
    seconds, enough to turn a runtime error into a time-limit verdict."""
    import traceback

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
        tb = tb.tb_next
    depth, node = 0, tb
    while node is not None:
        depth, node = depth + 1, node.tb_next
    for _ in range(depth - TRACE_FRAMES):  # skipped here: the traceback module inspects every frame
        tb = tb.tb_next if tb is not None else None
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return text[-ERROR_LIMIT:]


def _register_source(code: str) -> None:
    """Let tracebacks show the program's lines: ``solution.py`` is not a file inside the sandbox, and a
    missing file was also searched for along ``sys.path`` once per frame."""
    import linecache

    linecache.cache["solution.py"] = (len(code), None, code.splitlines(True), "solution.py")


def _entry_point(code: str, namespace: dict[str, Any], func_name: str) -> Any:
    """What a functional test calls, as LiveCodeBench's ``compile_code`` finds it: ``Solution().<func_name>``
    when the program's text holds ``class Solution``, else the module-level function ``<func_name>``."""
    if "class Solution" in code:
        solution = namespace.get("Solution")
        if solution is None:
            raise NameError("the program defines no class Solution")
        return getattr(solution(), func_name)
    function = namespace.get(func_name)
    if function is None:
        raise NameError(f"the program defines no class Solution and no function {func_name}")
    return function


def _run_program(code: str, config: dict[str, Any], status_fd: int) -> None:
    func_name = config.get("func_name")
    if func_name:
        # LiveCodeBench's call-based grading execs the code in ``ModuleType("tmp_sol")``: not ``__main__``,
        # so a ``unittest.main()`` or ``input()`` block under ``if __name__ == "__main__":`` stays out.
        # Registered, so that ``dataclasses``, ``pickle`` and ``typing`` can find the module.
        module = type(sys)(FUNCTIONAL_MODULE)
        sys.modules[FUNCTIONAL_MODULE] = module
        namespace: dict[str, Any] = vars(module)
        namespace["__builtins__"] = __builtins__
        # LiveCodeBench judges the returned value and never reads stdout: debugging prints go to
        # /dev/null, so they cannot reach the stdout cap and turn a right answer into a verdict.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    else:
        namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    sys.argv = ["solution.py"]
    line: str  # the done record's JSON, built inside the try: a result can fail to encode
    try:
        args = None
        # before the arguments are read: LiveCodeBench reads them under its limit too (the worker's
        # checks read them under it, and read the done record under it)
        _set_digit_limit(INT_MAX_STR_DIGITS)
        if func_name:
            lines = sys.stdin.read().split("\n")
            args = [json.loads(line) for line in lines if line.strip()]
        _prelude(namespace)
        # dont_inherit: the harness's own ``from __future__ import annotations`` stays out of the program
        compiled = compile(code, "solution.py", "exec", dont_inherit=True)
        _register_source(code)
        if func_name:
            exec(compiled, namespace)
            method = _entry_point(code, namespace, str(func_name))
            result = method(*(args or []))
            if isinstance(result, tuple):
                result = list(result)  # LiveCodeBench forgives a top-level tuple
            sys.stdout.flush()
            # No expected value holds an int past LiveCodeBench's limit (the worker reads records under
            # it): such a result is shown as one that can never match, not written as a record the worker
            # could not read. The program may have changed the limit: set it again.
            _set_digit_limit(INT_MAX_STR_DIGITS)
            try:
                line = json.dumps({"kind": "done", "ok": True, "result": _plain(result)})
            except (TypeError, RecursionError, ValueError):  # ValueError: an int past the digit limit
                line = json.dumps({"kind": "done", "ok": True, "unrepresentable": _shown(result)})
            except MemoryError:  # its JSON does not fit beside it under the address-space limit
                line = json.dumps({"kind": "done", "ok": True, "too_large": True})
        else:
            # LiveCodeBench swallows SystemExit: exit(…) after printing is a normal end. (No
            # contextlib here: every import is paid once per test.)
            try:  # noqa: SIM105
                exec(compiled, namespace)
            except SystemExit:
                pass
            sys.stdout.flush()
            line = json.dumps({"kind": "done", "ok": True})
    except BaseException as exc:  # noqa: BLE001 - every failure of the program is its verdict
        method = result = args = None  # a Solution instance, arguments the program grew: with the rest
        _let_go(namespace, exc)
        try:
            line = json.dumps({"kind": "done", "ok": False, "error": _error(exc)})
        except BaseException:  # noqa: BLE001 - formatting ran out too: the error's type and message
            said = f"{type(exc).__name__}: {str(exc)[:ERROR_LIMIT]}"[:ERROR_LIMIT]  # the message may be huge
            line = json.dumps({"kind": "done", "ok": False, "error": said})
    _write(status_fd, line)


def _let_go(namespace: dict[str, Any], exc: BaseException | None) -> None:
    """Free what a failed program holds (globals, the locals in its error's frames and in those of the errors
    it came from) before formatting its error: out of memory or descriptors, that failed too."""
    namespace.clear()
    for _ in range(100):  # bounded: a program can make a cycle of __cause__ or __context__
        tb, exc = (exc.__traceback__, exc.__cause__ or exc.__context__) if exc is not None else (None, None)
        while tb is not None:
            if tb.tb_frame.f_code.co_filename != "<string>":  # not the harness's own, still running
                try:  # noqa: SIM105 - no contextlib import in the harness: paid once per test
                    tb.tb_frame.clear()
                except RuntimeError:  # a frame still executing
                    pass
            tb = tb.tb_next


def deny_kernel_keys() -> bool:
    """Install a seccomp filter on this process (and what it starts) that fails ``add_key``,
    ``request_key`` and ``keyctl`` with ``EPERM`` and allows everything else; False where this machine's
    architecture is not known here or the kernel refuses the filter. Every call through another ABI (a
    32-bit call on a 64-bit machine, x32's numbers with bit 30 set) fails too: under other numbers it
    could reach the same calls, and no Python program makes one."""
    import ctypes
    import platform
    import struct

    known = KEY_SYSCALLS.get(platform.machine())
    if known is None:
        return False
    arch, numbers = known
    ld_w_abs, jeq_k, jge_k, ret_k = 0x20, 0x15, 0x35, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    # Instructions: (code, jump if true, jump if false, k); a jump skips that many instructions.
    n = len(numbers)
    program = [
        (ld_w_abs, 0, 0, 4),  # the call's audit architecture
        (jeq_k, 0, n + 3, arch),  # another architecture's call (a 32-bit one on a 64-bit machine): deny
        (ld_w_abs, 0, 0, 0),  # the call's number
        (jge_k, n + 1, 0, 0x40000000),  # another ABI of this machine: deny
        *((jeq_k, n - i, 0, number) for i, number in enumerate(numbers)),
        (ret_k, 0, 0, allow),
        (ret_k, 0, 0, deny),
    ]
    filters = b"".join(struct.pack("HBBI", *instruction) for instruction in program)
    buffer = ctypes.create_string_buffer(filters, len(filters))

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = Program(len(program), ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    return bool(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0)


def _stay_tied(lifeline_fd: int) -> None:
    """Die with the launcher: (re-)arm ``PR_SET_PDEATHSIG`` — changing uid cleared the one ``unshare
    --kill-child`` set — then exit if the worker already went away (its end of the lifeline pipe is
    closed), which closes the window before the signal was armed. The program never sees the fd."""
    import ctypes
    import select

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    # Not dumpable: a program of the same uid (no uid switch) cannot open this process's fds through
    # /proc or ptrace it (dropping root already does this). The worker's own fds stay reachable to such a
    # program: weak isolation is weak.
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    poller = select.poll()
    poller.register(lifeline_fd, select.POLLIN)
    if poller.poll(0):  # readable means end of file: the worker closed its end or died
        os._exit(1)
    os.close(lifeline_fd)


def main(argv: list[str]) -> int:
    config = json.loads(argv[1])
    status_fd = int(config["status_fd"])
    exit_fd = int(config["exit_fd"])
    # surrogatepass: the evaluator writes a lone surrogate so; compile() then refuses it as the verdict
    with open(str(config["code_path"]), encoding="utf-8", errors="surrogatepass") as source:
        code = source.read()
    uid = config.get("uid")
    gid = config.get("gid")
    if config.get("private_root"):
        _private_root(int(config["tmpfs_bytes"]), uid, gid)
    if uid is not None and gid is not None:
        os.setgroups([])
        os.setgid(int(gid))
        os.setuid(int(uid))
    _stay_tied(int(config["lifeline_fd"]))
    sys.stdout.flush()
    child = os.fork()
    if child == 0:
        try:
            os.close(exit_fd)  # the harness's alone: the program cannot write how it ended
            deny_kernel_keys()
            _run_program(code, config, status_fd)
        finally:
            os._exit(0)
    os.close(status_fd)  # the program's (its done record); the worker reads it to end of file
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as PID 1, a default disposition ignores the program
    while True:
        try:
            pid, status = os.waitpid(-1, 0)  # as PID 1 also reap re-parented orphans
        except ChildProcessError:
            return 0
        if pid == child:
            _write(exit_fd, json.dumps({"kind": "exit", "status": status}))
            _reap_the_rest()
            return 0


def _reap_the_rest() -> None:
    """As PID 1 of the test's namespace, kill and reap what the program left running: the kernel reaps
    what still runs when a namespace's init exits without counting its CPU time, which then never reached
    the worker's account. (Not PID 1, under weak isolation: ``kill(-1)`` would reach the whole uid.)"""
    if os.getpid() != 1:
        return
    while True:  # killed again before each wait: a process forked as the first kill went round
        try:  # noqa: SIM105 - no contextlib import in the harness: paid once per test
            os.kill(-1, signal.SIGKILL)  # every process of the namespace but this one
        except ProcessLookupError:
            pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


if __name__ == "__main__":
    sys.exit(main(sys.argv))
