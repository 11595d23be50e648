"""serve-sim in a thread for the tests that talk to it over HTTP: ``sim`` (a server of a fast engine and
an ``httpx`` client to it), ``body`` (a chat request), ``fmt`` (a JSON-schema response format) and
``TOOL_SCHEMA`` (a tool call or a final answer)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from asyncroll.backends.server_model import ServerModelConfig
from asyncroll.serve_sim.config import FaultConfig, SimConfig
from asyncroll.serve_sim.server import RunningSim, serve_in_thread

FAST = ServerModelConfig(max_num_seqs=64, step_base_ms=0.2, step_per_seq_ms=0.0, prefill_ms_per_token=0.0)
TOOL_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {
            "type": "object",
            "properties": {
                "type": {"const": "tool"},
                "name": {"const": "add"},
                "arguments": {
                    "type": "object",
                    "properties": {
                        "a": {"type": "integer"},
                        "xs": {"type": "array", "items": {"type": "number"}},
                    },
                    "required": ["a", "xs"],
                    "additionalProperties": False,
                },
            },
            "required": ["type", "name", "arguments"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {"type": {"const": "final"}, "answer": {"type": "string"}},
            "required": ["type", "answer"],
            "additionalProperties": False,
        },
    ]
}


def fmt(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "agent_action", "strict": True, "schema": schema}}


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "sim", "messages": [{"role": "user", "content": "x" * 40}], **extra}


@contextmanager
def sim(**settings: Any) -> Iterator[tuple[RunningSim, httpx.Client]]:
    faults = settings.pop("faults", FaultConfig())
    config = SimConfig(engine=settings.pop("engine", FAST), faults=faults, **settings)
    with serve_in_thread(config) as running, httpx.Client(base_url=running.url, timeout=20) as client:
        yield running, client
