"""serve-sim's streamed replies under load, disconnects and shutdown: a ``serve-sim`` process stopped by a
signal with streams open cuts them without an error line per stream, a stopped reader's included; the
bookkeeping (``inflight``, the statuses, the engine, the KV gauge, the watched sequences) comes back to
rest after many streamed requests that clients leave at every point; a stream held by a reader that
stopped reading reserves no KV once its sequence is done, and counts 499 when that reader leaves."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from asyncroll.backends.server_model import ServerModelConfig
from asyncroll.serve_sim.config import FaultConfig
from asyncroll.serve_sim.server import RunningSim
from tests.children import end
from tests.experiments import CLI, ROOT
from tests.sim_servers import body, sim

CHAT = "/v1/chat/completions"


def _start(tmp_path: Path, *engine: str) -> tuple[subprocess.Popen[bytes], str]:
    """``asyncroll serve-sim --port 0`` with these engine flags, its output in ``tmp_path/sim.log``."""
    log = (tmp_path / "sim.log").open("wb")
    server = subprocess.Popen(
        [*CLI, "serve-sim", "--port", "0", *engine],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    while not (text := (tmp_path / "sim.log").read_text()).startswith("serve-sim listening on "):
        assert server.poll() is None, text
        time.sleep(0.02)
    return server, text.split()[3]


def _read_stream(url: str, request: dict[str, object]) -> tuple[list[str], Exception | None]:
    """The lines a streamed request got, and what cut it (None: it ended whole)."""
    lines: list[str] = []
    try:
        with httpx.stream("POST", url + CHAT, json=request, timeout=30) as r:
            for line in r.iter_lines():
                lines.append(line)
    except httpx.HTTPError as exc:
        return lines, exc
    return lines, None


@pytest.mark.timeout(40)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_with_streams_open_cuts_them_without_an_error_line_per_stream(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """uvicorn logged ``ERROR: ASGI callable returned without completing response.`` for each stream still
    running after the 2 s grace (200 open streams: 200 error lines), though the docs call the cut the
    documented stop: the stream now ends its connection itself, as the truncate fault does."""
    server, url = _start(tmp_path, "--step-base-ms", "50", "--step-per-seq-ms", "0")
    try:
        long_stream = body(max_tokens=2000, ignore_eos=True, stream=True)  # 100 s of steps: cut by the stop
        with ThreadPoolExecutor(6) as pool:
            streams = [pool.submit(_read_stream, url, long_stream) for _ in range(6)]
            deadline = time.monotonic() + 20
            while httpx.get(url + "/sim/stats").json()["engine"]["running"] < 6:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            server.send_signal(signum)
            cut = [f.result(timeout=30) for f in streams]
        assert server.wait(20) == 0
    finally:
        end(server)
    for lines, exc in cut:
        assert isinstance(exc, httpx.RemoteProtocolError) and lines and "data: [DONE]" not in lines
    output = (tmp_path / "sim.log").read_text()
    assert "6 request(s) still running after the 2 s grace" in output, output
    assert "ERROR" not in output and "Traceback" not in output, output


@pytest.mark.timeout(40)
def test_a_stream_whose_reader_stopped_reading_is_cut_by_the_stop_without_an_error_line(
    tmp_path: Path,
) -> None:
    """A client that stopped reading leaves serve-sim's write buffer full: the FIN of a closed connection
    waits behind it, so uvicorn still found the response neither complete nor disconnected and logged
    ``ERROR: ASGI callable returned without completing response.``. What was not sent is dropped with a
    reset, as the process exiting drops it anyway."""
    server, url = _start(tmp_path, "--step-base-ms", "0.1", "--step-per-seq-ms", "0")
    host, port = url.removeprefix("http://").rsplit(":", 1)
    options = {"include_usage": True, "continuous_usage_stats": True}  # ≈ 300 bytes a chunk: 6 MB in all
    request = json.dumps(body(max_tokens=20000, ignore_eos=True, stream=True, stream_options=options))
    head = f"POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    try:
        with socket.create_connection((host, int(port)), timeout=10) as reader:
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            reader.sendall(f"{head}content-length: {len(request)}\r\n\r\n{request}".encode())
            deadline = time.monotonic() + 25
            while True:  # the engine is done with it while its stream waits for the reader: buffer full
                stats = httpx.get(url + "/sim/stats").json()
                if stats["engine"]["generated_tokens"] == 20000 and stats["inflight"] == 1:
                    break
                assert time.monotonic() < deadline, stats
                time.sleep(0.05)
            server.send_signal(signal.SIGINT)
            assert server.wait(20) == 0
    finally:
        end(server)
    output = (tmp_path / "sim.log").read_text()
    assert "1 request(s) still running after the 2 s grace" in output, output
    assert "ERROR" not in output and "Traceback" not in output, output


#: 0.1 ms a step: a stream of 20,000 tokens is decoded in 2 s
FAST = ServerModelConfig(max_num_seqs=8, step_base_ms=0.1, step_per_seq_ms=0.0, prefill_ms_per_token=0.0)


@contextlib.contextmanager
def _stopped_reader(running: RunningSim, deadline: float) -> Iterator[None]:
    """A stream of 20,000 tokens (6 MB) whose client stopped reading at once, open for the block: it is
    entered once the engine is done with the sequence while the stream waits for the reader."""
    host, port = running.url.removeprefix("http://").rsplit(":", 1)
    options = {"include_usage": True, "continuous_usage_stats": True}  # ≈ 300 bytes a chunk
    request = json.dumps(body(max_tokens=20000, ignore_eos=True, stream=True, stream_options=options))
    head = f"POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    with socket.create_connection((host, int(port)), timeout=10) as reader:
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.sendall(f"{head}content-length: {len(request)}\r\n\r\n{request}".encode())
        while (stats := running.stats())["engine"]["generated_tokens"] < 20000 or stats["inflight"] != 1:
            assert time.monotonic() < deadline, stats
            time.sleep(0.05)
        yield


async def _send_and_leave(url: str, request: dict[str, object]) -> None:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    _, writer = await asyncio.open_connection(host, int(port))
    payload = json.dumps(request)
    head = f"POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    writer.write(f"{head}content-length: {len(payload)}\r\n\r\n{payload}".encode())
    await writer.drain()
    writer.close()
    await writer.wait_closed()


async def _mixed_load(url: str, requests: int, seed: int) -> None:
    """``requests`` chat requests, 100 at a time: a third without ``stream``, the rest streamed and left by
    their client before the headers, after the headers, after k chunks or never."""
    rng = random.Random(seed)

    async def one(client: httpx.AsyncClient, leave_after: int | None, stream: bool) -> None:
        request = body(max_tokens=rng.randint(1, 40), ignore_eos=True, stream=stream)
        try:
            if not stream:
                await client.post(CHAT, json=request)
                return
            if (
                leave_after == -1
            ):  # gone before the headers: the whole request sent, then the connection closed
                await _send_and_leave(url, request)
                return
            async with client.stream("POST", CHAT, json=request) as r:
                chunks = 0
                async for line in r.aiter_lines():
                    chunks += bool(line)
                    if leave_after is not None and chunks >= leave_after:
                        return  # closing the response mid-stream drops its connection
        except httpx.TransportError:  # the reset and truncate faults
            pass

    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=url, timeout=20, limits=limits) as client:
        gate = asyncio.Semaphore(100)

        async def gated() -> None:
            async with gate:
                await one(client, rng.choice([-1, 0, 1, 3, None, None]), rng.random() > 0.33)

        await asyncio.gather(*(gated() for _ in range(requests)))


@pytest.mark.timeout(60)
def test_streams_left_at_every_point_under_faults_leave_nothing_behind() -> None:
    """600 requests, 100 at a time, streamed or not, their clients leaving at every point of a stream,
    with every fault on: each request is counted once, and the server comes back to rest (nothing in
    flight, no sequence in the engine or watched, no KV reserved, no connection or task left over)."""
    faults = FaultConfig(
        rate_503=0.05, reset_rate=0.05, truncate_rate=0.05, malformed_rate=0.05, slow_rate=0.05, slow_s=0.02
    )
    engine = ServerModelConfig(
        max_num_seqs=32, step_base_ms=0.5, step_per_seq_ms=0.0, prefill_ms_per_token=0.0
    )
    with sim(faults=faults, engine=engine) as (running, client):
        asyncio.run(asyncio.wait_for(_mixed_load(running.url, 600, seed=3), 40))
        client.close()
        deadline = time.monotonic() + 10
        while running.call(lambda: running.sim.inflight or len(running.sim.transports)):
            assert time.monotonic() < deadline, running.stats()
            time.sleep(0.02)
        stats = running.stats()

        def rest() -> tuple[int, int, list[str]]:
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            names = sorted(getattr(t.get_coro(), "__qualname__", "?") for t in others)
            return len(running.sim._in_engine), running.sim.engine._watched, names

        in_engine, watched, tasks = running.call(rest)
    assert stats["requests"] == sum(stats["statuses"].values()) == 600, stats
    assert set(stats["statuses"]) <= {"200", "499", "503", "reset", "truncated"}, stats
    assert stats["statuses"]["499"] > 0 and stats["statuses"]["truncated"] > 0, stats
    assert stats["inflight"] == 0 and stats["kv_cache_usage"] == 0, stats
    assert stats["engine"]["running"] == stats["engine"]["waiting"] == 0, stats
    assert (in_engine, watched) == (0, 0)
    assert tasks == ["BatchingServer.serve", "LifespanOn.main", "start_thread.<locals>.main.<locals>.serve"]


@pytest.mark.timeout(40)
def test_a_stream_held_by_a_stopped_reader_reserves_no_kv_once_its_sequence_left_the_engine() -> None:
    """The KV gauge counts the reservations of the oldest requests in the engine, as many as run. A stream
    kept its reservation until its last byte went out: one whose reader stopped reading held it after its
    sequence had finished, and the gauge counted it in place of a sequence still running."""
    with sim(engine=FAST) as (running, client):
        deadline = time.monotonic() + 25
        with (
            _stopped_reader(running, deadline),
            ThreadPoolExecutor(1) as pool,
        ):  # 2000 steps of 0.1 ms: 0.2 s running alone
            later = pool.submit(client.post, CHAT, json=body(max_tokens=2000, ignore_eos=True))
            while (stats := running.stats())["engine"]["running"] != 1:
                assert time.monotonic() < deadline and not later.done(), stats
                time.sleep(0.005)
            kv = stats["kv_cache_usage"]
            assert later.result(timeout=20).status_code == 200
    assert kv == (10 + 2000) / 262_144, kv  # 10 prompt tokens (40 characters) and 2000 output tokens


@pytest.mark.timeout(40)
def test_a_client_that_stopped_reading_and_left_aborted_its_stream() -> None:
    """A stream waiting for a reader that stopped reading, its sequence done, went on when the reader
    left: uvicorn drops what is sent after a disconnect, so it ran to ``[DONE]`` and counted 200 a reply
    whose client read a small part of it. Counted 499, as any client that leaves mid-stream."""
    with sim(engine=FAST) as (running, _):
        deadline = time.monotonic() + 25
        with _stopped_reader(running, deadline):
            pass  # and the reader leaves
        while (stats := running.stats())["inflight"]:
            assert time.monotonic() < deadline, stats
            time.sleep(0.01)
    assert stats["statuses"] == {"499": 1}, stats
