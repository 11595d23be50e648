r"""Model-only serving measurement: requests/s, output tokens/s and latency percentiles at a fixed
concurrency against any OpenAI-compatible endpoint (no tools, no CPU work), for comparing serving stacks.

    python scripts/serving_ablation.py --endpoint http://127.0.0.1:8000 --model NAME \
        --workload data/lcb_stdin_219_seed20260927.jsonl --concurrency 4 --requests 64 \
        --max-tokens 512 [--fixed-length] [--repeats 3] [--warmup 4] [--output result.json]

Prompts are the workload's ``prompt`` fields in file order (cycled when more requests than problems), so
the same workload gives the same request sequence on every stack. ``--fixed-length`` asks every
request for exactly ``--max-tokens`` tokens (``min_tokens`` + ``ignore_eos``, vLLM/SGLang), which
removes the model's own stopping decisions from a comparison of stacks. Each repeat is in the JSON
(``--output``); the table printed gives min / median / max over repeats. See SERVING_ABLATION.md.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import json
import math
import os
import platform
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx

from asyncroll.backends.exchange import MAX_RESPONSE_BYTES
from asyncroll.cpus import usable_cpus
from asyncroll.http_read import ResponseTooLarge, read_bounded, request_deadline_s
from asyncroll.json_checks import not_utf8
from asyncroll.outputs import result_file
from asyncroll.outputs.receipt import cpu_model


def load_prompts(path: Path, count: int, data: bytes | None = None) -> list[str]:
    """The first ``count`` prompts of the workload (``data``, the file's bytes, read here if not given),
    cycled; errors name the file and line."""
    prompts: list[str] = []
    # decoded whole: a text stream's UnicodeDecodeError gives the byte's place in its 8 KiB chunk
    with io.StringIO((path.read_bytes() if data is None else data).decode("utf-8"), newline=None) as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                prompt = json.loads(line)["prompt"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise SystemExit(f"{path}:{line_no}: not a workload line with a 'prompt'") from None
            if not isinstance(prompt, str) or not prompt:
                raise SystemExit(f"{path}:{line_no}: prompt must be a non-empty string")
            prompts.append(prompt)
    if not prompts:
        raise SystemExit(f"{path}: no prompts")
    return [prompts[i % len(prompts)] for i in range(count)]


TEMPERATURE = 0  # greedy: the same prompt gives the same reply on a deterministic stack


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile of an already sorted list (numpy's default method)."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q / 100 * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


async def one_pass(args: argparse.Namespace, prompts: list[str], client: httpx.AsyncClient) -> dict[str, Any]:
    """Send every prompt with at most ``concurrency`` in flight; time each request and the whole pass."""
    semaphore = asyncio.Semaphore(args.concurrency)
    latencies: list[float] = []
    tokens: list[int] = []
    errors: dict[str, int] = {}

    async def request(prompt: str) -> None:
        body: dict[str, Any] = {
            "model": args.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": args.max_tokens,
            "temperature": TEMPERATURE,
            "seed": args.seed,
        }
        if args.fixed_length:
            body.update(min_tokens=args.max_tokens, ignore_eos=True)

        def failed(kind: str) -> None:
            errors[kind] = errors.get(kind, 0) + 1

        async with semaphore:
            began = time.perf_counter()
            try:
                response, content = await read_bounded(
                    client,
                    client.build_request("POST", "/v1/chat/completions", json=body),
                    limit_bytes=MAX_RESPONSE_BYTES,
                    deadline_s=request_deadline_s(args.request_timeout),
                )
            except (httpx.HTTPError, ResponseTooLarge, TimeoutError) as exc:
                return failed(type(exc).__name__)
            elapsed = time.perf_counter() - began
        if response.status_code != 200:
            return failed(f"http_{response.status_code}")
        try:
            reply = json.loads(content)
            usage = reply.get("usage") or {}  # not an object (no .get): not a completion
            completion_tokens = int(usage.get("completion_tokens") or 0)
        except (ValueError, TypeError, AttributeError):
            return failed("bad_response")
        latencies.append(elapsed)
        tokens.append(completion_tokens)

    began = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for prompt in prompts:
            group.create_task(request(prompt))
    wall = time.perf_counter() - began
    ordered = sorted(latencies)
    return {
        "wall_s": wall,
        "ok": len(latencies),
        "errors": errors,
        "requests_per_s": len(latencies) / wall,
        "output_tokens_per_s": sum(tokens) / wall,
        "output_tokens": sum(tokens),
        "latency_s": {f"p{q}": percentile(ordered, q) if ordered else None for q in (50, 90, 99)}
        | {"min": ordered[0] if ordered else None, "max": ordered[-1] if ordered else None},
    }


def machine() -> dict[str, Any]:
    """Where the client ran: a serving figure belongs next to its machine (SERVING_ABLATION.md)."""
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable_cpus(),  # taskset, a cpuset, a cgroup CPU quota: fewer than the machine's
    }


def versions() -> dict[str, str | None]:
    """The client's own package versions (the server's are in its log and in arm.json)."""
    out: dict[str, str | None] = {}
    for name in ("asyncroll", "httpx"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    data = args.workload.read_bytes()  # once: hashed as read, not as the file may be after measuring
    prompts = load_prompts(args.workload, args.requests, data)
    # No connection limit of the client's own: the semaphore bounds concurrency, and read_bounded's
    # deadline can leak a slot of a limited pool (asyncroll.http_read).
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=args.concurrency)
    timeout = httpx.Timeout(args.request_timeout)
    async with httpx.AsyncClient(
        base_url=args.endpoint, limits=limits, timeout=timeout, trust_env=False
    ) as client:
        if args.warmup:
            await one_pass(args, prompts[: args.warmup], client)
        passes = [await one_pass(args, prompts, client) for _ in range(args.repeats)]
    return {
        "endpoint": args.endpoint,
        "model": args.model,
        "workload": str(args.workload),
        "workload_sha256": hashlib.sha256(data).hexdigest(),
        "concurrency": args.concurrency,
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "fixed_length": args.fixed_length,
        # the rest of what was sent and how, so that the file alone says how to repeat it
        "temperature": TEMPERATURE,
        "seed": args.seed,
        "warmup": args.warmup,
        "request_timeout_s": args.request_timeout,
        "repeats": passes,
        "summary": {
            key: spread([p[key] for p in passes]) for key in ("requests_per_s", "output_tokens_per_s")
        }
        | {
            f"latency_{q}_s": spread([p["latency_s"][q] for p in passes if p["latency_s"][q] is not None])
            for q in ("p50", "p90", "p99")
            if any(p["latency_s"][q] is not None for p in passes)
        },
        "machine": machine(),
        "versions": versions(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--endpoint", required=True, help="Server base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="The served model name.")
    parser.add_argument("--workload", type=Path, required=True, help="Workload JSONL (prompts).")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--requests", type=int, default=64, help="Requests per repeat.")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--fixed-length", action="store_true", help="min_tokens = max_tokens, ignore_eos.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=4, help="Untimed requests first.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--request-timeout", type=float, default=600.0)
    parser.add_argument(
        "--output", type=Path, help="Write the full result as JSON to this new file (its folder must exist)."
    )
    args = parser.parse_args(argv)
    for name in ("concurrency", "requests", "max_tokens", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    if not (math.isfinite(args.request_timeout) and args.request_timeout > 0):
        parser.error("--request-timeout must be a finite number > 0")
    try:  # read before measuring, as the measurement will read it
        load_prompts(args.workload, 1)
    except OSError as exc:
        parser.error(f"--workload {args.workload}: cannot read ({exc.strerror or exc})")
    except UnicodeDecodeError as exc:
        parser.error(f"--workload {args.workload}: {not_utf8(exc)}")
    if args.output is not None and (why := result_file.refusal(args.output, "--output")):
        parser.error(why)  # checked before minutes of measuring, never overwritten
    result = asyncio.run(measure(args))
    unwritten = None
    if args.output:  # one that appeared meanwhile, or a full disk: the JSON goes to stdout below
        unwritten = result_file.write_new(args.output, json.dumps(result, indent=2) + "\n", "--output")
    s = result["summary"]
    host, pkgs = result["machine"], result["versions"]
    print(
        f"machine: {host['cpu']}, {host['logical_cpus']} logical CPUs"
        + (f" ({host['usable_cpus']} usable)" if host["usable_cpus"] != host["logical_cpus"] else "")
        + f", Python {host['python']}, "
        f"{host['platform']}; " + ", ".join(f"{name} {v or 'not installed'}" for name, v in pkgs.items())
    )
    print(
        f"{args.endpoint} model {args.model}: concurrency {args.concurrency}, {args.requests} requests x "
        f"{args.repeats} repeats, max_tokens {args.max_tokens}{' fixed' if args.fixed_length else ''}"
    )
    print("| metric | min | median | max |\n|---|---|---|---|")
    for key, v in s.items():
        print(f"| {key} | {v['min']:.4g} | {v['median']:.4g} | {v['max']:.4g} |")
    failed = sum(sum(p["errors"].values()) for p in result["repeats"])
    if failed:
        print(f"errors: {[p['errors'] for p in result['repeats']]}", file=sys.stderr)
    if unwritten is not None:
        print(unwritten, file=sys.stderr)
        print(json.dumps(result, indent=2))
    return 1 if failed or unwritten else 0


if __name__ == "__main__":
    sys.exit(main())
