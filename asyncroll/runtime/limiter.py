"""A strictly FIFO capacity limiter with a frozen snapshot.

Admission and the model gate are each one of these, built from :class:`~asyncroll.config.Limits`. Waiters
are served in arrival order, so which trajectory gets the next slot never depends on event-loop details.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LimiterSnapshot:
    limit: int
    holding: int
    waiting: int
    peak_holding: int
    total_acquired: int


class FifoLimiter:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self._limit = limit
        self._holding = 0
        self._peak = 0
        self._total = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def holding(self) -> int:
        return self._holding

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def snapshot(self) -> LimiterSnapshot:
        return LimiterSnapshot(self._limit, self._holding, len(self._waiters), self._peak, self._total)

    def _grant(self) -> None:
        self._holding += 1
        self._total += 1
        self._peak = max(self._peak, self._holding)

    async def acquire(self) -> None:
        if self._holding < self._limit and not self._waiters:
            self._grant()
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                # Granted and cancelled in the same step: hand the slot on; the grant was never used (a
                # slot that passed through counted once per waiter it passed to).
                self._total -= 1
                self.release()
            elif waiter in self._waiters:  # release() may already have dropped a cancelled waiter
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                # The slot passes directly to the next waiter: holding stays the same.
                self._total += 1
                waiter.set_result(None)
                return
        if self._holding == 0:
            raise RuntimeError("release() with no slot held")
        self._holding -= 1
