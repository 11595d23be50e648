"""The HTTP backend's connection pools: each request goes to the pool with the fewest in flight, counted
until its response is closed; equals take requests in turn."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import httpx
import pytest

from asyncroll.backends.transport import PoolsTransport


class _Body(httpx.AsyncByteStream):
    """A body streamed as a server's is (a response made with its content is closed before it returns)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.data


def _pool(name: str, gates: dict[str, asyncio.Event], log: list[str]) -> httpx.MockTransport:
    async def handle(request: httpx.Request) -> httpx.Response:
        label = request.url.path.strip("/")
        log.append(f"{label}@{name}")
        await gates[label].wait()
        return httpx.Response(200, stream=_Body(label.encode()))

    return httpx.MockTransport(handle)


@pytest.mark.timeout(30)
def test_a_request_goes_to_the_least_busy_pool_not_the_next_in_turn() -> None:
    """a → p0, b → p1, c → p0; a and c done: d goes to the idle p0 (in turn it went to p1, which still
    has b in flight), then e to p1 and f to p0 in turn again, both at one each."""
    log: list[str] = []

    async def scenario() -> list[int]:
        gates = {label: asyncio.Event() for label in "abcdef"}
        transport = PoolsTransport([_pool("p0", gates, log), _pool("p1", gates, log)])
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:

            async def get(label: str) -> str:
                return (await client.get(f"/{label}")).text

            tasks = {label: asyncio.create_task(get(label)) for label in "abc"}
            await asyncio.sleep(0)
            assert transport.in_flight == [2, 1]
            gates["a"].set()
            gates["c"].set()
            assert [await tasks["a"], await tasks["c"]] == ["a", "c"]
            assert transport.in_flight == [0, 1]  # a response read in full ends its request
            tasks |= {label: asyncio.create_task(get(label)) for label in "def"}
            await asyncio.sleep(0)
            seen = list(transport.in_flight)
            for gate in gates.values():
                gate.set()
            await asyncio.gather(*tasks.values())
            assert transport.in_flight == [0, 0]
            return seen

    assert asyncio.run(scenario()) == [2, 2]
    assert log == ["a@p0", "b@p1", "c@p0", "d@p0", "e@p1", "f@p0"]


@pytest.mark.timeout(30)
def test_a_request_that_fails_or_a_response_never_read_still_ends() -> None:
    async def scenario() -> list[int]:
        def handle(request: httpx.Request) -> httpx.Response:
            if request.url.path == "/fail":
                raise httpx.ConnectError("refused", request=request)
            if request.url.path == "/in-memory":
                return httpx.Response(200, text="in memory")  # closed already
            return httpx.Response(200, stream=_Body(b"ok"))

        transport = PoolsTransport([httpx.MockTransport(handle), httpx.MockTransport(handle)])
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            with pytest.raises(httpx.ConnectError):
                await client.get("/fail")
            async with client.stream("GET", "/ok"):
                assert transport.in_flight == [0, 1]  # the first pool's failed request ended
            # its body never read: closed all the same
            assert (await client.get("/in-memory")).text == "in memory"
        return transport.in_flight

    assert asyncio.run(scenario()) == [0, 0]


@pytest.mark.timeout(60)
def test_no_pool_holds_more_than_its_share_when_the_client_holds_no_more_than_the_pools_shares() -> None:
    """16 requests in flight over 2 pools, of random lengths: each pool holds at most 8 at any time
    (taken in turn regardless, each peaked at 10 here)."""
    rng = random.Random(7)
    now = [0, 0]
    peak = [0, 0]

    def pool(i: int) -> httpx.MockTransport:
        async def handle(request: httpx.Request) -> httpx.Response:
            now[i] += 1
            peak[i] = max(peak[i], now[i])
            await asyncio.sleep(rng.uniform(0, 0.004))
            now[i] -= 1
            return httpx.Response(200, stream=_Body(b"x"))

        return httpx.MockTransport(handle)

    async def scenario() -> None:
        transport = PoolsTransport([pool(0), pool(1)])
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:

            async def one_client() -> None:
                for _ in range(25):
                    await client.get("/")

            await asyncio.gather(*(one_client() for _ in range(16)))

    asyncio.run(scenario())
    assert peak == [8, 8]


@pytest.mark.timeout(30)
def test_closing_closes_every_pool_and_says_each_failure() -> None:
    closed: list[int] = []

    class Failing(httpx.AsyncBaseTransport):
        def __init__(self, i: int) -> None:
            self.i = i

        async def aclose(self) -> None:
            closed.append(self.i)
            if self.i:
                raise OSError(f"pool {self.i} could not close")

    transport = PoolsTransport([Failing(0), Failing(1), Failing(2)])
    with pytest.raises(OSError, match="pool 1 could not close") as failed:
        asyncio.run(transport.aclose())
    assert closed == [0, 1, 2]
    assert failed.value.__notes__ == ["closing another pool failed too: OSError: pool 2 could not close"]


@pytest.mark.timeout(60)
def test_the_connections_a_server_sees_never_outnumber_the_inflight_limit() -> None:
    """9 in flight over 2 pools, in two waves of 9 at once (the server holds each wave's replies until all
    9 arrived): the pools take 5 and 4 of the first wave, and of the second, taken by fewest in flight, in
    turn, 4 and 5 — a tenth connection, one more than SPEC §7's pool sized to the inflight limit. Each
    pool's share of the limit (5 and 4) bounds what it holds, so the server sees 9 connections in all."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler

    from asyncroll.backends.base import ModelRequest
    from asyncroll.backends.openai import HttpSettings, OpenAIBackend
    from asyncroll.clock import SystemClock
    from asyncroll.workload import Problem
    from tests.http_backend import FINAL, completion
    from tests.loopback import LoopbackServer

    inflight = 9
    wave = threading.Barrier(inflight, timeout=10)
    ports: set[int] = set()
    reply = json.dumps(completion(FINAL)).encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: each connection is reused, as with vLLM's uvicorn

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            ports.add(self.client_address[1])
            wave.wait()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:
            return None

    request = ModelRequest(
        "t", Problem.model_validate({"prompt": "p"}), 0, [{"role": "user", "content": "p"}]
    )

    async def two_waves(url: str) -> None:
        settings = HttpSettings(
            endpoint=url, model="m", inflight=inflight, server_kind="vllm", request_timeout=20
        )
        backend = OpenAIBackend(settings, SystemClock())
        try:
            for _ in range(2):
                await asyncio.gather(*(backend.complete(request) for _ in range(inflight)))
        finally:
            await backend.aclose()

    with LoopbackServer(Handler) as server:
        asyncio.run(asyncio.wait_for(two_waves(server.url), 30))
    assert len(ports) == inflight


@pytest.mark.timeout(60)
def test_the_room_made_for_connections_holds_what_the_pools_keep_alive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """600 active trajectories at --max-inflight-model-requests 2000: at most 600 requests in flight, over
    the 250 pools of the limit, each taking a request while it has the fewest. A pool keeps alive as many
    connections as it ever held at once (httpcore reuses an idle one, opens one where none is), and each
    reaches one more than an even split: 750 connections, where room was made for 600 (``ulimit -n``)."""
    from types import SimpleNamespace

    from asyncroll import process_limits
    from asyncroll.backends.transport import pool_shares
    from asyncroll.commands.common import open_files_for_requests

    most, active = 2000, 600
    shares = pool_shares(most)
    transport = PoolsTransport(
        [httpx.MockTransport(lambda _: httpx.Response(200, stream=_Body(b""))) for _ in shares], shares
    )
    held = [0] * len(shares)  # the most each pool held at once: the connections it keeps
    rng = random.Random(7)

    async def churn() -> None:
        responses: list[httpx.Response] = []
        for step in range(active + 5000):
            if step >= active:  # one ends, another starts: 600 in flight throughout
                await responses.pop(rng.randrange(len(responses))).aclose()
            responses.append(await transport.handle_async_request(httpx.Request("GET", "http://server/")))
            held[:] = map(max, held, transport.in_flight)

    asyncio.run(churn())
    room: list[int] = []
    monkeypatch.setattr(
        process_limits,
        "open_files_for",
        lambda inflight, _workers, kept=None: room.append(inflight if kept is None else kept),
    )
    limits = SimpleNamespace(max_inflight_model_requests=most, max_active_trajectories=active, cpu_workers=1)
    open_files_for_requests(SimpleNamespace(backend="vllm", limits=limits))
    assert room and sum(held) <= room[0], (sum(held), room)  # was 600 for 750
