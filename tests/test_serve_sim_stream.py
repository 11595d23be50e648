"""serve-sim's streamed replies (``"stream": true``), as vLLM streams them: Server-Sent Events with a role
chunk at the first token, one chunk per decode step, ``finish_reason`` on the last token's chunk, the
usage chunk with ``stream_options.include_usage`` and ``data: [DONE]``; the text adds up to the
non-streamed reply's; a client that leaves aborts the sequence (499); the truncate and malformed faults
break the stream. Against a real serve-sim on loopback (tests/sim_servers.py); the engine's token
callback on a virtual clock."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from asyncroll.backends.server_model import BatchingServer, ServerModelConfig
from asyncroll.clock import VirtualClock
from asyncroll.serve_sim.config import FaultConfig
from tests.sim_servers import body, sim

CHAT = "/v1/chat/completions"
ACTION = '{"type": "final", "answer": "a streamed answer of some length"}'
SCRIPTED = {"x-asyncroll-action": ACTION}
#: 200 ms a step: a reply of 12 tokens is still being decoded long after its first chunk is read
SLOW = ServerModelConfig(max_num_seqs=8, step_base_ms=200.0, step_per_seq_ms=0.0, prefill_ms_per_token=0.0)


def events(lines: list[str]) -> list[Any]:
    """The SSE events of a stream's lines: parsed JSON chunks, and the final ``"[DONE]"``."""
    data = [line.removeprefix("data: ") for line in lines if line]
    assert all(line.startswith("data: ") for line in lines if line), lines
    return [d if d == "[DONE]" else json.loads(d) for d in data]


def stream(client: httpx.Client, **extra: Any) -> tuple[httpx.Response, list[Any]]:
    with client.stream("POST", CHAT, json=body(stream=True, **extra), headers=SCRIPTED) as r:
        lines = list(r.iter_lines())
    return r, events(lines)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"max_tokens": 5},  # cut at max_tokens: "length"
        {"max_tokens": 60, "min_tokens": 40},  # tokens past the text: "" deltas
        {"max_tokens": 30, "ignore_eos": True},
        {"stop": "some"},
    ],
)
def test_a_streamed_reply_adds_up_to_the_reply_a_request_without_stream_gets(extra: dict[str, Any]) -> None:
    with sim() as (running, client):
        whole = client.post(CHAT, json=body(**extra), headers=SCRIPTED).json()
        options = {"include_usage": True, "continuous_usage_stats": True}
        r, chunks = stream(client, stream_options=options, **extra)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert chunks[-1] == "[DONE]"
        usage = chunks[-2]
        assert usage["choices"] == [] and usage["usage"] == whole["usage"]
        first, rest = chunks[0], chunks[1:-2]
        assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert first["usage"]["completion_tokens"] == 0
        for chunk in chunks[:-1]:
            assert chunk["object"] == "chat.completion.chunk" and chunk["model"] == "sim"
            assert chunk["id"] == first["id"] != whole["id"]
        text = "".join(c["choices"][0]["delta"]["content"] for c in rest)
        assert text == whole["choices"][0]["message"]["content"]
        finishes = [c["choices"][0]["finish_reason"] for c in rest]
        assert finishes == [None] * (len(rest) - 1) + [whole["choices"][0]["finish_reason"]]
        counts = [c["usage"]["completion_tokens"] for c in rest]  # the tokens so far, chunk by chunk
        assert counts == sorted(set(counts)) and counts[-1] == whole["usage"]["completion_tokens"]
        stats = running.stats()
        assert stats["statuses"] == {"200": 2} and stats["inflight"] == 0 and stats["kv_cache_usage"] == 0


@pytest.mark.timeout(60)
def test_without_include_usage_no_chunk_carries_usage() -> None:
    with sim() as (_, client):
        r, chunks = stream(client, max_tokens=6)
        assert r.status_code == 200 and chunks[-1] == "[DONE]"
        assert all("usage" not in c and len(c["choices"]) == 1 for c in chunks[:-1])


@pytest.mark.timeout(60)
def test_chunks_arrive_while_the_engine_decodes_and_a_client_that_leaves_aborts_the_sequence() -> None:
    with sim(engine=SLOW) as (running, client):
        with client.stream("POST", CHAT, json=body(stream=True, max_tokens=12, min_tokens=12)) as r:
            lines = r.iter_lines()
            chunk = events([next(lines)])[0]
            assert chunk["choices"][0]["delta"]["role"] == "assistant"
            engine = running.stats()["engine"]
            assert engine["running"] == 1 and engine["generated_tokens"] < 12  # still decoding
        deadline = time.monotonic() + 20
        while running.stats()["statuses"] != {"499": 1} and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = running.stats()
        assert stats["statuses"] == {"499": 1} and stats["inflight"] == 0
        assert stats["engine"]["running"] == 0 and stats["engine"]["generated_tokens"] < 12


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (
            {"stream_options": {"include_usage": True}},
            "Stream options can only be defined when `stream=True`.",
        ),
        ({"stream": False, "stream_options": {"include_usage": True}}, "only be defined when `stream=True`"),
        # vLLM's pydantic types, lax: "yes" or 1 would be true, an unknown stream_options field ignored
        ({"stream": "maybe"}, "stream: Input should be a valid boolean"),
        ({"stream": True, "stream_options": [True]}, "stream_options: Input should be a valid dictionary"),
        (
            {"stream": True, "stream_options": {"include_usage": "sometimes"}},
            "stream_options.include_usage: Input should be a valid boolean",
        ),
    ],
)
def test_bad_stream_settings_are_a_400_before_the_engine(extra: dict[str, Any], needle: str) -> None:
    with sim() as (running, client):
        r = client.post(CHAT, json=body(**extra))
        assert r.status_code == 400 and r.headers["content-type"] == "application/json"
        assert needle in r.json()["error"]["message"]
        assert running.stats()["engine"]["steps"] == 0


@pytest.mark.timeout(60)
def test_the_truncate_fault_cuts_a_stream_before_its_end() -> None:
    with sim(faults=FaultConfig(truncate_rate=1.0)) as (running, client):
        lines: list[str] = []
        with (
            pytest.raises(httpx.RemoteProtocolError),
            client.stream("POST", CHAT, json=body(stream=True, max_tokens=10, min_tokens=10)) as r,
        ):
            assert r.status_code == 200
            lines.extend(r.iter_lines())
        chunks = events(lines)
        assert "[DONE]" not in chunks and 0 < len(chunks) < 11
        assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
        assert running.stats()["statuses"] == {"truncated": 1}


@pytest.mark.timeout(60)
def test_the_malformed_fault_sends_one_broken_event_in_a_stream_that_goes_on() -> None:
    with sim(faults=FaultConfig(malformed_rate=1.0)) as (running, client):
        with client.stream("POST", CHAT, json=body(stream=True, max_tokens=10, min_tokens=10)) as r:
            lines = [line for line in r.iter_lines() if line]
        broken = []
        for line in lines:
            try:
                json.loads(line.removeprefix("data: ")) if line != "data: [DONE]" else None
            except json.JSONDecodeError:
                broken.append(line)
        assert len(broken) == 1 and lines[-1] == "data: [DONE]"
        assert running.stats()["statuses"] == {"200": 1}


@pytest.mark.timeout(60)
def test_the_openai_sdk_reads_a_stream() -> None:
    openai = pytest.importorskip("openai")
    with sim() as (_, http):
        whole = http.post(CHAT, json=body(max_tokens=9), headers=SCRIPTED).json()
        client = openai.OpenAI(base_url=str(http.base_url) + "/v1", api_key="-", max_retries=0, timeout=20)
        chunks = list(
            client.chat.completions.create(
                model="sim",
                messages=body()["messages"],
                max_tokens=9,
                stream=True,
                stream_options={"include_usage": True},
                extra_headers=SCRIPTED,
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == whole["choices"][0]["message"]["content"]
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 9


def test_the_engine_tells_a_stream_every_token_as_its_step_ends() -> None:
    """On a virtual clock: the token counts 1 … n at each step's end, the last before the result, and
    the same timings as a sequence nobody watches (no steps in place while one is watched)."""
    cfg = ServerModelConfig(max_num_seqs=4, step_base_ms=10.0, step_per_seq_ms=1.0, prefill_ms_per_token=0.5)
    clock = VirtualClock()
    seen: list[tuple[int, float]] = []

    async def main() -> tuple[Any, Any]:
        server = BatchingServer(cfg, clock)
        engine = asyncio.ensure_future(server.serve())
        watched = asyncio.ensure_future(server.generate(20, 6, lambda n: seen.append((n, clock.now()))))
        other = asyncio.ensure_future(server.generate(20, 6))
        result = await asyncio.gather(watched, other)
        server.close()
        await engine
        return result[0], result[1]

    watched, other = clock.run(main())
    assert [n for n, _ in seen] == [1, 2, 3, 4, 5, 6]
    assert seen[0][1] == pytest.approx(watched.ttft_s) and seen[-1][1] == pytest.approx(watched.latency_s)
    assert watched == other
