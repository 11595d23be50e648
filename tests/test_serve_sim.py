"""serve-sim as a real server on loopback: response shapes, sizes, metrics, faults, the CLI subprocess."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

from asyncroll.backends.server_model import ServerModelConfig
from asyncroll.config import ServerKind
from asyncroll.serve_sim.config import FaultConfig, SimConfig
from asyncroll.serve_sim.server import RunningSim, serve_in_thread
from tests.children import end
from tests.conftest import invoke

FAST = ServerModelConfig(max_num_seqs=64, step_base_ms=0.2, step_per_seq_ms=0.0, prefill_ms_per_token=0.0)
TOOL_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {
            "type": "object",
            "properties": {
                "type": {"const": "tool"},
                "name": {"const": "add"},
                "arguments": {
                    "type": "object",
                    "properties": {
                        "a": {"type": "integer"},
                        "xs": {"type": "array", "items": {"type": "number"}},
                    },
                    "required": ["a", "xs"],
                    "additionalProperties": False,
                },
            },
            "required": ["type", "name", "arguments"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {"type": {"const": "final"}, "answer": {"type": "string"}},
            "required": ["type", "answer"],
            "additionalProperties": False,
        },
    ]
}


def fmt(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "agent_action", "strict": True, "schema": schema}}


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "sim", "messages": [{"role": "user", "content": "x" * 40}], **extra}


@contextmanager
def sim(**settings: Any) -> Iterator[tuple[RunningSim, httpx.Client]]:
    faults = settings.pop("faults", FaultConfig())
    config = SimConfig(engine=settings.pop("engine", FAST), faults=faults, **settings)
    with serve_in_thread(config) as running, httpx.Client(base_url=running.url, timeout=20) as client:
        yield running, client


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
        (json.dumps(body(max_tokens=0)).encode(), 400, "'max_tokens' must be an integer >= 1"),
        (json.dumps(body(max_tokens=5, min_tokens=9)).encode(), 400, "'min_tokens' (9) must be <="),
        (json.dumps(body(max_tokens=40_000)).encode(), 400, "maximum context length is 32768"),
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


def scrape(client: httpx.Client) -> dict[str, tuple[dict[str, str], float]]:
    out = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            out[sample.name] = (sample.labels, sample.value)
    return out


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("flavor", "names"),
    [
        (
            "vllm",
            (
                "vllm:num_requests_running",
                "vllm:num_requests_waiting",
                "vllm:kv_cache_usage_perc",
                "vllm:prompt_tokens_total",
                "vllm:generation_tokens_total",
            ),
        ),
        (
            "sglang",
            (
                "sglang:num_running_reqs",
                "sglang:num_queue_reqs",
                "sglang:token_usage",
                "sglang:prompt_tokens_total",
                "sglang:generation_tokens_total",
            ),
        ),
    ],
)
def test_metrics_use_the_servers_exact_names_under_load(flavor: str, names: tuple[str, ...]) -> None:
    """Five requests against a batch of two: the scrape shows 2 running, 3 waiting and KV in use."""
    engine = ServerModelConfig(
        max_num_seqs=2, step_base_ms=30.0, step_per_seq_ms=0.0, prefill_ms_per_token=0.0
    )
    with sim(engine=engine, metrics_flavor=flavor, kv_cache_tokens=1000) as (_, client):
        running_name, waiting_name, kv_name, prompt_name, gen_name = names
        idle = scrape(client)
        assert set(names) <= set(idle)
        assert all(idle[n][0] == {"model_name": "sim"} for n in names)
        assert idle[running_name][1] == 0 and idle[prompt_name][1] == 0
        with ThreadPoolExecutor(5) as pool:
            futures = [
                pool.submit(client.post, "/v1/chat/completions", json=body(max_tokens=20, ignore_eos=True))
                for _ in range(5)
            ]
            # Scrape until all five are in the engine (bounded by the test timeout): two admitted, three
            # queued. The KV gauge of that same scrape counts the two running sequences' reservations.
            while True:
                busy = scrape(client)
                if busy[running_name][1] + busy[waiting_name][1] == 5 and busy[running_name][1] == 2:
                    break
                # The window lasts one batch (20 steps of 30 ms); missing it is a failure, not a hang.
                assert not futures[0].done(), "the first batch finished before all five requests arrived"
            assert all(f.result().status_code == 200 for f in futures)
        assert busy[waiting_name][1] == 3
        assert busy[kv_name][1] == pytest.approx(2 * (10 + 20) / 1000)
        done = scrape(client)
        assert done[prompt_name][1] == 50 and done[gen_name][1] == 100
        assert done[running_name][1] == 0 and done[kv_name][1] == 0


@pytest.mark.timeout(30)
def test_peak_concurrency_counter() -> None:
    engine = ServerModelConfig(
        max_num_seqs=64, step_base_ms=5.0, step_per_seq_ms=0.0, prefill_ms_per_token=0.0
    )
    with sim(engine=engine) as (running, client):
        with ThreadPoolExecutor(6) as pool:
            futures = [
                pool.submit(client.post, "/v1/chat/completions", json=body(max_tokens=40, ignore_eos=True))
                for _ in range(6)
            ]
            assert all(f.result().status_code == 200 for f in futures)
        stats = running.stats()
        assert stats["peak_inflight"] == 6 and stats["inflight"] == 0 and stats["statuses"] == {"200": 6}
        assert client.post("/sim/reset-stats").json()["peak_inflight"] == 0


@pytest.mark.timeout(30)
def test_status_faults_and_retry_after() -> None:
    with sim(faults=FaultConfig(rate_429=1.0, retry_after_s=0.25)) as (_, client):
        r = client.post("/v1/chat/completions", json=body())
        assert r.status_code == 429 and r.json()["error"]["type"] == "RateLimitError"
        assert r.headers["retry-after-ms"] == "250" and r.headers["retry-after"] == "1"
    for status in (500, 503):
        rates: dict[str, Any] = {f"rate_{status}": 1.0}
        with sim(faults=FaultConfig(**rates)) as (running, client):
            assert client.post("/v1/chat/completions", json=body()).status_code == status
            assert running.stats()["faults"] == {f"http_{status}": 1}


@pytest.mark.timeout(30)
def test_connection_faults_and_bad_bodies() -> None:
    with sim(faults=FaultConfig(reset_rate=1.0)) as (running, client):
        with pytest.raises(httpx.TransportError):
            client.post("/v1/chat/completions", json=body())
        assert client.get("/health").status_code == 200  # the server itself is fine
        # no response was sent: counted as a reset, never as the 200 it never answered
        assert running.stats()["statuses"] == {"reset": 1}
    with sim(faults=FaultConfig(truncate_rate=1.0)) as (running, client):
        with pytest.raises(httpx.RemoteProtocolError):
            client.post("/v1/chat/completions", json=body())
        assert running.stats()["statuses"] == {"truncated": 1}
    with sim(faults=FaultConfig(malformed_rate=1.0)) as (_, client):
        r = client.post("/v1/chat/completions", json=body())
        assert r.status_code == 200
        with pytest.raises(json.JSONDecodeError):
            json.loads(r.content)
    with sim(faults=FaultConfig(reject_schema=True)) as (_, client):
        r = client.post("/v1/chat/completions", json=body(response_format=fmt(TOOL_SCHEMA)))
        assert r.status_code == 400 and "JSON schema" in r.json()["error"]["message"]
        assert client.post("/v1/chat/completions", json=body()).status_code == 200  # no schema: fine
    with sim(enforce_schema=False, faults=FaultConfig(invalid_action_rate=1.0)) as (_, client):
        r = client.post("/v1/chat/completions", json=body(response_format=fmt(TOOL_SCHEMA)))
        content = r.json()["choices"][0]["message"]["content"]
        with pytest.raises(json.JSONDecodeError):
            json.loads(content)


@pytest.mark.timeout(30)
def test_a_client_that_disconnects_stops_costing_decode_steps() -> None:
    """Like vLLM, a request whose client went away is aborted: its sequence leaves the running batch at
    once instead of decoding to the end (here 20,000 tokens × 5 ms = 100 s), and the engine goes idle."""
    engine = ServerModelConfig(
        max_num_seqs=8, step_base_ms=5.0, step_per_seq_ms=0.0, prefill_ms_per_token=0.0
    )
    with sim(engine=engine) as (running, client):
        with (
            httpx.Client(base_url=running.url, timeout=0.3) as impatient,
            pytest.raises(httpx.ReadTimeout),
        ):
            impatient.post("/v1/chat/completions", json=body(max_tokens=20_000, ignore_eos=True))
        # the impatient client closed its connection; wait (bounded) for the server to notice
        deadline = time.monotonic() + 10
        while (stats := running.stats())["inflight"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert stats["inflight"] == 0 and stats["statuses"] == {"499": 1}
        assert stats["engine"]["running"] == 0 and stats["engine"]["waiting"] == 0
        generated = stats["engine"]["generated_tokens"]
        assert 0 < generated < 2_000  # stopped after about a 0.3 s timeout, nowhere near 20,000
        time.sleep(0.1)
        assert running.stats()["engine"]["generated_tokens"] == generated  # nothing decodes any more
        # the server is fine and serves the next request in full
        r = client.post("/v1/chat/completions", json=body(max_tokens=3, ignore_eos=True))
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


@pytest.mark.timeout(30)
def test_fault_draws_are_seeded() -> None:
    faults = FaultConfig(rate_500=0.3, rate_503=0.3)
    runs = []
    for _ in range(2):
        with sim(seed=5, faults=faults) as (_, client):
            runs.append([client.post("/v1/chat/completions", json=body()).status_code for _ in range(20)])
    assert runs[0] == runs[1]
    assert {200, 500, 503} <= set(runs[0])


def test_fault_rates_are_validated() -> None:
    with pytest.raises(ValueError, match=r"--rate-503 must be in \[0, 1\]"):
        FaultConfig(rate_503=1.5)
    with pytest.raises(ValueError, match="--metrics-flavor"):
        SimConfig(metrics_flavor="tgi")  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_settings_are_refused(value: float) -> None:
    # NaN passed every `< 0` check: the server started, and /sim/stats failed after one request
    for name in ("slow_s", "retry_after_s", "rate_429", "slow_rate"):
        flag = "--retry-after" if name == "retry_after_s" else "--" + name.replace("_", "-")
        with pytest.raises(ValueError, match=f"{flag} must be a finite number"):
            FaultConfig(**{name: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="--chars-per-token must be a finite number"):
        SimConfig(chars_per_token=value)
    for name in ("step_base_ms", "step_per_seq_ms", "prefill_ms_per_token"):
        flag = "--" + name.replace("_", "-")
        with pytest.raises(ValueError, match=f"{flag} must be a finite number"):
            SimConfig(engine=ServerModelConfig(**{name: value}))  # type: ignore[arg-type]


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


@pytest.mark.timeout(30)
def test_cli_subprocess_prints_the_port_and_stops_on_sigterm() -> None:
    cmd = [
        sys.executable,
        "-m",
        "asyncroll.cli",
        "serve-sim",
        "--port",
        "0",
        "--model",
        "m",
        "--step-base-ms",
        "1",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("serve-sim listening on http://127.0.0.1:"), line
        url = line.split()[3]
        port = int(url.rsplit(":", 1)[1])
        assert port > 0 and f"port {port}" in line
        with httpx.Client(base_url=url, timeout=10) as client:
            assert client.get("/health").status_code == 200
            r = client.post(
                "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            )
            assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 1
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=15)
        assert proc.returncode == 0, stderr
    finally:
        end(proc)


@pytest.mark.timeout(30)
def test_cli_refuses_bad_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked in this process, with the server replaced by a recorder: a setting let through would be
    seen, never served (the real command: test_cli_subprocess_prints_the_port_and_stops_on_sigterm)."""
    import asyncroll.serve_sim.server as server_module

    served: list[SimConfig] = []

    def recorder(sim: SimConfig, *_a: Any, **_k: Any) -> int:
        served.append(sim)
        return 0

    monkeypatch.setattr(server_module, "serve_forever", recorder)
    for args, needle in (
        (["--rate-429", "2"], "--rate-429 must be in [0, 1]"),
        (["--invalid-action-rate", "0.5"], "needs --no-enforce-schema"),
        (["--metrics-flavor", "tgi"], "--metrics-flavor must be vllm or sglang"),
        (["--step-base-ms", "0", "--step-per-seq-ms", "0"], "a step must take some time"),
        # a step of 1e297 s: every request waited for ever (the client timed out), with no error
        (["--step-base-ms", "1e300"], "--step-base-ms must be from 0 to 86400000 ms (one day), got 1e+300"),
        (["--prefill-ms-per-token", "-1"], "--prefill-ms-per-token must be from 0 to 86400000 ms"),
        (["--max-num-seqs", "0"], "--max-num-seqs must be >= 1, got 0"),
        (["--step-base-ms", "nan"], "--step-base-ms must be a finite number"),
        (["--prefill-ms-per-token", "inf"], "--prefill-ms-per-token must be a finite number"),
        (["--slow-s", "inf"], "--slow-s must be a finite number"),
        (["--retry-after", "-inf"], "--retry-after must be a finite number"),
        (["--chars-per-token", "nan"], "--chars-per-token must be a finite number"),
        # started, then answered every chat request 500 (OverflowError sizing the prompt); simulate
        # --server batching, the same server model, refused it
        (["--chars-per-token", "1e-310"], "--chars-per-token must be >= 0.01, got 1e-310"),
        (["--chars-per-token", "0.001"], "--chars-per-token must be >= 0.01, got 0.001"),
        (["--log-level", "bogus"], "--log-level must be one of critical, error, warning, info, debug, trace"),
    ):
        result = invoke("serve-sim", "--port", "0", *args)
        assert result.exit_code == 2 and not served, (args, result.output)
        assert needle in result.stderr
    assert invoke("serve-sim", "--port", "0").exit_code == 0 and len(served) == 1  # the recorder works


@pytest.mark.timeout(30)
def test_a_port_it_cannot_listen_on_is_a_usage_error_as_for_run() -> None:
    """A port in use exited 1 (a failed run, by the CLI's codes) where ``run --metrics-port`` and the
    experiment pre-flight give 2 for the same thing: nothing was started, the flag was unusable."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = invoke("serve-sim", "--port", str(port))
    assert result.exit_code == 2, result.output
    assert f"error: cannot listen on 127.0.0.1:{port}: " in result.stderr


# --- the same server model behind two front ends: simulate --server batching and serve-sim -------------

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
    assert sim_response.completion_tokens == http_response.completion_tokens == parsed.script[1].output_tokens
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
