"""The model gate's counts and events on a virtual clock: what the live view, the summary and the policies
read (the limit, requests in flight and queued, the peak, started / failed / cancelled requests) and the
fields of each request's ``model_*`` events, for a scripted set of latencies."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from asyncroll.backends.base import ModelResponse
from asyncroll.clock import VirtualClock
from asyncroll.errors import ModelError
from asyncroll.event_log import EventCapture, EventLog
from asyncroll.events import (
    ModelEnqueued,
    ModelFailed,
    ModelFinished,
    ModelStarted,
    ServerAvailable,
    ServerUnavailable,
)
from asyncroll.runtime.model_gate import ModelGate, ModelGateSnapshot
from asyncroll.workload.models import FinalAction


def _after(
    clock: VirtualClock, seconds: float, fails: bool = False
) -> Callable[[], Awaitable[ModelResponse]]:
    async def request() -> ModelResponse:
        await clock.sleep(seconds)
        if fails:
            raise ModelError("http_status", "server said no", status=500, response_received=True)
        return ModelResponse(FinalAction(type="final", answer=1), prompt_tokens=3, completion_tokens=4)

    return request


@pytest.mark.timeout(10)
def test_a_gate_of_two_counts_three_requests_and_their_events() -> None:
    """Limit 2; at t=0 request 1 (1 s), request 2 (3 s, fails) and request 3 (2 s) arrive: 3 waits for
    1's slot and runs from t=1 to t=3; a fourth, in flight when it is cancelled at t=3.5, ends cancelled."""
    clock = VirtualClock()
    capture = EventCapture()
    events = EventLog(clock)
    events.subscribe(capture)
    events.start_measurement()
    gate = ModelGate(2, clock, events)
    seen: list[ModelGateSnapshot] = []

    async def scenario() -> None:
        calls = [
            asyncio.create_task(gate.call("a", 0, _after(clock, 1.0))),
            asyncio.create_task(gate.call("b", 0, _after(clock, 3.0, fails=True))),
            asyncio.create_task(gate.call("c", 0, _after(clock, 2.0))),
        ]
        await asyncio.sleep(0)
        seen.append(gate.snapshot())  # t=0: two in flight, one queued
        assert gate.limit == 2 and gate.outstanding == 3
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert isinstance(results[1], ModelError) and not isinstance(results[0], BaseException)
        seen.append(gate.snapshot())  # t=3: one failure, none cancelled
        late = asyncio.create_task(gate.call("d", 1, _after(clock, 5.0)))
        await clock.sleep(0.5)
        late.cancel()
        with pytest.raises(asyncio.CancelledError):
            await late
        seen.append(gate.snapshot())

    clock.run(scenario())
    assert seen == [
        ModelGateSnapshot(limit=2, inflight=2, queued=1, peak_inflight=2, requests=3, failures=0, started=2),
        ModelGateSnapshot(limit=2, inflight=0, queued=0, peak_inflight=2, requests=3, failures=1, started=3),
        ModelGateSnapshot(
            limit=2, inflight=0, queued=0, peak_inflight=2, requests=4, failures=1, started=4, cancelled=1
        ),
    ]
    assert seen[0].outstanding == 3
    enqueued = [(e.id, e.request_id, e.outstanding) for e in capture.of(ModelEnqueued)]
    assert enqueued == [("a", 1, 1), ("b", 2, 2), ("c", 3, 3), ("d", 4, 1)]
    started = [(e.request_id, e.inflight, e.queued_s) for e in capture.of(ModelStarted)]
    assert started == [(1, 1, 0.0), (2, 2, 0.0), (3, 2, 1.0), (4, 1, 0.0)]
    finished = [(e.request_id, e.t, e.latency_s, e.completion_tokens) for e in capture.of(ModelFinished)]
    assert finished == [(1, 1.0, 1.0, 4), (3, 3.0, 2.0, 4)]
    failed = [
        (e.request_id, e.t, e.latency_s, e.kind, e.status, e.response_received)
        for e in capture.of(ModelFailed)
    ]
    assert failed == [(2, 3.0, 3.0, "http_status", 500, True), (4, 3.5, 0.5, "cancelled", None, False)]


class _SteppedClock(VirtualClock):
    """A virtual clock the gate takes for a real one: it follows the server circuit only there."""

    virtual = False


def test_the_seconds_the_server_circuit_was_open_add_up_across_openings() -> None:
    """``server_unavailable_s`` (the live metrics' ``server_unavailable_seconds``): open from t=10 to 13,
    then again from t=20, read at t=21.5: 3 + 1.5 s, two openings, open now."""
    clock = _SteppedClock()
    events = EventLog(clock)
    events.start_measurement()
    gate = ModelGate(1, clock, events)
    for at, event in (
        (10.0, ServerUnavailable(failures=3, reason="connect", opened=1)),
        (13.0, ServerAvailable(paused_s=3.0, probes=2)),
        (20.0, ServerUnavailable(failures=3, reason="connect", opened=2)),
    ):
        clock.advance(at - clock.now())
        events.emit(event)
    clock.advance(1.5)
    snap = gate.snapshot()
    assert (snap.server_unavailable, snap.server_unavailable_count) == (True, 2)
    assert snap.server_unavailable_s == pytest.approx(4.5, abs=1e-9)
    clock.advance(0.5)
    events.emit(ServerAvailable(paused_s=2.0, probes=1))
    snap = gate.snapshot()
    assert (snap.server_unavailable, snap.server_unavailable_s) == (False, pytest.approx(5.0, abs=1e-9))


@pytest.mark.timeout(10)
def test_a_backend_bug_ends_its_request_with_model_failed() -> None:
    """A backend that raised what no backend should (a ``KeyError``: a bug) left its request with only
    ``model_enqueued`` and ``model_started``: the promise that every request holding a slot ends in an
    event broke, and the summary's requests did not add up. It now ends ``model_failed`` kind
    ``internal`` naming the error, is counted a failure, and the bug itself still propagates."""
    clock = VirtualClock()
    capture = EventCapture()
    events = EventLog(clock)
    events.subscribe(capture)
    events.start_measurement()
    gate = ModelGate(1, clock, events)

    async def buggy() -> ModelResponse:
        await clock.sleep(0.5)
        raise KeyError("choices")

    async def scenario() -> None:
        with pytest.raises(KeyError):
            await gate.call("a", 0, buggy)

    clock.run(scenario())
    (failed,) = capture.of(ModelFailed)
    assert failed.kind == "internal" and failed.error == "the backend raised KeyError: 'choices'"
    assert failed.latency_s == 0.5
    snap = gate.snapshot()
    assert (snap.failures, snap.cancelled, snap.inflight) == (1, 0, 0)
