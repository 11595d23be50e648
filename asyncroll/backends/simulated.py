"""The simulated-server backend: actions come from the script, model time from a batching server model.

Prompt tokens are those ``serve-sim`` counts for the same turn: the messages the HTTP backend sends for
it (:func:`~asyncroll.backends.action_schema.render_messages`: the system prompt with the turn's schema
and tools, then the conversation so far), sized by serve-sim's own rule
(:func:`~asyncroll.serve_sim.sizes.prompt_tokens`), so a turn's prefill costs the same through either
front end of the server model (against an HTTP run in ``--replay``, whose earlier turns go back rendered
from their actions, as here; an agent's go back as the text its model wrote). Output tokens come from
the action's ``output_tokens`` or from the size of the action as a model writes it
(:func:`~asyncroll.backends.action_schema.model_view`: without the script's timing fields), by the same
rule: what serve-sim's reply to that action (its echo) measures.

Each conversation entry is rendered and sized once (:func:`~asyncroll.backends.action_schema.render_message`
depends on the entry alone; a trajectory's conversation only grows), and each turn adds its system prompt:
re-rendering the whole conversation every turn made a trajectory of n turns cost O(n²) (a 5,000-turn one
took minutes of the simulator's CPU).
The engine loop runs as a task of the run's task group and stops at :meth:`aclose`.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict

from asyncroll.backends.action_schema import (
    is_code_workload,
    model_view,
    render_message,
    system_prompt,
    turn_schema,
)
from asyncroll.backends.base import ModelRequest, ModelResponse
from asyncroll.backends.scripted import scripted_failure, scripted_step
from asyncroll.backends.server_model import BatchingServer
from asyncroll.serve_sim.sizes import content_chars, tokens
from asyncroll.workload import ErrorStep, FinalAction

#: Conversations whose sized prefix is kept (least recently asked first out). A trajectory's entry is
#: dropped at its final answer; one that ends otherwise (failed, max_turns) ages out. An evicted one is
#: sized again from the start: slower, never different.
SIZED_CONVERSATIONS = 4096


class SimulatedServerBackend:
    name = "simulated"

    def __init__(self, server: BatchingServer, chars_per_token: float = 4.0, overhead_s: float = 0.0) -> None:
        self.server = server
        self._chars_per_token = chars_per_token
        self._overhead = overhead_s
        #: trajectory id → (entries of its conversation sized, their content characters)
        self._sized: OrderedDict[str, tuple[int, int]] = OrderedDict()

    async def start(self, tg: asyncio.TaskGroup) -> None:
        tg.create_task(self.server.serve())

    async def warmup(self, requests: int) -> int:
        return 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        action = scripted_step(request)
        if isinstance(action, ErrorStep):  # fails before the server: no batch slot, no tokens
            await scripted_failure(action, request.turn, self.server.clock, self._overhead)
        prompt = tokens(
            self._prompt_chars(request, final=isinstance(action, FinalAction)), self._chars_per_token
        )
        # a reply's size: declared, else the action a model writes (serve-sim's reply to its echo)
        output = action.output_tokens or tokens(len(json.dumps(model_view(action))), self._chars_per_token)
        generation = await self.server.generate(prompt, output)
        if self._overhead:
            await self.server.clock.sleep(self._overhead)
        return ModelResponse(action=action, prompt_tokens=prompt, completion_tokens=generation.output_tokens)

    def _prompt_chars(self, request: ModelRequest, final: bool) -> int:
        """The content characters of the messages the HTTP backend sends for this turn
        (:func:`~asyncroll.backends.action_schema.render_messages`), as serve-sim counts them
        (:func:`~asyncroll.serve_sim.sizes.content_chars`): the turn's system prompt, then the
        conversation, whose entries sized on earlier turns are not rendered again."""
        problem, messages = request.problem, request.messages
        code = is_code_workload(problem)
        done, chars = self._sized.pop(request.trajectory_id, (0, 0))
        if done > len(messages):  # not this conversation's prefix: size it whole
            done, chars = 0, 0
        chars += content_chars(render_message(message, code) for message in messages[done:])
        if not final:  # a final answer ends the trajectory
            self._sized[request.trajectory_id] = (len(messages), chars)
            while len(self._sized) > SIZED_CONVERSATIONS:
                self._sized.popitem(last=False)
        if code:
            return chars
        return chars + len(system_prompt(problem, turn_schema(problem, request.turn)))

    @property
    def batch_seconds(self) -> float:
        """Σ of the requests' time in the server's running batch, without their wait to join it: the
        work the ``max_num_seqs`` batch slots did (the lower bound's server term)."""
        return self.server.batch_seconds

    async def aclose(self) -> None:
        self.server.close()
