"""Cost of one telemetry sample on the client's event loop.

Two measurements on a synthetic vLLM V1 exposition of realistic shape (two engines; the gauges and
counters asyncroll reads, plus 14 histograms of 30 buckets each, as vLLM serves them):

* ``parse``: :func:`asyncroll.telemetry.exposition.parse_metrics` (only the wanted lines reach
  ``prometheus_client``'s parser) against parsing the whole exposition with that parser.
* ``sample``: one whole server sample as the sampler takes it — ``GET`` on a loopback HTTP server
  (stdlib, in a thread of the same process, so the wall time includes the server's own work) and the
  parse — through :class:`ServerMetricsSource`.

Median over many calls per repeat; min/median/max over repeats.

Run: ``python -m bench.telemetry [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from asyncroll.telemetry.exposition import VLLM, parse_metrics
from asyncroll.telemetry.server_metrics import ServerMetricsSource
from bench.common import machine, number_arg, quantiles, run_main

MODEL = "Qwen/Qwen2.5-7B-Instruct"
HISTOGRAMS = [
    "time_to_first_token_seconds",
    "inter_token_latency_seconds",
    "e2e_request_latency_seconds",
    "request_queue_time_seconds",
    "request_inference_time_seconds",
    "request_prefill_time_seconds",
    "request_decode_time_seconds",
    "request_prompt_tokens",
    "request_generation_tokens",
    "request_params_max_tokens",
    "request_params_n",
    "iteration_tokens_total",
    "request_max_num_generation_tokens",
    "time_per_output_token_seconds",
]


def exposition() -> str:
    lines: list[str] = []
    for engine in ("0", "1"):
        labels = f'engine="{engine}",model_name="{MODEL}"'
        lines += [
            f"vllm:num_requests_running{{{labels}}} 3.0",
            f"vllm:num_requests_waiting{{{labels}}} 1.0",
            f"vllm:kv_cache_usage_perc{{{labels}}} 0.42",
            f"vllm:prompt_tokens_total{{{labels}}} 123456.0",
            f"vllm:generation_tokens_total{{{labels}}} 65432.0",
            f"vllm:prefix_cache_queries_total{{{labels}}} 1000.0",
            f"vllm:prefix_cache_hits_total{{{labels}}} 750.0",
        ]
        for name in HISTOGRAMS:
            lines.append(f"# HELP vllm:{name} Histogram of {name}.")
            lines.append(f"# TYPE vllm:{name} histogram")
            for i in range(30):
                le = "+Inf" if i == 29 else f"{0.001 * 2**i:.6g}"
                lines.append(
                    f'vllm:{name}_bucket{{engine="{engine}",le="{le}",model_name="{MODEL}"}} {i * 7}.0'
                )
            lines.append(f"vllm:{name}_count{{{labels}}} 203.0")
            lines.append(f"vllm:{name}_sum{{{labels}}} 41.5")
    return "\n".join(lines) + "\n"


def _median_call(fn: Any, calls: int) -> float:
    times = []
    for _ in range(calls):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def serve(text: str) -> tuple[ThreadingHTTPServer, threading.Thread]:
    body = text.encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a real server's /metrics

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    return server, thread


async def sample_times(url: str, calls: int) -> float:
    source = ServerMetricsSource(url, flavor="vllm", model=MODEL, timeout=2.0)
    await source.probe(2.0)
    times = []
    for _ in range(calls):
        began = time.perf_counter()
        await source.read(time.monotonic)
        times.append(time.perf_counter() - began)
    await source.aclose()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=number_arg(int, 1, 1_000_000), default=5)
    parser.add_argument("--calls", type=number_arg(int, 1, 1_000_000), default=200)
    args = parser.parse_args()
    text = exposition()
    assert parse_metrics(text, VLLM, MODEL).running == 6.0
    filtered, full, sampled = [], [], []
    whole = max(1, args.calls // 4)  # the whole exposition is slow: a quarter of the calls, at least one
    server, thread = serve(text)
    host, port = server.server_address[:2]
    url = f"http://{host!s}:{port}/metrics"
    try:
        for _ in range(args.repeats):
            filtered.append(_median_call(lambda: parse_metrics(text, VLLM, MODEL), args.calls))
            full.append(_median_call(lambda: list(text_string_to_metric_families(text)), whole))
            sampled.append(asyncio.run(sample_times(url, args.calls)))
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    print(f"machine: {machine()}")
    print(
        f"exposition: {len(text)} bytes, {text.count(chr(10))} lines; {args.repeats} repeats of "
        f"{args.calls} calls ({whole} for prometheus_client)"
    )
    for label, values in (
        ("parse_metrics (wanted lines only)", filtered),
        ("prometheus_client, whole exposition", full),
        ("one server sample (loopback GET + parse)", sampled),
    ):
        lo, mid, hi = quantiles(values)
        spread = f"min {lo * 1e3:.3f} / median {mid * 1e3:.3f} / max {hi * 1e3:.3f}"
        print(f"{label:45s} median per call, ms: {spread}")


if __name__ == "__main__":
    run_main("bench.telemetry", main)
