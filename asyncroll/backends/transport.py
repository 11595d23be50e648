"""The HTTP backend's transport: the connections of its one ``httpx.AsyncClient`` split across a few
connection pools, each request taken by the least busy.

httpcore's pool walks all of its connections, and for each idle one all of them again, at every
request's start and end, on the event loop: with 64 requests in flight one pool spent 58% of a loopback
run's loop there (2.4 ms a pass), and the run took as long as at 16 in flight. Pools of up to
:data:`POOL_SHARE` requests in flight each keep a pass short. The client (its base URL, headers,
timeouts) is unchanged: one per run, as SPEC §7 asks. A client given a transport takes none of the
environment's proxy variables, so the backend uses these pools only where none is in play
(:meth:`asyncroll.backends.openai.OpenAIBackend._pools`).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from typing import Any

import httpx

#: Model requests in flight per connection pool.
POOL_SHARE = 8


class PoolsTransport(httpx.AsyncBaseTransport):
    """``pools`` transports, each request taken by the one with the fewest in flight (the next in turn
    among equals); closing it closes them all. In turn regardless of how long each request took, a pool
    could hold more than its share while another had room: longer passes, and more connections than
    requests in flight (tests/test_transport_pools.py)."""

    def __init__(self, pools: list[httpx.AsyncBaseTransport]) -> None:
        if not pools:
            raise ValueError("at least one pool")
        self.pools = pools
        self.in_flight = [0] * len(pools)  # a request counts until its response is closed
        self._turn = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        count, turn = len(self.pools), self._turn
        i = min(range(count), key=lambda k: (self.in_flight[k], (k - turn) % count))
        self._turn = (i + 1) % count
        self.in_flight[i] += 1
        try:
            response = await self.pools[i].handle_async_request(request)
        except BaseException:
            self.in_flight[i] -= 1
            raise
        if response.is_closed:  # its body read already (a transport that answers with it in memory)
            self.in_flight[i] -= 1
        else:
            assert isinstance(response.stream, httpx.AsyncByteStream)
            response.stream = _Counted(response.stream, self.in_flight, i)
        return response

    async def aclose(self) -> None:
        """Close every pool, each even if another's close failed; the first failure is raised, the others
        noted on it."""
        failures: list[Exception] = []
        for pool in self.pools:
            try:
                await pool.aclose()
            except Exception as exc:  # noqa: BLE001 - kept, raised once all are closed
                failures.append(exc)
        if failures:
            for other in failures[1:]:
                failures[0].add_note(f"closing another pool failed too: {type(other).__name__}: {other}")
            raise failures[0]


def pools_transport(inflight: int, limits: httpx.Limits, settings: dict[str, Any]) -> PoolsTransport:
    """One pool per :data:`POOL_SHARE` of ``inflight`` requests, each with ``limits`` and the client's
    TLS settings (``settings``: :func:`asyncroll.http_proxy.client_settings`'s ``verify`` and
    ``trust_env``, which decide the CA a pool trusts), made once and shared: a context per pool read the
    CA bundle again for each, 1.6 s on the event loop and 28 MB for the 38 pools of 300 in flight."""
    verify = settings.get("verify", True)
    if not isinstance(verify, ssl.SSLContext):
        verify = httpx.create_ssl_context(verify=verify, trust_env=settings.get("trust_env", True))
    count = -(-inflight // POOL_SHARE)
    return PoolsTransport([httpx.AsyncHTTPTransport(limits=limits, verify=verify) for _ in range(count)])


class _Counted(httpx.AsyncByteStream):
    """A response's body: its pool's request ends when it is closed (read in full by the client, or
    abandoned), once."""

    def __init__(self, stream: httpx.AsyncByteStream, in_flight: list[int], pool: int) -> None:
        self._stream, self._in_flight, self._pool = stream, in_flight, pool
        self._open = True

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            if self._open:
                self._open = False
                self._in_flight[self._pool] -= 1
