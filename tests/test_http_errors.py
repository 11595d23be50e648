"""A failed model request over HTTP: each error class recorded against its own trajectory, described,
and retried (or not) as its class says."""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import ssl
import sys
from pathlib import Path
from typing import Any

import pytest

from asyncroll.backends.http_errors import describe_transport_error
from asyncroll.backends.openai import HttpSettings, OpenAIBackend
from asyncroll.backends.retry import RetryPolicy, retry_after_s
from asyncroll.clock import SystemClock
from asyncroll.config import build_config
from asyncroll.errors import ModelError, UsageError
from asyncroll.events import ModelFailed, ModelFinished, ModelRetrying, TrajectoryFinished
from asyncroll.http_proxy import environment_proxy
from asyncroll.serve_sim.config import FaultConfig
from tests.hostile_http import HostileServer, json_reply, raw_reply
from tests.http_backend import FINAL, FakeOpenAI, completion, final_problems, http_run, serve, start_and_close

ERROR_CASES: dict[str, tuple[dict[str, Any], dict[str, Any], str, int | None, bool, bool]] = {
    "reset": ({"faults": FaultConfig(reset_rate=0.5)}, {}, "transport", None, False, False),
    "truncated": ({"faults": FaultConfig(truncate_rate=0.5)}, {}, "transport", None, False, False),
    "timeout": (
        {"faults": FaultConfig(slow_rate=0.5, slow_s=1.0)},
        {"request_timeout": 0.3},
        "timeout",
        None,
        False,
        False,
    ),
    "429": ({"faults": FaultConfig(rate_429=0.5)}, {}, "http_status", 429, True, False),
    "500": ({"faults": FaultConfig(rate_500=0.5)}, {}, "http_status", 500, True, False),
    "503": ({"faults": FaultConfig(rate_503=0.5)}, {}, "http_status", 503, True, False),
    "malformed": ({"faults": FaultConfig(malformed_rate=0.5)}, {}, "bad_response", 200, True, True),
    "invalid_action": (
        {"enforce_schema": False, "faults": FaultConfig(invalid_action_rate=0.5)},
        {},
        "invalid_action",
        200,
        True,
        True,
    ),
    "schema_rejected": ({"faults": FaultConfig(reject_schema=True)}, {}, "schema_rejected", 400, True, False),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_each_error_class_is_recorded_and_isolated(tmp_path: Path, case: str) -> None:
    sim_settings, run_settings, kind, status, received, parsed = ERROR_CASES[case]
    with serve(seed=2, **sim_settings) as running:
        outcome, capture, _ = http_run(
            tmp_path, final_problems(8), running.url, max_active_trajectories=1, **run_settings
        )
    assert outcome.status == "complete"  # a model failure ends its trajectory, never the run
    failed = capture.of(ModelFailed)
    finished = {e.id: e for e in capture.of(TrajectoryFinished)}
    assert len(finished) == 8
    assert failed, "the seeded faults should have hit at least one request"
    for event in failed:
        assert (event.kind, event.status, event.response_received, event.attempts) == (
            kind,
            status,
            received,
            1,
        )
        assert (event.parse_s is not None) == parsed
        assert event.latency_s > 0
        assert not event.error.rstrip().endswith(":"), event.error  # never "ReadError: " and nothing else
        assert finished[event.id].status == "failed"
        assert finished[event.id].error.startswith(f"model {kind}: ")
    failed_ids = {e.id for e in failed}
    assert len(failed_ids) == len(failed)  # one failure per failed trajectory, no retries by default
    others = [e for i, e in finished.items() if i not in failed_ids]
    assert all(e.status == "completed" for e in others)
    if case != "schema_rejected":
        assert others, "the other trajectories completed"
    if case == "timeout":
        assert all(0.3 <= e.latency_s < 0.9 for e in failed)
    # validity: a 200 that is not a valid action (garbled body or invalid action) is a response received
    assert outcome.summary is not None
    valid = len(capture.of(ModelFinished))
    responses = valid + (len(failed) if parsed else 0)
    assert outcome.summary["rates"]["validity_denominator"] == responses
    assert outcome.summary["rates"]["validity_rate"] == (round(valid / responses, 6) if responses else None)


def test_transport_errors_without_text_still_say_what_happened() -> None:
    import httpx

    assert describe_transport_error(httpx.ReadError("")) == (
        "ReadError: the connection was closed or reset while reading the response"
    )
    assert describe_transport_error(httpx.ReadTimeout("")) == "ReadTimeout: no response within the timeout"
    assert describe_transport_error(httpx.ConnectError("[Errno 111] refused")) == (
        "ConnectError: [Errno 111] refused"
    )
    try:
        try:
            raise OSError("socket closed")
        except OSError as inner:
            raise httpx.ReadError("") from inner
    except httpx.ReadError as exc:
        assert describe_transport_error(exc) == "ReadError: socket closed"  # the cause's text first
    # a plain-HTTP reply read as a TLS record: OpenSSL 3.0's words (tested for real below) and 3.5's
    for words in ("[SSL: WRONG_VERSION_NUMBER] wrong version number", "[SSL] packet length too long"):
        try:
            try:
                raise ssl.SSLError(1, words)
            except ssl.SSLError as inner:
                raise httpx.ConnectError(str(inner)) from inner
        except httpx.ConnectError as exc:
            assert describe_transport_error(exc).endswith(
                "(no TLS at the other end: is it a plain http:// server?)"
            )

    def hang(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("", request=request)

    with pytest.raises(ExceptionGroup) as raised:
        asyncio.run(start_and_close(hang))
    assert raised.group_contains(ModelError, match=r"\(ReadTimeout: no response within the timeout\)")


@pytest.mark.timeout(60)
def test_a_slow_reply_times_out_inside_httpx_and_never_locks_the_pool(tmp_path: Path) -> None:
    """A request that times out must end inside httpx (its own read timeout, which closes the
    connection): a cancellation delivered inside httpcore's pool can leave a connection counted for ever
    (encode/httpcore#1093), and a pool limited to the inflight limit then locked up — every later
    request timed out against a healthy server. The pool has no limit of its own (the model gate is the
    limit); the whole-request deadline, a little later, only ends a server that trickles bytes."""
    from asyncroll.http_read import request_deadline_s

    assert request_deadline_s(0.3) == 1.3 and request_deadline_s(120) == 132
    # a 2 s timeout, not 0.3 s: every other reply comes from a thread of this process, which a loaded
    # machine can hold off its CPU for 0.3 s (a second timeout, and two ModelFailed)
    with FakeOpenAI([completion(FINAL)], delays=[6.0]) as server:
        outcome, capture, _ = http_run(
            tmp_path, final_problems(3), server.url, max_active_trajectories=1, request_timeout=2.0
        )
    assert outcome.status == "complete", outcome.error
    (failed,) = capture.of(ModelFailed)
    assert failed.kind == "timeout" and "(ReadTimeout)" in failed.error
    assert outcome.summary is not None and outcome.summary["counts"]["completed"] == 2
    backend = OpenAIBackend(HttpSettings(endpoint=server.url, model="m", inflight=4), SystemClock())
    (transport,) = backend._http()._transport.pools  # type: ignore[attr-defined]  # 4 in flight: one pool
    pool = transport._pool
    assert (pool._max_connections, pool._max_keepalive_connections) == (sys.maxsize, 4)  # no limit


@pytest.mark.timeout(60)
def test_an_endpoint_with_v1_is_refused_and_a_404_names_its_url(tmp_path: Path) -> None:
    values = {"workload": "w.jsonl", "output": "o", "backend": "openai", "model": "sim"}
    with pytest.raises(UsageError, match="without /v1"):
        build_config(values | {"endpoint": "http://127.0.0.1:8000/v1/"})
    with serve() as running:
        _, capture, _ = http_run(tmp_path, final_problems(1), running.url + "/api")
    (failed,) = capture.of(ModelFailed)
    assert failed.status == 404 and f"(POST {running.url}/api/v1/chat/completions)" in failed.error


@pytest.mark.timeout(60)
def test_retries_are_counted_and_honour_retry_after(tmp_path: Path) -> None:
    faults = FaultConfig(rate_429=0.3, rate_503=0.3, retry_after_s=0.05)
    with serve(seed=4, faults=faults) as running:
        outcome, capture, _ = http_run(
            tmp_path,
            final_problems(6),
            running.url,
            max_retries=8,
            retry_max_delay=0.2,
            max_active_trajectories=1,  # one request at a time: the seeded fault sequence is exact
        )
        injected = running.stats()["faults"]
    assert outcome.status == "complete"
    retries = capture.of(ModelRetrying)
    assert not capture.of(ModelFailed)
    assert [e.status for e in capture.of(TrajectoryFinished)] == ["completed"] * 6
    assert len(retries) == injected.get("http_429", 0) + injected.get("http_503", 0) > 0
    assert outcome.summary is not None
    assert outcome.summary["model"]["retries"] == {"http_status": len(retries)}
    for event in retries:
        assert event.kind == "http_status" and event.status in (429, 503)
        if event.status == 429:
            assert event.delay_s == 0.05  # the server's retry-after-ms, honoured exactly
        else:
            assert 0.75 * min(0.5 * 2 ** (event.attempt - 1), 0.2) <= event.delay_s <= 0.2


@pytest.mark.timeout(60)
def test_exhausted_retries_fail_with_the_attempt_count(tmp_path: Path) -> None:
    with serve(faults=FaultConfig(rate_500=1.0)) as running:
        outcome, capture, _ = http_run(
            tmp_path, final_problems(2), running.url, max_retries=2, retry_max_delay=0.02
        )
    assert outcome.status == "complete"
    assert [(e.kind, e.status, e.attempts) for e in capture.of(ModelFailed)] == [("http_status", 500, 3)] * 2
    assert sorted(e.attempt for e in capture.of(ModelRetrying)) == [1, 1, 2, 2]


def test_retry_policy_units() -> None:
    import random

    policy = RetryPolicy(max_retries=3, base_delay=0.5, max_delay=8.0)
    rng = random.Random(0)
    assert 0.375 <= policy.delay(1, rng) <= 0.5 and 3.0 <= policy.delay(4, rng) <= 4.0
    assert policy.delay(10, rng) <= 8.0
    assert policy.delay(1, rng, {"retry-after-ms": "1500"}) == 1.5
    assert policy.delay(1, rng, {"retry-after": "60"}) == 8.0  # capped
    assert retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, now_epoch=1445412470) == 10.0
    assert retry_after_s({"retry-after": "soon"}) is None


@pytest.mark.timeout(60)
def test_an_error_status_with_an_unreadable_body_is_still_that_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 503 whose body fails its content-encoding, or is longer than the cap, is an HTTP 503: retried
    with ``--max-retries`` like any 503 (it was a ``bad_response`` with no status, never retried, and
    counted as a received invalid reply in the validity rate); a 200 with an oversized body stays
    ``bad_response``, now with its status."""
    import asyncroll.backends.exchange as exchange

    monkeypatch.setattr(exchange, "MAX_RESPONSE_BYTES", 1 << 10)
    replies = [
        raw_reply(503, {"content-encoding": "gzip", "retry-after": "0"}, b"not gzip at all"),
        raw_reply(503, {"content-type": "text/html", "retry-after": "0"}, b"x" * 4096),
        json_reply(completion(FINAL)),
        raw_reply(200, {"content-type": "application/json"}, b" " * 4096),
    ]
    with HostileServer(replies) as server:
        outcome, capture, _ = http_run(
            tmp_path, final_problems(2), server.url, max_active_trajectories=1, max_retries=2
        )
    assert outcome.status == "complete", outcome.error
    retried = capture.of(ModelRetrying)
    assert [(e.kind, e.status) for e in retried] == [("http_status", 503), ("http_status", 503)]
    assert "DecodingError" in retried[0].error and "longer than 1,024 bytes" in retried[1].error
    (failed,) = capture.of(ModelFailed)
    assert (failed.kind, failed.status, failed.response_received) == ("bad_response", 200, True)
    assert outcome.summary is not None
    assert outcome.summary["model"]["retries"] == {"http_status": 2}
    assert outcome.summary["rates"]["validity_denominator"] == 2  # one finished, one 200 unreadable


@pytest.mark.timeout(30)
def test_a_request_cancelled_during_a_retry_counts_its_attempts() -> None:
    """Two 429s retried, the third attempt in flight when the run stops: its ``model_failed`` (kind
    ``cancelled``) said ``attempts: 1`` whatever the retries before it (two ``model_retrying`` events)."""
    import httpx

    from asyncroll.backends.base import ModelRequest
    from asyncroll.event_log import EventCapture, EventLog
    from asyncroll.runtime.model_gate import ModelGate
    from asyncroll.workload import Problem

    calls: list[int] = []
    third = asyncio.Event()

    async def answer(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) < 3:
            return httpx.Response(429, headers={"retry-after": "0"}, text="busy")
        third.set()
        await asyncio.Event().wait()  # never answers
        raise AssertionError("unreachable")

    async def scenario() -> EventCapture:
        clock, capture = SystemClock(), EventCapture()
        events = EventLog(clock)
        events.subscribe(capture)
        events.start_measurement()
        settings = HttpSettings(endpoint="http://server", model="m", inflight=1, retry=RetryPolicy(5))
        backend = OpenAIBackend(settings, clock, transport=httpx.MockTransport(answer))
        backend.bind_events(events)
        gate = ModelGate(1, clock, events)
        problem = Problem.model_validate({"id": "p", "prompt": "Answer."})
        request = ModelRequest("p", problem, 0, [{"role": "user", "content": "Answer."}])
        call = asyncio.create_task(gate.call("p", 0, lambda: backend.complete(request)))
        await third.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await backend.aclose()
        return capture

    capture = asyncio.run(scenario())
    assert [e.attempt for e in capture.of(ModelRetrying)] == [1, 2]
    (failed,) = capture.of(ModelFailed)
    assert failed.kind == "cancelled" and failed.attempts == 3


TLS = Path(__file__).parent / "fixtures" / "tls"  # a self-signed certificate for localhost and 127.0.0.1


async def start_and_warm(url: str) -> int:
    """One warm-up request to a declared vLLM server at ``url`` (its kind not probed)."""
    backend = OpenAIBackend(
        HttpSettings(endpoint=url, model="m", inflight=1, server_kind="vllm", request_timeout=5),
        SystemClock(),
    )
    try:
        return await backend.warmup(1)
    finally:
        await backend.aclose()


def _httpx_at_least(major: int, minor: int) -> bool:
    import httpx

    return tuple(int(part) for part in httpx.__version__.split(".")[:2]) >= (major, minor)


def warmup_error(url: str) -> str:
    with pytest.raises(ModelError) as raised:
        asyncio.run(start_and_warm(url))
    return str(raised.value)


@pytest.mark.timeout(60)
def test_a_certificate_not_trusted_says_to_name_its_ca(monkeypatch: pytest.MonkeyPatch) -> None:
    """An https server with a self-signed certificate (a cluster's own CA) failed with OpenSSL's words
    alone ('certificate verify failed: self-signed certificate'), nothing on what to do; the environment's
    SSL_CERT_FILE is the way, and it works."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(TLS / "self_signed.pem", TLS / "self_signed.key")
    with FakeOpenAI([completion(FINAL)]) as server:
        server._server.socket = context.wrap_socket(server._server.socket, server_side=True)
        url = server.url.replace("http://", "https://")
        message = warmup_error(url)
        assert "certificate verify failed" in message, message
        assert "name the CA certificate that signed it with SSL_CERT_FILE=PATH" in message, message
        monkeypatch.setenv("SSL_CERT_FILE", str(TLS / "self_signed.pem"))
        assert asyncio.run(start_and_warm(url)) == 1  # the hint's way works
    with FakeOpenAI([completion(FINAL)]) as server:  # https:// to a plain HTTP server
        message = warmup_error(server.url.replace("http://", "https://"))
        assert "no TLS at the other end: is it a plain http:// server?" in message, message


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.timeout(60)
def test_a_warmup_that_reaches_no_server_names_the_url_and_the_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """'warm-up request 1/2 failed: ConnectError: All connection attempts failed' named no URL (a wrong
    port, or [::1] where the server listens on 127.0.0.1), nor the environment's proxy that was the one
    not answering (the server may be up): both are said, the proxy's password masked."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        for variable in (name, name.upper()):
            monkeypatch.delenv(variable, raising=False)
    port = closed_port()
    message = warmup_error(f"http://127.0.0.1:{port}")
    assert message.startswith("warm-up request 1/1 failed: ConnectError:"), message
    assert message.endswith(
        f"(POST http://127.0.0.1:{port}/v1/chat/completions); check that the server runs at --endpoint"
    ), message
    with FakeOpenAI([completion(FINAL)], delays=[3.0]) as slow:  # connected, answered too late
        message = asyncio.run(warm_slowly(slow.url))
    assert message == (
        "warm-up request 1/1 failed: no response within 0.5s (ReadTimeout) "
        f"(POST {slow.url}/v1/chat/completions)"
    ), message
    monkeypatch.setenv("HTTP_PROXY", f"http://me:secret@127.0.0.1:{port}")
    message = warmup_error("http://192.0.2.1:8000")  # another host: through the proxy, which is not there
    assert (
        f"(POST http://192.0.2.1:8000/v1/chat/completions through the environment's proxy "
        f"http://me:***@127.0.0.1:{port}, from HTTP_PROXY); check that the server runs at --endpoint, "
        "and that the proxy runs and reaches it (or go around it: no_proxy=192.0.2.1)" in message
    ), message
    assert "secret" not in message
    with pytest.raises(ExceptionGroup) as raised:  # the probe of --backend openai says it too
        asyncio.run(start_and_close_at("http://192.0.2.1:8000"))
    assert raised.group_contains(
        ModelError, match=r"\(ConnectError: .*, through the environment's proxy http://me:\*\*\*@127"
    )
    monkeypatch.setenv("NO_PROXY", "192.0.2.1")
    assert environment_proxy("http://192.0.2.1:8000") is None
    assert environment_proxy(f"http://127.0.0.1:{port}") is None  # this machine: never through a proxy


async def start_and_close_at(url: str) -> None:
    settings = HttpSettings(endpoint=url, model="m", inflight=1, request_timeout=5)
    backend = OpenAIBackend(settings, SystemClock())
    async with asyncio.TaskGroup() as tg:
        try:
            await backend.start(tg)  # probes the server's kind
        finally:
            await backend.aclose()


@pytest.mark.timeout(60)
def test_a_socks_proxy_without_socksio_is_named_with_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """all_proxy=socks5://… (set on many clusters) for a server on another host failed the run with
    'ImportError: Using SOCKS proxy, but the 'socksio' package is not installed', naming neither the
    variable nor the way around it."""
    pytest.importorskip("httpx")
    if importlib.util.find_spec("socksio") is not None:
        pytest.skip("socksio is installed: httpx can use the SOCKS proxy")
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        for variable in (name, name.upper()):
            monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("ALL_PROXY", "socks5://me:secret@127.0.0.1:1")
    said = (
        "the environment's proxy socks5://me:***@127.0.0.1:1, from ALL_PROXY, is a SOCKS proxy, which "
        "needs the socksio package (pip install 'httpx[socks]'), or unset it for this command (env -u "
        "ALL_PROXY asyncroll ...; no_proxy cannot go around it: httpx opens every proxy named)"
    )
    message = warmup_error("http://192.0.2.1:8000")
    assert message == said, message
    monkeypatch.setenv("no_proxy", "192.0.2.1")  # the advice was no_proxy=192.0.2.1: it is no way around
    assert warmup_error("http://192.0.2.1:8000") == said
    monkeypatch.delenv("no_proxy")
    monkeypatch.delenv("ALL_PROXY")
    monkeypatch.setenv("https_proxy", "socks5h://127.0.0.1:1")  # httpx opens it for an http:// server too
    socks5h = "is a SOCKS proxy" if _httpx_at_least(0, 28) else "is no http://, https:// or socks5:// URL"
    assert warmup_error("http://192.0.2.1:8000").startswith(  # httpx 0.27 (the floor) knows no socks5h
        f"the environment's proxy socks5h://127.0.0.1:1, from https_proxy, {socks5h}"
    )
    monkeypatch.setenv("https_proxy", "ftp://127.0.0.1:1")  # httpx refused it: 'ValueError: Unknown scheme'
    assert warmup_error("http://192.0.2.1:8000") == (
        "the environment's proxy ftp://127.0.0.1:1, from https_proxy, is no http://, https:// or socks5:// "
        "URL: fix it, or unset it for this command (env -u https_proxy asyncroll ...; no_proxy cannot go "
        "around it: httpx opens every proxy named)"
    )
    # a '#' left unescaped in the password: httpx's 'InvalidURL: Invalid port: 'se'' (the password's
    # start) was the run's error, in run.json, naming neither the proxy nor its variable
    monkeypatch.setenv("https_proxy", "http://me:se#cret@127.0.0.1:1")
    message = warmup_error("http://192.0.2.1:8000")
    assert message == (
        "the environment's proxy http://me:***@127.0.0.1:1, from https_proxy, is no URL httpx can read "
        "(a '#', '/', '?' or '@' in its user name or password must be %-escaped: %23, %2F, %3F, %40): fix "
        "it, or unset it for this command (env -u https_proxy asyncroll ...; no_proxy cannot go around it: "
        "httpx opens every proxy named)"
    ), message


async def warm_slowly(url: str) -> str:
    """The error of one warm-up request with a 0.5 s request timeout."""
    settings = HttpSettings(endpoint=url, model="m", inflight=1, server_kind="vllm", request_timeout=0.5)
    backend = OpenAIBackend(settings, SystemClock())
    try:
        with pytest.raises(ModelError) as raised:
            await backend.warmup(1)
    finally:
        await backend.aclose()
    return str(raised.value)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("url", ["https://127.0.0.1:9", "http://192.0.2.1:8000"])
def test_an_ssl_cert_file_that_cannot_be_read_is_named(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """SSL_CERT_FILE naming no file (a path from another machine) failed the run with 'FileNotFoundError:
    [Errno 2] No such file or directory', naming neither the variable nor the file (httpx reads it for any
    server but one on this machine over http://, whose client takes no environment settings)."""
    monkeypatch.setenv("SSL_CERT_FILE", "/nonexistent/ca.pem")
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    message = warmup_error(url)
    if _httpx_at_least(0, 28):
        assert message.startswith(
            "the environment's SSL_CERT_FILE=/nonexistent/ca.pem cannot be read as CA certificates (No such "
            "file"
        ), message
    else:  # httpx 0.27 (the floor) passes over an SSL_CERT_FILE that is no file: nothing failed on it
        assert "SSL_CERT_FILE" not in message and "ConnectError" in message, message
    monkeypatch.setenv("SSL_CERT_FILE", __file__)  # a file, of no certificate
    assert "the environment's SSL_CERT_FILE=" in warmup_error(url)


_NO_FILES_LEFT = """
import asyncio, os, socket
import httpx
from asyncroll.backends.http_errors import describe_transport_error

async def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/"
    async with httpx.AsyncClient() as client:
        try:  # a refused connection first: every module a failed connect needs is imported
            await client.get(url)
        except httpx.ConnectError:
            pass
        held = []
        try:
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        try:
            await client.get(url)
        except httpx.ConnectError as exc:
            message = describe_transport_error(exc)
        for fd in held:
            os.close(fd)
        print(message)

asyncio.run(main())
"""


@pytest.mark.timeout(60)
def test_a_connection_this_process_has_no_descriptor_for_says_so_with_the_limit() -> None:
    """A run at ``ulimit -n`` with many requests in flight: the socket cannot be made (EMFILE), and httpx
    says 'ConnectError: All connection attempts failed', as for a server that is down; the run's events
    and the warm-up's error sent the user to the server. The limit of this process is named."""
    from tests.children import python_with_open_files

    done = python_with_open_files(_NO_FILES_LEFT, 64)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "ConnectError: All connection attempts failed: [Errno 24] Too many open files "
        "(this process may hold 64 open files: ulimit -n)"
    ), done.stdout
