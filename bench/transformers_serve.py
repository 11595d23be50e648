"""A real engine nobody here wrote: Hugging Face ``transformers serve`` on CPU, driven in replay mode.

Builds a tiny random-weight Llama (``scripts/make_tiny_llama.py``; offline), starts
``transformers serve MODEL --device cpu --continuous-batching`` with a sized KV cache in its own process
group, waits for ``/health``, then runs a scripted workload with ``asyncroll run --backend openai
--server-kind transformers --replay`` at each inflight limit (real HTTP, real decoding of the scripted
token budgets) and reports per setting: completed trajectories, model requests/s, median and p95 model
latency. The server is stopped (its whole group) at the end; an engine that does not start, or a client
run that writes no summary, ends the bench with why (the engine's or the client's last output).

Needs a Python environment with the engine: ``python3 -m venv .venv-hf && .venv-hf/bin/pip install
torch==2.13.0 'transformers[serving]'`` (pin torch: its CPU wheel; an unpinned one pulls a CUDA build).
Run: ``python -m bench.transformers_serve --hf-python .venv-hf/bin/python [--inflight 1,4,16] [--n 32]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from asyncroll.experiment import listener
from bench.common import machine, number_arg, quantiles, run_main, scratch, sizes_arg, write_workload

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Engine:
    url: str
    model: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        """TERM the server's whole process group, then KILL after a grace period."""
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_model(hf_python: Path, out: Path) -> Path:
    subprocess.run(
        [str(hf_python), str(REPO / "scripts" / "make_tiny_llama.py"), str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


def start_engine(hf_python: Path, model: Path, log: Path, ready_timeout: float = 180.0) -> Engine:
    """Start ``transformers serve`` (offline, CPU, continuous batching, a small sized KV cache)."""
    port = free_port()
    cli = hf_python.parent / "transformers"
    argv = [str(cli), "serve", str(model), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    argv += ["--continuous-batching", "--cb-num-blocks", "128", "--cb-block-size", "32"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with log.open("wb") as sink:
        process = subprocess.Popen(
            argv, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    engine = Engine(f"http://127.0.0.1:{port}", str(model), process, log)
    try:  # its own session: a Ctrl-C here reaches only this process, which must stop it
        wait_ready(engine, ready_timeout)
    except BaseException:
        engine.stop()
        raise
    return engine


def wait_ready(engine: Engine, ready_timeout: float) -> None:
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if engine.process.poll() is not None:
            raise RuntimeError(
                f"transformers serve exited ({engine.process.returncode}); "
                f"log: {engine.log.read_text()[-2000:]}"
            )
        try:
            with httpx.stream("GET", f"{engine.url}/health", timeout=2) as health:  # the status only
                if health.status_code == 200:
                    check_listener(engine)
                    return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(
        f"transformers serve not ready within {ready_timeout:g}s; log: {engine.log.read_text()[-2000:]}"
    )


def check_listener(engine: Engine) -> None:
    """The port is free only until the engine binds it, and the engine loads for a while before it does:
    the process that answered must be the engine (or one it started), not a neighbour on that port."""
    url = urlsplit(engine.url)
    try:
        listener.owner(engine.process.pid, None, url.hostname or "127.0.0.1", url.port or 80)
    except listener.ForeignListener as exc:
        ours = f"transformers serve (pid {engine.process.pid})"
        what = (
            f"{ours} listens there, but so does {exc} (a port shared with SO_REUSEPORT)"
            if exc.shared
            else f"{ours} does not listen there: {exc} holds that port"
        )
        raise RuntimeError(f"{url.netloc} answered, but {what}; stop it and run again") from None


def workload(n: int, tool_tokens: int = 24, final_tokens: int = 16) -> list[dict[str, Any]]:
    """Each trajectory: a tool call (``add``) then a final answer; the budgets are what the server decodes."""
    return [
        {
            "id": f"t{i}",
            "prompt": f"Add {i} and {i + 1}, then answer.",
            "tools": [{"name": "add"}],
            "script": [
                {
                    "type": "tool",
                    "name": "add",
                    "arguments": {"a": i, "b": i + 1},
                    "output_tokens": tool_tokens,
                },
                {"type": "final", "answer": str(2 * i + 1), "output_tokens": final_tokens},
            ],
        }
        for i in range(n)
    ]


def run_client(
    engine: Engine, workload_path: Path, out: Path, inflight: int, *extra: str, probe: bool = False
) -> dict[str, Any]:
    """One ``asyncroll run`` against the engine; ``probe`` leaves its kind to the probe of ``/v1/models``."""
    argv = [
        sys.executable,
        "-m",
        "asyncroll.cli",
        "run",
        "--workload",
        str(workload_path),
        "--output",
        str(out),
    ]
    argv += [
        "--backend",
        "openai",
        *([] if probe else ["--server-kind", "transformers"]),
        "--model",
        engine.model,
    ]
    argv += ["--endpoint", engine.url, "--max-inflight-model-requests", str(inflight)]
    argv += ["--max-active-trajectories", str(max(inflight, 1) * 2), "--cpu-workers", "2", "--no-progress"]
    argv += ["--request-timeout", "120", *extra]
    began = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - began
    if not (out / "summary.json").exists():
        raise RuntimeError(f"client failed ({result.returncode}): {result.stderr[-2000:]}")
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    return {
        "returncode": result.returncode,
        "stderr": result.stderr,
        "wall_s": wall,
        "summary": summary,
        "events": events,
        **client_figures(summary, events),
    }


def client_figures(summary: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any]:
    """Requests/s, the model latency's p50 and p95, and the completion tokens of one client run.

    The quantiles are summary.json's own (``latency.model_latency_s``: finished requests, linear
    interpolation between ranks, as MEASUREMENT.md defines them), not a second definition here: the p95
    of 32 requests once came from the 30th smallest (a floor of the rank) instead of between the 30th
    and the 31st. A value the run could not measure stays None."""
    finished = [e for e in events if e["event"] == "model_finished"]
    tokens = [e["completion_tokens"] for e in finished if e.get("completion_tokens") is not None]
    makespan = summary["makespan_s"]
    latency = summary["latency"]["model_latency_s"]
    return {
        "requests": len(finished),
        "requests_per_s": len(finished) / makespan if makespan else None,
        "latency_p50_s": latency["p50"],
        "latency_p95_s": latency["p95"],
        "completion_tokens": tokens,
    }


def table_row(inflight: int, rows: list[dict[str, Any]], n: int) -> str:
    """One line of the table: medians over the repeats (the true median: for an even count the mean of
    the two middle values, not the upper one), "unknown" where a repeat could not measure a value."""

    def spread(values: list[float | None], spec: str) -> str:
        if not values or any(v is None for v in values):
            return "unknown"
        lo, mid, hi = quantiles([float(v) for v in values if v is not None])
        return " / ".join(format(x, spec) for x in (lo, mid, hi))

    def middle(values: list[float | None]) -> str:
        known = [v for v in values if v is not None]
        return "unknown" if not known or len(known) < len(values) else f"{statistics.median(known):.3f}"

    done = statistics.median(r["summary"]["counts"]["completed"] for r in rows)
    return (
        f"| {inflight} | {done:g} / {n} | {spread([r['requests_per_s'] for r in rows], '.1f')} "
        f"| {middle([r['latency_p50_s'] for r in rows])} | {middle([r['latency_p95_s'] for r in rows])} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--hf-python",
        type=Path,
        required=True,
        help="the Python of an environment with torch and transformers[serving] (its bin/ has transformers)",
    )
    parser.add_argument("--inflight", type=sizes_arg, default=[1, 4, 16], help="comma-separated limits")
    parser.add_argument("--n", type=number_arg(int, 1, 1_000_000), default=32)
    parser.add_argument("--repeats", type=number_arg(int, 1, 1_000_000), default=3)
    args = parser.parse_args()
    for program in (args.hf_python, args.hf_python.parent / "transformers"):
        if not os.access(program, os.X_OK) or program.is_dir():
            parser.error(f"--hf-python {args.hf_python}: {program} is not an executable file")
    tmp = scratch("hf-")  # the model, the server's log and every run: removed at exit
    try:
        model = build_model(args.hf_python, tmp / "tiny-llama")
    except subprocess.CalledProcessError as exc:
        why = exc.stderr.decode(errors="replace")[-2000:]
        raise SystemExit(f"error: building the model with {args.hf_python} failed:\n{why}") from None
    path = write_workload(tmp / "workload.jsonl", workload(args.n))
    try:
        engine = start_engine(args.hf_python, model, tmp / "server.log")
    except RuntimeError as exc:  # it exited, never answered /health, or another process holds its port
        raise SystemExit(f"error: {exc}") from None
    print(f"machine: {machine()}")
    print(
        f"transformers serve (tiny random Llama, CPU, continuous batching); {args.n} trajectories × 2 turns"
    )
    print("| inflight | completed | requests/s (min / med / max) | latency p50 s (median) | p95 s (median) |")
    print("|---:|---:|---|---:|---:|")
    try:
        for inflight in args.inflight:
            rows = [
                run_client(engine, path, tmp / f"run-{inflight}-{r}", inflight, "--replay")
                for r in range(args.repeats)
            ]
            print(table_row(inflight, rows, args.n))
    except RuntimeError as exc:  # a client run that wrote no summary
        raise SystemExit(f"error: {exc}") from None
    finally:
        engine.stop()


if __name__ == "__main__":
    run_main("bench.transformers_serve", main)
