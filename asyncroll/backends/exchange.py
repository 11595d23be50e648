"""One ``POST /v1/chat/completions`` exchange of the HTTP backend, every failure classified.

:func:`post_chat` sends a body and returns the status and raw body of a success (a 2xx: 200 from every
OpenAI-compatible server; SPEC §3 fails a non-2xx, as the OpenAI client does); anything else is raised
as :class:`AttemptFailed` with its kind: ``transport`` and ``timeout`` (no response, or one whose body was
cut short: its message says which), ``http_status``
and ``schema_rejected`` (a response), ``bad_response`` (a body that could not be read). Whatever a
hostile or broken server makes httpx or a codec raise, it is this attempt's failure, never the run's.

``--request-timeout`` is httpx's own, for each phase (connect, every read and write): a timed-out request
ends inside httpx, which closes its connection. Only a server that keeps trickling bytes meets the
whole-request deadline max(1 s, 10%) later (:func:`~asyncroll.http_read.request_deadline_s`), which
cancels the request. A body is read up to :data:`MAX_RESPONSE_BYTES` after decoding (an endless body or a
compression bomb is ``bad_response``; behind an error status, that status: ``http_status``), its text as
UTF-8 whatever charset the server names (:mod:`asyncroll.http_read`). Redirects are never followed.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import orjson

from asyncroll.backends.http_errors import KEY_REFUSED, describe_transport_error, key_refused, server_text
from asyncroll.backends.retry import means_unavailable
from asyncroll.http_read import ResponseTooLarge, read_bounded, request_deadline_s
from asyncroll.url_checks import masked_url

#: Words in a 400 or 422 body that mean the server refused the structured-output request itself.
_SCHEMA_WORDS = ("schema", "response_format", "grammar", "guided", "json_object", "structured")
#: The statuses of such a refusal: vLLM's 400 (a schema its grammar engine cannot compile), and the 422
#: with which ``transformers serve`` refuses a field it does not use, ``response_format`` among them (4.x
#: with ``--input_validation``; a 5.x development version on every request).
_SCHEMA_REFUSALS = (400, 422)
#: The most of a chat-completion body read (decoded): a reply of a few thousand tokens is kilobytes, with
#: per-token logprobs megabytes; past this a body is the server's failure, not a reply to parse.
MAX_RESPONSE_BYTES = 64 << 20
_REDIRECTS = (301, 302, 303, 307, 308)


class AttemptFailed(Exception):
    def __init__(
        self,
        kind: str,
        message: str,
        status: int | None,
        headers: httpx.Headers | None,
        received: bool,
        *,
        no_connection: bool = False,
    ) -> None:
        """``no_connection``: no connection could be made (a timed-out connect is kind ``timeout`` but,
        like a refused one, says the server is not there: the circuit counts it)."""
        super().__init__(message)
        self.kind, self.status, self.headers, self.received = kind, status, headers, received
        self.no_connection = no_connection

    @property
    def unavailable(self) -> bool:
        """Whether this failure says the server is not there (:func:`means_unavailable`)."""
        return self.no_connection or means_unavailable(self.kind, self.status)


def is_success(status: int) -> bool:
    """A 2xx: the reply is read as a completion (a 201 or 203 a gateway sends is one too; a 204 or 202
    has no completion in it and is ``bad_response``)."""
    return 200 <= status < 300


def _unreadable(head: list[httpx.Response], why: str) -> AttemptFailed:
    """A response whose body could not be read (too large, undecodable). Its status decides what it
    is: an error status is that status (``http_status``: retried, counted by the circuit, and not a
    received invalid reply in the validity rate, exactly as with a readable body); a 2xx (or no
    status known) is ``bad_response``."""
    if head and not is_success(head[0].status_code):
        response = head[0]
        status = response.status_code
        return AttemptFailed(
            "http_status", f"HTTP {status} (body unreadable: {why})", status, response.headers, True
        )
    return AttemptFailed("bad_response", why, head[0].status_code if head else None, None, True)


def _target(response: httpx.Response) -> str:
    """Where a redirect leads, as a whole URL (a reverse proxy's Location is often a path), and what to
    do about it; 'nowhere' for one without a Location."""
    location = response.headers.get("location")
    if location is None:
        return "'nowhere', not followed"
    try:
        whole = masked_url(str(response.request.url.join(location)))  # a user:password@ in it: masked
    except (httpx.InvalidURL, ValueError):
        return f"{location!r}, not followed"
    return f"{whole!r}, not followed: give --endpoint the root URL it leads to"


def request_body(body: dict[str, Any]) -> bytes:
    """The request's JSON. A lone UTF-16 surrogate in a message (text some code or tool made with one)
    is sent as its escape (``\\ud800``), as the observations' are: orjson refuses it, which failed the
    whole run where it should at most be the server's call."""
    try:
        return orjson.dumps(body)
    except TypeError:
        encoded = json.dumps(body, separators=(",", ":"))  # ASCII: every lone surrogate escaped
        return encoded.encode()


def _cut(head: list[httpx.Response], failure: str, cut: str) -> str:
    """``failure``, or ``cut`` after the status where the status line and headers had come: the server
    answered and its body was cut short (a server or proxy that died or stalled mid-reply), which is not the
    same as no answer at all. Either way no response was received: its body is incomplete."""
    return f"HTTP {head[0].status_code} and its headers came, then {cut}" if head else failure


async def post_chat(
    client: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str], request_timeout: float
) -> tuple[int, bytes]:
    """One HTTP exchange under the request timeout and the body cap; every failure — whatever a hostile
    or broken server makes httpx or a codec raise — is raised as :class:`AttemptFailed`: this
    request's, never the run's."""
    request = client.build_request(
        "POST",
        "/v1/chat/completions",
        content=request_body(body),
        headers={"content-type": "application/json", **headers},
    )
    deadline = request_deadline_s(request_timeout)
    head: list[httpx.Response] = []  # the response, once its status and headers arrived
    try:
        response, payload = await read_bounded(
            client, request, limit_bytes=MAX_RESPONSE_BYTES, deadline_s=deadline, on_response=head.append
        )
    except httpx.TimeoutException as exc:  # a phase took longer than --request-timeout
        raise AttemptFailed(
            "timeout",
            _cut(
                head,
                f"no response within {request_timeout:g}s ({type(exc).__name__})",
                f"no more of its body within {request_timeout:g}s ({type(exc).__name__})",
            ),
            None,
            None,
            False,
            # a host that drops SYNs (down, rebooting, firewalled) never refuses: it times out
            no_connection=isinstance(exc, httpx.ConnectTimeout),
        ) from exc
    except TimeoutError as exc:  # every phase in time, the whole request not (a trickling server)
        whole = f"no complete response within {deadline:g}s"
        cut = f"not the whole body within {deadline:g}s"
        raise AttemptFailed("timeout", _cut(head, whole, cut), None, None, False) from exc
    except ResponseTooLarge as exc:  # an endless body, or a compression bomb
        raise _unreadable(head, str(exc)) from exc
    except httpx.TransportError as exc:
        described = describe_transport_error(exc)
        cut = f"the connection failed before the body was complete ({described})"
        raise AttemptFailed("transport", _cut(head, described, cut), None, None, False) from exc
    except Exception as exc:
        # its content-encoding, a redirect loop, anything a hostile reply makes a codec raise): this
        # trajectory's failure, not the run's
        raise _unreadable(head, f"unreadable response ({type(exc).__name__}: {exc})") from exc
    status = response.status_code
    if not is_success(status):
        text = server_text(payload, 500, client.headers) or response.reason_phrase  # no body: its reason
        kind = "http_status"
        if (
            status in _SCHEMA_REFUSALS
            and "response_format" in body
            and any(w in text.lower() for w in _SCHEMA_WORDS)
        ):
            kind = "schema_rejected"
        if status == 404:  # a wrong --endpoint or model route: say which URL was asked
            text = f"{text} (POST {response.request.url})"
        if status in KEY_REFUSED:  # the key: every request is refused alike, and the body may not say so
            text = f"{text} ({key_refused(client.headers)})"
        if status in _REDIRECTS:  # never followed: a chat completion is not a page to chase
            text = f"{text} (redirect to {_target(response)})"
        raise AttemptFailed(kind, f"HTTP {status}: {text}", status, response.headers, True)
    return status, payload
