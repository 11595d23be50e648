"""The path from a trajectory to a misbehaving model server and back: what a user with a real
OpenAI-compatible server sees when it fails, stalls or is misconfigured (real loopback servers)."""

from __future__ import annotations

import asyncio
import json
import random
import ssl
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest

from asyncroll.backends.openai import HttpSettings, OpenAIBackend
from asyncroll.backends.retry import RetryPolicy, retry_after_s
from asyncroll.clock import SystemClock
from asyncroll.config import build_config
from asyncroll.errors import ModelError, UsageError
from asyncroll.events import ModelFailed, TrajectoryFinished, TrajectoryStarted
from asyncroll.http_proxy import client_settings, on_this_machine
from asyncroll.serve_sim.config import FaultConfig
from tests.conftest import invoke, write_workload
from tests.http_backend import FINAL, final_problems, http_run, serve, start_and_close
from tests.loopback import LoopbackServer
from tests.test_one_repair import _code_problem


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("sk-SECRET-1 ", "leading or trailing whitespace"),
        ("sk-SECRET-1\n", "leading or trailing whitespace"),
        ("sk-SECRET-1\r", "leading or trailing whitespace"),
        ("sk-SECRET\t1", "only visible ASCII"),
        ("sk-SECRET-é1", "only visible ASCII"),
    ],
)
def test_an_api_key_that_no_http_header_can_carry_is_refused_without_showing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, why: str
) -> None:
    """A key read with its file's newline (or a stray space, a CR from a Windows .env) made every
    request fail in h11 with ``Illegal header value b'Bearer sk-…'``: the key itself was then written to
    run.json's error, events.jsonl, results.jsonl, trace.json and timeline.html (and with the warm-up
    off, each failure counted against the server circuit as if the server were down); a non-ASCII one
    failed the run with a bare ``UnicodeEncodeError``. Both are refused before anything starts, naming
    the variable and never the key."""
    monkeypatch.setenv("ASYNCROLL_TEST_KEY", key)
    settings = {"workload": "w", "output": "o", "backend": "vllm", "model": "m"}
    with pytest.raises(UsageError, match=f"--api-key-env ASYNCROLL_TEST_KEY: .*{why}") as refused:
        build_config(settings | {"api_key_env": "ASYNCROLL_TEST_KEY"})
    assert "SECRET" not in str(refused.value)
    workload = write_workload(tmp_path / "w.jsonl", [{"id": "p", "prompt": "Say 5."}])
    result = invoke(
        "run", "--workload", workload, "--output", tmp_path / "out", "--backend", "vllm", "--model", "m",
        "--endpoint", "http://127.0.0.1:9", "--api-key-env", "ASYNCROLL_TEST_KEY", "--no-progress",
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "ASYNCROLL_TEST_KEY" in result.output and "SECRET" not in result.output
    assert not (tmp_path / "out").exists()
    monkeypatch.setenv("ASYNCROLL_TEST_KEY", "sk-fine_KEY.0/+=")  # any visible ASCII is a usable key
    assert build_config(settings | {"api_key_env": "ASYNCROLL_TEST_KEY"}).api_key_env == "ASYNCROLL_TEST_KEY"


@pytest.mark.parametrize("value", ["-5", "nan", "-inf", "NaN"])
def test_a_negative_or_nan_retry_after_is_no_delay_asked_for(value: str) -> None:
    """``retry-after: -5`` or ``nan`` (a broken proxy's) was read as 0 s: every retry went out at once,
    with no backoff at all, where the same value in ``retry-after-ms`` fell back to the backoff."""
    assert retry_after_s({"retry-after": value}) is None
    assert retry_after_s({"retry-after-ms": value}) is None
    policy = RetryPolicy(max_retries=3, base_delay=0.5, max_delay=8.0)
    assert 0.375 <= policy.delay(1, random.Random(0), {"retry-after": value}) <= 0.5  # the backoff
    assert retry_after_s({"retry-after": "0"}) == 0.0  # an explicit "now" is still honoured
    assert policy.delay(1, random.Random(0), {"retry-after": "inf"}) == 8.0  # capped


class RecordingProxy(LoopbackServer):
    """A forward proxy that forwards nothing: it records each request line it is sent and answers 502,
    as a proxy that cannot reach the caller's loopback does (its loopback is not the caller's)."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            def answer(self) -> None:
                seen.append(self.requestline)
                self.send_response(502)
                self.send_header("content-length", "0")
                self.end_headers()

            do_GET = do_POST = do_CONNECT = answer

            def log_message(self, *args: Any) -> None:
                return None

        super().__init__(Handler)


@pytest.mark.timeout(60)
def test_a_server_on_this_machine_is_reached_directly_whatever_proxy_the_environment_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``http_proxy`` set (as on many clusters, for pip), every request to a vLLM on loopback went
    to the proxy — which cannot reach this machine's loopback — and failed as ``ConnectError`` or the
    proxy's 502/503 (counted against the server circuit), while the server was up; the experiment
    runner's readiness probe, which ignores the environment, had just found it ready. With
    ``ALL_PROXY=socks5://…`` the run failed at once with httpx's ImportError about ``socksio``. A proxy
    is never used for a loopback (or unspecified: ``0.0.0.0``) host, requests, probes and the
    ``/metrics`` scrape alike."""
    for name in ("NO_PROXY", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with RecordingProxy() as proxy, serve() as running:
        monkeypatch.setenv("http_proxy", proxy.url)
        monkeypatch.setenv("ALL_PROXY", "socks5://127.0.0.1:9")
        outcome, capture, out = http_run(
            tmp_path, final_problems(3), running.url, backend="openai", warmup_requests=1,
            metrics_url=f"{running.url}/metrics", telemetry_interval=0.05,
        )  # fmt: skip
    assert outcome.status == "complete", outcome.error
    assert proxy.seen == []
    assert [e.status for e in capture.of(TrajectoryFinished)] == ["completed"] * 3
    receipt = json.loads((out / "run.json").read_text())
    assert receipt["backend"]["server_kind_source"] == "probed: /v1/models owned_by='vllm'"
    assert receipt["telemetry"]["sources"][0]["available"] is True


def test_only_a_host_on_this_machine_bypasses_the_environment_proxy() -> None:
    local = [
        "http://127.0.0.1:8000",
        "http://127.3.4.5",
        "http://127.0.1.1:8000",  # the address Debian gives the host's own name
        "http://[::ffff:127.0.0.1]:8000",  # IPv4-mapped: Python 3.11's ipaddress calls it not loopback
        "http://[::1]:8000",
        "http://localhost:8000",
        "http://LOCALHOST.:8000",
        "http://gpu.localhost:8000",
        "http://0.0.0.0:8000",
        "http://[::]:1",
    ]
    for url in local:
        assert on_this_machine(url), url
        assert client_settings(url)["trust_env"] is False
    for url in (
        "http://10.0.0.5:8000",
        "http://[::ffff:10.0.0.5]:8000",
        "https://api.example.com",
        "http://localhost.example.com",
    ):
        assert not on_this_machine(url), url
        assert client_settings(url) == {}  # the environment's proxy and CA settings stand
    https_local = client_settings("https://127.0.0.1:8443")
    assert https_local["trust_env"] is False and isinstance(https_local["verify"], ssl.SSLContext)


@pytest.mark.timeout(60)
def test_a_failed_warmup_still_records_the_backend_in_run_json(tmp_path: Path) -> None:
    """docs/SERVERS.md: warm-up retries are "counted in run.json as backend.warmup_retries" — but the backend
    section was written only after a warm-up that succeeded, so the run whose warm-up failed (the one
    that needs it) recorded no endpoint, server kind or warm-up retries at all."""
    with serve(faults=FaultConfig(rate_503=1.0)) as running:
        outcome, _, out = http_run(
            tmp_path, final_problems(1), running.url, warmup_requests=1, max_retries=2, retry_max_delay=0.01
        )
    assert outcome.status == "failed" and outcome.error is not None
    assert "warm-up request 1/1 failed after 3 attempts: HTTP 503" in outcome.error
    receipt = json.loads((out / "run.json").read_text())
    assert receipt["status"] == "failed"
    backend = receipt["backend"]
    assert (backend["endpoint"], backend["warmup_retries"], backend["server_kind"]) == (
        running.url,
        2,
        "vllm",
    )


@pytest.mark.timeout(30)
@pytest.mark.parametrize("status", [503, 500, 429])
def test_a_transient_error_from_the_model_list_is_no_server_kind(status: int) -> None:
    """``--backend openai`` probes ``/v1/models`` for the server kind. A 503 (a server behind a load
    balancer still starting, an overloaded one) made it ``generic``: a ``--replay`` run against vLLM then
    sent no ``min_tokens``/``ignore_eos`` and its decode lengths were not the scripted ones — silently,
    but for a line in run.json. A transient status is now an error that says so, as no answer is; a
    definite one (404: no such route) is still ``generic``."""

    async def probe(answer: int) -> tuple[str | None, str]:
        transport = httpx.MockTransport(lambda request: httpx.Response(answer, text="engine not ready"))
        settings = HttpSettings(endpoint="http://server", model="m", inflight=1, replay=True)
        backend = OpenAIBackend(settings, SystemClock(), transport=transport)
        async with asyncio.TaskGroup() as tg:
            try:
                await backend.start(tg)
            finally:
                await backend.aclose()  # stops the circuit watch that start() leaves running
        return backend.server_kind, backend.describe()["server_kind_source"]

    with pytest.raises(ExceptionGroup) as raised:
        asyncio.run(probe(status))
    assert raised.group_contains(
        ModelError, match=f"/v1/models: it answered HTTP {status} .*'engine not ready'.*--server-kind"
    )
    assert asyncio.run(probe(404)) == ("generic", "probed: /v1/models answered HTTP 404 without a model list")


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("status", "key"), [(401, None), (403, None), (401, "sk-wrong-one")])
def test_a_server_that_refuses_the_key_is_said_at_the_probe(status: int, key: str | None) -> None:
    """A server started with an API key answered the probe 401 without one: it was recorded as a
    ``generic`` server "without a model list", and every request then failed on its own. The probe now
    fails the start, saying a key is wanted (or that the one given was refused), the key masked."""

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json={"error": f"bad key {request.headers.get('authorization')}"})

    with pytest.raises(ExceptionGroup) as raised:
        asyncio.run(start_and_close(answer, api_key=key))
    (error,) = raised.value.exceptions
    assert isinstance(error, ModelError) and error.status == status
    said = str(error)
    assert f"refused GET /v1/models: HTTP {status}" in said
    if key is None:
        assert "it wants an API key" in said and "--api-key-env" in said
    else:
        assert "refused the API key --api-key-env gave" in said and key not in said and "***" in said


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("status", "key"), [(401, None), (403, "sk-wrong-one")])
def test_a_declared_server_that_refuses_the_key_is_said_at_the_warmup(status: int, key: str | None) -> None:
    """A declared server kind (``--backend vllm``, every experiment arm) skips the probe that says a key
    is wanted: the warm-up's 401/403 stopped the run with the server's text alone, not a word of
    ``--api-key-env``. It now says what the probe says, the key masked."""

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json={"error": f"bad key {request.headers.get('authorization')}"})

    async def warm() -> None:
        settings = HttpSettings(
            endpoint="http://server", model="m", inflight=1, api_key=key, server_kind="vllm"
        )
        backend = OpenAIBackend(settings, SystemClock(), transport=httpx.MockTransport(answer))
        try:
            await backend.warmup(1)
        finally:
            await backend.aclose()

    with pytest.raises(ModelError) as raised:
        asyncio.run(warm())
    said = str(raised.value)
    assert raised.value.status == status and f"warm-up request 1/1 failed: HTTP {status}" in said
    if key is None:
        assert "it wants an API key: name the environment variable that holds it with --api-key-env" in said
    else:
        assert "it refused the API key --api-key-env gave" in said and key not in said and "***" in said


@pytest.mark.timeout(60)
def test_a_turn_refused_for_its_key_says_so(tmp_path: Path) -> None:
    """With a declared kind and no warm-up nothing probes the server first: each turn failed on its own
    with "HTTP 401: …" and the server's text alone. A 401/403 turn's error now says a key is wanted."""
    from tests.hostile_http import HostileServer, raw_reply

    refuse = raw_reply(401, {"content-type": "application/json"}, b'{"error": "Unauthorized"}')
    with HostileServer([refuse]) as server:
        outcome, capture, _ = http_run(tmp_path, final_problems(1), server.url, server_kind="vllm")
    assert outcome.status == "complete", outcome.error
    (failed,) = capture.of(ModelFailed)
    assert failed.kind == "http_status" and failed.status == 401
    assert failed.error == (
        'HTTP 401: {"error": "Unauthorized"} (it wants an API key: name the environment variable that holds '
        "it with --api-key-env)"
    )


@pytest.mark.timeout(60)
def test_results_say_how_many_attempts_a_failed_request_made(tmp_path: Path) -> None:
    """A request that failed after its retries read in results.jsonl exactly as one that was never
    retried ("model http_status: HTTP 500: …"): only events.jsonl had its attempts. The warm-up already
    said "failed after 3 attempts"; a trajectory's error now does too."""
    with serve(faults=FaultConfig(rate_500=1.0)) as running:
        _, _, retried = http_run(
            tmp_path, final_problems(2), running.url, max_retries=2, retry_max_delay=0.01
        )
        _, _, once = http_run(tmp_path, final_problems(1), running.url)
    errors = [json.loads(line)["error"] for line in (retried / "results.jsonl").read_text().splitlines()]
    assert len(errors) == 2
    assert all(
        e.startswith("model http_status: HTTP 500") and e.endswith(" (after 3 attempts)") for e in errors
    )
    (single,) = [json.loads(line)["error"] for line in (once / "results.jsonl").read_text().splitlines()]
    assert single.startswith("model http_status: HTTP 500") and "attempts" not in single


class StatusServer(LoopbackServer):
    """Answers each chat request with the next ``(status, body)`` of ``replies`` (``None``: no body;
    bytes: sent as they are)."""

    def __init__(self, replies: list[tuple[int, Any]]) -> None:
        queue = iter(replies)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                status, body = next(queue)
                data = body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                if status != 204:  # a 204 has no body, nor a length
                    self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                return None

        super().__init__(Handler)


@pytest.mark.timeout(60)
def test_any_2xx_reply_is_read_as_a_completion(tmp_path: Path) -> None:
    """SPEC §3 fails a model call on a *non-2xx* status, as the OpenAI client does; a 201 or 203 (a
    gateway's) carrying a valid completion failed its trajectory as ``http_status``. Every 2xx body is
    read now: a completion completes, and a 202 or 204, which carry none, are ``bad_response`` (a
    response received)."""
    done = {
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": FINAL}, "finish_reason": "stop"}
        ],
    }
    replies = [(201, done), (203, done), (202, {"id": "job-1", "status": "queued"}), (204, None)]
    with StatusServer(replies) as server:
        outcome, capture, _ = http_run(
            tmp_path, final_problems(4), server.url, max_active_trajectories=1, telemetry=False
        )
    assert outcome.status == "complete", outcome.error
    assert [e.status for e in capture.of(TrajectoryFinished)] == [
        "completed",
        "completed",
        "failed",
        "failed",
    ]
    assert [(e.kind, e.status, e.response_received) for e in capture.of(ModelFailed)] == [
        ("bad_response", 202, True),
        ("bad_response", 204, True),
    ]


@pytest.mark.timeout(60)
def test_a_warmup_answered_with_a_page_that_is_no_completion_fails_the_run(tmp_path: Path) -> None:
    """The warm-up is there to fail a misconfigured run before the clock starts, but it read only the
    status: an ``--endpoint`` that reaches a web app or a proxy answering every path ``200`` with an
    HTML page passed it, and then every trajectory failed as ``bad_response``."""
    page = b"<!doctype html><html><body>Welcome</body></html>"
    with StatusServer([(200, page)] * 3) as server:
        outcome, capture, _ = http_run(
            tmp_path, final_problems(2), server.url, warmup_requests=1, telemetry=False
        )
    assert outcome.status == "failed" and outcome.error is not None
    assert "warm-up request 1/1: HTTP 200 body is not an OpenAI chat completion (not JSON" in outcome.error
    assert "<!doctype html>" in outcome.error
    assert not capture.of(TrajectoryStarted)


@pytest.mark.timeout(60)
def test_a_model_failure_after_an_evaluated_program_keeps_that_verdict(tmp_path: Path) -> None:
    """A one-repair code problem whose first program failed its tests and whose repair request then
    failed (a 503, a timeout) ended with no verdict at all: results.jsonl had no ``passed`` or
    ``generations``, and the summary dropped it from ``one_repair.evaluated`` and from ``graded`` —
    so every such failure *raised* ``pass_rate_first``, ``pass_rate_final`` and ``accuracy.exact`` (the
    dropped trajectories had all failed their first program). It keeps the verdict it reached."""
    message = {"role": "assistant", "content": "unused in replay"}
    done = {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
    }
    replies = [(200, done), (503, {"error": "overloaded"}), (200, done)]
    with StatusServer(replies) as server:
        outcome, _, out = http_run(
            tmp_path,
            [_code_problem("repair-lost", [False, True]), _code_problem("first-pass", [True])],
            server.url,
            replay=True,
            max_active_trajectories=1,
            telemetry=False,
        )
    assert outcome.status == "complete" and outcome.summary is not None
    results = {r["id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    lost = results["repair-lost"]
    assert lost["status"] == "failed" and lost["error"].startswith("model http_status: HTTP 503")
    assert (lost["passed"], lost["generations"], lost["repair_attempted"], lost["tests_total"]) == (
        False,
        1,
        False,
        2,
    )
    assert lost["correct"] is False  # its last (only) program failed its tests
    one_repair = outcome.summary["accuracy"]["one_repair"]
    assert (one_repair["evaluated"], one_repair["passed_first"], one_repair["repairs_attempted"]) == (2, 1, 0)
    assert one_repair["pass_rate_first"] == 0.5  # was 1.0: the failed first program had vanished
    accuracy = outcome.summary["accuracy"]
    assert (accuracy["denominator"], accuracy["correct"], accuracy["exact"]) == (2, 1, 0.5)


def test_an_answer_from_the_server_ends_a_run_of_unavailable_failures() -> None:
    """The circuit opens after ``--circuit-failures`` *consecutive* unavailable failures (refused, reset,
    502/503/504). A 429 or a 500 between them is the server answering — it is there — but only a 200
    reset the count, so 503, 429, 503 opened a circuit of 2 (a spurious ``server_unavailable``, admission
    paused until a health probe closed it). Pure protocol: ``httpx.MockTransport``, no probe running, so
    an opened circuit would leave the request waiting."""
    from asyncroll.backends.base import ModelRequest
    from asyncroll.workload import Problem

    replies = iter([503, 429, 503, 500, 503, 200])

    def handler(request: httpx.Request) -> httpx.Response:
        status = next(replies)
        if status == 200:
            return httpx.Response(
                200, json={"choices": [{"message": {"role": "assistant", "content": FINAL}}]}
            )
        return httpx.Response(status, json={"error": {"message": "busy"}})

    settings = HttpSettings(
        endpoint="http://server",
        model="m",
        inflight=1,
        retry=RetryPolicy(max_retries=8, base_delay=0.001, max_delay=0.001),
        circuit_failures=2,
    )
    backend = OpenAIBackend(settings, SystemClock(), transport=httpx.MockTransport(handler))
    request = ModelRequest(
        "t", Problem.model_validate({"prompt": "p"}), 0, [{"role": "user", "content": "p"}]
    )

    async def complete() -> Any:
        try:
            return await asyncio.wait_for(backend.complete(request), 5)
        finally:
            await backend.aclose()

    response = asyncio.run(complete())
    assert response.action.type == "final"
    assert backend.circuit.snapshot().opened == 0 and backend.retries == 5
