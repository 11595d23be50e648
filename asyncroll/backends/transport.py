"""The HTTP backend's transport: the connections of its one ``httpx.AsyncClient`` split across a few
connection pools, each request taken by the least busy of those with room left of their share of the
inflight limit.

httpcore's pool walks all of its connections, and for each idle one all of them again, at every
request's start and end, on the event loop: with 64 requests in flight one pool spent 58% of a loopback
run's loop there (2.4 ms a pass), and the run took as long as at 16 in flight. Pools of up to
:data:`POOL_SHARE` requests in flight each keep a pass short. The shares add up to the inflight limit
exactly, and no pool holds more than its share while the client holds no more than the limit: a pool opens
no more connections than it holds requests, so a server sees at most the limit's connections (SPEC §7: the
pool sized to the inflight limit), where pools taking the fewest in flight each opened up to the largest
share (10 connections for 9 in flight over 2 pools: 5 and 4, then 4 and 5). The client (its base URL, headers,
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
    """``pools`` transports, each request taken by the one with the fewest in flight among those with room
    left of their share (``shares``; none given: no share is ever full), the next in turn among equals;
    closing it closes them all.
    In turn regardless of how long each request took, a pool could hold more than its share while another
    had room: longer passes, and more connections than requests in flight (tests/test_transport_pools.py)."""

    def __init__(self, pools: list[httpx.AsyncBaseTransport], shares: list[int] | None = None) -> None:
        if not pools:
            raise ValueError("at least one pool")
        if shares is not None and len(shares) != len(pools):
            raise ValueError(f"{len(shares)} shares for {len(pools)} pools")
        self.pools = pools
        self.shares = shares or [0] * len(pools)
        self.in_flight = [0] * len(pools)  # a request counts until its response is closed
        self._turn = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        count, turn, shares, held = len(self.pools), self._turn, self.shares, self.in_flight
        # a pool whose share is full last: while the client holds fewer than the shares' sum, one has room
        i = min(range(count), key=lambda k: (0 < shares[k] <= held[k], held[k], (k - turn) % count))
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


def pool_shares(inflight: int) -> list[int]:
    """``inflight`` split into one share per :data:`POOL_SHARE` of it, as even as can be (9: 5 and 4)."""
    count = -(-inflight // POOL_SHARE)
    return [inflight // count + (1 if k < inflight % count else 0) for k in range(count)]


def pools_transport(inflight: int, limits: httpx.Limits, settings: dict[str, Any]) -> PoolsTransport:
    """One pool per :data:`POOL_SHARE` of ``inflight`` requests (:func:`pool_shares`), each with ``limits``
    (keeping at most its share of connections alive) and the client's
    TLS settings (``settings``: :func:`asyncroll.http_proxy.client_settings`'s ``verify`` and
    ``trust_env``, which decide the CA a pool trusts), made once and shared: a context per pool read the
    CA bundle again for each, 1.6 s on the event loop and 28 MB for the 38 pools of 300 in flight."""
    verify = settings.get("verify", True)
    if not isinstance(verify, ssl.SSLContext):
        verify = httpx.create_ssl_context(verify=verify, trust_env=settings.get("trust_env", True))
    shares = pool_shares(inflight)
    pools: list[httpx.AsyncBaseTransport] = [
        httpx.AsyncHTTPTransport(limits=_kept_alive(limits, share), verify=verify) for share in shares
    ]
    return PoolsTransport(pools, shares)


def _kept_alive(limits: httpx.Limits, share: int) -> httpx.Limits:
    """``limits`` keeping no more idle connections alive than ``share``."""
    kept = share if limits.max_keepalive_connections is None else min(share, limits.max_keepalive_connections)
    return httpx.Limits(
        max_connections=limits.max_connections,
        max_keepalive_connections=kept,
        keepalive_expiry=limits.keepalive_expiry,
    )


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
