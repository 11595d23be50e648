"""The model gate: the one limiter of concurrent model requests (``max_inflight_model_requests``).

Its snapshot gives the supply signal policies read: *model outstanding* = requests queued for a slot plus
requests in flight. Every request that took a slot ends with ``model_finished`` or ``model_failed``; one
still in flight when the run is stopped ends with ``model_failed`` of kind ``cancelled`` (as a CPU job
holding a worker gets ``cpu_failed`` reason ``cancelled``), and one still queued for a slot, never sent,
leaves the queue without an ending event (as a queued CPU job does).

On a real clock the gate also follows the HTTP backend's server circuit from the event stream
(``server_unavailable``/``server_available``), so that the live view (``--metrics-port``) can say when
admission is paused because the server is down, how often that happened and for how long.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from asyncroll.backends.base import ModelResponse
from asyncroll.clock import Clock
from asyncroll.errors import ModelError
from asyncroll.event_log import EventLog
from asyncroll.events import (
    Event,
    ModelEnqueued,
    ModelFailed,
    ModelFinished,
    ModelRetrying,
    ModelStarted,
    ServerAvailable,
    ServerUnavailable,
)
from asyncroll.runtime.limiter import FifoLimiter
from asyncroll.telemetry.nvtx import NO_RANGES, Ranges

#: How a request in flight when the run is stopped is recorded (never raised: the cancellation is).
_CANCELLED = "the run was stopped while this request was in flight"


@dataclass(frozen=True, slots=True)
class ModelGateSnapshot:
    """``requests``: enqueued so far; ``started``: those that took a slot; ``failures``: ended in
    ``model_failed`` (not counting ``cancelled``); ``server_*``: the HTTP backend's circuit (open now,
    times opened, seconds open so far, the current opening included)."""

    limit: int
    inflight: int
    queued: int
    peak_inflight: int
    requests: int
    failures: int
    started: int = 0
    cancelled: int = 0
    server_unavailable: bool = False
    server_unavailable_count: int = 0
    server_unavailable_s: float = 0.0

    @property
    def outstanding(self) -> int:
        return self.inflight + self.queued


class ModelGate:
    def __init__(self, limit: int, clock: Clock, events: EventLog, *, ranges: Ranges = NO_RANGES) -> None:
        """``ranges``: NVTX ranges (``--nvtx``) for each request's wait and service; no-ops by default."""
        self._limiter = FifoLimiter(limit)
        self._clock = clock
        self._events = events
        self._ranges = ranges
        self._next_id = 0
        self._started = 0
        self._failures = 0
        self._cancelled = 0
        self._down_since: float | None = None  # when the server circuit opened (clock time), while open
        self._down_count = 0
        self._down_s = 0.0
        self._retried: dict[tuple[str, int], int] = {}  # (trajectory, turn) in flight → model_retrying seen
        if not clock.virtual:  # only an HTTP backend opens a circuit; a simulation pays nothing for this
            events.subscribe(self._follow_server)

    def _follow_server(self, event: Event) -> None:
        if type(event) is ModelRetrying and event.id is not None and (event.id, event.turn) in self._retried:
            self._retried[event.id, event.turn] += 1  # a cancelled request's attempts
        elif type(event) is ServerUnavailable:
            self._down_count += 1
            self._down_since = self._clock.now()
        elif type(event) is ServerAvailable and self._down_since is not None:
            self._down_s += self._clock.now() - self._down_since
            self._down_since = None

    @property
    def limit(self) -> int:
        return self._limiter.limit

    @property
    def outstanding(self) -> int:
        return self._limiter.holding + self._limiter.waiting

    def snapshot(self) -> ModelGateSnapshot:
        s = self._limiter.snapshot()
        since = self._down_since
        down_s = self._down_s + (0.0 if since is None else max(0.0, self._clock.now() - since))
        return ModelGateSnapshot(
            s.limit,
            s.holding,
            s.waiting,
            s.peak_holding,
            self._next_id,
            self._failures,
            started=self._started,
            cancelled=self._cancelled,
            server_unavailable=since is not None,
            server_unavailable_count=self._down_count,
            server_unavailable_s=down_s,
        )

    async def call(
        self,
        trajectory_id: str,
        turn: int,
        request: Callable[[], Awaitable[ModelResponse]],
    ) -> ModelResponse:
        """Run one model request under the limit, emitting enqueued/started/finished-or-failed."""
        self._next_id += 1
        rid = self._next_id
        clock, events = self._clock, self._events
        queued_at = clock.now()
        events.emit(
            ModelEnqueued(id=trajectory_id, request_id=rid, turn=turn, outstanding=self.outstanding + 1),
            at=queued_at,
        )
        waiting = self._ranges.start("model wait", rid)
        try:
            await self._limiter.acquire()
        finally:
            self._ranges.end(waiting)
        serving = self._ranges.start("model request", rid)
        self._started += 1
        self._retried[trajectory_id, turn] = 0
        try:
            started = clock.now()
            events.emit(
                ModelStarted(
                    id=trajectory_id,
                    request_id=rid,
                    turn=turn,
                    inflight=self._limiter.holding,
                    queued_s=round(started - queued_at, 6),
                ),
                at=started,
            )
            try:
                response = await request()
            except (Exception, asyncio.CancelledError) as exc:
                # A request the stopping run cancelled (the server may still be working on it) ends too,
                # as does one whose backend raised what no backend should (a bug: it fails the run).
                if isinstance(exc, asyncio.CancelledError):
                    failure = self._cancelled_error(trajectory_id, turn)
                    self._cancelled += 1
                else:
                    failure = exc if isinstance(exc, ModelError) else _backend_bug(exc)
                    self._failures += 1
                ended = clock.now()
                events.emit(
                    ModelFailed(
                        id=trajectory_id,
                        request_id=rid,
                        turn=turn,
                        latency_s=round(ended - started, 6),
                        kind=failure.kind,
                        error=str(failure),
                        status=failure.status,
                        response_received=failure.response_received,
                        parse_s=failure.parse_s,
                        attempts=failure.attempts,
                        prompt_tokens=failure.prompt_tokens,
                        completion_tokens=failure.completion_tokens,
                        scripted=True if failure.scripted else None,
                    ),
                    at=ended,
                )
                raise
            ended = clock.now()
            events.emit(
                ModelFinished(
                    id=trajectory_id,
                    request_id=rid,
                    turn=turn,
                    latency_s=round(ended - started, 6),
                    action=response.action.type,
                    prompt_tokens=response.prompt_tokens,
                    completion_tokens=response.completion_tokens,
                    finish_reason=response.finish_reason,
                ),
                at=ended,
            )
            return response
        finally:
            self._retried.pop((trajectory_id, turn), None)
            self._ranges.end(serving)
            self._limiter.release()

    def _cancelled_error(self, trajectory_id: str, turn: int) -> ModelError:
        """How a request in flight when the run stopped is recorded: its attempts are the first plus one
        per ``model_retrying`` (an HTTP backend's retries) it had."""
        attempts = 1 + self._retried.get((trajectory_id, turn), 0)
        return ModelError("cancelled", _CANCELLED, response_received=False, attempts=attempts)


def _backend_bug(exc: Exception) -> ModelError:
    """What a backend's own error (not a :class:`ModelError`: a bug) records on its request's
    ``model_failed``: kind ``internal``, the error named."""
    return ModelError("internal", f"the backend raised {type(exc).__name__}: {exc}")
