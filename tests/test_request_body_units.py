"""The request bodies on their own: a turn's in agent and replay mode, the warm-up's, and the replayed
action's echo header up to its size limit."""

from __future__ import annotations

import json
from typing import Any

from asyncroll.backends.action_schema import final_schema, response_format
from asyncroll.backends.base import ModelRequest
from asyncroll.backends.http_settings import HttpSettings
from asyncroll.backends.request_body import (
    ACTION_HEADER,
    MAX_ACTION_HEADER,
    action_headers,
    chat_body,
    warmup_body,
)
from asyncroll.workload import FinalAction, Problem

REQUEST = ModelRequest("t", Problem.model_validate({"prompt": "p"}), 0, [{"role": "user", "content": "p"}])


def settings(**changes: Any) -> HttpSettings:
    base: dict[str, Any] = {
        "endpoint": "http://server",
        "model": "m",
        "inflight": 1,
        "max_tokens": 64,
        "seed": 3,
    }
    return HttpSettings(**(base | changes))


def final(answer: str, output_tokens: int | None = None) -> FinalAction:
    return FinalAction(type="final", answer=answer, output_tokens=output_tokens)


def test_the_echo_header_carries_the_model_view_up_to_its_limit() -> None:
    short = action_headers(final("a", output_tokens=5))
    assert json.loads(short[ACTION_HEADER]) == {"type": "final", "answer": "a"}
    overhead = len(json.dumps({"type": "final", "answer": ""}))
    at_limit = action_headers(final("x" * (MAX_ACTION_HEADER - overhead)))
    assert len(at_limit[ACTION_HEADER]) == MAX_ACTION_HEADER == 8192
    assert action_headers(final("x" * (MAX_ACTION_HEADER - overhead + 1))) == {}
    assert action_headers(None) == {}


def test_a_replayed_turn_without_output_tokens_asks_for_max_tokens() -> None:
    body = chat_body(settings(replay=True), "vllm", REQUEST, final("a"))
    assert (body["max_tokens"], body["min_tokens"], body["ignore_eos"]) == (64, 64, True)
    assert "response_format" not in body  # the action is the script's: no schema asked


def test_an_agent_turn_carries_its_schema_only_with_structured_output() -> None:
    body = chat_body(settings(), None, REQUEST, None)
    assert {k: body[k] for k in ("model", "temperature", "max_tokens", "seed")} == {
        "model": "m",
        "temperature": 0,
        "max_tokens": 64,
        "seed": 3,
    }
    assert body["response_format"] == response_format(final_schema())
    assert "min_tokens" not in body and "ignore_eos" not in body
    assert "response_format" not in chat_body(settings(structured=False), "vllm", REQUEST, None)


def test_the_warmup_is_small_deterministic_and_shaped_like_the_runs_requests() -> None:
    body = warmup_body(settings())
    assert {k: body[k] for k in ("model", "temperature", "max_tokens", "seed")} == {
        "model": "m",
        "temperature": 0,
        "max_tokens": 16,
        "seed": 3,
    }
    assert body["response_format"] == response_format(final_schema())
    assert warmup_body(settings(max_tokens=8))["max_tokens"] == 8  # never more than a turn may ask
    assert "response_format" not in warmup_body(settings(structured=False))
    assert "response_format" not in warmup_body(settings(replay=True))


def test_a_replay_warmup_fixes_its_length_as_the_runs_turns_do() -> None:
    vllm = warmup_body(settings(replay=True), "vllm")
    assert (vllm["max_tokens"], vllm["min_tokens"], vllm["ignore_eos"]) == (16, 16, True)
    transformers = warmup_body(settings(replay=True, max_tokens=8), "transformers")
    assert json.loads(transformers["generation_config"]) == {
        "max_new_tokens": 8,
        "min_new_tokens": 8,
        "eos_token_id": [],
    }
    generic = warmup_body(settings(replay=True), "generic")
    assert set(generic) == {"model", "messages", "temperature", "max_tokens", "seed"}
    agent = warmup_body(settings(), "vllm")  # agent mode: a free-length reply, as its turns
    assert "min_tokens" not in agent and "ignore_eos" not in agent
