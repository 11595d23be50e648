"""The scripted backend: turn *i* of a problem returns ``script[i]``; no network.

Each action may carry ``latency_ms``, which the backend waits on the run's clock, so realistic model time
can be modelled without a server (and exactly, on a virtual clock). Actions were validated when the
workload was scanned; running past the end of a script is a model failure of that trajectory.
"""

from __future__ import annotations

import asyncio

from asyncroll.backends.base import ModelRequest, ModelResponse
from asyncroll.clock import Clock
from asyncroll.errors import ModelError
from asyncroll.workload import Action


def scripted_action(request: ModelRequest) -> Action:
    """The action a problem's script gives for this turn; running past its end is a model failure."""
    script = request.problem.script or []
    if request.turn >= len(script):
        raise ModelError(
            "script_exhausted", f"script has {len(script)} actions; turn {request.turn} asked for another"
        )
    return script[request.turn]


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
        action = scripted_action(request)
        seconds = (action.latency_ms or 0.0) / 1000.0 + self._overhead
        if seconds:
            await self._clock.sleep(seconds)
        return ModelResponse(action=action)

    async def aclose(self) -> None:
        return None
