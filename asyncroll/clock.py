"""The one place that reads time or sleeps.

Everything in the runtime asks a :class:`Clock` for ``now()`` and ``sleep()``. Two clocks exist:

* :class:`SystemClock`: ``time.monotonic`` (the clock the event loop and the worker processes share on
  Linux, so worker-reported start/finish times are comparable with the runtime's).
* :class:`VirtualClock`: virtual time driven by its own event loop. Whenever the loop has nothing ready
  and would block until its next timer, time jumps to that timer instead. A ten-minute scripted workload
  runs in milliseconds and every timestamp is exact and repeatable, which is what scheduling tests and
  the simulator need. Timers fall on a nanosecond grid (:func:`on_grid`): sleeps that add up to the
  same instant end at the same instant, however the float sums round. Real I/O still works (it is
  polled), but a virtual loop must not wait on real processes: their time does not jump. A task that
  sleeps in many small steps (the batching server model: one per decoded token) can let the loop do its
  steps in place while nothing else happens (:meth:`VirtualClock.sleep_stepping`): the same results
  without a round of the loop per step.

Real worker processes (``asyncroll.workers``) stamp their IPC and execution times with ``time.monotonic``
directly: they only ever run beside a :class:`SystemClock`, which is that same clock.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import inspect
import math
import selectors
import time
from asyncio import base_events
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar, TypeVarTuple

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class Clock(Protocol):
    """Reads time and sleeps; the runtime's only seam to time."""

    virtual: bool

    def now(self) -> float:
        """Monotonic seconds."""
        ...

    def wall(self) -> float:
        """Seconds since the epoch (for receipts only, never for durations)."""
        ...

    async def sleep(self, seconds: float) -> None: ...

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        """Run ``main`` to completion on an event loop that keeps this clock's time."""
        ...


class SystemClock:
    """Real monotonic time."""

    virtual = False

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        return run_on_new_loop(asyncio.new_event_loop, main, set_current=True)


class VirtualClock:
    """Virtual time that jumps to the next timer whenever the event loop would block."""

    virtual = True

    def __init__(self, start: float = 0.0, wall: Callable[[], float] = time.time) -> None:
        self._now = float(start)
        self._wall = wall

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        """The real wall clock (``wall``): a receipt says when a simulation ran, not a virtual date (an
        hour of virtual time simulated in a second said it had finished an hour later)."""
        return self._wall()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def sleep_stepping(
        self, seconds: float, next_sleep: Callable[[], float | None], step: Callable[[], None]
    ) -> None:
        """:meth:`sleep`, for a caller that sleeps in steps and does little at each (the batching
        server model's engine loop: one step per decoded token). Where this clock's loop would do
        nothing else before the timer and after it, it does the caller's step in its place, without
        waking the caller: ``next_sleep()``, at the end of a sleep, says how long the caller would sleep
        next if woken now, or None when the caller must wake (its step is not that simple); ``step()``
        then does, in the caller's place, what it would do between waking and that sleep. Time, timers
        and every other task see exactly what they see when the caller wakes and sleeps again (see
        :meth:`_VirtualTimeLoop._step_in_place`), for a fraction of the CPU (a round of the loop and a
        wake-up of the caller cost ≈ 15 µs).

        A subclass whose :meth:`sleep` differs (tests' late timers) gets its own sleep, never a step in
        place; so does a caller on another loop."""
        loop = asyncio.get_running_loop()
        if (
            seconds <= 0
            or type(self).sleep is not VirtualClock.sleep
            or not isinstance(loop, _VirtualTimeLoop)
            or loop._virtual_clock is not self
        ):
            await self.sleep(seconds)
            return
        await loop.sleep_stepping(seconds, next_sleep, step)

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self._now += seconds

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return _VirtualTimeLoop(self)

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        return run_on_new_loop(self.new_event_loop, main)


def run_on_new_loop(
    new_loop: Callable[[], asyncio.AbstractEventLoop],
    main: Coroutine[Any, Any, T],
    *,
    set_current: bool = False,
) -> T:
    """``asyncio.run`` on a loop from ``new_loop`` (the current loop too when ``set_current``, as
    ``asyncio.run`` does), whatever stops it: a stop signal while the loop is being built waits until it
    is (a KeyboardInterrupt inside the constructor left half a loop, whose ``__del__`` printed a traceback
    at a random later moment); the loop is closed however the run ends, and ``main`` too if it never
    started (no "never awaited" warning)."""
    from asyncroll.cli_signals import deferred

    loop: asyncio.AbstractEventLoop | None = None
    try:
        with deferred():
            loop = new_loop()
        if set_current:
            asyncio.set_event_loop(loop)
        built = loop
        with asyncio.Runner(loop_factory=lambda: built) as runner:
            return runner.run(main)
    finally:
        if inspect.getcoroutinestate(main) == inspect.CORO_CREATED:
            main.close()
        if loop is not None:
            if set_current:
                asyncio.set_event_loop(None)
            if not loop.is_closed():
                loop.close()


# What BaseEventLoop._run_once decides with (not in typeshed): the longest select, and when it purges
# cancelled timers from its heap.
_MAX_SELECT_S: float = base_events.MAXIMUM_SELECT_TIMEOUT  # type: ignore[attr-defined]
_PURGE_ABOVE: int = base_events._MIN_SCHEDULED_TIMER_HANDLES  # type: ignore[attr-defined]
_PURGE_FRACTION: float = base_events._MIN_CANCELLED_TIMER_HANDLES_FRACTION  # type: ignore[attr-defined]

#: While callbacks are ready, a virtual loop polls real file descriptors once per this many iterations.
POLL_EVERY = 32

#: Timers per second of virtual time: a virtual loop's timers fall on this grid (:func:`on_grid`).
GRID_PER_S = 1_000_000_000
#: From here on (2^53 ns ≈ 104 days) the grid is finer than the floats themselves: times are left as they are.
_GRID_UNTIL_S = 2.0**53 / GRID_PER_S


def on_grid(when: float) -> float:
    """``when`` on the nanosecond grid: the same float for every sum that lands on the same nanosecond.

    Without it, float rounding decided which of two timers due at one instant ran first: a request sent at
    0.16 s that takes 0.1775 s and one sent at 0.335 s that takes 0.0025 s end at 0.3375 s, as two floats
    one ulp apart, and that order changed when the same durations were recorded and replayed
    (``simulate --from-run``), which sleeps 0.1775 as one number, not as 0.175 + 0.0025. On the grid both
    are due at one instant, and the heap of timers orders them as it orders every tie: by the timers
    set so far, which a replay sets as its source did. Far out (≥ 104 days) it is the identity: there,
    floats are coarser than a nanosecond."""
    if not abs(when) < _GRID_UNTIL_S:  # also leaves inf and nan alone, for asyncio to deal with
        return when
    return round(when * GRID_PER_S) / GRID_PER_S


class _VirtualSelector(selectors.BaseSelector):
    """Polls real file descriptors without blocking; turns a timed wait into a jump of virtual time."""

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock
        self._inner = selectors.DefaultSelector()
        self._spins = 0
        self.loop: _VirtualTimeLoop | None = None  # set by the loop: it may step a sleeper in place

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout == 0:
            # The loop has work ready: a simulation turns over thousands of times per virtual second,
            # and a real poll each time was a third of its CPU. Real I/O is still polled, just less often.
            self._spins += 1
            if self._spins < POLL_EVERY:
                return []
        self._spins = 0
        ready = self._inner.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            # Nothing is scheduled: only real I/O (or another thread) can wake the loop.
            return self._inner.select(None)
        self._clock.advance(timeout)
        if self.loop is not None and self.loop.steppers:
            return self.loop._step_in_place(self._inner)
        return []

    def close(self) -> None:
        self._inner.close()

    def get_map(self) -> Any:
        return self._inner.get_map()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


#: A :meth:`VirtualClock.sleep_stepping` sleeper's ``next_sleep``, ``step`` and the future it awaits.
_Stepper = tuple[Callable[[], float | None], Callable[[], None], asyncio.Future[None]]


class _VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: VirtualClock) -> None:
        self._virtual_clock = clock
        selector = _VirtualSelector(clock)
        super().__init__(selector=selector)
        #: id of a stepping sleeper's timer → its step (:meth:`VirtualClock.sleep_stepping`)
        self.steppers: dict[int, _Stepper] = {}
        selector.loop = self

    async def sleep_stepping(
        self, seconds: float, next_sleep: Callable[[], float | None], step: Callable[[], None]
    ) -> None:
        """``asyncio.sleep(seconds)`` (``seconds`` > 0): the same future and timer, made the same way."""
        future = self.create_future()
        handle = self.call_later(seconds, _wake, future)
        key = id(handle)
        self.steppers[key] = (next_sleep, step, future)
        try:
            await future
        finally:
            handle.cancel()
            del self.steppers[key]

    def _step_in_place(self, inner: selectors.BaseSelector) -> list[tuple[selectors.SelectorKey, int]]:
        """Called by the selector once time has jumped to the earliest timer. When that is a stepping
        sleeper's, and nothing else would happen in the loop until that sleeper sleeps again, do its step
        here and move its timer to the end of its next sleep, instead of waking it; again and again while
        that holds. Returns the real I/O events seen meanwhile (polled every :data:`POLL_EVERY` steps).

        Everything the loop would do otherwise is done the same way: the timer is popped from and pushed
        to the heap when the loop and the sleeper would (so equal-time timers keep their order), time
        jumps by ``when - now`` as in :meth:`_run_once` (the same floats), the new timer is due at
        ``on_grid(now + delay)`` as ``call_later`` makes it. Nothing else would happen means: nothing
        ready, no other timer due at the end of the sleep, the next timer not a cancelled one and no purge of
        cancelled timers due (``_run_once`` would remove those between the wake-up and the next sleep),
        and the next sleep ends later than now (one that ends within the clock's resolution would be
        run without a jump of time). A callback made ready meanwhile (a signal's handler, a thread's
        ``call_soon_threadsafe``) ends the stretch before time moves on: the loop never jumps time while
        one is ready. Should ``next_sleep`` or ``step`` raise, the sleeper's sleep raises it (its task
        fails as if its own code had raised it), never the event loop itself."""
        sched: list[Any] = self._scheduled  # type: ignore[attr-defined]
        ready: Any = self._ready  # type: ignore[attr-defined]
        if not sched or ready or self.get_debug():
            return []
        head = sched[0]
        stepper = self.steppers.get(id(head))
        if stepper is None or head._cancelled:
            return []
        next_sleep, step, future = stepper
        clock = self._virtual_clock
        base_resolution = self._base_resolution
        heappop, heappush = heapq.heappop, heapq.heappush
        # whether _run_once would purge cancelled timers once this one is popped (the same at every step)
        purge = self._purge_due(len(sched) - 1)
        steps = 0
        while True:
            now = clock._now
            end_time = now + max(base_resolution, math.ulp(now))  # _clock_resolution
            if head._when >= end_time:  # not due yet: a select longer than a day goes in pieces
                return []
            heappop(sched)  # the loop pops the due timer...
            head._scheduled = False
            nxt = sched[0] if sched else None
            delay = None
            try:
                if not (ready or purge) and (nxt is None or (nxt._when >= end_time and not nxt._cancelled)):
                    delay = next_sleep()
                when = None if delay is None else on_grid(now + delay)  # as call_later would set it
                if when is None or not when >= end_time:
                    ready.append(head)  # ... and wakes the sleeper, which does the rest
                    return []
                step()
            except Exception as exc:  # noqa: BLE001 - the sleeper's code, run in its place: its sleep raises it
                if not future.done():
                    future.set_exception(exc)
                return []
            head._when = when  # the sleeper's next call_later(delay)
            heappush(sched, head)
            head._scheduled = True
            if ready or sched[0] is not head:  # ready: a signal's handler or a thread added a callback
                return []  # meanwhile, which runs now, before time moves on (as _run_once runs it)
            timeout = head._when - now  # the next _run_once's select
            if timeout > _MAX_SELECT_S:
                return []
            steps += 1
            if steps % POLL_EVERY == 0:
                events = inner.select(0)
                if events:
                    return events
            clock._now = now + timeout  # advance(timeout), timeout > 0

    def _purge_due(self, count: int) -> bool:
        """Whether ``_run_once`` would purge the cancelled timers from a heap of ``count``."""
        cancelled: int = self._timer_cancelled_count  # type: ignore[attr-defined]
        return count > _PURGE_ABOVE and cancelled / count > _PURGE_FRACTION

    def time(self) -> float:
        return self._virtual_clock.now()

    def call_at(
        self,
        when: float,
        callback: Callable[[*Ts], object],
        *args: *Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        """Every timer of this loop (``call_later``, ``asyncio.sleep``, ``asyncio.timeout``) is made here:
        on the grid (:func:`on_grid`)."""
        return super().call_at(on_grid(when), callback, *args, context=context)

    # asyncio runs a timer when it lies below ``time() + _clock_resolution`` (the monotonic clock's, 1 ns).
    # From 2^24 s of virtual time (≈ 194 days) adding 1 ns to ``now`` rounds back to ``now``: time jumped
    # to a timer that was then never due, and the loop spun for ever. The resolution never falls below
    # the spacing of floats at ``now``, so a timer whose time has come always runs.
    @property
    def _clock_resolution(self) -> float:
        return max(self._base_resolution, math.ulp(self._virtual_clock.now()))

    @_clock_resolution.setter
    def _clock_resolution(self, value: float) -> None:  # set once by BaseEventLoop.__init__
        self._base_resolution = value

    async def shutdown_default_executor(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        # ``asyncio.Runner`` gives the executor's threads 300 s to finish; from Python 3.13 that limit is a
        # timer of this loop, which in virtual time expires at once (the threads are abandoned with a
        # RuntimeWarning). Real threads take real time: wait for them without a limit, as 3.11 does.
        await super().shutdown_default_executor()
