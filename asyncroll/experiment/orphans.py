"""The processes an arm leaves behind: what a started server or client detached, and what a runner that
died left running, found and killed.

Orphans are attributed to the process they descend from. The runner is a child subreaper, so what a
server or a client detaches (``setsid -f``, a double fork) is re-parented to the runner, and its parentage
is lost then. Each started process therefore gets a random ``ASYNCROLL_EXPERIMENT_ORIGIN`` in its
environment, which everything it starts inherits, detached or not: its stop kills the adopted orphans
that carry its origin and lists them as its own. An adopted process that carries no origin of ours (it
cleared its environment) cannot be attributed; the server's stop, the arm's last, kills it all the same
and keeps it apart.

A runner that was killed adopts nothing more: what its server or client had detached was re-parented to
init (or the nearest other subreaper). ``sweep_orphan``, on ``--resume``, finds those by the origin the
dead runner recorded, as well as the recorded process group and tree.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

import psutil

from asyncroll.proctree import all_gone, children, descendants, environ, reap, same_process, signal_tree

#: Inherited by everything a started process starts: tells whose an orphan the runner adopted is.
ORIGIN_ENV = "ASYNCROLL_EXPERIMENT_ORIGIN"


def sweep_orphan(record: dict[str, Any] | None, grace_s: float = 5.0) -> str:
    """Kill what a runner that died left of one recorded process: its group and tree, if its leader is
    still the same process, and every process carrying its origin (what it had detached, re-parented to
    init when the runner died, out of its group and tree; what outlived the leader in its group). Says
    what was found.

    A leader that is gone is never taken for its group: its pid, and so its group id, may be another
    process's now (a reboot, pid reuse), and a ``killpg`` of that id killed an unrelated process group."""
    if not record or (record.get("pid") is None and not record.get("origin")):
        return "none recorded"
    # only its origin: the runner died between the spawn and its record of the process
    pid = record.get("pid")
    if pid is None:
        outcome = "no pid recorded"
    elif isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:  # a hand-edited arm.json
        outcome = f"pid not readable ({str(pid)[:40]!r})"
    else:
        outcome = _sweep_leader(pid, record, grace_s)
    left = carrying(record.get("origin"))
    if left:
        killed = kill_adopted(left, grace_s)
        named = ", ".join(f"pid {k['pid']} ({k['command']})" for k in killed)
        outcome += f"; killed what carried its origin: {named}"
    return outcome


def _sweep_leader(pid: int, record: dict[str, Any], grace_s: float) -> str:
    # none recorded: nothing proves the pid is still ours; a wall-clock step since the record moves
    # create_time, not the start mark (a record from before marks has only create_time)
    if not same_process(pid, record.get("start_mark"), record.get("create_time")):
        return "gone"  # what outlived it in its group carries its origin: found by sweep_orphan
    try:
        proc = psutil.Process(pid)
    except psutil.Error:
        return "gone"
    tree = [proc, *descendants(pid)]
    signal_tree(pid, signal.SIGTERM, tree)
    deadline = time.monotonic() + grace_s
    while not all_gone(tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    signal_tree(pid, signal.SIGKILL, tree)
    with contextlib.suppress(psutil.Error):
        proc.wait(5.0)  # reaps it only if we are its parent; otherwise init does
    return "killed"


def carrying(origin: str | None) -> list[psutil.Process]:
    """Every live process, other than this one, whose environment carries ``origin`` (a random token
    given to one started process, so only what that process started carries it)."""
    if not origin:
        return []
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            mine = proc.pid != os.getpid() and origin_of(proc.pid) == origin
            if mine and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def origin_of(pid: int) -> str | None:
    """The ``ORIGIN_ENV`` a process inherited (None: none, or its environment cannot be read)."""
    env = environ(pid)
    return None if env is None else env.get(ORIGIN_ENV)


def adopted_from(origin: str | None, exclude: int) -> list[psutil.Process]:
    """The runner's live children, other than ``exclude``, that carry ``origin``: orphans of that process
    (or of its descendants) re-parented to the runner. Nothing is reaped here: a child that is not one of
    these (the server, while the client's orphans are looked for) is not this function's to wait for."""
    if origin is None:
        return []
    found = []
    for pid in sorted(children() - {exclude}):
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if origin_of(pid) == origin:
                found.append(proc)
    return found


def adopted_orphans(known: set[int]) -> list[psutil.Process]:
    """The runner's children that it did not start (``known`` holds those it did, or that were already
    there): orphans of the server or the client re-parented to the runner. Exited ones are reaped."""
    found = []
    for pid in sorted(children() - known):
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                reap(pid)
                continue
            found.append(proc)
        except psutil.Error:
            reap(pid)
    return found


def kill_adopted(orphans: list[psutil.Process], grace_s: float) -> list[dict[str, Any]]:
    """TERM each adopted orphan and its descendants, KILL what is left after ``grace_s``, reap them."""
    records = []
    for proc in orphans:
        with contextlib.suppress(psutil.Error):
            record: dict[str, Any] = {"pid": proc.pid, "command": " ".join(proc.cmdline())[:300]}
            origin = origin_of(proc.pid)
            if origin is not None:
                record["origin"] = origin
            records.append(record)
    trees = {proc.pid: [proc, *descendants(proc.pid)] for proc in orphans}
    for leader, tree in trees.items():
        signal_tree(leader, signal.SIGTERM, tree)
    everything = [p for tree in trees.values() for p in tree]
    deadline = time.monotonic() + grace_s
    while not all_gone(everything) and time.monotonic() < deadline:
        for proc in orphans:
            reap(proc.pid)
        time.sleep(0.05)
    for leader, tree in trees.items():
        signal_tree(leader, signal.SIGKILL, tree)
    for proc in orphans:
        with contextlib.suppress(psutil.Error):
            proc.wait(5.0)  # our child now: this reaps it
    for record in records:
        record["killed"] = True
    return records
