"""The FIFO limiter (admission, the model gate) under cancellation, which a stop does to every waiter at
once: a cancelled waiter leaves the queue (``waiting`` in the live view), a slot granted to a waiter that
is cancelled in the same loop step passes on to the next one (else it is lost for the rest of the run),
and a cancelled waiter that a release already dropped still ends cancelled (not with an error that would
fail the run). A limit below one is refused."""

from __future__ import annotations

import asyncio

import pytest

from asyncroll.runtime.limiter import FifoLimiter, LimiterSnapshot


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"limit must be >= 1"):
        FifoLimiter(0)
    assert FifoLimiter(1).limit == 1


@pytest.mark.timeout(10)
def test_a_waiter_cancelled_while_waiting_leaves_the_queue() -> None:
    async def scenario() -> tuple[LimiterSnapshot, LimiterSnapshot]:
        limiter = FifoLimiter(1)
        await limiter.acquire()
        waiter = asyncio.create_task(limiter.acquire())
        await asyncio.sleep(0)  # it waits for the slot
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        cancelled = limiter.snapshot()
        limiter.release()
        return cancelled, limiter.snapshot()

    assert asyncio.run(scenario()) == (
        LimiterSnapshot(limit=1, holding=1, waiting=0, peak_holding=1, total_acquired=1),
        LimiterSnapshot(limit=1, holding=0, waiting=0, peak_holding=1, total_acquired=1),
    )


@pytest.mark.timeout(10)
def test_a_slot_granted_to_a_waiter_cancelled_in_the_same_step_passes_to_the_next() -> None:
    async def scenario() -> tuple[bool, LimiterSnapshot, LimiterSnapshot]:
        limiter = FifoLimiter(1)
        await limiter.acquire()
        first = asyncio.create_task(limiter.acquire())
        second = asyncio.create_task(limiter.acquire())
        await asyncio.sleep(0)  # both wait
        limiter.release()  # the slot goes to the first waiter ...
        first.cancel()  # ... which is stopped before its task runs again
        with pytest.raises(asyncio.CancelledError):
            await first
        await asyncio.sleep(0)
        handed_on = second.done() and second.exception() is None
        held = limiter.snapshot()
        limiter.release()
        return handed_on, held, limiter.snapshot()

    handed_on, held, after = asyncio.run(scenario())
    assert handed_on
    # the first acquire and the second waiter's: the grant the cancelled waiter never used is not counted
    assert held == LimiterSnapshot(limit=1, holding=1, waiting=0, peak_holding=1, total_acquired=2)
    assert (after.holding, after.waiting) == (0, 0)


@pytest.mark.timeout(10)
def test_waiters_cancelled_before_a_release_drops_them_end_cancelled() -> None:
    """The release skips (and drops) the waiters cancelled meanwhile; each of them, when its task runs,
    finds itself gone from the queue and ends with CancelledError, nothing else."""

    async def scenario() -> tuple[list[BaseException | None], LimiterSnapshot]:
        limiter = FifoLimiter(1)
        await limiter.acquire()
        waiters = [asyncio.create_task(limiter.acquire()) for _ in range(3)]
        await asyncio.sleep(0)
        waiters[0].cancel()
        waiters[1].cancel()
        limiter.release()  # drops both cancelled waiters, grants the third
        results = await asyncio.gather(*waiters, return_exceptions=True)
        return results, limiter.snapshot()

    results, snapshot = asyncio.run(scenario())
    assert [type(r) for r in results] == [asyncio.CancelledError, asyncio.CancelledError, type(None)]
    assert snapshot == LimiterSnapshot(limit=1, holding=1, waiting=0, peak_holding=1, total_acquired=2)


def test_a_release_with_no_slot_held_is_refused() -> None:
    """A double release would leave ``holding`` at −1 and let one more in than the limit from then on."""
    limiter = FifoLimiter(1)
    with pytest.raises(RuntimeError, match=r"release\(\) with no slot held"):
        limiter.release()
    assert limiter.snapshot() == LimiterSnapshot(
        limit=1, holding=0, waiting=0, peak_holding=0, total_acquired=0
    )
