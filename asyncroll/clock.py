"""The one place that reads time or sleeps.

Everything in the runtime asks a :class:`Clock` for ``now()`` and ``sleep()``. Two clocks exist:

* :class:`SystemClock`: ``time.monotonic`` (the clock the event loop and the worker processes share on
  Linux, so worker-reported start/finish times are comparable with the runtime's).
* :class:`VirtualClock`: virtual time driven by its own event loop. Whenever the loop has nothing ready
  and would block until its next timer, time jumps to that timer instead. A ten-minute scripted workload
  runs in milliseconds and every timestamp is exact and repeatable, which is what scheduling tests and
  the simulator need. Real I/O still works (it is polled), but a virtual loop must not wait on real
  processes: their time does not jump.

Real worker processes (``asyncroll.workers``) stamp their IPC and execution times with ``time.monotonic``
directly: they only ever run beside a :class:`SystemClock`, which is that same clock.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import selectors
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


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

    def __init__(self, start: float = 0.0, wall_start: float | None = None) -> None:
        self._now = float(start)
        self._wall_offset = (time.time() if wall_start is None else wall_start) - self._now

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._wall_offset + self._now

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

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


#: While callbacks are ready, a virtual loop polls real file descriptors once per this many iterations.
POLL_EVERY = 32


class _VirtualSelector(selectors.BaseSelector):
    """Polls real file descriptors without blocking; turns a timed wait into a jump of virtual time."""

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock
        self._inner = selectors.DefaultSelector()
        self._spins = 0

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
        return []

    def close(self) -> None:
        self._inner.close()

    def get_map(self) -> Any:
        return self._inner.get_map()


class _VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: VirtualClock) -> None:
        self._virtual_clock = clock
        super().__init__(selector=_VirtualSelector(clock))

    def time(self) -> float:
        return self._virtual_clock.now()

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
