"""serve-sim against what vLLM's OpenAI server does with the fields earlier QA left aside: ``echo``
(vLLM's chat ``echo`` prepends the last message's content when its role is the reply's), ``prompt_logprobs``
(refused: serve-sim computes none), ``stop_token_ids`` (typed as vLLM types it), text parts joined with a
newline as vLLM joins them into the prompt, ``content: null`` only where vLLM's message types allow it, the
``_created`` samples of vLLM's counters, and a second Ctrl-C during the shutdown grace, which ends the
server at once as uvicorn's own second Ctrl-C does."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.children import end
from tests.sim_servers import body, sim

CHAT = "/v1/chat/completions"
ACTION = '{"type": "final", "answer": "done"}'
SCRIPTED = {"x-asyncroll-action": ACTION}
PREFILL = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "Sure: "}]


def streamed_text(client: httpx.Client, request: dict[str, Any]) -> tuple[str, list[Any]]:
    with client.stream("POST", CHAT, json={**request, "stream": True}, headers=SCRIPTED) as r:
        assert r.status_code == 200
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line and line != "data: [DONE]"]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    return text, chunks


@pytest.mark.timeout(30)
def test_echo_prepends_the_last_message_when_its_role_is_the_replys() -> None:
    with sim() as (_, client):
        plain = client.post(CHAT, json=body(messages=PREFILL), headers=SCRIPTED).json()
        echoed = client.post(CHAT, json=body(messages=PREFILL, echo=True), headers=SCRIPTED).json()
        assert plain["choices"][0]["message"]["content"] == ACTION
        assert echoed["choices"][0]["message"]["content"] == "Sure: " + ACTION
        # the echo is not generated: the usage is the same request's without it
        assert echoed["usage"] == plain["usage"]
        # the last message is the user's, the reply the assistant's: nothing to echo
        alone = client.post(CHAT, json=body(echo=True), headers=SCRIPTED).json()
        assert alone["choices"][0]["message"]["content"] == ACTION
        # add_generation_prompt false: the reply continues the last message's role, whatever it is
        user = client.post(CHAT, json=body(echo=True, add_generation_prompt=False), headers=SCRIPTED).json()
        assert user["choices"][0]["message"]["content"] == "x" * 40 + ACTION
        # streamed: one chunk with the echo after the role chunk, as vLLM sends it
        text, chunks = streamed_text(client, body(messages=PREFILL, echo=True))
        assert text == "Sure: " + ACTION
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert chunks[1]["choices"][0]["delta"] == {"content": "Sure: "}


@pytest.mark.timeout(30)
def test_prompt_logprobs_are_refused_naming_the_field() -> None:
    with sim() as (_, client):
        r = client.post(CHAT, json=body(prompt_logprobs=0))
        assert r.status_code == 400 and "'prompt_logprobs'" in r.json()["error"]["message"]
        assert client.post(CHAT, json=body(prompt_logprobs=None)).status_code == 200


@pytest.mark.timeout(30)
def test_stop_token_ids_are_typed_as_vllm_types_them() -> None:
    with sim() as (_, client):
        r = client.post(CHAT, json=body(stop_token_ids="eos"))
        assert r.status_code == 400 and "stop_token_ids" in r.json()["error"]["message"]
        assert client.post(CHAT, json=body(stop_token_ids=[151645])).status_code == 200


@pytest.mark.timeout(30)
def test_text_parts_count_the_newlines_vllm_joins_them_with() -> None:
    parts = [{"type": "text", "text": "ab"}, {"type": "text", "text": "cd"}, "ef"]
    with sim(chars_per_token=1.0) as (_, client):
        r = client.post(CHAT, json=body(messages=[{"role": "user", "content": parts}]))
        assert r.status_code == 200
        assert r.json()["usage"]["prompt_tokens"] == len("ab\ncd\nef")


@pytest.mark.timeout(30)
def test_null_content_only_where_vllms_message_types_allow_it() -> None:
    with sim() as (_, client):
        for role in ("user", "system", "tool"):
            messages = [{"role": "user", "content": "hi"}, {"role": role, "content": None}]
            r = client.post(CHAT, json=body(messages=messages))
            assert r.status_code == 400, role
            assert "messages[1].content" in r.json()["error"]["message"]
        for role in ("assistant", "function"):
            messages = [{"role": "user", "content": "hi"}, {"role": role, "content": None}]
            assert client.post(CHAT, json=body(messages=messages)).status_code == 200, role
        # no content at all is another matter: vLLM's custom-role message type lets it out
        assert client.post(CHAT, json=body(messages=[{"role": "user"}])).status_code == 200


@pytest.mark.timeout(30)
@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_counters_have_created_samples_as_the_flavours_server_serves_them(flavor: str) -> None:
    """vLLM with one API server (its default) serves ``prometheus_client``'s default registry: each
    counter has its ``_created`` sample. SGLang runs ``prometheus_client`` in multiprocess mode: none."""
    before = time.time()
    with sim(metrics_flavor=flavor) as (_, client):
        assert client.post(CHAT, json=body()).status_code == 200
        families = list(text_string_to_metric_families(client.get("/metrics").text))
    created = {s.name: s.value for f in families for s in f.samples if s.name.endswith("_created")}
    if flavor == "sglang":
        assert created == {}
        return
    assert set(created) == {"vllm:prompt_tokens_created", "vllm:generation_tokens_created"}
    assert all(before - 1 <= value <= time.time() for value in created.values()), created


@pytest.mark.timeout(60)
def test_a_second_ctrl_c_during_the_grace_stops_at_once() -> None:
    """A request that outlives the 2 s grace: one SIGINT waits it out, a second ends serve-sim at once,
    as uvicorn's own second Ctrl-C does."""
    cmd = [sys.executable, "-m", "asyncroll.cli", "serve-sim", "--port", "0", "--step-base-ms", "500"]
    cmd += ["--log-level", "info"]  # uvicorn's "Shutting down": the first SIGINT was handled
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[3]
        with httpx.Client(base_url=url, timeout=30) as client:
            request = body(max_tokens=100, ignore_eos=True, stream=True)
            with client.stream("POST", CHAT, json=request) as r:
                assert r.status_code == 200
                lines = r.iter_lines()
                assert next(lines).startswith("data: ")  # the first token: the request is in the engine
                proc.send_signal(signal.SIGINT)
                assert proc.stderr is not None
                while "Shutting down" not in (line := proc.stderr.readline()):
                    assert line, "serve-sim ended without shutting down"
                proc.send_signal(signal.SIGINT)  # one signal after the other: two at once may count once
                started = time.monotonic()
                proc.wait(timeout=20)
                took = time.monotonic() - started
        assert proc.returncode == 0
        assert took < 1.5, f"took {took:.2f}s: the second Ctrl-C did not cut the 2 s grace short"
    finally:
        end(proc)
