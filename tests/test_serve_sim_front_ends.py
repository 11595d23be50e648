"""The same server model behind two front ends, ``simulate --server batching`` and serve-sim: the same
bound on characters per token, and a turn costs the same prompt, prefill and decode through either."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import httpx
import pytest

from asyncroll.backends.server_model import ServerModelConfig
from asyncroll.config import ServerKind
from asyncroll.serve_sim.config import SimConfig
from asyncroll.serve_sim.server import serve_in_thread
from asyncroll.workload import ErrorStep


@pytest.mark.timeout(30)
def test_the_fewest_chars_per_token_both_front_ends_accept_is_served() -> None:
    """serve-sim and simulate share one bound (``sizes.MIN_CHARS_PER_TOKEN``); at it, a long prompt is
    sized and served, not failed with a 500."""
    from asyncroll.serve_sim.sizes import MIN_CHARS_PER_TOKEN
    from asyncroll.simulation.engine import SimulationSettings

    SimulationSettings(server="batching", chars_per_token=MIN_CHARS_PER_TOKEN)
    with pytest.raises(ValueError, match=r"chars_per_token must be a finite number >= 0\.01"):
        SimulationSettings(server="batching", chars_per_token=MIN_CHARS_PER_TOKEN / 2)
    with pytest.raises(ValueError, match=r"--chars-per-token must be >= 0\.01"):
        SimConfig(chars_per_token=MIN_CHARS_PER_TOKEN / 2)
    content = "x" * 100
    with (
        serve_in_thread(
            SimConfig(engine=ServerModelConfig(step_base_ms=1), chars_per_token=MIN_CHARS_PER_TOKEN)
        ) as running,
        httpx.Client(base_url=running.url, timeout=10) as client,
    ):
        r = client.post(
            "/v1/chat/completions",
            json={"model": "sim", "messages": [{"role": "user", "content": content}], "max_tokens": 1},
        )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 10_000  # 100 characters / 0.01


_TOOL_TURN = {
    "id": "t",
    "prompt": "What is 6 * 7? Use the tool.",
    "tools": [{"name": "sleep_ms", "description": "sleeps"}],
    "script": [
        {
            "type": "tool",
            "name": "sleep_ms",
            "arguments": {"milliseconds": 5},
            "latency_ms": 9,
            "output_tokens": 6,
        },
        {"type": "final", "answer": "42", "latency_ms": 9, "output_tokens": 4},
    ],
}


_CODE_TURN = {
    "id": "c",
    "prompt": "Write a program that prints 1.",
    "tools": [{"name": "lcb_evaluate"}],
    "script": [
        {"type": "submit", "code": "print(2)", "latency_ms": 9, "cpu_ms": 4, "output_tokens": 5},
        {"type": "submit", "code": "print(1)", "latency_ms": 9, "cpu_ms": 4, "output_tokens": 5},
    ],
    "metadata": {
        "reference_tests": [{"input": "", "output": "1", "testtype": "stdin"}],
        "prompt_metadata": {"protocol": "one_repair", "max_generations": 2},
    },
}


def _one_turn_on_both_front_ends(
    request: Any, engine: ServerModelConfig, chars_per_token: float, server_kind: ServerKind | None
) -> tuple[Any, Any, Any, dict[str, Any]]:
    """One model turn on ``simulate --server batching``'s backend (virtual clock) and on serve-sim over
    HTTP (``--replay``): the simulated response, its engine's snapshot, the HTTP response and serve-sim's
    engine stats."""
    from asyncroll.backends.openai import HttpSettings, OpenAIBackend
    from asyncroll.backends.server_model import BatchingServer
    from asyncroll.backends.simulated import SimulatedServerBackend
    from asyncroll.clock import SystemClock, VirtualClock

    clock = VirtualClock()
    simulated = SimulatedServerBackend(BatchingServer(engine, clock), chars_per_token=chars_per_token)

    async def on_the_simulator() -> Any:
        async with asyncio.TaskGroup() as tg:
            await simulated.start(tg)
            try:
                return await simulated.complete(request)
            finally:
                await simulated.aclose()

    sim_response = clock.run(on_the_simulator())
    with serve_in_thread(SimConfig(engine=engine, chars_per_token=chars_per_token)) as running:
        settings = HttpSettings(running.url, "sim", inflight=1, replay=True, server_kind=server_kind)
        http = OpenAIBackend(settings, SystemClock())

        async def over_http() -> Any:
            try:
                return await http.complete(request)
            finally:
                await http.aclose()

        http_response = asyncio.run(over_http())
        served = running.stats()["engine"]
    return sim_response, simulated.server.snapshot(), http_response, served


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("problem", "observation"),
    [
        (_TOOL_TURN, {"role": "tool", "content": '{"slept_ms": 5}'}),
        (_CODE_TURN, {"role": "user", "content": "Your program failed a test.\n\nexpected 1, got 2"}),
    ],
    ids=["tools", "one-repair"],
)
def test_a_turn_costs_the_same_prompt_and_prefill_through_either_front_end(
    problem: dict[str, Any], observation: dict[str, Any]
) -> None:
    """``simulate --server batching`` counted the conversation only; serve-sim, the same server model
    behind HTTP, also sees the system prompt the HTTP backend sends (the turn's schema and tool list),
    and counted an assistant turn as the action's JSON without the script's timing fields: the same turn
    had another prefill cost unless --prefill-ms-per-token 0. Now both size the messages the HTTP
    backend renders, by serve-sim's rule."""
    from asyncroll.backends.action_schema import render_messages
    from asyncroll.backends.base import ModelRequest
    from asyncroll.workload import Problem

    parsed = Problem.model_validate(problem)
    assert parsed.script is not None and isinstance(parsed.id, str)
    conversation: list[dict[str, Any]] = [
        {"role": "user", "content": parsed.prompt},
        {"role": "assistant", "action": parsed.script[0]},
    ]
    request = ModelRequest(parsed.id, parsed, 1, [*conversation, observation])
    engine = ServerModelConfig(
        max_num_seqs=4, step_base_ms=1.0, step_per_seq_ms=0.0, prefill_ms_per_token=0.5
    )
    sim_response, sim_engine, http_response, served = _one_turn_on_both_front_ends(
        request, engine, 3.0, "vllm"
    )

    sent = render_messages(parsed, request.messages, 1)
    expected = math.ceil(sum(len(m["content"]) for m in sent) / 3.0)
    assert sim_response.prompt_tokens == http_response.prompt_tokens == expected
    assert sim_engine.prompt_tokens == served["prompt_tokens"] == expected
    step = parsed.script[1]
    assert not isinstance(step, ErrorStep)
    assert sim_response.completion_tokens == http_response.completion_tokens == step.output_tokens
    # the same steps, the first with the same prefill: the same engine time (computed, not measured)
    assert served["steps"] == sim_engine.steps and served["busy_s"] == sim_engine.busy_s
    assert sim_engine.busy_s == pytest.approx((sim_engine.steps * 1.0 + expected * 0.5) / 1000)


@pytest.mark.timeout(30)
def test_a_reply_without_declared_tokens_has_serve_sim_s_size_on_the_simulator() -> None:
    """An action without ``output_tokens`` is sized from its JSON on both front ends; the simulator
    measured the script's own form (``latency_ms`` included), so the same reply cost more decode steps
    under ``simulate --server batching`` than serve-sim's reply to it (the action a model writes)."""
    from asyncroll.backends.base import ModelRequest
    from asyncroll.workload import Problem

    final = {"type": "final", "answer": "42", "latency_ms": 123456}
    parsed = Problem.model_validate({"id": "u", "prompt": "Say 42.", "script": [final]})
    assert isinstance(parsed.id, str)
    request = ModelRequest(parsed.id, parsed, 0, [{"role": "user", "content": parsed.prompt}])
    engine = ServerModelConfig(
        max_num_seqs=4, step_base_ms=1.0, step_per_seq_ms=0.0, prefill_ms_per_token=0.0
    )
    # a server of no declared kind gets no min_tokens: its reply is the echoed action as serve-sim writes it
    sim_response, _, http_response, _ = _one_turn_on_both_front_ends(request, engine, 1.0, None)
    reply = json.dumps({"type": "final", "answer": "42"})
    assert sim_response.completion_tokens == http_response.completion_tokens == len(reply)


@pytest.mark.timeout(30)
def test_characters_are_divided_by_the_chars_per_token_as_written() -> None:
    """``--chars-per-token 0.7``: 21 characters are 30 tokens, as written (21 ÷ 0.7). In floats 21 / 0.7
    is 30.000000000000004, so both front ends counted 31, and a reply cut at ``max_tokens`` 10 of a
    ``--chars-per-token`` 0.29 server kept 2 characters (10 × 0.29 = 2.9000000000000004: 2, right) but at
    ``max_tokens`` 100 kept 28 (28.999999999999996) where 29 fit."""
    from asyncroll.serve_sim import sizes

    assert sizes.tokens(21, 0.7) == 30
    assert sizes.tokens(22, 0.7) == 32  # 31.43: rounded up
    assert sizes.tokens(29, 0.29) == 100
    assert sizes.tokens(0, 0.7) == 1
    assert sizes.chars(100, 0.29) == 29
    assert sizes.chars(10, 0.29) == 2
    assert sizes.chars(1, 0.7) == 0
    engine = ServerModelConfig(step_base_ms=1.0)
    with (
        serve_in_thread(SimConfig(engine=engine, chars_per_token=0.29)) as running,
        httpx.Client(base_url=running.url, timeout=10) as client,
    ):
        body = {"model": "sim", "messages": [{"role": "user", "content": "x" * 29}], "max_tokens": 100}
        r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 100
    # the seeded policy's reply, {"type": "final", "answer": "answer-N"}, cut at 100 tokens: 29 characters
    assert r.json()["choices"][0]["message"]["content"] == '{"type": "final", "answer": "'
