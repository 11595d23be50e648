"""Review of serve-sim's streamed replies against a real serve-sim on loopback: the KV cache a stream's
sequence holds is released when the engine finishes it, not when a slow reader has read the last chunk."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import httpx
import pytest

from asyncroll.backends.server_model import ServerModelConfig
from tests.sim_servers import body, sim

ENGINE = ServerModelConfig(max_num_seqs=8, step_base_ms=0.05, step_per_seq_ms=0.0, prefill_ms_per_token=0.0)


def _wait_for(running: Any, ready: Any, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        stats: dict[str, Any] = running.stats()
        if ready(stats):
            return stats
        assert time.monotonic() < deadline, (what, stats)
        time.sleep(0.01)


@pytest.mark.timeout(60)
def test_a_stream_whose_reader_lags_holds_no_kv_cache_once_the_engine_finished_its_sequence() -> None:
    """A client that reads a stream slowly (here: not at all) keeps the stream open long after the engine
    generated its last token. Its prompt and output tokens were still counted as held in the KV cache, and,
    as the oldest entry, in place of a sequence that was running: ``kv_cache_usage`` showed the finished
    stream's 31,000 tokens instead of the running request's 2,001."""
    with sim(engine=ENGINE) as (running, client):
        stream_body = json.dumps(
            body(
                messages=[{"role": "user", "content": "x" * 4000}],  # 1,000 prompt tokens
                max_tokens=30_000,  # ~7 MB of chunks: more than the socket buffers hold
                ignore_eos=True,
                stream=True,
                stream_options={"include_usage": True, "continuous_usage_stats": True},
            )
        ).encode()
        host, port = running.url.removeprefix("http://").split(":")
        reader = socket.socket()
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once: the stream blocks
        reader.settimeout(30)
        try:
            reader.connect((host, int(port)))
            head = (
                f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(stream_body)}\r\n\r\n"
            )
            reader.sendall(head.encode() + stream_body)
            # the engine finished the stream's sequence; the stream itself is still waiting on its reader
            _wait_for(
                running,
                lambda s: s["engine"]["generated_tokens"] >= 30_000 and s["engine"]["running"] == 0,
                "the stream's sequence to finish",
            )
            assert running.stats()["inflight"] == 1
            other: list[httpx.Response] = []
            request = body(
                max_tokens=2000, ignore_eos=True
            )  # 10 prompt tokens + 2,000: 0.1 s of steps or more
            sender = threading.Thread(
                target=lambda: other.append(client.post("/v1/chat/completions", json=request))
            )
            sender.start()
            stats = _wait_for(running, lambda s: s["engine"]["running"] == 1, "the other request to run")
            sender.join(timeout=30)
        finally:
            reader.close()
    assert other and other[0].status_code == 200
    assert stats["kv_cache_usage"] == pytest.approx(2010 / 262_144, abs=1e-5)
