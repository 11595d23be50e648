"""serve-sim as a newcomer meets it from other OpenAI clients: vLLM's ``include_stop_str_in_output``
keeps the stop string in the reply, streamed or not (it was silently ignored: the string left out)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.sim_servers import body, sim

CHAT = "/v1/chat/completions"
ACTION = '{"type": "final", "answer": "the end of it all"}'
SCRIPTED = {"x-asyncroll-action": ACTION}


def streamed_text(client: httpx.Client, **extra: Any) -> tuple[str, str | None]:
    text, finish = "", None
    with client.stream("POST", CHAT, json=body(stream=True, **extra), headers=SCRIPTED) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line.removeprefix("data: "))["choices"]:
                    text += choice["delta"].get("content") or ""
                    finish = choice["finish_reason"] or finish
    return text, finish


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("include", "expected"),
    [(None, '{"type": "final", "answer": "the '), (True, '{"type": "final", "answer": "the end')],
)
def test_include_stop_str_in_output_keeps_the_stop_string_as_vllm_does(
    include: bool | None, expected: str
) -> None:
    extra: dict[str, Any] = {"stop": ["end", "zzz"]}
    if include is not None:
        extra["include_stop_str_in_output"] = include
    with sim() as (_, client):
        whole = client.post(CHAT, json=body(**extra), headers=SCRIPTED).json()
        choice = whole["choices"][0]
        assert (choice["message"]["content"], choice["finish_reason"]) == (expected, "stop")
        assert streamed_text(client, **extra) == (expected, "stop")
        # the stop string's tokens are counted either way: the usage does not change with it
        assert whole["usage"]["completion_tokens"] == -(-len('{"type": "final", "answer": "the end') // 4)


@pytest.mark.timeout(30)
def test_include_stop_str_in_output_that_is_not_a_boolean_is_a_400_naming_it() -> None:
    with sim() as (_, client):
        r = client.post(CHAT, json=body(stop="end", include_stop_str_in_output="maybe"), headers=SCRIPTED)
        assert r.status_code == 400 and "include_stop_str_in_output" in r.json()["error"]["message"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "part",
    [
        {"type": "text", "text": "a" * 40},
        {"type": "refusal", "refusal": "a" * 40},  # vLLM's chat parser reads both as text
        {"type": "thinking", "thinking": "a" * 40},
    ],
)
def test_refusal_and_thinking_parts_count_as_text_as_vllm_reads_them(part: dict[str, Any]) -> None:
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": [part]}]
    with sim() as (_, client):
        r = client.post(CHAT, json=body(messages=messages, max_tokens=1), headers=SCRIPTED)
        assert r.json()["usage"]["prompt_tokens"] == 11  # 41 characters at 4 a token


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "extra",
    [
        {"guided_json": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}},
        {"guided_choice": ["yes", "no"]},
        {"guided_regex": "[0-9]+"},
        {"guided_grammar": "root ::= 'a'"},
        {"structured_outputs": {"choice": ["yes", "no"]}},
    ],
)
def test_vllm_guided_decoding_fields_are_refused_naming_the_field_not_silently_ignored(
    extra: dict[str, Any],
) -> None:
    """A client of vLLM's own structured-output fields got an unconstrained reply (one that broke its
    schema or choice) with a 200; serve-sim constrains only ``response_format``."""
    (name,) = extra
    with sim() as (running, client):
        for stream in (False, True):
            r = client.post(CHAT, json=body(stream=stream, **extra))
            assert r.status_code == 400, r.text
            message = r.json()["error"]["message"]
            assert name in message and "response_format" in message
        assert running.stats()["engine"]["steps"] == 0
        ok = client.post(CHAT, json=body(guided_json=None, structured_outputs=None, max_tokens=1))
        assert ok.status_code == 200  # a null field asks for nothing
