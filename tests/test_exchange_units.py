"""One chat exchange on its own (``httpx.MockTransport``, no server): each failure's kind, status, message
and whether a response came; the body cap and the whole-request deadline of :mod:`asyncroll.http_read`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from asyncroll.backends.exchange import AttemptFailed, is_success, post_chat
from asyncroll.http_read import ResponseTooLarge, body_text, read_bounded, request_deadline_s
from tests.hostile_http import HostileServer

Handler = Callable[[httpx.Request], httpx.Response]
SCHEMA_BODY: dict[str, Any] = {"model": "m", "messages": [], "response_format": {"type": "json_schema"}}


def exchange(handler: Handler, body: dict[str, Any] | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    """``post_chat`` against ``handler``; raises what it raises."""

    async def go() -> tuple[int, bytes]:
        async with httpx.AsyncClient(
            base_url="http://server", transport=httpx.MockTransport(handler)
        ) as client:
            return await post_chat(client, body or {"model": "m", "messages": []}, {}, timeout)

    return asyncio.run(go())


def failure(handler: Handler, body: dict[str, Any] | None = None, timeout: float = 5.0) -> AttemptFailed:
    with pytest.raises(AttemptFailed) as caught:
        exchange(handler, body, timeout)
    return caught.value


def answer(status: int, content: bytes = b"", **headers: str) -> Handler:
    return lambda request: httpx.Response(status, content=content, headers=headers)


@pytest.mark.parametrize("status", [200, 201, 203, 299])
def test_any_2xx_is_a_success_with_its_body(status: int) -> None:
    assert exchange(answer(status, b'{"choices": []}')) == (status, b'{"choices": []}')


def test_a_success_is_exactly_the_2xx_range() -> None:
    assert [is_success(s) for s in (199, 200, 299, 300)] == [False, True, True, False]


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_every_redirect_is_named_with_its_target_and_not_followed(status: int) -> None:
    failed = failure(answer(status, b"moved", location="http://elsewhere.invalid/x"))
    assert (failed.kind, failed.status, failed.received) == ("http_status", status, True)
    assert str(failed) == (
        f"HTTP {status}: moved (redirect to 'http://elsewhere.invalid/x', not followed: give --endpoint the "
        "root URL it leads to)"
    )


def test_a_status_that_is_no_redirect_is_not_called_one() -> None:
    for status in (300, 304, 305, 306, 309):
        assert "redirect" not in str(failure(answer(status, b"odd"))), status


def test_a_404_names_the_url_asked_and_other_errors_do_not() -> None:
    assert (
        str(failure(answer(404, b"no route")))
        == "HTTP 404: no route (POST http://server/v1/chat/completions)"
    )
    assert str(failure(answer(405, b"no route"))) == "HTTP 405: no route"


def test_an_error_body_is_cut_to_500_characters() -> None:
    failed = failure(answer(500, b"e" * 2000, **{"retry-after": "3"}))
    assert str(failed) == "HTTP 500: " + "e" * 500
    assert failed.headers is not None and failed.headers["retry-after"] == "3"  # for the retry's delay


def test_only_a_400_about_the_schema_to_a_structured_request_is_schema_rejected() -> None:
    refusal = b'{"error": "Invalid JSON SCHEMA in response_format"}'
    assert failure(answer(400, refusal), SCHEMA_BODY).kind == "schema_rejected"
    assert failure(answer(400, refusal)).kind == "http_status"  # the request asked for no schema
    assert failure(answer(400, b"max_tokens too large"), SCHEMA_BODY).kind == "http_status"
    assert failure(answer(422, refusal), SCHEMA_BODY).kind == "schema_rejected"  # transformers serve's
    assert failure(answer(422, b"Unexpected keys: {'min_tokens'}"), SCHEMA_BODY).kind == "http_status"
    assert failure(answer(500, refusal), SCHEMA_BODY).kind == "http_status"


@pytest.mark.timeout(60)
def test_a_422_refusing_response_format_is_schema_rejected_and_not_retried() -> None:
    """``transformers serve`` refuses a field it does not use with 422, ``response_format`` among them
    (4.x with ``--input_validation``: "Unused fields in the request"; a 5.x development version on any
    request: "Unsupported fields in the request"): the schema refused, as vLLM's 400 says it, not a
    plain HTTP status, and no retry asks again."""
    from asyncroll.backends.base import ModelRequest
    from asyncroll.backends.openai import HttpSettings, OpenAIBackend
    from asyncroll.backends.retry import RetryPolicy
    from asyncroll.clock import SystemClock
    from asyncroll.errors import ModelError
    from asyncroll.workload import Problem
    from tests.hostile_http import raw_reply

    detail = b'{"detail":"Unsupported fields in the request: {\'response_format\'}"}'
    request = ModelRequest(
        "t", Problem.model_validate({"prompt": "p"}), 0, [{"role": "user", "content": "p"}]
    )

    async def turn(url: str) -> ModelError:
        retry = RetryPolicy(max_retries=2, base_delay=0.01)
        settings = HttpSettings(endpoint=url, model="m", inflight=1, server_kind="transformers", retry=retry)
        backend = OpenAIBackend(settings, SystemClock())
        try:
            with pytest.raises(ModelError) as caught:
                await backend.complete(request)
        finally:
            await backend.aclose()
        return caught.value

    with HostileServer([raw_reply(422, {"content-type": "application/json"}, detail)]) as server:
        error = asyncio.run(asyncio.wait_for(turn(server.url), 30))
    assert (error.kind, error.status, error.attempts) == ("schema_rejected", 422, 1)
    assert "response_format" in str(error)


def test_no_response_is_a_transport_or_timeout_failure_and_only_no_connection_is_unavailable() -> None:
    def raising(exc: Exception) -> Handler:
        def handler(request: httpx.Request) -> httpx.Response:
            raise exc

        return handler

    refused = failure(raising(httpx.ConnectError("refused")))
    assert (refused.kind, refused.status, refused.received, refused.unavailable) == (
        "transport",
        None,
        False,
        True,
    )
    connect = failure(raising(httpx.ConnectTimeout("syn dropped")))
    assert (connect.kind, connect.received, connect.no_connection, connect.unavailable) == (
        "timeout",
        False,
        True,
        True,
    )
    assert str(connect) == "no response within 5s (ConnectTimeout)"
    slow = failure(raising(httpx.ReadTimeout("slow")))
    assert (slow.kind, slow.received, slow.no_connection, slow.unavailable) == (
        "timeout",
        False,
        False,
        False,
    )


def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    async def gen() -> AsyncIterator[bytes]:
        for part in parts:
            yield part

    return gen()


@pytest.mark.timeout(30)
def test_a_reply_that_never_completes_ends_at_the_whole_request_deadline_after_its_status() -> None:
    """Every phase in time (the mock applies no per-read timeout), the body never ends: the request's
    whole-exchange deadline (0.1 s + the 1 s minimum margin) ends it, a timeout with no response (its body
    is incomplete) whose message says the status and headers had come (it said "no complete response")."""

    async def endless() -> AsyncIterator[bytes]:
        yield b'{"choices": ['
        await asyncio.Event().wait()

    failed = failure(lambda request: httpx.Response(200, content=endless()), timeout=0.1)
    assert (failed.kind, failed.status, failed.received, failed.unavailable) == (
        "timeout",
        None,
        False,
        False,
    )
    assert str(failed) == "HTTP 200 and its headers came, then not the whole body within 1.1s"


def cut_reply(stall: bool) -> Any:
    """200 and headers announcing 100 bytes, 6 of them, then the connection closed (or held open)."""

    def reply(handler: Any, stop: threading.Event) -> None:
        handler.send_response(200)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", "100")
        handler.end_headers()
        handler.wfile.write(b'{"choi')
        handler.wfile.flush()
        if stall:
            stop.wait(30)

    return reply


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stall", [False, True], ids=["closed", "stalled"])
def test_a_reply_cut_after_its_headers_says_the_server_answered(stall: bool) -> None:
    """A server (or proxy) that dies or stalls mid-reply, over a real socket: still a transport failure or
    a timeout with no response received (the body is incomplete), but its message says the status and
    headers had come; it said what a server that never answered gets ("no response within 0.5s")."""

    async def go(url: str) -> tuple[int, bytes]:
        async with httpx.AsyncClient(
            base_url=url, timeout=0.5, trust_env=False
        ) as client:  # as the backend's
            return await post_chat(client, {"model": "m", "messages": []}, {}, 0.5)

    with HostileServer([cut_reply(stall)]) as server, pytest.raises(AttemptFailed) as caught:
        asyncio.run(asyncio.wait_for(go(server.url), 30))
    failed = caught.value
    kind = "timeout" if stall else "transport"
    # a reset counts towards the circuit as one with no status did (means_unavailable); a read timeout not
    assert (failed.kind, failed.status, failed.received, failed.unavailable) == (kind, None, False, not stall)
    cut = "no more of its body within 0.5s (ReadTimeout)" if stall else "the connection failed before"
    assert str(failed).startswith(f"HTTP 200 and its headers came, then {cut}"), str(failed)
    assert stall or "RemoteProtocolError: peer closed connection" in str(failed)


def not_gzip(status: int) -> Handler:
    """A body that fails its content-encoding, streamed: httpx decodes it only as it is read."""
    gzip = {"content-encoding": "gzip"}
    return lambda request: httpx.Response(status, content=chunks(b"not gzip at all"), headers=gzip)


def test_an_unreadable_success_is_a_received_bad_response_with_its_status() -> None:
    failed = failure(not_gzip(200))
    assert (failed.kind, failed.status, failed.received, failed.unavailable) == (
        "bad_response",
        200,
        True,
        False,
    )
    assert failed.headers is None and "DecodingError" in str(failed)
    gateway = failure(not_gzip(502))
    assert (gateway.kind, gateway.status, gateway.received, gateway.unavailable) == (
        "http_status",
        502,
        True,
        True,
    )


def read(parts: list[bytes], limit: int) -> bytes:
    """The body :func:`read_bounded` reads of a reply streamed as ``parts`` under a cap of ``limit``."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=chunks(*parts))

    async def go() -> bytes:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            _, body = await read_bounded(
                client, client.build_request("GET", "http://x/"), limit_bytes=limit, deadline_s=5
            )
            return body

    return asyncio.run(go())


def test_a_body_of_exactly_the_cap_is_read_and_one_byte_more_is_not() -> None:
    assert read([b"abc", b"def", b"gh"], 8) == b"abcdefgh"
    with pytest.raises(ResponseTooLarge, match="longer than 7 bytes"):
        read([b"abc", b"def", b"gh"], 7)
    with pytest.raises(ResponseTooLarge):
        read([b"abc", b"defgh"], 4)


def test_the_whole_request_deadline_is_the_timeout_plus_a_tenth_but_at_least_a_second() -> None:
    assert request_deadline_s(0.3) == pytest.approx(1.3)
    assert request_deadline_s(10.0) == pytest.approx(11.0)
    assert request_deadline_s(120.0) == pytest.approx(132.0)
    assert request_deadline_s(5.0, min_margin_s=2.0) == pytest.approx(7.0)


def test_body_text_is_utf8_cut_to_its_characters() -> None:
    text = "é" * 10
    assert body_text(text.encode(), 4) == "éééé"
    assert body_text(text.encode()) == text
    assert body_text(b"ok\xffgo") == "ok\ufffdgo"
    assert body_text("€€€".encode(), 2) == "€€"  # three bytes each: the cut is in characters, not bytes


def test_a_redirect_with_an_empty_body_names_its_reason_and_its_whole_target() -> None:
    """A reverse proxy's 308 (to https://, or another prefix) has no body and a relative Location: the
    error was 'HTTP 308:  (redirect to '/llm/v1/chat/completions', not followed)'."""
    failed = failure(answer(308, location="/llm/v1/chat/completions"))
    assert str(failed) == (
        "HTTP 308: Permanent Redirect (redirect to 'http://server/llm/v1/chat/completions', not followed: "
        "give --endpoint the root URL it leads to)"
    )
    assert str(failure(answer(304))) == "HTTP 304: Not Modified"
