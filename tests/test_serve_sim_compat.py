"""serve-sim as an OpenAI client meets it: request fields it cannot honour are refused with a 400 that
names them, never silently ignored (an ``n: 2`` client got one choice, a ``logprobs`` client got
``null``, a ``tool_choice: "required"`` client got no ``tool_calls``; streams:
test_serve_sim_stream.py); the length fields and ``finish_reason`` are as vLLM has them; a schema is
refused with a 400 rather than broken or answered with a 500; a server that stops answers 503."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import orjson
import pytest

from asyncroll.backends.server_model import ServerModelConfig
from asyncroll.serve_sim.app import SimApp
from asyncroll.serve_sim.config import SimConfig
from asyncroll.serve_sim.server import RunningSim, bind, make_server, serve_in_thread, start_thread, stop
from tests.sim_servers import FAST

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "sim", "messages": [{"role": "user", "content": "x" * 40}], **extra}


@contextmanager
def sim() -> Iterator[tuple[RunningSim, httpx.Client]]:
    config = SimConfig(engine=FAST)
    with serve_in_thread(config) as running, httpx.Client(base_url=running.url, timeout=20) as c:
        yield running, c


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"n": 2}, "'n'"),
        ({"n": 0}, "'n'"),
        ({"logprobs": True}, "'logprobs'"),
        ({"logprobs": True, "top_logprobs": 3}, "'logprobs'"),
        ({"top_logprobs": 3}, "'top_logprobs'"),
        ({"tools": [TOOL], "tool_choice": "required"}, "'tool_choice'"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}}, "'tool_choice'"),
    ],
)
def test_a_field_serve_sim_cannot_honour_is_a_400_naming_it(extra: dict[str, Any], needle: str) -> None:
    with sim() as (running, client):
        r = client.post("/v1/chat/completions", json=body(max_tokens=4, **extra))
        assert r.status_code == 400, r.text
        assert r.headers["content-type"].startswith("application/json")  # not an SSE stream, not a 200
        error = r.json()["error"]
        assert needle in error["message"] and error["code"] == 400 and error["type"] == "BadRequestError"
        stats = running.stats()
        assert stats["statuses"] == {"400": 1} and stats["engine"]["steps"] == 0  # refused before the engine


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "extra",
    [
        {"stream": False},
        {"stream": None},
        {"n": 1},
        {"n": None},
        {"logprobs": False},
        {"logprobs": None, "top_logprobs": None},
        {"logprobs": False, "top_logprobs": 0},
        {"tools": [TOOL]},  # "auto": a model may answer without calling a tool
        {"tools": [TOOL], "tool_choice": "auto"},
        {"tools": [TOOL], "tool_choice": "none"},
    ],
)
def test_the_values_it_can_honour_are_answered(extra: dict[str, Any]) -> None:
    with sim() as (_, client):
        r = client.post("/v1/chat/completions", json=body(max_tokens=4, **extra))
        assert r.status_code == 200, r.text
        reply = r.json()
        assert reply["object"] == "chat.completion" and len(reply["choices"]) == 1
        assert reply["choices"][0]["logprobs"] is None


@pytest.mark.timeout(30)
def test_max_completion_tokens_wins_over_max_tokens_as_in_vllm() -> None:
    """OpenAI deprecated ``max_tokens`` for ``max_completion_tokens``; vLLM and SGLang take the new one
    when a client sends both. serve-sim took ``max_tokens``."""
    with sim() as (_, client):
        both = body(max_tokens=50, max_completion_tokens=3, ignore_eos=True)
        reply = client.post("/v1/chat/completions", json=both).json()
        assert reply["usage"]["completion_tokens"] == 3 and reply["choices"][0]["finish_reason"] == "length"
        old = client.post("/v1/chat/completions", json=body(max_tokens=5, ignore_eos=True)).json()
        assert old["usage"]["completion_tokens"] == 5
        bad = client.post("/v1/chat/completions", json=body(max_tokens=5, max_completion_tokens=0))
        assert bad.status_code == 400 and "'max_completion_tokens' must be an integer >= 1" in bad.text


def nested_schema(depth: int) -> bytes:
    """A JSON schema ``depth`` objects deep, as text: past ~127 levels neither ``json`` nor ``orjson``
    would serialise it, and a client may still send it."""
    head = b'{"type": "object", "properties": {"a": '
    return head * depth + b'{"type": "string"}' + b'}, "required": ["a"]}' * depth


@pytest.mark.timeout(30)
@pytest.mark.parametrize("depth", [100, 200])
@pytest.mark.parametrize("echo", [False, True])
def test_a_schema_nested_too_deep_to_check_is_a_counted_400(depth: int, echo: bool) -> None:
    """100 levels exhausted Python's recursion in jsonschema's metaschema check, 200 orjson's depth limit
    (a TypeError), with or without an echoed action: either was an HTTP 500 with a traceback, missing
    from ``/sim/stats`` and ending the connection, which a client that retries 5xx sends again and again."""
    headers = {"content-type": "application/json"} | ({"x-asyncroll-action": '{"a": "x"}'} if echo else {})
    with sim() as (running, client):
        fmt = (
            b'{"type": "json_schema", "json_schema": {"name": "deep", "schema": '
            + nested_schema(depth)
            + b"}}"
        )
        payload = orjson.dumps(body(max_tokens=4)).removesuffix(b"}") + b',"response_format":' + fmt + b"}"
        r = client.post("/v1/chat/completions", content=payload, headers=headers)
        assert r.status_code == 400, r.text
        assert "nested too deeply" in r.json()["error"]["message"]
        assert client.post("/v1/chat/completions", json=body(max_tokens=4)).status_code == 200  # same client
        assert running.stats()["statuses"] == {"200": 1, "400": 1}


@pytest.mark.timeout(30)
def test_an_echoed_action_nested_too_deep_for_a_recursive_schema_is_a_counted_400() -> None:
    """A shallow schema that refers to itself checks an action of any depth: one 300 levels deep (valid
    JSON to Python) exhausted the recursion of the check under enforcement, an HTTP 500 as above."""
    schema = {"type": "object", "properties": {"a": {"$ref": "#"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "tree", "schema": schema}}
    action = '{"a": ' * 300 + "{}" + "}" * 300
    with sim() as (running, client):
        r = client.post(
            "/v1/chat/completions",
            json=body(max_tokens=4, response_format=fmt),
            headers={"x-asyncroll-action": action},
        )
        assert r.status_code == 400, r.text
        assert "nested too deeply" in r.json()["error"]["message"]
        shallow = client.post(
            "/v1/chat/completions",
            json=body(max_tokens=40, response_format=fmt),
            headers={"x-asyncroll-action": '{"a": {"a": {}}}'},
        )
        assert (
            shallow.status_code == 200
            and shallow.json()["choices"][0]["message"]["content"] == '{"a": {"a": {}}}'
        )
        assert running.stats()["statuses"] == {"200": 1, "400": 1}


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("lengths", "tokens", "finish"),
    [
        ({"max_tokens": 30, "min_tokens": 17}, 17, "stop"),  # EOS allowed again at 17, before the limit
        ({"max_tokens": 30, "min_tokens": 30}, 30, "length"),  # EOS suppressed up to the limit
        ({"max_tokens": 30, "ignore_eos": True}, 30, "length"),
        ({"max_tokens": 30}, 9, "stop"),
        ({"max_tokens": 3}, 3, "length"),  # cut
        ({"max_tokens": 9}, 9, "length"),  # exactly as long: its EOS would be a 10th token (said "stop")
        ({"max_tokens": 9, "ignore_eos": True}, 9, "length"),  # a replay's echoed action of max_tokens
    ],
)
def test_finish_reason_is_length_only_when_max_tokens_stopped_the_reply(
    lengths: dict[str, Any], tokens: int, finish: str
) -> None:
    """``min_tokens`` below ``max_tokens`` lengthens a short reply, and the model then stops by itself
    (vLLM: ``stop``); serve-sim said ``length`` although the limit was never reached, which a client (and
    ``summary.json``'s ``finish_reasons``) reads as a reply cut short."""
    header = {"x-asyncroll-action": '{"type": "final", "answer": "42"}'}  # 33 characters: 9 tokens
    with sim() as (_, client):
        reply = client.post("/v1/chat/completions", json=body(**lengths), headers=header).json()
        assert (reply["usage"]["completion_tokens"], reply["choices"][0]["finish_reason"]) == (tokens, finish)


def test_a_drawn_object_holds_every_required_property_even_one_it_does_not_declare() -> None:
    """``required`` may name a property that ``properties`` does not declare (any value then fits it):
    serve-sim left it out, so every drawn reply broke the schema it enforces."""
    import random

    import jsonschema

    from asyncroll.serve_sim.policy import UnsupportedSchema, draw

    rng = random.Random(0)
    free = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]}
    typed = {**free, "additionalProperties": {"type": "boolean"}}
    for schema in (free, typed, {"type": "object", "required": ["x"]}):
        for _ in range(20):
            jsonschema.validate(draw(schema, rng), schema)
    assert all(isinstance(draw(typed, rng)["b"], bool) for _ in range(10))
    with pytest.raises(UnsupportedSchema, match="'b'"):  # required, yet no property may be added
        draw({**free, "additionalProperties": False}, rng)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2},
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "null"}},
            "maxProperties": 1,
        },
        {"type": "object", "additionalProperties": {"type": "integer"}, "propertyNames": {"maxLength": 2}},
        {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]},
        {"type": "array", "items": {"type": "integer"}, "contains": {"const": 7}},
        {"type": "object", "properties": {"a": {"type": "null"}}, "dependentRequired": {"a": ["z"]}},
        {"type": "object", "properties": {"a": {"type": "null"}}, "unevaluatedProperties": False},
    ],
)
def test_a_keyword_the_draw_does_not_honour_is_refused_not_broken(schema: dict[str, Any]) -> None:
    """These keywords were ignored, so a drawn value broke them some or all of the time."""
    import random

    from asyncroll.serve_sim.policy import UnsupportedSchema, draw

    with pytest.raises(UnsupportedSchema):
        draw(schema, random.Random(0))


@pytest.mark.timeout(30)
def test_a_drawn_reply_that_would_break_the_schema_is_a_400_never_sent() -> None:
    """``enum``/``const`` are drawn as given, whatever else the schema says: a value that breaks the
    rest is refused as an unsupported schema (the docstring's promise), not sent under enforcement."""
    impossible = {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"enum": ["a"], "minLength": 2}},
    }
    with sim() as (running, client):
        r = client.post("/v1/chat/completions", json=body(max_tokens=20, response_format=impossible))
        assert r.status_code == 400 and "unsupported JSON schema" in r.json()["error"]["message"], r.text
        assert running.stats()["engine"]["steps"] == 0


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _read_stream(client: httpx.Client, request: dict[str, Any]) -> tuple[list[str], Exception | None]:
    """A streamed reply's lines, and the error that ended the read (None: the stream ended whole)."""
    lines: list[str] = []
    try:
        with client.stream("POST", "/v1/chat/completions", json=request) as r:
            lines.extend(line for line in r.iter_lines() if line)
    except httpx.HTTPError as exc:
        return lines, exc
    return lines, None


@pytest.mark.timeout(60)
def test_requests_outliving_the_graceful_shutdown_get_a_503_not_a_500_and_a_traceback() -> None:
    """uvicorn gives in-flight requests 2 s when serve-sim stops (Ctrl-C, SIGTERM), then cancels them:
    each was an HTTP 500 and an 'Exception in ASGI application' traceback on the console, uncounted in
    ``/sim/stats``. A server going away answers 503, which a client's circuit breaker reads as the server
    down (asyncroll's opens on 503, not on 500). A stream, whose status went out long before, is cut
    (counted ``truncated``), without a traceback either."""
    slow = ServerModelConfig(max_num_seqs=8, step_base_ms=50.0, step_per_seq_ms=0.0, prefill_ms_per_token=0.0)
    sock = bind("127.0.0.1", 0)
    sim_app = SimApp(SimConfig(engine=slow))
    records = _Records()
    server = make_server(sim_app)  # its logging configuration first: it drops the handlers it finds
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addHandler(records)
    try:
        running = start_thread(sock, sim_app, server)
        long_request = body(max_tokens=2000, ignore_eos=True)  # 100 s of decode steps: never finishes here
        with ThreadPoolExecutor(4) as pool, httpx.Client(base_url=running.url, timeout=30) as client:
            futures = [pool.submit(client.post, "/v1/chat/completions", json=long_request) for _ in range(3)]
            streamed = pool.submit(_read_stream, client, {**long_request, "stream": True})
            deadline = time.monotonic() + 20
            while running.stats()["engine"]["running"] < 4:  # all four in the running batch
                assert time.monotonic() < deadline, running.stats()
                time.sleep(0.02)
            stop(running, 30.0)
            replies = [f.result(timeout=30) for f in futures]
            lines, cut = streamed.result(timeout=30)
    finally:
        uvicorn_log.removeHandler(records)
        sock.close()
    assert [r.status_code for r in replies] == [503, 503, 503]
    error = replies[0].json()["error"]
    assert error["type"] == "ServiceUnavailableError" and "shutting down" in error["message"]
    assert isinstance(cut, httpx.RemoteProtocolError) and lines and "data: [DONE]" not in lines  # cut short
    assert sim_app.statuses == {503: 3, "truncated": 1} and sim_app.inflight == 0
    assert not [m for m in records.messages if "Exception in ASGI application" in m], records.messages
    # the cut stream is serve-sim's documented stop, not uvicorn's "ERROR: ASGI callable returned without
    # completing response" (an application that forgot to finish its reply)
    assert not [m for m in records.messages if "without completing response" in m], records.messages
    # uvicorn's "ERROR: Cancel 4 running task(s), timeout graceful shutdown exceeded": the documented stop
    assert (
        "4 request(s) still running after the 2 s grace: answered 503, or a stream cut (serve-sim stopping)"
        in records.messages
    )
    assert not [m for m in records.messages if m.startswith("Cancel")], records.messages


@pytest.mark.timeout(30)
def test_a_request_without_a_model_is_served_by_the_served_model_as_vllm_does() -> None:
    """vLLM serves a request that names no model with its own; serve-sim answered 404 "The model `None`
    does not exist". A model it does not serve is still a 404."""
    with sim() as (_, client):
        for missing in ({}, {"model": None}, {"model": ""}):
            request = {**body(max_tokens=4), **missing}
            if not missing:
                del request["model"]
            r = client.post("/v1/chat/completions", json=request)
            assert r.status_code == 200 and r.json()["model"] == "sim", (missing, r.text)
        other = client.post("/v1/chat/completions", json=body(model="gpt-9"))
        assert other.status_code == 404 and "The model `gpt-9` does not exist" in other.text
