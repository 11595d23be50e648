"""A hostile ``/metrics`` (a gzip bomb, a trickle): whatever it does, the probe stays bounded in memory
and time."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

import pytest

from asyncroll.telemetry.server_metrics import MetricsUnavailable, ServerMetricsSource
from tests.metrics_loopback import MetricsServer, idle_vllm, trickle_metrics


def _gzip_zeros(mib: int) -> bytes:
    """A valid gzip stream of ``mib`` MiB of zeros in about ``mib`` KB: one full-flushed deflate block of
    1 MiB repeated (each stands alone), then the trailer."""
    block = b"\0" * (1 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    flushed = deflate.compress(block) + deflate.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(mib):
        crc = zlib.crc32(block, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    return header + flushed * mib + deflate.flush() + struct.pack("<II", crc, (mib << 20) & 0xFFFFFFFF)


def _probe_error(url: str, limit_s: float, hard_limit_s: float) -> tuple[str, float]:
    """The probe's MetricsUnavailable message and how long it took (``hard_limit_s``: a hang fails)."""

    async def go() -> tuple[str, float]:
        source = ServerMetricsSource(url, flavor="vllm", model="sim", timeout=limit_s)
        began = time.monotonic()
        try:
            async with asyncio.timeout(hard_limit_s):
                with pytest.raises(MetricsUnavailable) as caught:
                    await source.probe(limit_s)
        finally:
            await source.aclose()
        return str(caught.value), time.monotonic() - began

    return asyncio.run(go())


@pytest.mark.timeout(30)
def test_a_gzip_bomb_at_metrics_is_refused_as_too_large_in_bounded_memory(
    metrics_server: Callable[..., MetricsServer],
) -> None:
    """256 MiB of zeros in 260 KB of gzip: the read stops at the 16 MiB cap on the *decoded* body (D2)."""
    bomb = _gzip_zeros(256)

    def serve_bomb(handler: BaseHTTPRequestHandler, n: int, closing: threading.Event) -> bool:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain; version=0.0.4")
        handler.send_header("Content-Encoding", "gzip")
        handler.send_header("Content-Length", str(len(bomb)))
        handler.end_headers()
        with contextlib.suppress(OSError):  # the client hangs up at its cap
            handler.wfile.write(bomb)
        return True

    server = metrics_server(idle_vllm, serve_bomb)
    tracemalloc.start()
    try:
        message, _ = _probe_error(server.url, 5.0, hard_limit_s=20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert message.startswith(f"GET {server.url}: the response body is longer than 16,777,216 bytes")
    # Bounded, but above the cap by what one network read inflates to: httpx decodes a whole 64 KiB read
    # at once (up to ~64 MiB of zeros), and read_bounded appends it before it compares (peak ~140 MiB);
    # without a cap the whole 256 MiB, and its text, were held.
    assert peak < 192 << 20, f"peak {peak / 2**20:.0f} MiB"


@pytest.mark.timeout(30)
def test_a_trickling_metrics_ends_within_the_deadline(metrics_server: Callable[..., MetricsServer]) -> None:
    """Each byte comes in time for httpx's per-phase timeout, the whole body never (D6). The per-phase
    timeout is 2 s, 100 times the trickle's 20 ms: with 0.2 s, the trickling thread held off a loaded
    machine's CPU for 0.2 s made it a per-phase timeout ('no response within 0.2 s')."""
    server = metrics_server(idle_vllm, lambda handler, n, closing: trickle_metrics(handler, closing))
    message, took = _probe_error(server.url, 2.0, hard_limit_s=15)
    assert message == f"GET {server.url}: no complete response within 2.5 s"  # 2 s + the 0.5 s margin
    assert 2.4 < took < 10.0  # its 2.5 s deadline (slack: a loaded machine); it hung before
