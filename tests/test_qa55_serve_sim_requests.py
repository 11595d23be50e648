"""serve-sim checks a chat request as vLLM's OpenAI server does (``ChatCompletionRequest`` in
vllm/entrypoints/openai/protocol.py, its pydantic types in lax mode and its "before" validators;
``SamplingParams``' ranges; the content part types of vllm/entrypoints/chat_utils.py): what vLLM serves,
serve-sim serves, and what vLLM refuses with 400, serve-sim refuses with 400. Against a real serve-sim on
loopback (tests/sim_servers.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.sim_servers import body, fmt, sim

CHAT = "/v1/chat/completions"
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def _events(text: str) -> list[Any]:
    data = [line.removeprefix("data: ") for line in text.splitlines() if line]
    return [d if d == "[DONE]" else json.loads(d) for d in data]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "extra",
    [
        {"temperature": "0.5"},  # pydantic's lax mode: a numeric string is a number
        {"temperature": 0, "top_p": 1, "seed": 7.0},
        {"max_tokens": 16.0},  # an integral float is an int
        {"max_completion_tokens": "16", "min_tokens": 1.0},
        {"ignore_eos": "false", "max_tokens": 4},
        {"n": 1.0, "logprobs": "false", "top_logprobs": 0.0},
        {"tools": TOOLS},  # tool_choice left to vLLM's default with tools, "auto"; serve-sim calls none
        {"tools": TOOLS, "tool_choice": "auto"},
        {"stream_options": {}},  # vLLM refuses stream_options without stream only when they are truthy
        {"user": "someone", "logit_bias": {"50256": -100}, "frequency_penalty": -2, "presence_penalty": 2},
        {"response_format": {"type": "json_object"}},
        {"some_field_vllm_ignores": [1, 2]},
    ],
)
def test_a_request_vllm_serves_serve_sim_serves(extra: dict[str, Any]) -> None:
    with sim() as (_, client):
        r = client.post(CHAT, json=body(**extra))
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"model": 3}, "model: Input should be a valid string"),  # vLLM: 400, never a 404
        ({"model": ["sim"]}, "model: Input should be a valid string"),
        ({"temperature": "hot"}, "temperature: Input should be a valid number"),
        ({"temperature": -0.5}, "temperature must be non-negative, got -0.5"),
        ({"top_p": 0}, "top_p must be in (0, 1], got 0.0"),
        ({"top_p": 1.5}, "top_p must be in (0, 1]"),
        ({"presence_penalty": 3}, "presence_penalty must be in [-2, 2]"),
        ({"seed": 1.5}, "seed: Input should be a valid integer"),
        ({"seed": 2**64}, "seed: "),  # past a 64-bit integer
        ({"seed": "abc"}, "seed: Input should be a valid integer"),
        ({"max_tokens": 16.5}, "max_tokens: Input should be a valid integer"),
        ({"min_tokens": None}, "min_tokens: Input should be a valid integer"),
        ({"user": 5}, "user: Input should be a valid string"),
        ({"tool_choice": "auto"}, "When using `tool_choice`, `tools` must be set."),
        ({"tool_choice": "required"}, "When using `tool_choice`, `tools` must be set."),
        ({"tools": [{"type": "function"}]}, "tools.0.function: Field required"),
        ({"tools": [{"type": "function", "function": {"name": 5}}]}, "tools.0.function.name"),
        ({"tools": TOOLS, "tool_choice": "any"}, "tool_choice"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}},
            "response_format.json_schema.name: Field required",
        ),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
    ],
)
def test_a_request_vllm_refuses_is_a_400_naming_the_field(extra: dict[str, Any], needle: str) -> None:
    with sim() as (running, client):
        r = client.post(CHAT, json=body(**extra))
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["type"] == "BadRequestError" and error["code"] == 400
        assert needle in error["message"]
        assert running.stats()["engine"]["steps"] == 0


@pytest.mark.timeout(60)
def test_a_json_schema_response_format_with_its_name_still_draws_a_valid_reply() -> None:
    with sim() as (_, client):
        r = client.post(CHAT, json=body(response_format=fmt({"type": "object", "required": ["a"]})))
        assert r.status_code == 200 and "a" in json.loads(r.json()["choices"][0]["message"]["content"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("options", "usage_chunk", "usage_everywhere"),
    [
        ({}, True, False),  # vLLM's StreamOptions: include_usage defaults to true
        ({"continuous_usage_stats": True}, True, True),
        ({"include_usage": False, "continuous_usage_stats": True}, False, False),
        ({"include_usage": 1}, True, False),  # lax: 1 is true
        ({"include_usage": True, "include_obfuscation": False}, True, False),  # unknown: ignored
    ],
)
def test_stream_options_read_as_vllm_reads_them(
    options: dict[str, Any], usage_chunk: bool, usage_everywhere: bool
) -> None:
    with sim() as (_, client):
        r = client.post(CHAT, json=body(stream=True, stream_options=options, max_tokens=4))
        assert r.status_code == 200, r.text
        chunks = _events(r.text)
        assert chunks[-1] == "[DONE]"
        assert (chunks[-2]["choices"] == [] and "usage" in chunks[-2]) is usage_chunk
        assert all("usage" in c for c in chunks[:-2]) is usage_everywhere


@pytest.mark.timeout(60)
def test_a_stream_flag_vllm_reads_as_true_streams() -> None:
    with sim() as (_, client):
        r = client.post(CHAT, json=body(stream="true", max_tokens=3))
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert _events(r.text)[-1] == "[DONE]"


@pytest.mark.timeout(60)
def test_content_parts_are_served_and_their_text_counts_as_prompt_tokens() -> None:
    with sim(chars_per_token=4.0) as (_, client):
        parts = [
            {"type": "text", "text": "x" * 40},
            "y" * 20,  # vLLM reads a plain string part as text
            {"type": "input_text", "text": "z" * 20},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ]
        r = client.post(CHAT, json=body(messages=[{"role": "user", "content": parts}]))
        assert r.status_code == 200, r.text
        # 80 characters of text and the 2 newlines vLLM joins its 3 text parts with, at 4 a token
        assert r.json()["usage"]["prompt_tokens"] == 21


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("part", "needle"),
    [
        ({"type": "video", "url": "x"}, "Unsupported chat content part type: 'video'"),
        ({"text": "no type"}, "Missing 'type' field in multimodal part"),
        ({"type": 3, "text": "x"}, "Invalid 'type' field in multimodal part"),
        (5, "must be an object (a content part) or a string"),
    ],
)
def test_a_content_part_vllm_cannot_read_is_a_400(part: Any, needle: str) -> None:
    with sim() as (_, client):
        r = client.post(CHAT, json=body(messages=[{"role": "user", "content": [part]}]))
        assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text
