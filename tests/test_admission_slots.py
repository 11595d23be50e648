"""Admission on a virtual clock: at most ``limit`` trajectories at once, problems read only when a slot is
free, ``pending`` while one waits for a slot, and a slot handed back when the server check or the task group
refuses the trajectory."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from asyncroll.clock import VirtualClock
from asyncroll.runtime.admission import Admission
from asyncroll.runtime.limiter import LimiterSnapshot


@pytest.mark.timeout(10)
def test_two_slots_run_five_problems_two_at_a_time_reading_each_when_a_slot_frees() -> None:
    """Problem i takes i+1 seconds; with 2 slots they start at t = 0, 0, 1, 2, 4 (each when the earliest
    running one ends), the stream is read at most one problem ahead of the slots, and ``pending`` is True
    while a read problem waits for one."""
    clock = VirtualClock()
    admission = Admission(2)
    assert not admission.pending  # nothing read yet
    log: list[tuple[str, float, int, int | str]] = []

    def problems() -> Iterator[int]:
        for i in range(5):
            log.append(("read", clock.now(), admission.active, i))
            yield i

    async def start(index: int, item: int) -> None:
        log.append(("start", clock.now(), admission.active, item))
        assert index == item and admission.active <= 2
        await clock.sleep(item + 1)

    async def scenario() -> tuple[LimiterSnapshot, bool]:
        async with asyncio.TaskGroup() as tg:
            runner = tg.create_task(admission.run(tg, problems(), start))
            await clock.sleep(0.5)
            during = (admission.snapshot(), admission.pending)
            await runner
            assert not admission.pending  # the stream is exhausted: the batch's tail
        assert admission.active == 0
        return during

    snapshot, pending = clock.run(scenario())
    assert (snapshot.holding, snapshot.waiting, snapshot.limit, pending) == (2, 1, 2, True)
    assert [(what, t, item) for what, t, _, item in log] == [
        ("read", 0.0, 0),
        ("read", 0.0, 1),
        ("read", 0.0, 2),  # waits for a slot: the only problem read ahead
        ("start", 0.0, 0),
        ("start", 0.0, 1),
        ("read", 1.0, 3),
        ("start", 1.0, 2),
        ("read", 2.0, 4),
        ("start", 2.0, 3),
        ("start", 4.0, 4),
    ]
    assert max(active for what, _, active, _ in log if what == "start") <= 2


@pytest.mark.timeout(10)
def test_a_failing_server_check_hands_its_slot_back() -> None:
    """``ready`` raising (the run stops while the server is down) propagates and leaves no slot held."""
    clock = VirtualClock()
    calls = 0

    async def ready() -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("server down and the run is stopping")

    admission = Admission(3, ready)
    started: list[int] = []

    async def start(index: int, item: int) -> None:
        started.append(item)

    async def scenario() -> None:
        async with asyncio.TaskGroup() as tg:
            with pytest.raises(RuntimeError):
                await admission.run(tg, iter(range(4)), start)

    clock.run(scenario())
    assert started == [0] and admission.active == 0 and not admission.pending


@pytest.mark.timeout(10)
def test_a_group_shutting_down_refuses_the_trajectory_and_gets_its_slot_back() -> None:
    """A trajectory failed and its task group is shutting down when admission, holding a fresh slot, hands
    it the next one: the group refuses it (``RuntimeError``), the slot is handed back, nothing starts, and
    the trajectory's coroutine is closed (never a "coroutine was never awaited" warning, which this suite
    turns into an error)."""
    clock = VirtualClock()
    admission = Admission(2)
    started: list[int] = []

    async def start(index: int, item: int) -> None:
        started.append(item)

    async def fails() -> None:
        raise ValueError("a trajectory failed")

    async def scenario() -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(fails())
            with pytest.raises(asyncio.CancelledError):
                await clock.sleep(1)  # the failure cancels the group's body: the group is shutting down
            with pytest.raises(RuntimeError):
                await admission.run(tg, iter([7]), start)
            assert admission.active == 0 and not admission.pending

    with pytest.raises(ExceptionGroup) as failed:
        clock.run(scenario())
    assert [type(e) for e in failed.value.exceptions] == [ValueError]
    assert started == [] and admission.active == 0


@pytest.mark.timeout(10)
def test_a_trajectory_cancelled_before_it_ran_hands_its_slot_back() -> None:
    """A trajectory fails and hands its slot to admission, which starts the next one in the same loop turn;
    the failure then cancels that task before it ever ran (its coroutine never reached the ``finally`` that
    releases): its slot is handed back all the same, not held for the rest of the run (the live view's
    ``active`` counted a trajectory that never started)."""
    clock = VirtualClock()
    admission = Admission(1)
    started: list[int] = []

    async def start(index: int, item: int) -> None:
        started.append(item)
        if item == 0:
            raise ValueError("a trajectory failed")

    async def scenario() -> None:
        async with asyncio.TaskGroup() as tg:
            await admission.run(tg, iter(range(3)), start)

    with pytest.raises(ExceptionGroup) as failed:
        clock.run(scenario())
    assert [type(e) for e in failed.value.exceptions] == [ValueError]
    assert started == [0]
    assert admission.active == 0, admission.snapshot()
