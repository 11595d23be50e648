"""Orphans of dead workers: the runtime adopts them and kills them by the origin they inherited.

A live worker is a child subreaper, so whatever a tool detaches (``setsid -f``, a double fork, a child
in a session of its own) stays in the tree that is killed with the worker. Once the worker itself is
dead (a crash, a kill from outside, SIGKILL after a timeout) its children are re-parented to the
nearest subreaper above it. While a pool runs process workers the runtime is one (:class:`Adopter`,
restored after), so they come to the runtime, not to init, and their parentage is lost then. Each
worker is therefore spawned with a unique :data:`ORIGIN_ENV` in its environment (the idea of
:mod:`asyncroll.experiment.orphans`' ``ASYNCROLL_EXPERIMENT_ORIGIN``), which everything it starts
inherits, detached or not: after a worker's tree is killed, the pool kills the runtime's children that
carry that worker's origin (their process groups and descendants too) and reaps them.

Only the runtime's own children are looked at, and never one in the runtime's session (a worker and all
it starts are in sessions of their own, so no descendant of a worker is there), one that was already a
child when the pool started, or a worker: a model server or a probe the runtime started is never
touched. An adopted process that carries no origin (its environment was replaced or cleared, or cannot
be read) cannot be attributed, nor can a zombie outside every worker's session: they are left alone,
since a child of the runtime that no worker's origin names may belong to another part of the program
(a server it started in a session of its own); one still alive when the runtime exits goes to init.
Exited adopted processes the pool killed, that a worker's kill signalled (descendants in sessions of
their own die after the worker, as the runtime's zombies), that a dead worker's last job reply named
(its children outside its process group: in sessions of their own, their environment gone once they
exit) or of a worker's session are reaped whenever the pool sweeps.
Reaping waits for one known pid at a time (``WNOHANG``), never for any child: asyncio's child watcher
waits only for the pids it spawned and is not disturbed.

None of this runs per job: only when a worker is replaced and when the pool closes. Elsewhere than
Linux there is no child subreaper and no ``/proc``: nothing is adopted and the sweeps find nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
from collections.abc import Collection

import psutil

from asyncroll.proctree import (
    all_gone,
    children,
    descendants,
    environ,
    hold_subreaper,
    reap,
    release_subreaper,
    signal_tree,
    state,
)

ORIGIN_ENV = "ASYNCROLL_WORKER_ORIGIN"
"""Inherited by everything a worker starts: tells which worker an orphan the runtime adopted came from."""
GRACE_S = 0.2
"""Adopted processes still running this long after SIGTERM get SIGKILL (as a worker's tree does)."""
LIMIT_S = 2.0
"""A sweep gives up waiting this long after SIGKILL; the pool's close sweeps again."""
_POLL_S = 0.01


def new_origin(index: int, generation: int) -> str:
    """A worker's origin: unique to it (this process's pid, its slot and generation, and a random part)."""
    return f"{os.getpid()}:{index}:{generation}:{secrets.token_hex(6)}"


class Adopter:
    """While open, this process is a child subreaper, so it adopts what dead workers leave behind;
    :meth:`sweep` kills those attributed to given workers (or, at close, every adopted one)."""

    def __init__(self) -> None:
        self._before = children()  # never touched: they are not adopted from workers of this pool
        self._session = os.getsid(0)
        self.origins: set[str] = set()
        """The origins given to this pool's workers, less those a sweep found no process to carry any more."""
        self.killed = 0
        """Adopted processes killed so far."""
        self._sessions: set[int] = set()  # workers' sessions (a worker leads its own) still with members
        self._signalled: set[int] = set()  # adopted processes signalled and not yet reaped: ours to reap
        self._reaped: set[int] = set()  # reaped by this sweep: their pids may belong to anyone now
        self.doomed: set[int] = set()
        """Pids a worker's kill signalled (its descendants): whichever of them end as the runtime's
        zombies (in sessions of their own, they die after the worker) are reaped by the next sweep."""
        self.named: set[int] = set()
        """Children outside its process group that a dead worker's last reply named: whichever of them
        is the runtime's zombie at the next sweep is reaped (not waited for, unlike :attr:`doomed`); the
        sweep then forgets them. One still running then carries its worker's origin (killed and reaped
        like any) or none (left, as the module says)."""
        self._open = True
        hold_subreaper()

    @property
    def open(self) -> bool:
        return self._open

    async def sweep(
        self,
        origins: Collection[str],
        workers: Collection[int],
        *,
        grace: float = GRACE_S,
    ) -> int:
        """Kill the adopted processes that carry one of ``origins`` with their groups and descendants:
        SIGTERM, then SIGKILL to what is left after ``grace`` seconds; reap them, and any adopted zombie
        of a worker's session. ``workers`` are the pids of the pool's workers (never touched). Returns
        how many adopted processes were signalled."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        self._reaped = set()
        signalled: dict[int, list[psutil.Process]] = {}
        signum = signal.SIGTERM
        while True:
            live = self._scan(origins, set(workers))
            for pid in live:
                if pid not in signalled:
                    signalled[pid] = _tree(pid)
                    self._signalled.add(pid)
                    _signal(pid, signum, signalled[pid])
            everything = [p for tree in signalled.values() for p in tree]
            dying = self.doomed & children()  # killed with a worker, not yet reaped
            if not live and all_gone(everything) and not dying:
                self.origins.difference_update(origins)  # nothing carries them: none can again
                break
            now = loop.time()
            if signum == signal.SIGTERM and now >= started + grace:
                signum = signal.SIGKILL
                for pid, tree in signalled.items():
                    if pid in self._reaped:
                        continue  # gone and reaped: the pid is free for anyone
                    tree += descendants(pid)  # started since it was signalled
                    _signal(pid, signum, tree)
            elif now >= started + grace + LIMIT_S:
                break
            await asyncio.sleep(_POLL_S)
        if signalled or self.doomed or self.named:
            self._scan((), set(workers))  # reap what died after the last look
        self.named.clear()  # a pid kept longer could be another process's by the next sweep
        self._forget_the_gone()
        self.killed += len(signalled)
        return len(signalled)

    def close(self) -> None:
        """Stop adopting (the subreaper flag as it was before the pool, unless another pool holds it)."""
        if self._open:
            self._open = False
            release_subreaper()

    def _forget_the_gone(self) -> None:
        """Forget pids that can no longer matter (the sets would grow with every restart of a long run):
        a signalled or doomed one no process has now (reaped by whoever was its parent: its pid is free
        for anyone)."""
        self._signalled = {pid for pid in self._signalled if state(pid) is not None}
        self.doomed = {pid for pid in self.doomed if state(pid) is not None}

    def _scan(self, origins: Collection[str], workers: set[int]) -> list[int]:
        """Adopted children to kill: running ones that carry one of ``origins``. Zombies are reaped on
        the way when they are ours to reap: signalled by a sweep, or still in a worker's session (its
        environment unreadable once it exited). Anything else is left to whoever started it: a child of
        this process that no worker's origin or session names may be another part of the program's.

        A dead worker's session is forgotten once no child of this process is in it: a session gains no
        members, and each of its live members descends, through members, from its leader, so once the
        leader is dead they are this process's children or below them."""
        self._sessions |= workers
        found = []
        occupied = set(workers)
        for pid in sorted(children() - self._before - workers):
            info = state(pid)
            if info is None or info[2] == self._session:
                continue  # gone, or started by this process itself (a worker's tree has its own sessions)
            occupied.add(info[2])
            if info[0] in ("Z", "X"):
                ours = pid in self._signalled or pid in self.doomed or pid in self.named
                if (ours or info[2] in self._sessions) and reap(pid):
                    self._reaped.add(pid)
                    self._signalled.discard(pid)
                    self.doomed.discard(pid)
                    self.named.discard(pid)
                continue
            env = environ(pid)
            if env is not None and env.get(ORIGIN_ENV) in origins:
                found.append(pid)
        self._sessions &= occupied
        return found


def _tree(pid: int) -> list[psutil.Process]:
    try:
        return [psutil.Process(pid), *descendants(pid)]
    except psutil.Error:
        return []


def _signal(pid: int, signum: int, tree: list[psutil.Process]) -> None:
    """Signal an adopted process's group, the process and its descendants. The group is one of a
    worker's sessions (never the runtime's): a worker's descendants and theirs are all it can hold."""
    info = state(pid)
    signal_tree(info[1] if info is not None else pid, signum, tree)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)  # an unreaped child of ours: its pid cannot have been reused
