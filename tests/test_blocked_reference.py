"""Client CPU-blocked time against its definition, recomputed the plain way on seeded random event
streams: the state after all events of one timestamp (≥ 1 active trajectory, 0 model requests
outstanding, ≥ 1 CPU job pending) holds until the next timestamp; blocked seconds are the sum of those
spans, intervals the maximal runs of them, and a request a stop cancelled stays outstanding."""

from __future__ import annotations

import random

import pytest

from asyncroll.events import (
    Event,
    ModelEnqueued,
    ModelFailed,
    ModelFinished,
    TrajectoryFinished,
    TrajectoryStarted,
)
from asyncroll.outputs.blocked import BlockedMeter
from tests.blocked_reference import blocked_reference
from tests.event_records import at, cpu_enqueued, cpu_failed, cpu_finished


def _stream(rng: random.Random, n: int) -> list[Event]:
    """Events in time order, several at one instant at times, counters never below 0."""
    active = outstanding = pending = 0
    t = 0.0
    events: list[Event] = []
    for _ in range(n):
        t += rng.choice((0.0, 0.0, 0.25, 0.5, 1.0))
        choice = rng.randrange(9)
        if choice == 0 or (choice == 1 and active == 0):  # work may go on with no trajectory active
            active += 1
            event: Event = TrajectoryStarted(id="a", index=0, prompt_chars=1, active=active)
        elif choice == 1:
            active -= 1
            event = TrajectoryFinished(id="a", status="completed", turns=1, tool_calls=0, duration_s=0.0)
        elif choice == 2 or (choice in (3, 4) and outstanding == 0):
            outstanding += 1
            event = ModelEnqueued(id="a", request_id=1, turn=0, outstanding=outstanding)
        elif choice == 3:
            outstanding -= 1
            event = ModelFinished(id="a", request_id=1, turn=0, latency_s=0.0, action="tool")
        elif choice == 4:
            kind = rng.choice(("timeout", "cancelled"))
            outstanding -= kind != "cancelled"  # a cancelled request stays outstanding (a stop)
            event = ModelFailed(id="a", request_id=1, turn=0, latency_s=0.0, kind=kind, error="x")
        elif choice in (5, 6) or pending == 0:
            pending += 1
            event = cpu_enqueued()
        elif choice == 7:
            pending -= 1
            event = cpu_finished()
        else:
            pending -= 1
            event = cpu_failed()
        events.append(at(t, event))
    return events


def _reference(events: list[Event], end: float) -> tuple[float, int]:
    seconds, intervals = blocked_reference(
        ({"t": e.t, "event": e.event, "kind": getattr(e, "kind", None)} for e in events), end
    )
    return round(seconds, 6), intervals


@pytest.mark.parametrize("seed", range(40))
def test_the_meter_agrees_with_the_definition(seed: int) -> None:
    rng = random.Random(seed)
    events = _stream(rng, rng.randrange(5, 60))
    meter = BlockedMeter()
    for event in events:
        meter(event)
    for end in (events[-1].t, events[-1].t + 0.75):
        expected_s, expected_n = _reference(events, end)
        assert meter.total(end) == pytest.approx(expected_s, abs=1e-9), (seed, end)
        assert meter.intervals(end) == expected_n, (seed, end)
