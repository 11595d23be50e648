"""HTTP client cost and throughput of the OpenAI-compatible backend against serve-sim.

serve-sim runs as a separate process (``asyncroll serve-sim``) with (almost) zero simulated model time:
a 1 µs engine step, no per-sequence or prefill cost, a batch of 1024. Every request is a real agent-mode
turn: a problem with one tool, so the body carries the ``anyOf`` tool schema, serve-sim draws a
schema-valid action, and the backend parses and validates it.

Two measurements, each repeated; the table shows min / median / max over repeats:

* **per request, inflight 1** (sequential ``OpenAIBackend.complete`` calls): wall time per request (the
  whole round trip, server included) and the client process's CPU time per request, split into the
  share of a raw ``httpx`` POST of the same prepared body and asyncroll's own share on top (message
  rendering, schema building, JSON encoding, response parsing and action validation). That share is a
  difference of two noisy figures, so the same work is also timed in process with no I/O at all.
* **requests/s at inflight 1, 4, 16, 64, 256**: that many concurrent ``complete`` calls (connection pool
  sized to match), ``--requests`` (at least 2 × inflight) in all, after a warm-up that opens the pool.

The server and the client share the machine's cores, so on a small machine the throughput figures
measure both processes' CPU, not the network. The model gate (one limiter + three events per request) is
not in this loop; ``bench/overhead.py`` measures it.

Run: ``python -m bench.client [--repeats 5] [--requests 400] [--sequential 300] [--json NEW_FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from asyncroll.backends.base import ModelRequest
from asyncroll.backends.openai import HttpSettings, OpenAIBackend
from asyncroll.clock import SystemClock
from asyncroll.http_proxy import client_settings
from asyncroll.outputs import result_file
from asyncroll.workload import Problem
from bench.common import machine, number_arg, quantiles, run_main

PROBLEM = Problem.model_validate(
    {
        "id": "p",
        "prompt": "What is 2 + 3? Use the add tool.",
        "tools": [
            {"name": "add", "description": "Add two numbers.", "inputs": {"a": "number", "b": "number"}}
        ],
    }
)
REQUEST = ModelRequest("p", PROBLEM, 0, [{"role": "user", "content": PROBLEM.prompt}])
INFLIGHT = (1, 4, 16, 64, 256)


def start_server(start_timeout: float = 60.0) -> tuple[subprocess.Popen[str], str]:
    cmd = [
        sys.executable, "-m", "asyncroll.cli", "serve-sim", "--port", "0", "--max-num-seqs", "1024",
        "--step-base-ms", "0.001", "--step-per-seq-ms", "0", "--prefill-ms-per-token", "0",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    # a server that hangs before its first line would hang the benchmark with it
    ready, _, _ = select.select([proc.stdout], [], [], start_timeout)
    line = proc.stdout.readline() if ready else f"(no line in {start_timeout:g} s)"
    if not line.startswith("serve-sim listening on "):
        proc.kill()
        code = proc.wait(timeout=30)
        proc.stdout.close()
        if not line:  # it closed its stdout: it exited, its reason on stderr above
            line = f"(it exited with {code} before saying it listens)"
        raise RuntimeError(f"serve-sim did not start: {line!r}")
    return proc, line.split()[3]


def backend(url: str, inflight: int) -> OpenAIBackend:
    settings = HttpSettings(endpoint=url, model="sim", inflight=inflight, max_tokens=64, server_kind="vllm")
    return OpenAIBackend(settings, SystemClock())


async def sequential(url: str, n: int) -> dict[str, float]:
    client = backend(url, 1)
    for _ in range(20):  # warm the connection and the code paths
        await client.complete(REQUEST)
    began_wall, began_cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        await client.complete(REQUEST)
    wall, cpu = time.perf_counter() - began_wall, time.process_time() - began_cpu
    body = client.build_body(REQUEST, None)
    await client.aclose()
    async with httpx.AsyncClient(base_url=url, timeout=60, **client_settings(url)) as raw:  # as ours
        payload = json.dumps(body).encode()
        headers = {"content-type": "application/json"}
        for _ in range(20):
            await raw.post("/v1/chat/completions", content=payload, headers=headers)
        began_cpu = time.process_time()
        for _ in range(n):
            (await raw.post("/v1/chat/completions", content=payload, headers=headers)).raise_for_status()
        raw_cpu = time.process_time() - began_cpu
    return {
        "wall_ms": 1000 * wall / n,
        "client_cpu_us": 1e6 * cpu / n,
        "httpx_cpu_us": 1e6 * raw_cpu / n,
        "asyncroll_cpu_us": 1e6 * (cpu - raw_cpu) / n,
    }


def in_process(n: int) -> float:
    """CPU µs per request of asyncroll's own work without any I/O: build the body (render, schema) and
    encode it, then decode and validate a reply (the reply serve-sim would give)."""
    client = backend("http://unused", 1)
    reply = orjson.dumps(
        {
            "choices": [{"message": {"content": '{"type":"tool","name":"add","arguments":{"a":1.5,"b":2}}'}}],
            "usage": {"prompt_tokens": 30, "completion_tokens": 15},
        }
    )

    def one() -> None:
        orjson.dumps(client.build_body(REQUEST, None))
        client._parse(REQUEST, None, 200, reply, 1)

    for _ in range(200):
        one()
    began = time.process_time()
    for _ in range(n):
        one()
    return 1e6 * (time.process_time() - began) / n


async def throughput(url: str, inflight: int, n: int) -> float:
    client = backend(url, inflight)
    limit = asyncio.Semaphore(inflight)

    async def one() -> None:
        async with limit:
            await client.complete(REQUEST)

    await asyncio.gather(*(one() for _ in range(min(n, 2 * inflight))))  # warm-up: open the pool
    began = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    elapsed = time.perf_counter() - began
    await client.aclose()
    return n / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=number_arg(int, 1, 1_000_000), default=5)
    parser.add_argument(
        "--requests",
        type=number_arg(int, 1, 1_000_000),
        default=400,
        help="requests per throughput measurement",
    )
    parser.add_argument(
        "--sequential",
        type=number_arg(int, 1, 1_000_000),
        default=300,
        help="requests per sequential measurement",
    )
    parser.add_argument("--json", type=Path, help="also write the raw figures to this new file")
    args = parser.parse_args()
    if args.json is not None and (why := result_file.refusal(args.json, "--json")):
        parser.error(why)  # checked before measuring, never overwritten
    try:
        proc, url = start_server()
    except RuntimeError as exc:  # serve-sim's own reason, if it gave one, is on stderr above
        raise SystemExit(f"bench.client: {exc}") from None
    settings = {**vars(args), "json": None if args.json is None else str(args.json)}
    raw: dict[str, Any] = {"machine": machine(), "args": settings, "sequential": [], "throughput": {}}
    try:
        raw["in_process_us"] = [in_process(2000) for _ in range(args.repeats)]
        for _ in range(args.repeats):
            raw["sequential"].append(asyncio.run(sequential(url, args.sequential)))
        for inflight in INFLIGHT:
            raw["throughput"][inflight] = [
                asyncio.run(throughput(url, inflight, max(args.requests, 2 * inflight)))
                for _ in range(args.repeats)
            ]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
            if proc.stdout is not None:
                proc.stdout.close()
    raw["load_average_after"] = os.getloadavg()
    print(f"machine: {raw['machine']}")
    print(f"load average (1/5/15 min) at the end: {raw['load_average_after']}")
    print(
        f"repeats: {args.repeats}; sequential requests per repeat: {args.sequential}; requests per "
        f"throughput measurement: {args.requests} (at least 2 × inflight)\n"
    )
    print("| per request, inflight 1 | min | median | max |\n|---|---|---|---|")
    for key, label in (
        ("wall_ms", "round trip, wall (ms)"),
        ("client_cpu_us", "client CPU, total (µs)"),
        ("httpx_cpu_us", "  of which a raw httpx POST (µs)"),
        ("asyncroll_cpu_us", "  of which asyncroll's own (µs)"),
    ):
        lo, mid, hi = quantiles([r[key] for r in raw["sequential"]])
        print(
            f"| {label} | {lo:.3f} | {mid:.3f} | {hi:.3f} |"
            if key == "wall_ms"
            else f"| {label} | {lo:.0f} | {mid:.0f} | {hi:.0f} |"
        )
    lo, mid, hi = quantiles(raw["in_process_us"])
    print(f"| asyncroll's own, in process, no I/O (µs) | {lo:.0f} | {mid:.0f} | {hi:.0f} |")
    print("\n| inflight | requests/s min | median | max |\n|---|---|---|---|")
    for inflight, values in raw["throughput"].items():
        lo, mid, hi = quantiles(values)
        print(f"| {inflight} | {lo:.0f} | {mid:.0f} | {hi:.0f} |")
    if args.json is not None:
        unwritten = result_file.write_new(args.json, json.dumps(raw, indent=2) + "\n", "--json")
        if unwritten is not None:  # it appeared meanwhile, or the disk is full: the figures go to stdout
            print(unwritten, file=sys.stderr)
            print(json.dumps(raw, indent=2))
            raise SystemExit(1)


if __name__ == "__main__":
    run_main("bench.client", main)
