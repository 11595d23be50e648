"""Helpers for the OpenAI-compatible backend's tests: a run of the real runtime against a server, a
serve-sim in a thread, the schemas and completions the tests compare with, and a scripted fake server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from asyncroll.backends.openai import HttpSettings, OpenAIBackend
from asyncroll.backends.server_model import ServerModelConfig
from asyncroll.clock import SystemClock
from asyncroll.config import build_config
from asyncroll.event_log import EventCapture
from asyncroll.runtime.run import Run, RunOutcome, prepare
from asyncroll.runtime.virtual_worker import builtin_duration, virtual_factory
from asyncroll.serve_sim.config import FaultConfig, SimConfig
from asyncroll.serve_sim.server import RunningSim, serve_in_thread
from tests.conftest import write_workload
from tests.loopback import LoopbackServer

FAST = ServerModelConfig(max_num_seqs=64, step_base_ms=0.2, step_per_seq_ms=0.0, prefill_ms_per_token=0.0)

ADD = {"name": "add", "description": "Add two numbers.", "inputs": {"a": "number", "b": "number"}}


def final_problems(n: int) -> list[dict[str, Any]]:
    return [{"id": f"p{i}", "prompt": f"Answer question {i}."} for i in range(n)]


def http_run(
    tmp_path: Path,
    problems: list[dict[str, Any]],
    url: str,
    client: OpenAIBackend | None = None,
    **settings: Any,
) -> tuple[RunOutcome, EventCapture, Path]:
    """One run of the real runtime (system clock, virtual tool workers) against ``url``."""
    name = f"run{len(list(tmp_path.glob('run*')))}"
    workload = write_workload(tmp_path / f"{name}.jsonl", problems)
    values = {
        "workload": workload,
        "output": tmp_path / name,
        "backend": "vllm",
        "model": "sim",
        "endpoint": url,
        "warmup_requests": 0,
        "circuit_failures": 0,
        **settings,
    }
    cfg = build_config(values)
    clock = SystemClock()
    capture = EventCapture()
    run = Run(
        prepare(cfg, ["test"]),
        clock,
        worker_factory=virtual_factory(clock, builtin_duration),
        backend=client,
        subscribers=(capture,),
    )
    return asyncio.run(run.execute()), capture, tmp_path / name


async def start_and_close(handler: Any, **settings: Any) -> OpenAIBackend:
    """An HTTP backend started (its kind probed) against ``handler`` (an httpx mock transport's), then
    closed; what ``start`` raised propagates in the task group's ExceptionGroup."""
    import httpx

    config = HttpSettings(endpoint="http://server", model="m", inflight=1, **settings)
    backend = OpenAIBackend(config, SystemClock(), transport=httpx.MockTransport(handler))
    async with asyncio.TaskGroup() as tg:
        try:
            await backend.start(tg)
        finally:
            await backend.aclose()  # stops the circuit watch that start() leaves running
    return backend


def serve(**settings: Any) -> contextlib.AbstractContextManager[RunningSim]:
    faults = settings.pop("faults", FaultConfig())
    return serve_in_thread(SimConfig(engine=settings.pop("engine", FAST), faults=faults, **settings))


def requests_of(running: RunningSim) -> list[dict[str, Any]]:
    return list(running.call(lambda: list(running.sim.recent_requests)))


def closed_schema(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


FINAL_SCHEMA = closed_schema({"type": {"const": "final"}, "answer": {"type": "string"}})

FINAL = json.dumps({"type": "final", "answer": "1"})


def completion(content: Any, usage: Any = None) -> dict[str, Any]:
    message = {"role": "assistant", "content": content}
    body = {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
    }
    return body | {"usage": {"prompt_tokens": 5, "completion_tokens": 3} if usage is None else usage}


class FakeOpenAI(LoopbackServer):
    """A real loopback HTTP server answering ``/v1/chat/completions`` with ``bodies`` in turn (then the
    last one again); ``/v1/models`` names vLLM, ``/health`` is 200."""

    def __init__(
        self,
        bodies: list[Any],
        get_status: dict[str, int] | None = None,
        delays: list[float] | None = None,
        key: str | None = None,
    ) -> None:
        """``delays``: seconds to wait before answering each chat request, in turn (then none); ``key``:
        an API key every request must carry (``Authorization: Bearer KEY``), else 401."""
        statuses = get_status or {}
        self.authorizations: list[str | None] = []  # each request's Authorization header
        self.chat_bodies: list[Any] = []  # each chat request's JSON body, in turn
        waits = iter(delays or [])

        served = iter(bodies)
        last = [bodies[-1]]
        seen, received = self.authorizations, self.chat_bodies

        class Handler(BaseHTTPRequestHandler):
            def send(self, obj: Any, status: int = 200) -> None:
                data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                if isinstance(obj, bytes):  # raw bytes are sent as a gzip body that is not gzip
                    self.send_header("content-encoding", "gzip")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def refused(self) -> bool:
                if self.path == "/metrics":  # as vLLM: its metrics are not behind the API key
                    return False
                seen.append(self.headers.get("authorization"))
                if key is None or self.headers.get("authorization") == f"Bearer {key}":
                    return False
                self.send({"error": {"message": "invalid API key"}}, 401)
                return True

            def do_GET(self) -> None:
                if self.refused():
                    return
                body = {"data": [{"id": "sim", "owned_by": "vllm"}]} if self.path == "/v1/models" else {}
                self.send(body, statuses.get(self.path, 200))

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.refused():
                    return
                received.append(json.loads(body))
                time.sleep(next(waits, 0.0))
                last[0] = next(served, last[0])
                self.send(last[0])

            def log_message(self, *args: Any) -> None:
                return None

        super().__init__(Handler)
