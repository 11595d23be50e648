"""serve-sim's replies on loopback: valid for the request's schema, seeded, echoed when scripted, cut at
the exact decode length, refused with OpenAI's errors; the values it draws keep their schema's bounds or
are refused."""

from __future__ import annotations

import json
import math
from typing import Any

import jsonschema
import pytest

from tests.sim_servers import TOOL_SCHEMA, body, fmt, sim


@pytest.mark.timeout(30)
def test_schema_replies_are_valid_and_usage_counts_tokens() -> None:
    with sim(seed=3) as (running, client):
        kinds = set()
        for _ in range(12):
            r = client.post(
                "/v1/chat/completions", json=body(max_tokens=200, response_format=fmt(TOOL_SCHEMA))
            )
            assert r.status_code == 200
            data = r.json()
            assert data["object"] == "chat.completion" and data["model"] == "sim"
            choice = data["choices"][0]
            assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "stop"
            action = json.loads(choice["message"]["content"])
            jsonschema.validate(action, TOOL_SCHEMA)
            kinds.add(action["type"])
            usage = data["usage"]
            assert usage["prompt_tokens"] == 10  # 40 characters / 4 per token
            assert usage["completion_tokens"] == math.ceil(len(choice["message"]["content"]) / 4)
            assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert kinds == {"tool", "final"}  # the seeded policy draws both branches of anyOf
        stats = running.stats()
        assert stats["engine"]["prompt_tokens"] == 120 and stats["requests"] == 12


@pytest.mark.timeout(30)
def test_same_seed_same_replies() -> None:
    replies = []
    for _ in range(2):
        with sim(seed=11) as (_, client):
            replies.append(
                [
                    client.post("/v1/chat/completions", json=body(response_format=fmt(TOOL_SCHEMA))).json()[
                        "choices"
                    ][0]["message"]["content"]
                    for _ in range(5)
                ]
            )
    assert replies[0] == replies[1]


@pytest.mark.timeout(30)
def test_scripted_echo_and_exact_decode_lengths() -> None:
    action = {"type": "final", "answer": "42"}
    header = {"x-asyncroll-action": json.dumps(action)}
    with sim() as (running, client):
        r = client.post("/v1/chat/completions", json=body(max_tokens=30, ignore_eos=True), headers=header)
        data = r.json()
        assert json.loads(data["choices"][0]["message"]["content"]) == action
        assert data["usage"]["completion_tokens"] == 30 and data["choices"][0]["finish_reason"] == "length"
        r = client.post("/v1/chat/completions", json=body(max_tokens=30, min_tokens=17), headers=header)
        assert r.json()["usage"]["completion_tokens"] == 17
        # Longer than max_tokens: cut there, finish_reason "length", as a real server does.
        r = client.post("/v1/chat/completions", json=body(max_tokens=3), headers=header)
        data = r.json()
        assert data["usage"]["completion_tokens"] == 3 and data["choices"][0]["finish_reason"] == "length"
        assert data["choices"][0]["message"]["content"] == json.dumps(action)[:12]
        assert running.stats()["engine"]["generated_tokens"] == 30 + 17 + 3


@pytest.mark.timeout(30)
def test_enforcement_refuses_an_echo_that_violates_the_schema() -> None:
    wrong = {"x-asyncroll-action": json.dumps({"type": "submit", "code": "print(1)"})}
    request = body(response_format=fmt(TOOL_SCHEMA))
    with sim() as (_, client):
        r = client.post("/v1/chat/completions", json=request, headers=wrong)
        assert r.status_code == 400 and "violates the request's schema" in r.json()["error"]["message"]
    with sim(enforce_schema=False) as (_, client):
        r = client.post("/v1/chat/completions", json=request, headers=wrong)
        assert r.status_code == 200
        assert json.loads(r.json()["choices"][0]["message"]["content"])["type"] == "submit"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("payload", "status", "needle"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (json.dumps(body(model="gpt-9")).encode(), 404, "The model `gpt-9` does not exist"),
        (json.dumps(body(messages=[])).encode(), 400, "'messages' must be a non-empty list"),
        (
            json.dumps(body(messages=[{"role": "user", "content": ["hello", 1]}])).encode(),
            400,
            "messages[0].content[1] must be an object",
        ),
        (json.dumps(body(max_tokens=0)).encode(), 400, "'max_tokens' must be an integer >= 1"),
        (json.dumps(body(max_tokens=5, min_tokens=9)).encode(), 400, "'min_tokens' (9) must be <="),
        (json.dumps(body(max_tokens=40_000)).encode(), 400, "maximum context length is 32768"),
        (json.dumps(body(max_tokens=40_000)).encode(), 400, " in the completion). Please reduce the length"),
        (  # no max_tokens asked: the messages alone are too long ("1 in the completion" before)
            json.dumps(body(messages=[{"role": "user", "content": "x" * 140_000}])).encode(),
            400,
            "tokens in the messages, Please reduce the length of the messages.",
        ),
        (json.dumps(body(response_format={"type": "xml"})).encode(), 400, "response_format.type"),
        (
            json.dumps(body(response_format=fmt({"type": "object", "required": 5}))).encode(),
            400,
            "invalid JSON schema",
        ),
    ],
)
def test_bad_requests_get_openai_errors(payload: bytes, status: int, needle: str) -> None:
    with sim() as (_, client):
        r = client.post("/v1/chat/completions", content=payload, headers={"content-type": "application/json"})
        assert r.status_code == status
        assert needle in r.json()["error"]["message"]
        assert r.json()["error"]["code"] == status


@pytest.mark.timeout(30)
def test_health_and_models() -> None:
    with sim(model="my/model", metrics_flavor="sglang") as (_, client):
        assert client.get("/health").status_code == 200
        card = client.get("/v1/models").json()["data"][0]
        assert card["id"] == "my/model" and card["owned_by"] == "sglang"


def test_drawn_values_honour_numeric_and_length_bounds() -> None:
    """Every draw satisfies its schema's bounds (inclusive and exclusive, off the default 0–100 range,
    fractional on an integer); a schema nothing satisfies, or with a constraint the simulator does not
    honour, is refused, never answered with a value that breaks it."""
    import random

    from asyncroll.serve_sim.policy import UnsupportedSchema, draw

    rng = random.Random(0)
    satisfiable: list[dict[str, Any]] = [
        {"type": "integer", "minimum": 200},
        {"type": "integer", "maximum": -1},
        {"type": "integer", "minimum": 0.5, "maximum": 1},
        {"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 5},
        {"type": "number", "minimum": 500},
        {"type": "number", "maximum": -7.5},
        {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 0.001},
        {"type": "string", "minLength": 30},
        {"type": "string", "maxLength": 2},
        {"type": "array", "items": {"type": "integer"}, "maxItems": 0},
        {"type": "array", "items": {"type": "integer"}, "minItems": 5, "maxItems": 5},
    ]
    for schema in satisfiable:
        for _ in range(50):
            jsonschema.validate(draw(schema, rng), schema)
    refused: list[dict[str, Any]] = [
        {"type": "integer", "minimum": 5, "maximum": 4},
        {"type": "integer", "minimum": 0.2, "maximum": 0.8},
        {"type": "number", "exclusiveMinimum": 1, "exclusiveMaximum": 1},
        {"type": "number", "minimum": "0"},
        {"type": "string", "minLength": 3, "maxLength": 2},
        {"type": "string", "pattern": "^[a-f]+$"},
        {"type": "integer", "multipleOf": 7},
        {"type": "array", "items": {"type": "boolean"}, "minItems": 3, "uniqueItems": True},
        {"type": "array", "minItems": 4, "maxItems": 2},
    ]
    for schema in refused:
        with pytest.raises(UnsupportedSchema):
            draw(schema, rng)


def test_drawn_maps_of_integer_keys_are_valid_tool_calls() -> None:
    """A ``dict[int, int]`` input's keys are ``patternProperties`` of asyncroll's integer pattern: serve-sim
    drew ``{}`` for every such map (valid, never a key); it draws integer keys, and refuses a pattern it
    cannot draw for rather than break it."""
    import random

    from asyncroll.backends.action_schema import parse_action, turn_schema
    from asyncroll.serve_sim.policy import UnsupportedSchema, draw
    from asyncroll.workload import Problem, ToolAction

    tool = {"name": "count", "implementation": "t.py", "inputs": {"counts": "dict[int, int]"}}
    schema = turn_schema(Problem.model_validate({"prompt": "p", "tools": [tool]}), 0)
    rng = random.Random(0)
    for _ in range(20):
        action = parse_action(json.dumps(draw(schema, rng)), schema, structured=True, code=False)
        assert isinstance(action, ToolAction)
        assert action.arguments["counts"] and all(int(k) >= 0 for k in action.arguments["counts"])
    other = {"type": "object", "patternProperties": {"^[a-z]+$": {"type": "integer"}}}
    with pytest.raises(UnsupportedSchema, match="patternProperties"):
        draw(other, rng)


@pytest.mark.timeout(30)
def test_a_schema_the_simulator_cannot_satisfy_is_a_counted_400_on_a_live_connection() -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 4}},
        "required": ["n"],
    }
    with sim() as (running, client):
        r = client.post("/v1/chat/completions", json=body(response_format=fmt(schema)))
        assert r.status_code == 400 and "unsupported JSON schema" in r.text
        ok = client.post("/v1/chat/completions", json=body(response_format=fmt(TOOL_SCHEMA)))
        assert ok.status_code == 200  # the same keep-alive connection still serves
        assert running.stats()["statuses"] == {"200": 1, "400": 1}
