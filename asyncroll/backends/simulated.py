"""The simulated-server backend: actions come from the script, model time from a batching server model.

Prompt tokens are those ``serve-sim`` counts for the same turn: the messages the HTTP backend sends for
it (:func:`~asyncroll.backends.action_schema.render_messages`: the system prompt with the turn's schema
and tools, then the conversation so far), sized by serve-sim's own rule
(:func:`~asyncroll.serve_sim.sizes.prompt_tokens`), so a turn's prefill costs the same through either
front end of the server model. Output tokens come from the action's ``output_tokens`` or from the size of
the action as a model writes it (:func:`~asyncroll.backends.action_schema.model_view`: without the script's
timing fields), by the same rule: what serve-sim's reply to that action (its echo) measures.
The engine loop runs as a task of the run's task group and stops at :meth:`aclose`.
"""

from __future__ import annotations

import asyncio
import json

from asyncroll.backends.action_schema import model_view, render_messages
from asyncroll.backends.base import ModelRequest, ModelResponse
from asyncroll.backends.scripted import scripted_action
from asyncroll.backends.server_model import BatchingServer
from asyncroll.serve_sim.sizes import prompt_tokens, tokens


class SimulatedServerBackend:
    name = "simulated"

    def __init__(self, server: BatchingServer, chars_per_token: float = 4.0, overhead_s: float = 0.0) -> None:
        self.server = server
        self._chars_per_token = chars_per_token
        self._overhead = overhead_s

    async def start(self, tg: asyncio.TaskGroup) -> None:
        tg.create_task(self.server.serve())

    async def warmup(self, requests: int) -> int:
        return 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        action = scripted_action(request)
        sent = render_messages(request.problem, request.messages, request.turn)  # as the HTTP backend
        prompt = prompt_tokens(sent, self._chars_per_token)  # and as serve-sim counts them
        # a reply's size: declared, else the action a model writes (serve-sim's reply to its echo)
        output = action.output_tokens or tokens(len(json.dumps(model_view(action))), self._chars_per_token)
        generation = await self.server.generate(prompt, output)
        if self._overhead:
            await self.server.clock.sleep(self._overhead)
        return ModelResponse(action=action, prompt_tokens=prompt, completion_tokens=generation.output_tokens)

    @property
    def batch_seconds(self) -> float:
        """Σ of the requests' time in the server's running batch, without their wait to join it: the
        work the ``max_num_seqs`` batch slots did (the lower bound's server term)."""
        return self.server.batch_seconds

    async def aclose(self) -> None:
        self.server.close()
