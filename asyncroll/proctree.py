"""Process trees, as the kernel sees them: this process's children and the child-subreaper flag, a
child's state, session and inherited environment, reaping one child, and signalling a whole tree.

A worker leads its own process group, but a tool (or the code evaluator) may start descendants that
call ``setsid`` and leave the group. Signalling the group *and* every descendant psutil finds reaches
both. On Linux a worker is a child subreaper (:mod:`asyncroll.workers.child`), so a descendant whose
parent exited (a double fork, ``setsid -f``) is re-parented to the worker and still found. Descendants
can only be found this way while the worker lives, so a tree is always signalled before the worker is
reaped; once a worker has died, its children are re-parented to the runtime (a child subreaper while
its pool runs) and found by the origin they inherited (:mod:`asyncroll.workers.orphans`). The sandbox
(:mod:`asyncroll.evaluator.sandbox`) and the experiment runner use the same calls for what they start.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from pathlib import Path

import psutil

PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37


def libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def children() -> set[int]:
    """Pids of this process's children, zombies included (from /proc, without psutil's filtering)."""
    pids: set[int] = set()
    try:
        for task in Path(f"/proc/{os.getpid()}/task").iterdir():
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in (task / "children").read_text().split())
    except OSError:
        return {p.pid for p in psutil.Process().children()}
    return pids


def set_subreaper(on: bool) -> None:
    """Make this process adopt its descendants' orphans (Linux ``prctl``; a no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        libc().prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)


def is_subreaper() -> bool:
    """Whether this process adopts its descendants' orphans (a tool worker always does, on Linux)."""
    flag = ctypes.c_int(0)
    with contextlib.suppress(OSError, AttributeError):
        libc().prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
    return bool(flag.value)


_held = 0
_held_was = False
_hold_lock = threading.Lock()


def hold_subreaper() -> None:
    """Make this process a child subreaper until the matching :func:`release_subreaper`. Holds are
    counted: the flag is restored to what it was before the first when the last is released."""
    global _held, _held_was
    with _hold_lock:
        if _held == 0:
            _held_was = is_subreaper()
            set_subreaper(True)
        _held += 1


def release_subreaper() -> None:
    """Release a :func:`hold_subreaper`; the last one turns the flag off unless it was on before."""
    global _held
    with _hold_lock:
        if _held == 0:
            return
        _held -= 1
        if _held == 0 and not _held_was:
            set_subreaper(False)


def state(pid: int) -> tuple[str, int, int] | None:
    """A process's state letter (``Z``: a zombie awaiting its reaper), process group and session, from
    ``/proc/PID/stat`` (still there for a zombie); ``None`` if it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
        return fields[0].decode(), int(fields[2]), int(fields[3])
    except (OSError, IndexError, ValueError):
        return None


#: A process in the middle of an ``exec`` (just spawned, or a shell exec'ing the server it wraps) shows an
#: empty environment for a moment: a child read right after its spawn was found without its origin
#: one time in six. An empty read of a process younger than this many seconds is tried again until it
#: is that old: one older (a kernel thread, a zombie, an ``env -i`` helper) is read once, and a scan of
#: many processes waits this long at most in all.
EXEC_WINDOW_S = 0.2


def _age(pid: int) -> float:
    """Seconds since ``pid`` started (0 where that cannot be read: a young process is the safe guess)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            ticks = int(stat.read().rpartition(b")")[2].split()[19])  # starttime, since boot
        return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, AttributeError):
        return 0.0


def start_mark(pid: int) -> str | None:
    """Which process holds ``pid``, on no wall clock: the boot's id and the process's start in clock ticks
    since that boot (``/proc``). A process given the pid later, after a reboot too, has another mark, and
    no wall-clock step changes it (psutil's ``create_time`` is the boot time in wall-clock seconds plus
    the start: NTP stepping the clock an hour moves it an hour). None where ``/proc`` cannot tell."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        with open(f"/proc/{pid}/stat", "rb") as stat:
            ticks = int(stat.read().rpartition(b")")[2].split()[19])  # starttime, since boot
    except (OSError, IndexError, ValueError):
        return None
    return f"{boot}:{ticks}"


def same_process(pid: int, mark: object, create_time: object) -> bool:
    """Whether ``pid`` is still the process recorded with ``mark`` (:func:`start_mark`) or, in a record
    made before marks were (or where /proc could not tell), with psutil's ``create_time``."""
    if isinstance(mark, str):
        return start_mark(pid) == mark
    try:
        return (
            isinstance(create_time, int | float)
            and abs(psutil.Process(pid).create_time() - create_time) < 0.01
        )
    except psutil.Error:
        return False


def environ(pid: int) -> dict[str, str] | None:
    """The environment ``pid`` started with (what its ancestors passed on), or ``None`` where it cannot be
    read: gone, a zombie, or another user's. An empty one of a process younger than
    :data:`EXEC_WINDOW_S` is read again until it is that old (an ``exec`` may be under way)."""
    deadline = time.monotonic() + EXEC_WINDOW_S
    while True:
        try:
            with open(f"/proc/{pid}/environ", "rb") as env:
                data = env.read()
        except OSError:
            return None
        if data or time.monotonic() >= deadline or _age(pid) >= EXEC_WINDOW_S:
            break
        time.sleep(0.001)
    pairs = (item.partition(b"=") for item in data.split(b"\0") if item)
    return {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, _, v in pairs}


def reap(pid: int) -> bool:
    """Reap ``pid`` if it is this process's child and has exited; True once it is no child of ours.

    Waits for that one pid only (``WNOHANG``): asyncio's child watcher, which waits for the pids it
    started, is never robbed of a status."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done == pid


def descendants(pid: int) -> list[psutil.Process]:
    """Every live descendant of ``pid`` (empty if ``pid`` is gone)."""
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


def signal_tree(leader: int, signum: int, processes: list[psutil.Process]) -> None:
    """Send ``signum`` to the process group ``leader`` leads and to each of ``processes``.

    A process group id stays reserved while any member lives, so ``killpg`` reaches only our group;
    psutil's ``send_signal`` refuses a pid that was reused by another process meanwhile.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, signum)
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.send_signal(signum)


def all_gone(processes: list[psutil.Process]) -> bool:
    """True when none of ``processes`` still runs (zombies awaiting their reaper count as gone)."""
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                return False
    return True


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU of ``pid`` and of the children it reaped, or ``None`` if unreadable (gone, or
    its /proc file cannot be opened: no descriptor left at ``ulimit -n`` is an OSError, no psutil.Error)."""
    try:
        times = psutil.Process(pid).cpu_times()
    except (psutil.Error, OSError):
        return None
    return float(times.user + times.system + times.children_user + times.children_system)
