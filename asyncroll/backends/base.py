"""The backend interface: one model request in, one validated action out."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from asyncroll.workload import Action, Problem


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One model turn. ``messages`` is the conversation so far in asyncroll's own form: the user prompt,
    then ``{"role": "assistant", "action": Action}`` and ``{"role": "tool", "content": str}`` entries
    (and a one-repair protocol's ``user`` repair message). A backend renders it for its server (the
    scripted backend needs only ``turn``); an assistant entry's ``response`` is its :class:`ModelResponse`
    (whose ``text`` is sent back where the action was read from it); the other keys of an entry
    (``turn``, a tool's ``name``) are the transcript's (:mod:`asyncroll.runtime.transcript`)."""

    trajectory_id: str
    problem: Problem
    turn: int
    messages: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class ModelResponse:
    action: Action
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None  # the server's, when it sent one (``stop``, ``length``, ...)
    #: The server's completion text exactly as received (its text parts joined); None when no server
    #: wrote one: the scripted and simulated backends take the action from the script, and a text made
    #: up from it would pass for a model's in a transcript.
    text: str | None = None
    #: The action was read from ``text`` (an agent's turn with an HTTP server; not a replay, whose action
    #: is the script's): later turns send ``text`` back as the model's turn, exactly as it was written.
    read_from_text: bool = False


class Backend(Protocol):
    name: str

    async def start(self, tg: asyncio.TaskGroup) -> None:
        """Start anything the backend runs in the background (as tasks of the run's group)."""
        ...

    async def warmup(self, requests: int) -> int:
        """Send untimed warm-up requests before the measurement clock starts; returns how many were sent."""
        ...

    async def complete(self, request: ModelRequest) -> ModelResponse: ...

    async def aclose(self) -> None: ...
