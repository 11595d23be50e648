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
            held = self._hold(start, index, item)
            try:
                tg.create_task(held)
            except RuntimeError:  # the group is shutting down (a task failed): nothing starts
                held.close()
                self._limiter.release()
                raise

    async def _hold(self, start: Callable[[int, P], Awaitable[None]], index: int, item: P) -> None:
        # The trajectory's coroutine is made here, inside its task: a task cancelled before it ever ran
        # leaves no coroutine behind that nobody awaited.
        try:
            await start(index, item)
        finally:
            self._limiter.release()
