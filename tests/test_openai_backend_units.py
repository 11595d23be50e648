"""The OpenAI-compatible backend on its own (``httpx.MockTransport``, virtual clock, no server): what a
retried, failed or unreadable turn reports (attempts, status, the retry events and their delays), what a
warm-up counts, how long the circuit watch waits before it fails the run, and what run.json records."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx
import pytest

from asyncroll.backends import openai
from asyncroll.backends.base import ModelRequest
from asyncroll.backends.completion import Completion, read_completion
from asyncroll.backends.openai import HttpSettings, OpenAIBackend
from asyncroll.backends.retry import RetryPolicy
from asyncroll.clock import VirtualClock
from asyncroll.errors import InvalidActionError, ModelError
from asyncroll.event_log import EventCapture, EventLog
from asyncroll.events import ModelPaused, ModelRetrying, ServerAvailable, ServerUnavailable
from asyncroll.workload import Problem
from tests.http_backend import FINAL, completion

Handler = Callable[[httpx.Request], httpx.Response]
TLS_FIXTURES = Path(__file__).parent / "fixtures" / "tls"
REQUEST = ModelRequest("t", Problem.model_validate({"prompt": "p"}), 0, [{"role": "user", "content": "p"}])


def replies(*answers: int | dict[str, Any] | bytes) -> Handler:
    """A chat endpoint answering each POST with the next of ``answers`` (a status with an error body, a
    JSON body with 200, or raw bytes with 200), then the last again; every GET (a probe) is 200."""
    queue = list(answers)

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json={})
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(answer, int):
            return httpx.Response(answer, json={"error": {"message": "busy"}})
        if isinstance(answer, bytes):
            return httpx.Response(200, content=answer)
        return httpx.Response(200, json=answer)

    return handler


def settings(**values: Any) -> HttpSettings:
    base: dict[str, Any] = {"endpoint": "http://server", "model": "m", "inflight": 1, "circuit_failures": 0}
    return HttpSettings(**(base | values))


def on_virtual_clock(
    handler: Handler,
    body: Callable[[OpenAIBackend], Coroutine[Any, Any, Any]],
    clock: VirtualClock | None = None,
    **values: Any,
) -> tuple[Any, OpenAIBackend, EventCapture, VirtualClock]:
    """Run ``body(backend)`` on a virtual clock against ``handler``; the backend's events are captured."""
    clock = clock or VirtualClock(start=100.0)
    capture = EventCapture()
    backend = OpenAIBackend(settings(**values), clock, transport=httpx.MockTransport(handler))

    async def main() -> Any:
        events = EventLog(clock)
        events.subscribe(capture)
        events.start_measurement()
        backend.bind_events(events)
        try:
            return await body(backend)
        finally:
            await backend.aclose()

    return clock.run(main()), backend, capture, clock


def slow_reading(monkeypatch: pytest.MonkeyPatch) -> VirtualClock:
    """A virtual clock on which reading a reply takes 1.2345678 ms (parse_s is rounded to the µs)."""
    clock = VirtualClock(start=100.0)

    def read(payload: bytes) -> Completion:
        clock.advance(0.0012345678)
        return read_completion(payload)

    monkeypatch.setattr(openai, "read_completion", read)
    return clock


def complete(handler: Handler, **values: Any) -> tuple[Any, OpenAIBackend, EventCapture, VirtualClock]:
    return on_virtual_clock(handler, lambda backend: backend.complete(REQUEST), **values)


RETRY = RetryPolicy(max_retries=2, base_delay=1.0, max_delay=8.0)
ONE_RETRY = RetryPolicy(max_retries=1, base_delay=1.0, max_delay=8.0)


def test_a_turn_retried_to_success_counts_each_retry_with_its_attempt_and_delay() -> None:
    response, backend, capture, clock = complete(replies(503, 429, completion(FINAL)), retry=RETRY)
    assert response.action.type == "final"
    assert (response.prompt_tokens, response.completion_tokens, response.text) == (5, 3, FINAL)
    assert response.finish_reason == "stop"
    rng = random.Random(0)  # the backend's jitter, seeded by --seed
    delays = [round(1.0 * (1 - 0.25 * rng.random()), 6), round(2.0 * (1 - 0.25 * rng.random()), 6)]
    retried = capture.of(ModelRetrying)
    assert [(e.attempt, e.kind, e.status, e.delay_s) for e in retried] == [
        (1, "http_status", 503, delays[0]),
        (2, "http_status", 429, delays[1]),
    ]
    assert [e.error[:8] for e in retried] == ["HTTP 503", "HTTP 429"]
    assert backend.retries == 2
    assert clock.now() == pytest.approx(100.0 + sum(delays))


#: A retry-after that reads as an HTTP date with a day or zone too large for the C library's int
OVERFLOWING_DATE = "99999999999999999999 Feb 2026 00:00:00 GMT"


def test_a_retry_after_too_large_to_be_a_date_is_no_delay_asked_for_the_backoff_stands() -> None:
    """The date parser raised OverflowError from inside the retry: the request ended as kind
    ``internal`` (the backend's own bug), which failed the whole run (the warm-up's, too)."""
    queue = [httpx.Response(429, headers={"retry-after": OVERFLOWING_DATE}, json={}), None]

    def handler(request: httpx.Request) -> httpx.Response:
        return queue.pop(0) or httpx.Response(200, json=completion(FINAL))

    response, _, capture, _ = complete(handler, retry=ONE_RETRY)
    assert response.action.type == "final"
    delay = round(1.0 * (1 - 0.25 * random.Random(0).random()), 6)  # the backoff, jittered
    assert [(e.status, e.delay_s) for e in capture.of(ModelRetrying)] == [(429, delay)]
    queue[:] = [httpx.Response(429, headers={"retry-after": OVERFLOWING_DATE}, json={}), None]
    _, backend, _, _ = on_virtual_clock(handler, lambda backend: backend.warmup(1), retry=ONE_RETRY)
    assert backend.warmup_retries == 1


def test_a_turn_that_fails_every_attempt_says_how_many_it_made() -> None:
    with pytest.raises(ModelError) as caught:
        complete(replies(503), retry=ONE_RETRY)
    err = caught.value
    assert (err.kind, err.status, err.response_received, err.attempts) == ("http_status", 503, True, 2)
    assert str(err).endswith(" (after 2 attempts)"), str(err)


def test_a_turn_failed_at_its_only_attempt_does_not_speak_of_attempts() -> None:
    with pytest.raises(ModelError) as caught:
        complete(replies(400))
    err = caught.value
    assert (err.kind, err.status, err.attempts) == ("http_status", 400, 1)
    assert "attempts" not in str(err), str(err)


def test_a_reply_that_is_no_completion_is_a_bad_response_after_its_attempts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = slow_reading(monkeypatch)
    with pytest.raises(ModelError) as caught:
        complete(replies(503, b"<html>not an api</html>"), clock=clock, retry=RETRY)
    err = caught.value
    assert (err.kind, err.status, err.response_received, err.attempts) == ("bad_response", 200, True, 2)
    assert str(err).startswith("HTTP 200 body is not an OpenAI chat completion ("), str(err)
    assert str(err).endswith(": b'<html>not an api</html>'"), str(err)
    assert err.parse_s == 0.001235


def test_an_invalid_action_keeps_the_usage_text_and_attempts_of_its_completion(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reply = completion("not an action", usage={"prompt_tokens": 7, "completion_tokens": 11})
    with pytest.raises(InvalidActionError) as caught:
        complete(replies(503, reply), clock=slow_reading(monkeypatch), retry=RETRY)
    err = caught.value
    assert (err.kind, err.status, err.response_received, err.attempts) == ("invalid_action", 200, True, 2)
    assert (err.prompt_tokens, err.completion_tokens) == (7, 11)
    assert (err.text, err.finish_reason, err.parse_s) == ("not an action", "stop", 0.001235)


def test_a_warmup_retried_to_success_counts_its_retries() -> None:
    done, backend, capture, _ = on_virtual_clock(
        replies(503, 503, completion(FINAL)), lambda b: b.warmup(2), retry=RETRY
    )
    assert (done, backend.warmup_retries) == (2, 2)
    assert capture.of(ModelRetrying) == []  # before the clock: counted in run.json, not as events
    assert backend.describe()["warmup_retries"] == 2


def test_a_warmup_that_keeps_failing_names_its_request_and_attempts() -> None:
    with pytest.raises(ModelError) as caught:
        on_virtual_clock(replies(completion(FINAL), 503), lambda b: b.warmup(3), retry=ONE_RETRY)
    err = caught.value
    assert (err.kind, err.status) == ("http_status", 503)
    assert str(err).startswith("warm-up request 2/3 failed after 2 attempts: HTTP 503"), str(err)
    with pytest.raises(ModelError) as caught:
        on_virtual_clock(replies(400), lambda b: b.warmup(1), retry=RETRY)
    assert str(caught.value).startswith("warm-up request 1/1 failed: HTTP 400"), str(caught.value)


def test_a_warmup_reply_that_is_no_completion_fails_at_once() -> None:
    with pytest.raises(ModelError) as caught:
        on_virtual_clock(replies(completion(FINAL), b"<html/>"), lambda b: b.warmup(2), retry=RETRY)
    err = caught.value
    assert (err.kind, err.status) == ("bad_response", 200)
    assert str(err).startswith("warm-up request 2/2: HTTP 200 body is not an OpenAI chat completion")
    assert str(err).endswith(": b'<html/>'"), str(err)


def health(*statuses: int) -> Handler:
    """A server whose ``GET /health`` answers ``statuses`` in turn (then the last again); it has no
    ``GET /version`` (the start's one probe of it)."""
    queue = list(statuses)

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/version":
            return httpx.Response(404)
        return httpx.Response(queue.pop(0) if len(queue) > 1 else queue[0], json={})

    return handler


async def watch_opened_circuit(backend: OpenAIBackend, watched: float) -> None:
    """Open the circuit (two unavailable failures) and run the watch for ``watched`` virtual seconds."""
    clock = backend._clock
    async with asyncio.TaskGroup() as tg:
        await backend.start(tg)
        await asyncio.sleep(1.0)
        assert not backend.circuit.record_unavailable(clock.now())
        assert backend.circuit.record_unavailable(clock.now())  # opened at t=101
        await asyncio.sleep(watched)
        await backend.aclose()


def test_the_watch_closes_the_circuit_at_the_first_healthy_probe_and_says_after_how_long() -> None:
    _, backend, capture, _ = on_virtual_clock(
        health(503, 503, 503, 200),
        lambda b: watch_opened_circuit(b, 10.0),
        circuit_failures=2,
        probe_interval=0.5,
        server_kind="vllm",
    )
    available = capture.of(ServerAvailable)
    assert [(e.paused_s, e.probes) for e in available] == [(1.5, 4)]
    assert available[0].t == 2.5  # from measurement start at t=100
    assert not backend.circuit.is_open


def test_a_server_down_for_the_timeout_fails_the_run_with_how_long_and_the_last_probe() -> None:
    with pytest.raises(ExceptionGroup) as caught:
        on_virtual_clock(
            health(503),
            lambda b: watch_opened_circuit(b, 10.0),
            circuit_failures=2,
            probe_interval=0.5,
            server_down_timeout=3.0,
            server_kind="vllm",
        )
    (err,) = caught.value.exceptions
    assert isinstance(err, ModelError) and err.kind == "server_down"
    assert str(err) == (
        "the server at http://server stayed unavailable for 3.0s (--server-down-timeout 3; last probe: "
        "GET /health: HTTP 503); admission was paused meanwhile"
    )


def test_a_request_that_waited_for_the_circuit_says_how_long() -> None:
    async def body(backend: OpenAIBackend) -> Any:
        clock = backend._clock
        assert backend.circuit.record_unavailable(clock.now())  # circuit_failures 1: open at t=100

        async def close_later() -> None:
            await asyncio.sleep(2.5)
            backend.circuit.close()

        async with asyncio.TaskGroup() as tg:
            tg.create_task(close_later())
            response = await backend.complete(REQUEST)
        return response

    response, _, capture, _ = on_virtual_clock(replies(completion(FINAL)), body, circuit_failures=1)
    assert response.action.type == "final"
    assert [(e.attempt, e.waited_s) for e in capture.of(ModelPaused)] == [(1, 2.5)]


def test_run_json_records_the_settings_declared_probed_and_sent() -> None:
    backend = OpenAIBackend(
        settings(replay=True, server_kind="sglang", retry=RETRY, circuit_failures=3, api_key_env="KEY"),
        VirtualClock(),
    )
    described = backend.describe()
    assert described == described | {
        "mode": "replay",
        "structured_output": False,  # a replay sends no response_format: it said True
        "server_kind": "sglang",
        "server_kind_source": "declared",
        "replay_fixed_length": "min_tokens + ignore_eos",
        "pool_connections": 1,
        "max_retries": 2,
        "circuit_failures": 3,
        "api_key": "from the environment variable KEY",
    }
    agent = OpenAIBackend(settings(), VirtualClock()).describe()
    assert (agent["mode"], agent["server_kind_source"], agent["replay_fixed_length"]) == (
        "agent",
        "unknown",
        None,
    )
    assert agent["api_key"] is None and agent["structured_output"] is True
    assert json.dumps(described)  # run.json


def test_run_json_records_the_environments_proxy_the_requests_went_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A proxied run's latencies include the proxy's, and nothing in run.json said one was used."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        for variable in (name, name.upper()):
            monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://me:secret@proxy.example:3128")

    def proxy(endpoint: str) -> Any:
        return OpenAIBackend(settings(endpoint=endpoint), VirtualClock()).describe()["proxy"]

    assert proxy("https://gpu.example:8000") == "http://me:***@proxy.example:3128, from HTTPS_PROXY"
    assert proxy("http://gpu.example:8000") is None  # no http_proxy set
    assert proxy("https://127.0.0.1:8000") is None  # this machine: never through a proxy
    monkeypatch.setenv("no_proxy", "gpu.example")
    assert proxy("https://gpu.example:8000") is None


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        # no scheme (httpx takes it as http://): urlsplit read 'me' as the scheme, no password
        ("me:secret@proxy.example:3128", "me:***@proxy.example:3128"),
        # a '#', '/' or '?' left unescaped in the password: urlsplit's host ended there, with no '@'
        ("http://me:se#cret@proxy.example:3128", "http://me:***@proxy.example:3128"),
        ("http://me:se/cret@proxy.example:3128", "http://me:***@proxy.example:3128"),
        ("http://me:se?cret@proxy.example:3128", "http://me:***@proxy.example:3128"),
        # a URL urlsplit cannot read at all (an unclosed '['): it was shown as given
        ("http://me:secret@[::1", "http://me:***@[::1"),
        ("http://me:secret@proxy.example:3128", "http://me:***@proxy.example:3128"),
        ("http://proxy.example:3128", "http://proxy.example:3128"),
        # a token given as the user name alone (http://TOKEN@proxy, as many proxies and gateways take it)
        ("http://tok3n-secret@proxy.example:3128", "http://***@proxy.example:3128"),
        ("tok3n-secret@proxy.example:3128", "***@proxy.example:3128"),
    ],
)
def test_run_json_never_records_a_proxys_password_however_it_is_written(
    value: str, shown: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run.json's backend.proxy (and every message naming the proxy) kept the password of a proxy
    variable without a scheme, or one whose password held an unescaped '#', '/' or '?'."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        for variable in (name, name.upper()):
            monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", value)
    described = OpenAIBackend(settings(endpoint="https://gpu.example:8000"), VirtualClock()).describe()
    assert described["proxy"] == f"{shown}, from HTTPS_PROXY"
    assert "secret" not in json.dumps(described)


def never_answers(health_status: int, probes: list[str]) -> Handler:
    """A server whose chat requests time out; its health probe answers ``health_status``."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            raise httpx.ReadTimeout("", request=request)
        probes.append(request.url.path)
        return httpx.Response(health_status, json={})

    return handler


@pytest.mark.parametrize(("health_status", "frozen"), [(503, True), (200, False)])
def test_a_timed_out_request_counts_towards_the_circuit_only_when_the_health_probe_fails(
    health_status: int, frozen: bool
) -> None:
    probes: list[str] = []
    err, backend, capture, _ = on_virtual_clock(
        never_answers(health_status, probes), failing_turn, circuit_failures=1
    )
    assert err.kind == "timeout" and probes == ["/health"]
    assert backend.circuit.snapshot().opened == int(frozen)
    reasons = [e.reason for e in capture.of(ServerUnavailable)]
    assert reasons == ([f"timeout: {err}; then GET /health: HTTP 503"] if frozen else [])


def test_no_health_probe_follows_a_timeout_when_the_circuit_is_off() -> None:
    probes: list[str] = []
    with pytest.raises(ModelError):
        complete(never_answers(503, probes), circuit_failures=0)
    assert probes == []


async def failing_turn(backend: OpenAIBackend) -> ModelError:
    with pytest.raises(ModelError) as caught:
        await backend.complete(REQUEST)
    return caught.value


def test_the_connection_pool_asks_the_import_system_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """httpcore's pool asks ``import sniffio`` which async library runs it, several times per request, on
    the event loop. Without sniffio installed (newer anyio, 4.16 here, no longer pulls it in) each ask is
    a failed import that stats every folder of sys.path: ~11 per request, 69 µs each on a 5-entry path (a
    loopback run at --max-inflight-model-requests 48: 130,000 stat calls on the loop in 2,300 requests).
    sniffio is a dependency, so the ask is a dictionary lookup."""
    import importlib.machinery

    from httpcore._synchronization import current_async_library

    lookups: list[str] = []
    find_spec = importlib.machinery.PathFinder.find_spec

    def counted(name: str, *args: Any, **kwargs: Any) -> Any:
        lookups.append(name)
        return find_spec(name, *args, **kwargs)

    async def ask() -> str:
        monkeypatch.setattr(importlib.machinery.PathFinder, "find_spec", counted)
        try:
            return current_async_library()
        finally:
            monkeypatch.undo()

    assert asyncio.run(ask()) == "asyncio"
    assert lookups == []


@pytest.mark.timeout(60)
def test_requests_are_spread_over_a_few_connection_pools_of_the_one_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """httpcore's pool walks every connection (and, per idle one, all of them again) at each request's
    start and end, on the event loop: one pool for 64 requests in flight spent 58% of the loop there.
    The one client's requests are spread over ceil(inflight / 8) pools (real ones, to a loopback server:
    one at a time, each goes to the next of the idle pools); all of them are closed with the backend."""
    from asyncroll.backends.transport import PoolsTransport
    from asyncroll.clock import SystemClock
    from tests.http_backend import serve

    handled: list[int] = []
    closed: list[int] = []

    async def six_turns(url: str) -> OpenAIBackend:
        backend = OpenAIBackend(HttpSettings(endpoint=url, model="sim", inflight=20), SystemClock())
        transport = backend._http()._transport
        assert isinstance(transport, PoolsTransport) and len(transport.pools) == 3
        assert backend.describe()["connection_pools"] == 3  # run.json says how many
        for i, pool in enumerate(transport.pools):
            handle, close = pool.handle_async_request, pool.aclose

            async def counted(request: httpx.Request, i: int = i, handle: Any = handle) -> httpx.Response:
                handled.append(i)
                return await handle(request)

            async def noted(i: int = i, close: Any = close) -> None:
                closed.append(i)
                await close()

            monkeypatch.setattr(pool, "handle_async_request", counted)
            monkeypatch.setattr(pool, "aclose", noted)
        try:
            for _ in range(6):
                await backend.complete(REQUEST)
            assert transport.in_flight == [0, 0, 0]  # each request ended with its response
        finally:
            await backend.aclose()
        return backend

    with serve() as running:
        asyncio.run(six_turns(running.url))
    assert sorted(handled) == [0, 0, 1, 1, 2, 2] and sorted(closed) == [0, 1, 2]


@pytest.mark.timeout(60)
def test_the_pools_share_one_tls_context_with_the_clients_ca_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Each pool made its own TLS context, reading the whole CA bundle again: 38 of them at 300 in flight
    took 1.6 s on the event loop at the start and 28 MB (125 at 1,000: 5.7 s), for a plain http:// server
    too. The pools share one context, made with the client's CA settings (SSL_CERT_FILE for a server on
    another host, as httpx reads it)."""
    import ssl

    from asyncroll.backends.transport import PoolsTransport
    from asyncroll.clock import SystemClock

    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "SSL_CERT_DIR"):
        for variable in (name, name.upper()):
            monkeypatch.delenv(variable, raising=False)
    loaded: list[Any] = []
    load = ssl.SSLContext.load_verify_locations

    def counted(self: ssl.SSLContext, *args: Any, **kwargs: Any) -> None:
        loaded.append(kwargs.get("cafile", args[0] if args else None))
        load(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted)
    monkeypatch.setenv("SSL_CERT_FILE", str(TLS_FIXTURES / "self_signed.pem"))
    for endpoint in ("http://127.0.0.1:8000", "https://127.0.0.1:8000", "https://gpu.example:8000"):
        loaded.clear()
        settings = HttpSettings(endpoint=endpoint, model="m", inflight=300)
        transport = OpenAIBackend(settings, SystemClock())._http()._transport
        assert isinstance(transport, PoolsTransport) and len(transport.pools) == 38
        contexts = {id(pool._pool._ssl_context) for pool in transport.pools}  # type: ignore[attr-defined]
        assert len(contexts) == 1 and len(loaded) <= 1, (endpoint, len(contexts), len(loaded))
        if endpoint.startswith("https"):  # the environment's CA file, for this machine's server too
            assert loaded == [str(TLS_FIXTURES / "self_signed.pem")], (endpoint, loaded)


def test_a_remote_server_behind_the_environments_proxy_keeps_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client given a transport of its own takes none of the environment's proxies: the connection
    pools are for servers the environment sends no proxy to (this machine's, or with none set)."""
    from asyncroll.backends.transport import PoolsTransport
    from asyncroll.clock import SystemClock

    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        for variable in (name, name.upper()):
            monkeypatch.delenv(variable, raising=False)

    def transport_of(endpoint: str) -> Any:
        settings = HttpSettings(endpoint=endpoint, model="m", inflight=64)
        return OpenAIBackend(settings, SystemClock())._http()._transport

    assert len(transport_of("http://gpu.example:8000").pools) == 8
    monkeypatch.setenv("http_proxy", "http://proxy.example:3128")
    assert isinstance(transport_of("http://127.0.0.1:8000"), PoolsTransport)  # never proxied
    proxied = OpenAIBackend(
        HttpSettings(endpoint="http://gpu.example:8000", model="m", inflight=64), SystemClock()
    )
    assert proxied.describe()["connection_pools"] is None  # no client made yet
    client = proxied._http()
    assert not isinstance(client._transport, PoolsTransport)
    assert client._transport_for_url(httpx.URL("http://gpu.example:8000/v1/chat/completions")) is not (
        client._transport
    )  # the proxy's
    assert proxied.describe()["connection_pools"] == 1  # run.json: httpx's own pool


@pytest.mark.parametrize(
    ("no_proxy", "pooled"),
    [
        *[("gpu.example", True), (".example", True), ("*", True), ("10.1.2.3", True)],
        *[("other.example", False), ("10.0.0.0/8", False)],  # httpx reads no CIDR range: it proxies 10.1.2.3
    ],
)
def test_a_remote_server_no_proxy_names_gets_the_connection_pools(
    monkeypatch: pytest.MonkeyPatch, no_proxy: str, pooled: bool
) -> None:
    """A cluster's proxy variables (set for pip) with its GPU nodes in ``no_proxy``: httpx reaches the
    node directly, so the client keeps the connection pools (it had httpx's one pool whenever a proxy
    variable was set); a host ``no_proxy`` does not name, as httpx reads it, still goes through the proxy."""
    from asyncroll.backends.transport import PoolsTransport
    from asyncroll.clock import SystemClock

    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        for variable in (name, name.upper()):
            monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("http_proxy", "http://proxy.example:3128")
    monkeypatch.setenv("no_proxy", no_proxy)
    host = "10.1.2.3" if no_proxy[0].isdigit() else "gpu.example"
    client = OpenAIBackend(
        HttpSettings(endpoint=f"http://{host}:8000", model="m", inflight=64), SystemClock()
    )._http()
    assert isinstance(client._transport, PoolsTransport) is pooled


@pytest.mark.parametrize(
    ("no_proxy", "host", "proxied"),
    [
        (".gpu.example", "gpu.example", True),  # httpx: '*.gpu.example', names under it only; urllib: it too
        ("other.example,*", "gpu.example", False),  # httpx: a '*' anywhere in the list; urllib: '*' alone
        ("gpu.example", "gpu.example", False),
        ("other.example", "gpu.example", True),
    ],
)
def test_run_json_names_the_proxy_httpx_sends_through(
    monkeypatch: pytest.MonkeyPatch, no_proxy: str, host: str, proxied: bool
) -> None:
    """run.json's ``proxy`` (and the hint of a request that got no reply) read ``no_proxy`` as urllib
    does, the requests went as httpx reads it: with ``no_proxy=.gpu.example`` the requests to gpu.example
    went through the proxy while run.json said none, and with ``no_proxy=other.example,*`` they went
    directly while it named the proxy. Both now say what httpx does, as the choice of pools does."""
    from asyncroll.backends.transport import PoolsTransport
    from asyncroll.clock import SystemClock

    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        for variable in (name, name.upper()):
            monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("http_proxy", "http://proxy.example:3128")
    monkeypatch.setenv("no_proxy", no_proxy)
    url = f"http://{host}:8000"
    backend = OpenAIBackend(HttpSettings(endpoint=url, model="m", inflight=9), SystemClock())
    client = backend._http()
    direct = isinstance(client._transport, PoolsTransport)
    with httpx.Client() as plain:  # how httpx itself routes it
        assert (plain._transport_for_url(httpx.URL(f"{url}/v1")) is not plain._transport) is proxied
    assert direct is not proxied
    said = backend.describe()["proxy"]
    assert said == ("http://proxy.example:3128, from http_proxy" if proxied else None), said
