"""serve-sim under load and misbehaving on purpose: the metrics by the servers' exact names, its counters,
a client that disconnects, and the faults it injects (statuses, resets, bad bodies), seeded."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from asyncroll.backends.server_model import ServerModelConfig
from asyncroll.serve_sim.config import FaultConfig
from tests.sim_servers import TOOL_SCHEMA, body, fmt, sim


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
    with sim(engine=engine, metrics_flavor=flavor, kv_cache_tokens=1000, max_model_len=1000) as (_, client):
        running_name, waiting_name, kv_name, prompt_name, gen_name = names
        idle = scrape(client)
        assert set(names) <= set(idle)
        vllm = {"model_name": "sim", "engine": "0"}
        # SGLang: the scheduler's gauges carry its ranks, the tokenizer's counters none
        ranks = {
            "model_name": "sim",
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        counters = {"model_name": "sim", "engine_type": "unified"}
        labels = {n: vllm if flavor == "vllm" else ranks if i < 3 else counters for i, n in enumerate(names)}
        assert all(idle[n][0] == labels[n] for n in names)
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
def test_vllm_metrics_carry_model_name_and_engine_labels_as_vllm_v1_does() -> None:
    with sim() as (_, client):
        assert client.post("/v1/chat/completions", json=body()).status_code == 200
        families = list(text_string_to_metric_families(client.get("/metrics").text))
    samples = {s.name: s.labels for f in families for s in f.samples}
    assert set(samples) == {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:prompt_tokens_created",  # vLLM's one API server serves them (tests/test_qa56_serve_sim.py)
        "vllm:generation_tokens_total",
        "vllm:generation_tokens_created",
    }
    assert all(labels == {"model_name": "sim", "engine": "0"} for labels in samples.values()), samples


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


def test_fault_rates_are_chances_of_a_draw_and_the_first_drawn_applies() -> None:
    """docs/SERVERS.md's example: --rate-429 0.6 --rate-500 0.6 answers about 60% 429 and 24% (0.4 × 0.6)
    500, not
    60% of each; every request draws every rate, so slowness comes on top of a fault."""
    from asyncroll.serve_sim.faults import FaultPlan

    plan = FaultPlan(FaultConfig(rate_429=0.6, rate_500=0.6, slow_rate=0.5), seed=7, enforce_schema=True)
    draws = [plan.draw() for _ in range(20_000)]
    share = {f: sum(d[0] == f for d in draws) / len(draws) for f in ("http_429", "http_500", None)}
    assert share["http_429"] == pytest.approx(0.6, abs=0.015)
    assert share["http_500"] == pytest.approx(0.24, abs=0.015)
    assert share[None] == pytest.approx(0.16, abs=0.015)
    slow_429 = sum(1 for fault, slow in draws if slow and fault == "http_429") / len(draws)
    assert slow_429 == pytest.approx(0.3, abs=0.015)
    assert plan.injected["http_500"] == sum(d[0] == "http_500" for d in draws)


@pytest.mark.timeout(30)
def test_a_client_that_disconnects_while_sending_its_body_is_counted_499() -> None:
    """A client gone before its body arrived in full is aborted as one gone later: status 499 in
    ``/sim/stats``; it was counted under no status, with a ``ClientDisconnect`` traceback on stderr."""
    with sim() as (running, _client):
        host, port = running.url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as conn:
            conn.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\n"
                b'Content-Length: 1000\r\n\r\n{"model": '
            )
            deadline = time.monotonic() + 10
            while running.stats()["inflight"] == 0 and time.monotonic() < deadline:
                time.sleep(0.01)  # the handler is reading the body
        while (stats := running.stats())["inflight"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stats["requests"] == 1 and stats["inflight"] == 0
        assert stats["statuses"] == {"499": 1}
