"""summary.json's ``model.circuit`` on hand-made outages: paused seconds are clipped to the measured
window at both ends, an outage still open at the end counts up to it, and the waits are summed."""

from __future__ import annotations

from typing import Any

from asyncroll.events import Event, ModelPaused, ServerAvailable, ServerUnavailable
from asyncroll.outputs.summary import SummaryBuilder
from tests.event_records import at

LIMITS = {"max_active_trajectories": 1, "max_inflight_model_requests": 1, "cpu_workers": 1}


def _down(t: float) -> Event:
    return at(t, ServerUnavailable(failures=3, reason="refused", opened=1))


def _up(t: float) -> Event:
    return at(t, ServerAvailable(paused_s=0.0, probes=1))


def _circuit(events: list[Event], makespan_s: float | None) -> dict[str, Any]:
    builder = SummaryBuilder()
    for event in events:
        builder(event)
    summary = builder.build(
        makespan_s=makespan_s, policy="fifo", limits=LIMITS, cpu_cost={}, peaks={}, status="complete"
    )
    circuit: dict[str, Any] = summary["model"]["circuit"]
    return circuit


def test_paused_seconds_are_clipped_to_the_window() -> None:
    """Window 0-10 s. Outages: -1..2 (2 s inside), 5..7 (2 s), 9..12 (1 s), 11..13 (none inside); a
    ``server_available`` with no outage open changes nothing."""
    events = [
        _down(-1.0),
        _up(2.0),
        _up(3.0),
        _down(5.0),
        _up(7.0),
        _down(9.0),
        _up(12.0),
        _down(11.0),
        _up(13.0),
    ]
    events += [
        at(6.0, ModelPaused(turn=0, attempt=1, waited_s=0.75)),
        at(6.5, ModelPaused(turn=1, attempt=1, waited_s=0.5)),
    ]
    circuit = _circuit(events, 10.0)
    assert circuit == {
        "opened": 4,
        "paused_s": 5.0,
        "open_at_end": False,
        "requests_waited": 2,
        "request_wait_s": 1.25,
    }


def test_an_outage_open_at_the_end_counts_up_to_the_end() -> None:
    circuit = _circuit([_down(1.0), _up(2.5), _down(8.0)], 10.0)
    assert (circuit["opened"], circuit["paused_s"], circuit["open_at_end"]) == (2, 3.5, True)
    assert _circuit([], 10.0) == {
        "opened": 0,
        "paused_s": 0.0,
        "open_at_end": False,
        "requests_waited": 0,
        "request_wait_s": 0.0,
    }
    assert _circuit([_down(1.0)], None)["paused_s"] is None  # no window: unknown, not 0


def test_circuit_seconds_are_rounded_to_the_microsecond() -> None:
    events = [_down(1.0), _up(1.1234567), at(1.2, ModelPaused(turn=0, attempt=1, waited_s=0.2345678))]
    circuit = _circuit(events, 10.0)
    assert (circuit["paused_s"], circuit["request_wait_s"]) == (0.123457, 0.234568)
