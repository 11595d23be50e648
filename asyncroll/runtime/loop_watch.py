"""Watches a real run's event loop for stalls: :func:`watch_loop` emits ``loop_stalled`` events.

Everything a run does goes through one event loop; a blocking call on it (a slow write, a long computation,
a paused terminal) or a machine with no CPU to spare for the client stops admission, dispatch and the reading
of responses at once. Queue and latency figures then grow, and without this watch the summary blamed the
schedule for them. The watch sleeps :data:`PROBE_S` at a time; a wake-up at least :data:`STALL_S` late is a
stall, recorded with how late it was (a stall shorter than the probe period can go unseen: the figures are a
lower bound, with a grain of :data:`PROBE_S`). A simulation's clock is virtual: it has no watch.
"""

from __future__ import annotations

import asyncio

from asyncroll.clock import Clock
from asyncroll.event_log import EventLog
from asyncroll.events import LoopStalled

#: How long the watch sleeps at a time: ~20 wake-ups a second, a few µs each.
PROBE_S = 0.05
#: A wake-up at least this late is a stall (an idle loop wakes late by well under a millisecond).
STALL_S = 0.1


async def watch_loop(
    clock: Clock, events: EventLog, probe_s: float = PROBE_S, stall_s: float = STALL_S
) -> None:
    """Sleep ``probe_s`` at a time and emit ``loop_stalled`` for each wake-up ``stall_s`` or more late,
    until cancelled."""
    while True:
        asked = clock.now() + probe_s
        await asyncio.sleep(probe_s)
        late = clock.now() - asked
        if late >= stall_s:
            events.emit(LoopStalled(late_s=round(late, 6)))
