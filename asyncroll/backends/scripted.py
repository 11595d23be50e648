"""The scripted backend: turn *i* of a problem returns ``script[i]``; no network.

Each action may carry ``latency_ms``, which the backend waits on the run's clock, so realistic model time
can be modelled without a server (and exactly, on a virtual clock). Actions were validated when the
workload was scanned; running past the end of a script is a model failure of that trajectory, and so is
an ``error`` step (:class:`~asyncroll.workload.ErrorStep`), after its ``latency_ms``, with its kind.
"""

from __future__ import annotations

import asyncio
from typing import NoReturn

from asyncroll.backends.base import ModelRequest, ModelResponse
from asyncroll.clock import Clock
from asyncroll.errors import ModelError
from asyncroll.workload import ErrorStep, ScriptStep


def scripted_step(request: ModelRequest) -> ScriptStep:
    """The step a problem's script gives for this turn; running past its end is a model failure."""
    script = request.problem.script or []
    if request.turn >= len(script):
        raise ModelError(
            "script_exhausted", f"script has {len(script)} actions; turn {request.turn} asked for another"
        )
    return script[request.turn]


async def scripted_failure(step: ErrorStep, turn: int, clock: Clock, overhead_s: float = 0.0) -> NoReturn:
    """An ``error`` step: no request is sent anywhere; after its ``latency_ms`` (and the turn's overhead)
    the request fails with the step's kind, message and status, marked ``scripted`` (its ``model_failed``
    says so: no server failed it) unless the step replays a server's failure (its ``scripted`` false)."""
    seconds = (step.latency_ms or 0.0) / 1000.0 + overhead_s
    if seconds:
        await clock.sleep(seconds)
    raise ModelError(
        step.kind,
        step.error_text(turn),
        status=step.status,
        response_received=step.status is not None,
        scripted=step.scripted,
    )


class ScriptedBackend:
    name = "scripted"

    def __init__(self, clock: Clock, overhead_s: float = 0.0) -> None:
        """``overhead_s`` is added to every turn: a simulation's stand-in for what a real client pays
        beyond the model time (timer overshoot, request handling)."""
        self._clock = clock
        self._overhead = overhead_s

    async def start(self, tg: asyncio.TaskGroup) -> None:
        return None

    async def warmup(self, requests: int) -> int:
        # Nothing to warm: a script needs no server. Reported as 0 warm-up requests sent.
        return 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        action = scripted_step(request)
        if isinstance(action, ErrorStep):
            await scripted_failure(action, request.turn, self._clock, self._overhead)
        seconds = (action.latency_ms or 0.0) / 1000.0 + self._overhead
        if seconds:
            await self._clock.sleep(seconds)
        return ModelResponse(action=action)

    async def aclose(self) -> None:
        return None
