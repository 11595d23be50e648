"""Admission: the one limiter of active trajectories (``max_active_trajectories``).

Problems are pulled from the workload stream only when a slot is free, so memory stays bounded by the
number of active trajectories however long the workload is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from asyncroll.runtime.limiter import FifoLimiter, LimiterSnapshot

P = TypeVar("P")


class Admission:
    def __init__(self, limit: int, ready: Callable[[], Awaitable[None]] | None = None) -> None:
        """``ready`` (optional) is awaited before each admission: an HTTP backend whose server is down
        pauses admission this way instead of failing every new trajectory."""
        self._limiter = FifoLimiter(limit)
        self._blocked = False
        self._ready = ready

    @property
    def active(self) -> int:
        return self._limiter.holding

    @property
    def pending(self) -> bool:
        """A problem has been read and waits for an active slot (False in the batch's tail)."""
        return self._blocked

    def snapshot(self) -> LimiterSnapshot:
        return self._limiter.snapshot()

    async def run(
        self, tg: asyncio.TaskGroup, stream: Iterable[P], start: Callable[[int, P], Awaitable[None]]
    ) -> None:
        """Run ``start(index, item)`` for each item of ``stream`` as a task of ``tg``, ``limit`` at once."""
        for index, item in enumerate(stream):
            self._blocked = True
            try:
                await self._limiter.acquire()
                if self._ready is not None:
                    # Checked with the slot held, so a server that went down while we waited for the
                    # slot is seen before the next trajectory starts.
                    try:
                        await self._ready()
                    except BaseException:
                        self._limiter.release()
                        raise
            finally:
                self._blocked = False
            slot = _Slot(self._limiter)
            held = self._hold(start, index, item, slot)
            try:
                task = tg.create_task(held)
            except RuntimeError:  # the group is shutting down (a task failed): nothing starts
                held.close()
                slot.release()
                raise
            # A task cancelled before it ever ran (a trajectory failed and the group cancelled the one
            # just admitted in its slot) never reaches _hold's ``finally``: its slot is released here.
            task.add_done_callback(slot.release)

    async def _hold(
        self, start: Callable[[int, P], Awaitable[None]], index: int, item: P, slot: _Slot
    ) -> None:
        # The trajectory's coroutine is made here, inside its task: a task cancelled before it ever ran
        # leaves no coroutine behind that nobody awaited.
        try:
            await start(index, item)
        finally:
            slot.release()


class _Slot:
    """One admitted trajectory's slot, released once: when its task ends (``_hold``'s ``finally``, in the
    task's last step), or by the task's done callback for a task cancelled before it ran."""

    __slots__ = ("_limiter",)

    def __init__(self, limiter: FifoLimiter) -> None:
        self._limiter: FifoLimiter | None = limiter

    def release(self, _task: object = None) -> None:
        limiter, self._limiter = self._limiter, None
        if limiter is not None:
            limiter.release()
