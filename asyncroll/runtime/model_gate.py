"""The model gate: the one limiter of concurrent model requests (``max_inflight_model_requests``).

Its snapshot gives the supply signal policies read: *model outstanding* = requests queued for a slot plus
requests in flight.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from asyncroll.backends.base import ModelResponse
from asyncroll.clock import Clock
from asyncroll.errors import ModelError
from asyncroll.events import EventLog, ModelEnqueued, ModelFailed, ModelFinished, ModelStarted
from asyncroll.runtime.limiter import FifoLimiter
from asyncroll.telemetry.nvtx import NO_RANGES, Ranges


@dataclass(frozen=True, slots=True)
class ModelGateSnapshot:
    limit: int
    inflight: int
    queued: int
    peak_inflight: int
    requests: int
    failures: int

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
        self._failures = 0

    @property
    def limit(self) -> int:
        return self._limiter.limit

    @property
    def outstanding(self) -> int:
        return self._limiter.holding + self._limiter.waiting

    def snapshot(self) -> ModelGateSnapshot:
        s = self._limiter.snapshot()
        return ModelGateSnapshot(s.limit, s.holding, s.waiting, s.peak_holding, self._next_id, self._failures)

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
        events.emit(
            ModelEnqueued(id=trajectory_id, request_id=rid, turn=turn, outstanding=self.outstanding + 1)
        )
        queued_at = clock.now()
        waiting = self._ranges.start("model wait", rid)
        try:
            await self._limiter.acquire()
        finally:
            self._ranges.end(waiting)
        serving = self._ranges.start("model request", rid)
        try:
            started = clock.now()
            events.emit(
                ModelStarted(
                    id=trajectory_id,
                    request_id=rid,
                    turn=turn,
                    inflight=self._limiter.holding,
                    queued_s=round(started - queued_at, 6),
                )
            )
            try:
                response = await request()
            except ModelError as exc:
                self._failures += 1
                events.emit(
                    ModelFailed(
                        id=trajectory_id,
                        request_id=rid,
                        turn=turn,
                        latency_s=round(clock.now() - started, 6),
                        kind=exc.kind,
                        error=str(exc)[:1000],
                        status=exc.status,
                        response_received=exc.response_received,
                        parse_s=exc.parse_s,
                        attempts=exc.attempts,
                    )
                )
                raise
            events.emit(
                ModelFinished(
                    id=trajectory_id,
                    request_id=rid,
                    turn=turn,
                    latency_s=round(clock.now() - started, 6),
                    action=response.action.type,
                    prompt_tokens=response.prompt_tokens,
                    completion_tokens=response.completion_tokens,
                )
            )
            return response
        finally:
            self._ranges.end(serving)
            self._limiter.release()
