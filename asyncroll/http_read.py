"""Reading an HTTP response within bounds a server cannot stretch: a cap on the body and a whole-request
deadline.

httpx's own timeouts are per phase (connect, write, each read), so a server that trickles one byte at a
time resets them forever; and ``response.content`` holds whatever the server sends, decompressed — a
few megabytes of gzip can hold gigabytes of zeros. :func:`read_bounded` streams the body and stops at
``limit_bytes`` of *decoded* content (a compression bomb stops there too; httpx inflates each network
read whole, so one chunk — up to ~64 MiB of zeros from 64 KiB — is the most held beyond the cap while it
is checked), under ``deadline_s`` for the whole exchange (:func:`request_deadline_s`).
:func:`body_text` decodes a body as UTF-8 with replacement whatever charset the server names (httpx
would use it: an odd one, ``rot13`` or ``hex``, raised from deep inside the codec).

The deadline is an :func:`asyncio.timeout` around the exchange. Cancelling into httpcore's pool while it
holds a connection not yet open can leak that connection slot (encode/httpcore#1093), so a client used
with it should have no connection limit of its own (``max_connections=None``), and its per-phase
timeout should fire first whenever one phase is what is slow.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx

#: The most of an inference server's probe answer read (``/health``, ``/v1/models``, by a run's backend
#: and by an experiment's readiness check): a model list of many adapters fits easily.
MAX_PROBE_BYTES = 8 << 20


def request_deadline_s(limit_s: float, min_margin_s: float = 1.0) -> float:
    """The whole-exchange deadline of a request whose per-phase timeout is ``limit_s``: ``limit_s`` plus
    max(``min_margin_s``, 10%), so that httpx's own timeout (which ends a request cleanly) fires first
    whenever one phase is what is slow, and this one only ends a response that keeps every phase in time
    but never completes (a trickle)."""
    return limit_s + max(min_margin_s, 0.1 * limit_s)


class ResponseTooLarge(Exception):
    """The response body (decoded) is longer than the cap the caller set."""

    def __init__(self, limit_bytes: int) -> None:
        super().__init__(f"the response body is longer than {limit_bytes:,} bytes (decoded)")
        self.limit_bytes = limit_bytes


async def read_bounded(
    client: httpx.AsyncClient,
    request: httpx.Request,
    *,
    limit_bytes: int,
    deadline_s: float,
    on_response: Callable[[httpx.Response], None] | None = None,
) -> tuple[httpx.Response, bytes]:
    """Send ``request`` and read its whole body: at most ``limit_bytes`` after content decoding, all
    within ``deadline_s``. Raises httpx's errors, :class:`ResponseTooLarge`, or :class:`TimeoutError`
    when the deadline passes (every phase in time, the whole exchange not). ``on_response`` is called
    with the response as soon as its status and headers arrive, before the body is read: a caller learns
    the status of a response whose body then fails (too large, undecodable)."""
    async with asyncio.timeout(deadline_s):
        response = await client.send(request, stream=True)
        if on_response is not None:
            on_response(response)
        try:
            body = bytearray()
            async for chunk in response.aiter_bytes():
                if len(body) + len(chunk) > limit_bytes:  # checked before keeping the chunk
                    raise ResponseTooLarge(limit_bytes)
                body += chunk
        finally:
            await response.aclose()
    return response, bytes(body)


def body_text(body: bytes, limit_chars: int | None = None) -> str:
    """``body`` as text for an error message or a text format: UTF-8, undecodable bytes replaced."""
    data = body if limit_chars is None else body[: 4 * limit_chars]
    text = data.decode("utf-8", "replace")
    return text if limit_chars is None else text[:limit_chars]
