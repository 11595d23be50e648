"""What the OpenAI-compatible backend sends: the schemas in agent requests, replay's fixed budgets per
server kind, the echo header, the API key, and text a JSON encoder refuses."""

from __future__ import annotations

import asyncio
import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from asyncroll.backends.openai import HttpSettings, OpenAIBackend
from asyncroll.clock import SystemClock
from asyncroll.config import build_config
from asyncroll.errors import UsageError
from asyncroll.events import ModelFailed, ModelFinished, TrajectoryFinished
from asyncroll.serve_sim.config import FaultConfig
from asyncroll.workload import FinalAction, Problem
from tests.http_backend import (
    ADD,
    FINAL,
    FINAL_SCHEMA,
    FakeOpenAI,
    closed_schema,
    completion,
    final_problems,
    http_run,
    requests_of,
    serve,
)
from tests.loopback import LoopbackServer


@pytest.mark.timeout(60)
def test_agent_requests_carry_the_spec_schemas_exactly(tmp_path: Path) -> None:
    problem = {"id": "t", "prompt": "What is 2 + 3?", "tools": [ADD]}
    with serve(seed=1) as running:
        outcome, capture, _ = http_run(tmp_path, [problem], running.url, max_tokens=64, seed=7)
        bodies = [r["body"] for r in requests_of(running)]
    assert outcome.status == "complete"
    assert [e.status for e in capture.of(TrajectoryFinished)] == ["completed"]
    first, second = bodies
    add_branch = closed_schema(
        {
            "type": {"const": "tool"},
            "name": {"const": "add"},
            "arguments": closed_schema({"a": {"type": "number"}, "b": {"type": "number"}}),
        }
    )
    assert first["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "agent_action", "strict": True, "schema": {"anyOf": [add_branch]}},
    }
    assert {k: first[k] for k in ("model", "temperature", "max_tokens", "seed")} == {
        "model": "sim",
        "temperature": 0,
        "max_tokens": 64,
        "seed": 7,
    }
    assert "min_tokens" not in first and "ignore_eos" not in first  # agent mode: the model decides
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert first["messages"][1]["content"] == "What is 2 + 3?"
    assert second["response_format"]["json_schema"]["schema"] == FINAL_SCHEMA
    roles = [m["role"] for m in second["messages"]]
    assert roles == ["system", "user", "assistant", "user"]
    tool_call = json.loads(second["messages"][2]["content"])
    assert tool_call["type"] == "tool" and tool_call["name"] == "add"
    expected = tool_call["arguments"]["a"] + tool_call["arguments"]["b"]
    assert json.loads(second["messages"][3]["content"].removeprefix("Tool result: ")) == expected
    finished = capture.of(ModelFinished)
    assert all(e.prompt_tokens and e.completion_tokens for e in finished)  # usage recorded


@pytest.mark.timeout(60)
def test_later_turns_send_the_models_reply_back_exactly_as_it_was_written(tmp_path: Path) -> None:
    """A model's earlier turn went back to it re-rendered from the parsed action (other spacing and key
    order; a code reply's prose and fences dropped): not what it wrote, and a prefix cache's miss."""
    call = ' {"arguments": {"b": 3,  "a": 2}, "name": "add", "type": "tool"}\n'
    code = {
        "id": "code",
        "prompt": "Print 1.",
        "tools": [{"name": "lcb_evaluate"}],
        "metadata": {
            "reference_tests": [{"input": "", "output": "1", "testtype": "stdin"}],
            "prompt_metadata": {"protocol": "one_repair", "max_generations": 2},
        },
    }
    wrong = "Here it is:\n```python\nprint(2)\n```\nIt prints the answer."
    with FakeOpenAI([completion(call), completion(FINAL)]) as server:
        outcome, _, _ = http_run(tmp_path, [{"id": "t", "prompt": "2 + 3?", "tools": [ADD]}], server.url)
        tool_turn = server.chat_bodies[1]["messages"]
    with FakeOpenAI([completion(wrong), completion("```python\nprint(1)\n```")]) as server:
        repaired, capture, _ = http_run(
            tmp_path, [code], server.url, structured_output=False, allow_weak_isolation=True
        )
        repair_turn = server.chat_bodies[1]["messages"]
    assert outcome.status == repaired.status == "complete"
    assert tool_turn[2] == {"role": "assistant", "content": call}
    assert [m["role"] for m in repair_turn] == ["user", "assistant", "user"]
    assert repair_turn[1] == {"role": "assistant", "content": wrong}
    assert [(e.status, e.correct) for e in capture.of(TrajectoryFinished)] == [("completed", True)]


@pytest.mark.timeout(60)
def test_no_structured_output_sends_no_schema(tmp_path: Path) -> None:
    with serve() as running:
        outcome, capture, _ = http_run(tmp_path, final_problems(2), running.url, structured_output=False)
        bodies = [r["body"] for r in requests_of(running)]
    assert outcome.status == "complete" and len(bodies) == 2
    assert all("response_format" not in b for b in bodies)
    assert all(b["messages"][0]["role"] == "system" for b in bodies)  # the format is told, not enforced
    assert [e.status for e in capture.of(TrajectoryFinished)] == ["completed", "completed"]


@pytest.mark.timeout(60)
def test_replay_sends_the_scripted_budgets(tmp_path: Path) -> None:
    problem = {
        "id": "r",
        "prompt": "What is 2 + 3?",
        "tools": [ADD],
        "reference_answer": "5",
        "script": [
            {"type": "tool", "name": "add", "arguments": {"a": 2, "b": 3}, "output_tokens": 7},
            {"type": "final", "answer": "5", "output_tokens": 13, "latency_ms": 1},
        ],
    }
    with serve() as running:
        outcome, capture, out = http_run(tmp_path, [problem], running.url, replay=True, max_tokens=99)
        seen = requests_of(running)
    assert outcome.status == "complete"
    assert [(s["body"]["max_tokens"], s["body"]["min_tokens"], s["body"]["ignore_eos"]) for s in seen] == [
        (7, 7, True),
        (13, 13, True),
    ]
    assert all("response_format" not in s["body"] for s in seen)
    assert json.loads(seen[0]["action_header"]) == {
        "type": "tool",
        "name": "add",
        "arguments": {"a": 2, "b": 3},
    }
    assert json.loads(seen[1]["action_header"]) == {"type": "final", "answer": "5"}
    # the server's text is no action of the model's: the later turn sends the script's action
    assert json.loads(seen[1]["body"]["messages"][2]["content"]) == json.loads(seen[0]["action_header"])
    assert [e.completion_tokens for e in capture.of(ModelFinished)] == [7, 13]
    finished = capture.of(TrajectoryFinished)[0]
    assert finished.status == "completed" and finished.correct is True
    receipt = json.loads((out / "run.json").read_text())
    assert receipt["backend"]["mode"] == "replay"
    assert receipt["backend"]["replay_fixed_length"] == "min_tokens + ignore_eos"


def test_replay_body_per_server_kind() -> None:
    problem = Problem.model_validate(
        {"prompt": "p", "script": [{"type": "final", "answer": "a", "output_tokens": 5}]}
    )
    from asyncroll.backends.base import ModelRequest

    request = ModelRequest("t", problem, 0, [{"role": "user", "content": "p"}])
    action = FinalAction(type="final", answer="a", output_tokens=5)
    bodies = {}
    for kind in ("vllm", "sglang", "transformers", "generic"):
        settings = HttpSettings(endpoint="http://x", model="m", inflight=1, replay=True, server_kind=kind)  # type: ignore[arg-type]
        bodies[kind] = OpenAIBackend(settings, SystemClock()).build_body(request, action)
    assert bodies["vllm"]["min_tokens"] == 5 and bodies["sglang"]["ignore_eos"] is True
    assert "min_tokens" not in bodies["transformers"] and "ignore_eos" not in bodies["transformers"]
    assert json.loads(bodies["transformers"]["generation_config"]) == {
        "max_new_tokens": 5,
        "min_new_tokens": 5,
        "eos_token_id": [],  # transformers' continuous batching ignores min_new_tokens
    }
    assert set(bodies["generic"]) == {"model", "messages", "temperature", "max_tokens", "seed"}
    assert all(b["max_tokens"] == 5 for b in bodies.values())


@pytest.mark.timeout(60)
def test_replay_of_a_large_action_skips_the_echo_header(tmp_path: Path) -> None:
    answer = "x" * 10_000  # larger than servers accept in headers
    problem = {
        "id": "big",
        "prompt": "p",
        "script": [{"type": "final", "answer": answer, "output_tokens": 3}],
    }
    with serve() as running:
        outcome, capture, _ = http_run(tmp_path, [problem], running.url, replay=True)
        seen = requests_of(running)
    assert outcome.status == "complete" and seen[0]["action_header"] is None
    assert seen[0]["body"]["max_tokens"] == 3
    assert [e.completion_tokens for e in capture.of(ModelFinished)] == [3]
    assert [e.finish_reason for e in capture.of(ModelFinished)] == ["length"]  # cut at max_tokens: 3


@pytest.mark.timeout(60)
def test_replay_warmup_sends_no_schema(tmp_path: Path) -> None:
    """Replay requests carry no schema, so neither do its warm-up requests: a server that refuses schemas
    serves the whole replay (the warm-up used to send one and fail the run)."""
    problem = {
        "id": "r",
        "prompt": "p",
        "reference_answer": "5",
        "script": [{"type": "final", "answer": "5", "output_tokens": 3}],
    }
    with serve(faults=FaultConfig(reject_schema=True)) as running:
        outcome, _, _ = http_run(tmp_path, [problem], running.url, replay=True, warmup_requests=2)
        seen = requests_of(running)
    assert outcome.status == "complete", outcome.error
    assert len(seen) == 3 and all("response_format" not in s["body"] for s in seen)


@pytest.mark.timeout(60)
def test_an_api_key_from_the_environment_is_sent_and_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server started with an API key (vLLM's or SGLang's ``--api-key``, a hosted endpoint) answered
    every request 401: there was no way to send one. ``--api-key-env NAME`` sends the key NAME holds;
    the key is in no output (run.json records the command line and the config: the name only)."""
    secret = "sk-test-5f1c0a"
    monkeypatch.setenv("ASYNCROLL_TEST_KEY", secret)
    with FakeOpenAI([completion(FINAL)], key=secret) as server:
        outcome, _, out = http_run(
            tmp_path, final_problems(2), server.url, api_key_env="ASYNCROLL_TEST_KEY", warmup_requests=1
        )
        refused, _, _ = http_run(tmp_path, final_problems(1), server.url, warmup_requests=1)
    assert outcome.status == "complete" and outcome.summary is not None, outcome.error
    assert outcome.summary["counts"]["completed"] == 2
    assert server.authorizations[:3] == [f"Bearer {secret}"] * 3  # the warm-up and both turns
    assert refused.status == "failed" and refused.error is not None and "401" in refused.error
    receipt = json.loads((out / "run.json").read_text())
    assert receipt["backend"]["api_key"] == "from the environment variable ASYNCROLL_TEST_KEY"
    assert receipt["config"]["api_key_env"] == "ASYNCROLL_TEST_KEY"
    assert not [f for f in out.rglob("*") if f.is_file() and secret.encode() in f.read_bytes()]
    monkeypatch.delenv("ASYNCROLL_TEST_KEY")
    with pytest.raises(
        UsageError, match="--api-key-env ASYNCROLL_TEST_KEY: that environment variable is not set"
    ):
        build_config(
            {
                "workload": "w",
                "output": "o",
                "backend": "vllm",
                "model": "m",
                "api_key_env": "ASYNCROLL_TEST_KEY",
            }
        )
    with pytest.raises(UsageError, match="--api-key-env only applies to HTTP backends"):
        build_config({"workload": "w", "output": "o", "api_key_env": "HOME"})


@pytest.mark.timeout(60)
def test_a_lone_surrogate_in_a_message_is_sent_escaped_not_a_failed_run() -> None:
    """Text a tool or the evaluator made with a lone surrogate (``"\\ud800"``) in a message: orjson
    refused to encode the request, a TypeError outside the exchange's handling that failed the whole run.
    It is sent as the escape, a valid JSON text (the server decides); ordinary text stays UTF-8."""
    import httpx

    from asyncroll.backends.exchange import post_chat

    received: list[bytes] = []

    class Echo(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(self.rfile.read(int(self.headers["content-length"])))
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *_: Any) -> None:
            pass

    async def send(text: str) -> tuple[int, bytes]:
        async with httpx.AsyncClient(base_url=server.url) as client:
            return await post_chat(client, {"messages": [{"role": "user", "content": text}]}, {}, 10.0)

    with LoopbackServer(Echo) as server:
        assert asyncio.run(send("bad \ud800 value")) == (200, b"{}")
        assert asyncio.run(send("café")) == (200, b"{}")
    assert received[0] == b'{"messages":[{"role":"user","content":"bad \\ud800 value"}]}'
    assert json.loads(received[0])["messages"][0]["content"] == "bad \ud800 value"
    assert received[1] == '{"messages":[{"role":"user","content":"café"}]}'.encode()


def test_a_key_the_server_echoes_in_an_error_is_masked() -> None:
    """A server (a gateway) that echoed the request's key in its error body had it written to
    events.jsonl, results.jsonl, trace.json, timeline.html (and run.json, from a warm-up or the
    server-kind probe): the error text now masks the key, also where the text is cut through it."""
    import httpx

    from asyncroll.backends.exchange import AttemptFailed, post_chat
    from asyncroll.backends.probes import probe_kind
    from asyncroll.errors import ModelError

    secret = "sk-echoed-7c2f9e41"

    def echo(status: int, pad: int) -> httpx.MockTransport:
        def answer(request: httpx.Request) -> httpx.Response:
            said = "x" * pad + f"invalid key {request.headers['authorization']}"
            return httpx.Response(status, json={"error": said})

        return httpx.MockTransport(answer)

    async def chat(pad: int) -> str:
        headers = {"authorization": f"Bearer {secret}"}
        async with httpx.AsyncClient(base_url="http://s", headers=headers, transport=echo(401, pad)) as c:
            with pytest.raises(AttemptFailed) as failed:
                await post_chat(c, {"model": "m"}, {}, 5.0)
        return str(failed.value)

    async def probe() -> str:
        headers = {"authorization": f"Bearer {secret}"}
        async with httpx.AsyncClient(base_url="http://s", headers=headers, transport=echo(503, 0)) as c:
            with pytest.raises(ModelError) as failed:
                await probe_kind(c, "http://s", 5.0)
        return str(failed.value)

    whole, cut = asyncio.run(chat(0)), asyncio.run(chat(466))  # the 500-character cut falls in the key
    assert "HTTP 401" in whole and "invalid key Bearer ***" in whole and secret not in whole
    assert secret[:8] not in cut
    said = asyncio.run(probe())
    assert "HTTP 503" in said and "***" in said and secret not in said


def test_a_key_a_server_echoes_json_escaped_is_masked() -> None:
    """A gateway whose JSON escapes '/' as '\\/' (PHP's json_encode) or a key's '"' and '\\' echoed the
    key in a form the mask did not look for: a base64 key (holding '/') was written whole."""
    import httpx

    from asyncroll.backends.exchange import AttemptFailed, post_chat

    async def chat(secret: str, body: bytes) -> str:
        headers = {"authorization": f"Bearer {secret}"}
        transport = httpx.MockTransport(lambda request: httpx.Response(401, content=body))
        async with httpx.AsyncClient(base_url="http://s", headers=headers, transport=transport) as c:
            with pytest.raises(AttemptFailed) as failed:
                await post_chat(c, {"model": "m"}, {}, 5.0)
        return str(failed.value)

    slash = "wJalrXUtnFEMI/K7MDENG/bPxRfiCY"
    said = asyncio.run(chat(slash, b'{"error":"invalid key wJalrXUtnFEMI\\/K7MDENG\\/bPxRfiCY"}'))
    assert "invalid key ***" in said and "K7MDENG" not in said, said
    quote = 'sk-"quoted\\key'
    said = asyncio.run(chat(quote, json.dumps({"error": f"invalid key {quote}"}).encode()))
    assert "invalid key ***" in said and "quoted" not in said, said


@pytest.mark.timeout(60)
def test_a_key_a_server_echoes_in_a_2xx_that_is_no_completion_is_masked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 2xx body that is no chat completion is quoted in its ``bad_response`` error (a turn's, or the
    warm-up's that fails the run): a gateway echoing the key there had it written to events.jsonl,
    results.jsonl and run.json. The quote and the reason now mask it, as an error status's body is."""
    from tests.hostile_http import HostileServer, json_reply

    secret = "sk-echoed-2xx-91ad"
    monkeypatch.setenv("ASYNCROLL_TEST_KEY", secret)
    echo = json_reply({"choices": [{"message": {"content": [{"type": f"key {secret}"}]}}], "k": secret})
    with HostileServer([echo]) as server:
        turn, capture, out = http_run(
            tmp_path, final_problems(1), server.url, api_key_env="ASYNCROLL_TEST_KEY"
        )
        warm, _, warm_out = http_run(
            tmp_path, final_problems(1), server.url, api_key_env="ASYNCROLL_TEST_KEY", warmup_requests=1
        )
    assert turn.status == "complete", turn.error  # the failure is the trajectory's, not the run's
    (failed,) = capture.of(ModelFailed)
    assert failed.kind == "bad_response" and "body is not an OpenAI chat completion" in failed.error
    assert "'key ***'" in failed.error and '"k":"***"' in failed.error.replace(" ", ""), failed.error
    assert warm.status == "failed" and warm.error is not None and "warm-up request 1/1" in warm.error
    assert secret not in warm.error and "***" in warm.error
    for run_dir in (out, warm_out):
        assert not [f for f in run_dir.rglob("*") if f.is_file() and secret.encode() in f.read_bytes()]


@pytest.mark.timeout(90)
def test_a_replay_whose_length_is_not_fixed_says_so(tmp_path: Path) -> None:
    """A replay on a server of kind generic (one that names no engine in its model list)
    sends only max_tokens, an upper bound: replies shorter than scripted read as ``finish_reason stop``,
    and only run.json's ``replay_fixed_length`` said so. It is now said on stderr; not for a vLLM server."""
    from tests.cli_runs import SMOKE, cli

    with serve() as running:
        args: tuple[str | Path, ...] = ("--workload", SMOKE, "--backend", "openai", "--model", "sim")
        args += ("--endpoint", running.url, "--replay", "--max-tokens", "8", "--no-progress")
        args += ("--no-telemetry", "--warmup-requests", "0")
        generic = cli("run", *args, "--output", tmp_path / "generic", "--server-kind", "generic")
        fixed = cli("run", *args, "--output", tmp_path / "vllm", "--server-kind", "vllm")
    assert generic.returncode == 0 and fixed.returncode == 0, generic.stderr + fixed.stderr
    assert "warning: --replay: the decode length was not fixed on this server (kind generic" in generic.stderr
    assert "decode length" not in fixed.stderr
