"""The FIFO limiter's snapshot counts what the live view and the Prometheus exporter show (``active 3/8``,
``trajectories_started``): the limit, the holders, the waiters, the peak and every grant — a slot handed
from a releasing holder straight to a waiter included."""

from __future__ import annotations

import asyncio

import pytest

from asyncroll.runtime.limiter import FifoLimiter, LimiterSnapshot


@pytest.mark.timeout(10)
def test_the_snapshot_counts_grants_waiters_and_the_peak() -> None:
    async def scenario() -> list[LimiterSnapshot]:
        limiter = FifoLimiter(2)
        seen = [limiter.snapshot()]
        await limiter.acquire()
        await limiter.acquire()
        waiter = asyncio.create_task(limiter.acquire())
        await asyncio.sleep(0)  # the waiter runs up to its wait for a slot
        seen.append(limiter.snapshot())
        limiter.release()  # the slot passes to the waiter
        await waiter
        seen.append(limiter.snapshot())
        limiter.release()
        limiter.release()
        seen.append(limiter.snapshot())
        assert limiter.limit == 2 and (limiter.holding, limiter.waiting) == (0, 0)
        return seen

    assert asyncio.run(scenario()) == [
        LimiterSnapshot(limit=2, holding=0, waiting=0, peak_holding=0, total_acquired=0),
        LimiterSnapshot(limit=2, holding=2, waiting=1, peak_holding=2, total_acquired=2),
        LimiterSnapshot(limit=2, holding=2, waiting=0, peak_holding=2, total_acquired=3),
        LimiterSnapshot(limit=2, holding=0, waiting=0, peak_holding=2, total_acquired=3),
    ]
