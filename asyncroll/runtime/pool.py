"""The worker pool: the one limiter of CPU concurrency (``cpu_workers``).

It owns N worker slots. A slot is *idle* (ready for a job), *busy* (holding a job) or *restarting*. A
worker that timed out, died holding a job, or was found dead while idle is killed with its whole process
tree, and one that a job left above ``--worker-max-rss-mb`` is closed; either is replaced by a fresh one
of the next generation, preloaded and warmed before the slot takes work again. Every replacement is a
``worker_restarting`` event and is counted.

Process workers leave nothing behind (:mod:`asyncroll.workers.orphans`): while the pool runs them, the
runtime is a child subreaper, so what a worker that died had detached (``setsid -f``, a double fork, a
child in a session of its own) is re-parented to the runtime rather than to init. Once a replaced
worker's tree is killed, the pool kills the runtime's adopted children that carry that worker's origin;
at close, every one left that carries an origin of this pool's workers, and the flag is restored.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from asyncroll.clock import Clock
from asyncroll.errors import ToolsNotLoaded, WorkerOverMemoryCap, WorkerStartupError
from asyncroll.event_log import EventLog
from asyncroll.events import WorkerReady, WorkerRestarting
from asyncroll.workers.orphans import Adopter
from asyncroll.workers.process import CallResult
from asyncroll.workers.protocol import JobRequest

RestartReason = Literal["timeout", "died", "startup_failed", "memory"]
MAX_RESTART_ATTEMPTS = 3
_log = logging.getLogger(__name__)


class Worker(Protocol):
    """What the pool needs of a worker: a real process (:mod:`asyncroll.workers`) or a virtual one."""

    index: int
    generation: int

    @property
    def pid(self) -> int | None: ...

    @property
    def startup_s(self) -> float | None: ...

    @property
    def alive(self) -> bool: ...

    async def start(self) -> None: ...

    async def call(
        self,
        request: JobRequest,
        timeout: float,  # noqa: ASYNC109 - expiry kills the worker tree
        *,
        large: bool = False,
    ) -> CallResult: ...

    async def kill(self) -> None: ...

    async def wait_exit(self) -> int: ...

    def cpu_seconds(self) -> float | None: ...

    async def aclose(self) -> None: ...


WorkerFactory = Callable[[int, int], Worker]  # (slot index, generation) -> unstarted worker


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    size: int
    idle: int
    busy: int
    restarting: int
    peak_busy: int
    restarts: int


class WorkerPool:
    def __init__(
        self,
        size: int,
        factory: WorkerFactory,
        clock: Clock,
        events: EventLog,
        max_rss_bytes: int | None = None,
    ) -> None:
        self._size = size
        self._max_rss = max_rss_bytes  # --worker-max-rss-mb: a worker left above it after a job is replaced
        self._factory = factory
        self._clock = clock
        self._events = events
        self._workers: list[Worker | None] = [None] * size
        # The idle slots: a heap (the lowest index first) and the same slots as a set. A sorted list cost
        # O(workers) per job (a membership check, a sort and a pop from its front: with 10,240 simulated
        # workers, a quarter of a simulation's CPU); the heap hands out the same slots in O(log workers).
        self._idle: list[int] = []
        self._idle_set: set[int] = set()
        self._busy: set[int] = set()
        self._restarting: set[int] = set()
        self._peak_busy = 0
        self._restarts = 0
        self._replaced = False
        self._closing = False
        self._tg: asyncio.TaskGroup | None = None
        self._replacing: set[asyncio.Task[None]] = set()
        self._adopter: Adopter | None = None  # from the first process worker on
        self.on_available: Callable[[], None] = lambda: None

    # --- state -------------------------------------------------------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        return PoolSnapshot(
            self._size,
            len(self._idle),
            len(self._busy),
            len(self._restarting),
            self._peak_busy,
            self._restarts,
        )

    @property
    def replaced_any(self) -> bool:
        """True once a running pool replaced a worker (its CPU time before death is then unknown); a
        replacement while the pool starts is not one (the measured window's CPU reading follows it)."""
        return self._replaced

    @property
    def orphans_killed(self) -> int:
        """Processes left behind by dead workers (adopted by the runtime) that the pool killed."""
        return 0 if self._adopter is None else self._adopter.killed

    @property
    def idle(self) -> int:
        return len(self._idle)

    def worker(self, slot: int) -> Worker:
        worker = self._workers[slot]
        assert worker is not None
        return worker

    def take_idle(self) -> int | None:
        """Claim an idle slot (lowest index first), or None if every slot is busy or restarting.

        A slot whose worker is known to have died (its exit seen, its watcher not yet run: a few loop
        turns) is replaced, not handed out: its job would fail without ever reaching a worker."""
        while self._idle and not self._closing and not self.worker(self._idle[0]).alive:
            self.replace_soon(self._idle[0], "died")  # takes it out of the idle slots
        if not self._idle:
            return None
        slot = heapq.heappop(self._idle)
        self._idle_set.discard(slot)
        self._busy.add(slot)
        self._peak_busy = max(self._peak_busy, len(self._busy))
        return slot

    @property
    def reads_rss(self) -> bool:
        """Whether jobs should ask their worker for its resident memory (a cap is set)."""
        return self._max_rss is not None

    def job_done(self, slot: int, rss_bytes: int | None) -> None:
        """A job ended on the slot's (healthy) worker: the slot is idle again, unless the job left the
        worker above the memory cap — a tool that leaks (an unbounded cache, module state) would grow
        the warm worker for the whole run: it is then closed and replaced (``worker_restarting``,
        reason ``memory``), its tools preloaded afresh."""
        if self._max_rss is not None and rss_bytes is not None and rss_bytes > self._max_rss:
            self.replace_soon(slot, "memory")
        else:
            self.release(slot)

    def release(self, slot: int) -> None:
        """Return a healthy slot after its job (or after its replacement started)."""
        assert slot not in self._idle_set, f"worker slot {slot} released twice"
        self._busy.discard(slot)
        heapq.heappush(self._idle, slot)
        self._idle_set.add(slot)
        self.on_available()

    # --- lifecycle ---------------------------------------------------------------------------------------

    async def start(self, tg: asyncio.TaskGroup) -> None:
        """Start every worker concurrently; all must be ready, or all are killed and the error raised.

        A worker killed from outside while it starts (:attr:`WorkerStartupError.retry`) is replaced like
        one that dies later — recorded and counted, up to :data:`MAX_RESTART_ATTEMPTS` starts of the slot
        in all; any other start-up failure (its tools do not load, it exits or is too slow) would fail
        the same way again and fails the run at once."""
        self._tg = tg
        try:
            async with asyncio.TaskGroup() as starting:
                for slot in range(self._size):
                    starting.create_task(self._first_start(slot))
        except BaseExceptionGroup as group:
            await asyncio.shield(self.aclose())
            startup = [e for e in group.exceptions if isinstance(e, WorkerStartupError)]
            if startup:
                raise startup[0] from group
            raise
        except asyncio.CancelledError:  # Ctrl-C while workers start: none may outlive the run
            await asyncio.shield(self.kill())
            raise
        self._idle = list(range(self._size))  # sorted: a heap already
        self._idle_set = set(self._idle)
        for slot in range(self._size):
            tg.create_task(self._watch(slot, self.worker(slot)))

    async def _first_start(self, slot: int) -> None:
        for generation in range(MAX_RESTART_ATTEMPTS):
            if generation:  # the previous generation was killed from outside while it started
                old = self.worker(slot)  # not _replaced: the window's CPU reading starts after this one
                await self._kill_orphans(slot, old)
                self._restarting_event(slot, old, generation, "startup_failed")
            try:
                await self._start_slot(slot, generation)
                return
            except WorkerStartupError as exc:
                if not exc.retry:
                    raise
                if generation == MAX_RESTART_ATTEMPTS - 1:  # say so: each start was killed, not just one
                    raise WorkerStartupError(
                        f"worker {slot} could not be started in {MAX_RESTART_ATTEMPTS} attempts: {exc}",
                        retry=True,
                    ) from exc

    async def _start_slot(self, slot: int, generation: int) -> Worker:
        worker = self._factory(slot, generation)
        self._workers[slot] = worker
        self._adopt(worker)
        await worker.start()
        self._check_rest_memory(worker)
        self._events.emit(
            WorkerReady(
                worker=slot,
                pid=worker.pid,
                generation=generation,
                startup_s=round(worker.startup_s or 0.0, 6),
            )
        )
        return worker

    def _check_rest_memory(self, worker: Worker) -> None:
        """Refuse a worker that is above the memory cap before any job (its tools' imports alone take
        more): every job would have it replaced, the run paying a fresh start per job, without a word."""
        rest = getattr(worker, "rest_rss_bytes", None)  # a process worker's; a virtual one has none
        if self._max_rss is None or not isinstance(rest, int) or rest <= self._max_rss:
            return
        raise WorkerOverMemoryCap(
            f"worker {worker.index} (pid {worker.pid}) holds {rest / 2**20:.0f} MiB once its tools are "
            f"imported, above --worker-max-rss-mb {self._max_rss / 2**20:g}: every job would have it "
            "replaced; set the cap well above what the tools take at rest"
        )

    def replace_soon(self, slot: int, reason: RestartReason) -> None:
        """Replace the slot's worker in a task of the pool's own group (the one given to :meth:`start`):
        the job that lost the worker gets its answer at once, and a replacement that no trajectory needs
        any more (the batch ended meanwhile) does not hold up the end of the run's measured window.
        :meth:`aclose` stops a replacement still under way; one that fails fails the run.

        The slot leaves service at once, and the restart is recorded (``worker_restarting``, counted)
        before the task runs: a replacement the run's end stops before or while it kills the old tree is
        still one (with no ``worker_ready``). A slot already being replaced is left to that replacement
        (an idle worker's death is seen by its watcher and by a job dispatched to it in the same loop
        turn: one replacement)."""
        assert self._tg is not None, "pool used before start()"
        if self._closing or slot in self._restarting:
            return
        self._out_of_service(slot)
        self._replaced = True
        old = self.worker(slot)
        self._restarting_event(slot, old, old.generation + 1, reason)
        replacement = self._replace(slot, old, retire=reason == "memory")
        try:
            task = self._tg.create_task(replacement)
        except RuntimeError:  # the run's group is shutting down (a task failed): its end needs no worker
            replacement.close()
            return
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    async def _replace(self, slot: int, old: Worker, retire: bool = False) -> None:
        """Kill the old worker's tree (close it, when it is healthy and ``retire``d: it ends its own
        descendants first) and start the next generation (its restart already recorded by
        :meth:`replace_soon`); a start that fails is retried as a restart of its own, up to
        :data:`MAX_RESTART_ATTEMPTS` in all — except one whose tools do not load (:class:`ToolsNotLoaded`:
        the next start reads the same files) or that starts above the memory cap
        (:class:`WorkerOverMemoryCap`), which fails the run at once. The slot is idle again
        afterwards."""
        if self._closing:
            return
        await (old.aclose() if retire else old.kill())
        await self._kill_orphans(slot, old)
        generation = old.generation + 1
        last_error: Exception | None = None
        for attempt in range(MAX_RESTART_ATTEMPTS):
            if attempt:  # the previous attempt's worker (killed as it started) is the one replaced
                generation += 1
                self._restarting_event(slot, self.worker(slot), generation, "startup_failed")
            try:
                new = await self._start_slot(slot, generation)
            except (ToolsNotLoaded, WorkerOverMemoryCap) as exc:
                raise WorkerStartupError(f"worker {slot} could not be replaced: {exc}") from exc
            except WorkerStartupError as exc:
                last_error = exc
                continue
            self._restarting.discard(slot)
            assert self._tg is not None
            self._tg.create_task(self._watch(slot, new))
            self.release(slot)
            return
        raise WorkerStartupError(
            f"worker {slot} could not be replaced after {MAX_RESTART_ATTEMPTS} attempts: {last_error}"
        ) from last_error

    def _adopt(self, worker: Worker) -> None:
        """Before a process worker starts: the runtime adopts orphans from then on, and knows its origin."""
        origin = _origin(worker)
        if origin is None:
            return  # a virtual worker: no process, nothing to adopt
        if self._adopter is None and not self._closing:
            self._adopter = Adopter()
        if self._adopter is not None:
            self._adopter.origins.add(origin)

    async def _kill_orphans(self, slot: int, old: Worker) -> None:
        """Kill what the replaced worker (dead now, reaped) left behind, re-parented to the runtime."""
        origin = _origin(old)
        if self._adopter is None or not self._adopter.open or origin is None:
            return
        self._adopter.doomed |= getattr(old, "killed_pids", set())
        self._adopter.named |= getattr(old, "outside_children", set())
        killed = await self._adopter.sweep({origin}, self._worker_pids())
        if killed:
            _log.debug("worker %d (pid %s): killed %d processes it left behind", slot, old.pid, killed)

    async def _close_orphans(self) -> None:
        """After every worker is gone: kill every orphan the runtime adopted from this pool's workers,
        then stop adopting."""
        adopter = self._adopter
        if adopter is None or not adopter.open:
            return
        try:
            before = adopter.killed
            for worker in self._workers:  # a killed (not closed) worker's tree: its zombies are ours
                adopter.doomed |= getattr(worker, "killed_pids", set())
                adopter.named |= getattr(worker, "outside_children", set())
            await adopter.sweep(adopter.origins, self._worker_pids())
            if adopter.killed > before:
                _log.debug("pool close: killed %d processes left behind", adopter.killed - before)
        finally:
            adopter.close()

    def _worker_pids(self) -> set[int]:
        return {w.pid for w in self._workers if w is not None and w.pid is not None}

    def _restarting_event(self, slot: int, old: Worker, generation: int, reason: RestartReason) -> None:
        self._restarts += 1
        self._events.emit(
            WorkerRestarting(
                worker=slot, old_pid=old.pid, generation=generation, reason=reason, restarts=self._restarts
            )
        )

    def _out_of_service(self, slot: int) -> None:
        self._busy.discard(slot)
        if slot in self._idle_set:  # a worker that died idle (rare): O(workers) here
            self._idle_set.discard(slot)
            self._idle.remove(slot)
            heapq.heapify(self._idle)
        self._restarting.add(slot)

    async def _watch(self, slot: int, worker: Worker) -> None:
        """Notice a worker that dies while idle (killed from outside) and replace it at once."""
        await worker.wait_exit()
        if not self._closing and self._workers[slot] is worker and slot in self._idle_set:
            self.replace_soon(slot, "died")

    def cpu_seconds(self) -> float | None:
        """CPU seconds of the current workers (None if any reading is unavailable)."""
        total = 0.0
        for worker in self._workers:
            value = worker.cpu_seconds() if worker is not None else None
            if value is None:
                return None
            total += value
        return total

    async def aclose(self) -> None:
        """Stop every worker and its tree. Safe to call more than once and after a failed start."""
        self._closing = True
        replacing = list(self._replacing)
        for task in replacing:  # a replacement still starting: stopped first, then its worker closed
            task.cancel()
        await asyncio.gather(*replacing, return_exceptions=True)
        await asyncio.gather(
            *(worker.aclose() for worker in self._workers if worker is not None), return_exceptions=True
        )
        await self._close_orphans()

    async def kill(self) -> None:
        """Kill every worker tree at once, without the polite end-of-stream wait (an interrupted start:
        a worker still importing its tools would not read it)."""
        self._closing = True
        await asyncio.gather(
            *(worker.kill() for worker in self._workers if worker is not None), return_exceptions=True
        )
        await self._close_orphans()


def _origin(worker: Worker) -> str | None:
    """A process worker's origin (:mod:`asyncroll.workers.orphans`); ``None`` for a virtual one."""
    origin = getattr(worker, "origin", None)
    return origin if isinstance(origin, str) else None
