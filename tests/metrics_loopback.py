"""A real loopback ``/metrics`` server (scripted per scrape, or answering hostilely), an idle vLLM's
exposition for it, and a run on the real clock to point at it."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from asyncroll.clock import SystemClock
from asyncroll.config import build_config
from asyncroll.event_log import EventCapture
from asyncroll.runtime.run import Run, RunOutcome, prepare
from asyncroll.runtime.virtual_worker import builtin_duration, virtual_factory
from asyncroll.schemas import SummaryModel
from tests.conftest import write_workload
from tests.loopback import LoopbackServer, trickle

#: A hostile answer: ``raw(handler, n, closing)`` writes the n-th scrape's whole response itself and
#: returns True, or returns False to leave it to ``render``; ``closing`` is set when the server shuts down.
Raw = Callable[[BaseHTTPRequestHandler, int, threading.Event], bool]


class MetricsServer(LoopbackServer):
    """A loopback ``/metrics`` server; ``render(n)`` gives (status, body) of the n-th scrape, unless
    ``raw(handler, n)`` answered it (returned True). ``closing`` is set at shutdown, for a raw answer that
    never ends by itself."""

    def __init__(self, render: Callable[[int], tuple[int, str]], raw: Raw | None = None) -> None:
        self.render = render
        self.scrapes = 0
        self.closing = threading.Event()
        owner = self
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with lock:
                    owner.scrapes += 1
                    n = owner.scrapes
                if raw is not None and raw(self, n, owner.closing):
                    return
                status, body = owner.render(n)
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                return None

        super().__init__(Handler)
        self.url += "/metrics"

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        super().__exit__(*exc)


def idle_vllm(n: int) -> tuple[int, str]:
    """An idle vLLM server whose token counters still grow (prefix-cached work from elsewhere), with a
    busy *other* model that the model filter must ignore, and a NaN KV-cache reading every 4th scrape."""
    kv = "NaN" if n % 4 == 0 else "0.125"
    return 200, (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="sim"} 0.0\n'
        'vllm:num_requests_running{engine="0",model_name="busy"} 7.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="sim"} 0.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="busy"} 3.0\n'
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="sim"}} {kv}\n'
        "# TYPE vllm:prompt_tokens_total counter\n"
        f'vllm:prompt_tokens_total{{engine="0",model_name="sim"}} {100.0 * n}\n'
        f'vllm:generation_tokens_total{{engine="0",model_name="sim"}} {10.0 * n}\n'
    )


def real_clock_run(
    tmp_path: Path, problems: list[dict[str, Any]], **settings: Any
) -> tuple[RunOutcome, EventCapture, dict[str, Any]]:
    """A run on the real clock with virtual workers (no processes): real sockets, real time."""
    workload = write_workload(tmp_path / "w.jsonl", problems)
    cfg = build_config({"workload": workload, "output": tmp_path / "run", **settings})
    clock = SystemClock()
    capture = EventCapture()
    run = Run(
        prepare(cfg, ["test"]),
        clock,
        worker_factory=virtual_factory(clock, builtin_duration),
        subscribers=(capture,),
    )
    outcome = asyncio.run(run.execute())
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    SummaryModel.model_validate(summary)
    return outcome, capture, summary


def trickle_metrics(handler: BaseHTTPRequestHandler, closing: threading.Event) -> bool:
    trickle(handler, closing, "text/plain; version=0.0.4", every_s=0.02)
    return True


def probe_and_read(url: str, model: str, times: list[float]) -> tuple[dict[str, Any], list[Any]]:
    """The real metrics source over loopback: its probe's detail, then one sample per time in ``times``
    (the clock each read sees)."""
    from asyncroll.telemetry.server_metrics import ServerMetricsSource

    clock = iter(times)

    async def go() -> tuple[dict[str, Any], list[Any]]:
        source = ServerMetricsSource(url, model=model, timeout=5.0)
        try:
            detail = await source.probe(5.0)
            return detail, [await source.read(lambda: next(clock)) for _ in times]
        finally:
            await source.aclose()

    return asyncio.run(go())
