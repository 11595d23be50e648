"""serve-sim as other OpenAI clients meet it: the ``openai`` SDK, curl, Prometheus. A path or method it does
not serve is a JSON error object naming it (not a plain-text ``Not Found``), a body not sent as JSON is
refused as vLLM refuses it, and the SDK reads every answer and retries a 429 after its ``retry-after``."""

from __future__ import annotations

import json

import httpx
import pytest

from asyncroll.serve_sim.config import FaultConfig
from tests.sim_servers import body, sim

CHAT = "/v1/chat/completions"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("method", "path", "status", "needle"),
    [
        ("POST", "/v1/completions", 404, "POST /v1/completions"),
        ("POST", "/v1/embeddings", 404, "POST /v1/embeddings"),
        ("GET", "/v1/nothing", 404, "GET /v1/nothing"),
        ("GET", CHAT, 405, f"GET {CHAT}"),
    ],
)
def test_a_path_or_method_not_served_is_an_error_object_naming_it(
    method: str, path: str, status: int, needle: str
) -> None:
    with sim() as (_, client):
        r = client.request(method, path, json={"model": "sim", "prompt": "hi", "input": "hi"})
        assert r.status_code == status
        assert r.headers["content-type"] == "application/json"
        error = r.json()["error"]
        assert needle in error["message"] and error["code"] == status
        if status == 404:  # what is served, every route of the app named
            assert error["message"].endswith("/metrics, /sim/stats, POST /sim/reset-stats")
        if status == 405:
            assert r.headers["allow"] == "POST"
        assert client.post(CHAT, json=body()).status_code == 200  # the server is fine


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "application/x-www-form-urlencoded", "application/jsonl"]
)
def test_a_body_not_sent_as_json_is_a_400_as_vllm_answers_it(content_type: str | None) -> None:
    """``curl -d`` without ``-H 'content-type: application/json'`` sends a form: vLLM refuses it."""
    raw = httpx.Request("POST", "http://x", json=body()).content
    headers = {"content-type": content_type} if content_type else {}
    with sim() as (running, client):
        r = client.post(CHAT, content=raw, headers=headers)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["message"] == "Unsupported Media Type: Only 'application/json' is allowed"
        ok = client.post(CHAT, content=raw, headers={"content-type": "Application/JSON; charset=utf-8"})
        assert ok.status_code == 200, ok.text
        assert running.stats()["statuses"] == {"200": 1, "400": 1}


@pytest.mark.timeout(60)
def test_the_openai_sdk_reads_every_answer() -> None:
    openai = pytest.importorskip("openai")
    messages = [{"role": "user", "content": "hello"}]
    with sim() as (running, _):
        client = openai.OpenAI(base_url=running.url + "/v1", api_key="-", max_retries=0, timeout=20)
        assert [m.id for m in client.models.list()] == ["sim"]
        reply = client.chat.completions.create(
            model="sim", messages=messages, max_completion_tokens=3, seed=1, n=1, temperature=0.5
        )
        assert reply.object == "chat.completion" and reply.model == "sim"
        assert reply.choices[0].finish_reason == "length" and reply.usage is not None
        assert reply.usage.completion_tokens == 3
        reply = client.chat.completions.create(
            model="sim", messages=messages, max_tokens=40, extra_body={"min_tokens": 30}
        )
        assert reply.usage is not None and reply.usage.completion_tokens == 30
        chunks = list(
            client.chat.completions.create(model="sim", messages=messages, max_tokens=4, stream=True)
        )
        assert chunks[-1].choices[0].finish_reason == "length"  # streamed: tests/test_serve_sim_stream.py
        with pytest.raises(openai.NotFoundError, match="/v1/completions"):
            client.completions.create(model="sim", prompt="hi")
        with pytest.raises(openai.NotFoundError, match="/v1/embeddings"):
            client.embeddings.create(model="sim", input="hi")


@pytest.mark.timeout(60)
def test_the_openai_sdk_retries_a_429_after_its_retry_after() -> None:
    openai = pytest.importorskip("openai")
    with sim(faults=FaultConfig(rate_429=1.0, retry_after_s=0.05)) as (running, _):
        client = openai.OpenAI(base_url=running.url + "/v1", api_key="-", max_retries=2, timeout=20)
        with pytest.raises(openai.RateLimitError, match="injected fault: HTTP 429"):
            client.chat.completions.create(model="sim", messages=[{"role": "user", "content": "hi"}])
        assert running.stats()["statuses"] == {"429": 3}


ACTION = '{"type": "final", "answer": "abc STOP def"}'
ACTION_HEADER = {"x-asyncroll-action": ACTION}
UNTIL_STOP = ACTION[: ACTION.index("STOP")]
STOP_END_TOKENS = -(-(len(UNTIL_STOP) + 4) // 4)  # the tokens out when STOP is complete (4 chars a token)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("extra", "content", "finish", "completion_tokens"),
    [
        ({"stop": "STOP"}, UNTIL_STOP, "stop", STOP_END_TOKENS),
        ({"stop": ["zzz", "STOP", "def"]}, UNTIL_STOP, "stop", STOP_END_TOKENS),
        ({"stop": "STOP", "ignore_eos": True, "max_tokens": 50}, UNTIL_STOP, "stop", STOP_END_TOKENS),
        ({"stop": ["zzz"]}, ACTION, "stop", 11),
        ({"stop": None}, ACTION, "stop", 11),
        ({"stop": "STOP", "max_tokens": 50, "min_tokens": 20}, ACTION, "stop", 20),  # before min_tokens
        ({"stop": "STOP", "max_tokens": 3}, ACTION[:12], "length", 3),  # max_tokens comes first
    ],
)
def test_a_stop_string_ends_the_reply_as_in_vllm(
    extra: dict[str, object], content: str, finish: str, completion_tokens: int
) -> None:
    """It was ignored: the reply went on past the stop string, which it held."""
    with sim() as (_, client):
        r = client.post(CHAT, json=body(**extra), headers=ACTION_HEADER)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert (choice["message"]["content"], choice["finish_reason"]) == (content, finish)
        assert r.json()["usage"]["completion_tokens"] == completion_tokens
        # vLLM's stop_reason: the stop string that ended the reply, null where EOS or max_tokens did
        assert choice["stop_reason"] == ("STOP" if content == UNTIL_STOP else None)
        with client.stream("POST", CHAT, json=body(stream=True, **extra), headers=ACTION_HEADER) as streamed:
            chunks = [json.loads(line[6:]) for line in streamed.iter_lines() if line[6:7] == "{"]
        last = chunks[-1]["choices"][0]
        assert (last["finish_reason"], last["stop_reason"]) == (finish, choice["stop_reason"])
        assert all("stop_reason" not in c["choices"][0] for c in chunks[:-1])


@pytest.mark.timeout(30)
@pytest.mark.parametrize("stop", ["", ["a", ""], 3, ["a", 3], {"s": "a"}])
def test_a_stop_that_is_not_strings_is_a_400_naming_it(stop: object) -> None:
    with sim() as (running, client):
        r = client.post(CHAT, json=body(stop=stop))
        assert r.status_code == 400 and "'stop'" in r.json()["error"]["message"], r.text
        assert running.stats()["engine"]["generated_tokens"] == 0
