"""serve-sim's streamed replies (``"stream": true``): Server-Sent Events, one chunk per decode step.

The shape is vLLM's (``chat_completion_stream_generator``): the status and headers go at once; at the
first token a chunk with ``{"role": "assistant", "content": ""}`` (and with ``echo``, one with the echoed
text); then, at the end of every engine step
that generated a token for this request, a chunk with its text (``""`` for a token past the reply's text,
as ``min_tokens`` or ``ignore_eos`` pad it); the last token's chunk carries ``finish_reason``; with
``stream_options.include_usage`` a chunk with no choices and the ``usage``; then ``data: [DONE]``.
``continuous_usage_stats`` (with ``include_usage``) puts the usage so far in every chunk. Tokens that a
slow reader let pile up go out together in one chunk, as vLLM merges a request's outputs. Token *k* of the
reply holds its characters up to ``chars(k)`` (:func:`~asyncroll.serve_sim.sizes.chars`), the last token
the rest, so the chunks add up to the text a non-streamed reply would hold.

A client that disconnects aborts the request as a non-streamed one does: the sequence leaves the engine
and the request counts under 499. The ``truncate`` fault cuts the stream after about half of its tokens
(a FIN, no ``[DONE]``: counted ``truncated``); ``malformed`` sends one broken event there and goes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from asyncroll.backends.server_model import BatchingServer
from asyncroll.serve_sim import sizes

T = TypeVar("T")

#: What ``/sim/stats`` counts a request under: its status, or ``reset``/``truncated`` (no complete response)
Outcome = int | str
CLIENT_CLOSED = 499  # nginx's "client closed request"; never sent: nobody is left to read it


def stream_settings(body: dict[str, Any]) -> tuple[bool, bool, bool]:
    """``(stream, include_usage, continuous_usage_stats)`` of a body that
    :func:`~asyncroll.serve_sim.fields.checked_fields` checked (``stream_options`` without ``stream`` is
    its 400): as vLLM's ``should_include_usage``, ``stream_options`` given asks for the usage chunk
    unless ``include_usage`` is false (``{}`` asks for it), and the usage in every chunk only with it."""
    stream = bool(body.get("stream"))
    options = body.get("stream_options")
    if not stream or not options:
        return stream, False, False
    include_usage = bool(options.get("include_usage"))
    return True, include_usage, include_usage and bool(options.get("continuous_usage_stats"))


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """What the request handler decided; the stream plays it out."""

    request_id: str
    created: int
    model: str
    prompt_tokens: int
    tokens: int
    content: str
    finish: str
    stop_reason: str | None  # the stop string that ended the reply (vLLM's ``stop_reason``), else None
    chars_per_token: float
    include_usage: bool
    continuous_usage: bool
    fault: str | None  # "truncate", "malformed" or None
    role: str = "assistant"  # the reply's: the last message's with ``add_generation_prompt`` false
    echo: str = ""  # vLLM's ``echo``: sent in a chunk of its own after the role chunk (not a token)

    def text(self, done: int, now: int) -> str:
        """The characters of tokens ``done + 1 … now``; the last token holds the rest."""
        end = len(self.content) if now >= self.tokens else sizes.chars(now, self.chars_per_token)
        return self.content[sizes.chars(done, self.chars_per_token) : end]


class _Progress:
    """Tokens generated so far, and an event set when that changes."""

    def __init__(self) -> None:
        self.count = 0
        self.changed = asyncio.Event()

    def advance(self, count: int) -> None:
        self.count = count
        self.changed.set()


class StreamHost(Protocol):
    """What a stream needs of the server it runs in (:class:`~asyncroll.serve_sim.app.SimApp`)."""

    engine: BatchingServer
    stopping: bool  # set as the server starts to stop: a stream cancelled from then on was cut by it

    def reserve(self, seq: int, tokens: int) -> AbstractContextManager[None]:
        """Hold the request's tokens in the KV cache while its sequence is in the engine."""

    def stream_ended(self, outcome: Outcome) -> None:
        """Count the request (``/sim/stats``) and take it out of ``inflight``."""

    def transport(self, scope: Scope) -> asyncio.BaseTransport | None:
        """The request's connection, if the server tracks it."""

    def close_connection(self, scope: Scope, *, now: bool = False) -> None:
        """End the request's connection with a FIN (the ``truncate`` fault); ``now`` (the server stops):
        with a reset where what was written is still buffered, held back by a reader that stopped."""


class StreamReply(Response):
    """The SSE reply to one request (``seq``): runs its sequence through the engine while it streams, and
    tells the host its outcome once, whatever ends the stream (200; 499: the client left; ``truncated``:
    the truncate fault or the server's shutdown)."""

    def __init__(self, plan: StreamPlan, seq: int, host: StreamHost) -> None:
        super().__init__()
        self.plan, self._seq, self._host = plan, seq, host
        self._told = False
        self._transport: asyncio.BaseTransport | None = None

    def _end(self, outcome: Outcome) -> None:
        """Tell the outcome, once: before the stream's last bytes go out, as a reply without ``stream`` is
        counted before it is sent (a client that reads ``[DONE]`` then ``/sim/stats`` finds it there)."""
        if not self._told:
            self._told = True
            self._host.stream_ended(outcome)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        outcome: Outcome = "truncated"  # cut by anything unforeseen
        self._transport = self._host.transport(scope)
        try:
            if not await until_disconnected(receive, self._stream(scope, send)):
                outcome = CLIENT_CLOSED
        except asyncio.CancelledError:
            if not self._host.stopping:
                raise
            # uvicorn cancels what outlives its graceful shutdown: the stream was cut there (no [DONE]),
            # which its client sees as a connection closed mid-body; not an error of the application
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            # end the connection here, as the truncate fault does: uvicorn, finding a response neither
            # complete nor disconnected, logged "ERROR: ASGI callable returned without completing
            # response." for every stream the stop cut (a reset if a reader that stopped reading holds
            # the FIN back: what it did not read is lost as the process exits anyway)
            self._host.close_connection(scope, now=True)
            await asyncio.sleep(0)
        finally:
            self._end(outcome)

    async def _stream(self, scope: Scope, send: Send) -> bool:
        """True once the stream ended (whole or cut by a fault); False: the client left."""
        plan = self.plan
        progress = _Progress()
        generation = asyncio.ensure_future(self._generate(progress))
        generation.add_done_callback(lambda _: progress.changed.set())
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            sent = 0
            cut = max(1, plan.tokens // 2) if plan.fault is not None else None
            while sent < plan.tokens:
                await progress.changed.wait()
                progress.changed.clear()
                if generation.done():
                    generation.result()  # the engine's own failure, if any, ends the stream
                now = progress.count
                if now <= sent:
                    continue
                events = []
                if sent == 0:
                    events.append(self._chunk({"role": plan.role, "content": ""}, None, 0))
                    if plan.echo:
                        events.append(self._chunk({"content": plan.echo}, None, 0))
                finish = plan.finish if now >= plan.tokens else None
                events.append(self._chunk({"content": plan.text(sent, now)}, finish, now))
                faulty = cut is not None and sent < cut <= now
                sent = now
                if faulty and plan.fault == "truncate":  # what was generated so far, then a FIN
                    await self._send(send, events, more=True)
                    self._end("truncated")
                    self._host.close_connection(scope)
                    await asyncio.sleep(0)  # the server sees the connection lost before the app returns
                    return True
                if faulty:  # "malformed": one broken event, then the stream goes on
                    events.append(
                        b'data: {"id": "' + plan.request_id.encode() + b'", "cho<!-- upstream error -->'
                    )
                await self._send(send, events, more=True)
                if self._left():
                    return False
            await generation
            if self._left():
                return False
            events = []
            if plan.include_usage:
                usage = self._usage(plan.tokens)
                events.append(_event({**self._envelope(), "choices": [], "usage": usage}))
            events.append(b"data: [DONE]")
            self._end(200)
            await self._send(send, events, more=False)
            return True
        finally:
            if not generation.done():
                generation.cancel()
            await asyncio.gather(generation, return_exceptions=True)

    def _left(self) -> bool:
        """The client closed the connection while a send waited for it to read (a stopped reader that
        left): uvicorn drops what is sent after that, so the stream would otherwise run on to 200."""
        return self._transport is not None and self._transport.is_closing()

    async def _generate(self, progress: _Progress) -> None:
        """The sequence in the engine, its KV reserved while it is there: not while a slow reader is still
        sent its last chunks (the KV gauge counts the oldest reservations, as many as run)."""
        plan = self.plan
        with self._host.reserve(self._seq, plan.prompt_tokens + plan.tokens):
            await self._host.engine.generate(plan.prompt_tokens, plan.tokens, on_token=progress.advance)

    def _envelope(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "id": plan.request_id,
            "object": "chat.completion.chunk",
            "created": plan.created,
            "model": plan.model,
        }

    def _usage(self, completion: int) -> dict[str, int]:
        prompt = self.plan.prompt_tokens
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _chunk(self, delta: dict[str, str], finish: str | None, tokens: int) -> bytes:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if finish is not None:  # as vLLM: the finish chunk says which stop string ended the reply (or null)
            choice["stop_reason"] = self.plan.stop_reason
        chunk: dict[str, Any] = {**self._envelope(), "choices": [choice]}
        if self.plan.continuous_usage:
            chunk["usage"] = self._usage(tokens)
        return _event(chunk)

    @staticmethod
    async def _send(send: Send, events: list[bytes], *, more: bool) -> None:
        body = b"".join(event + b"\n\n" for event in events)
        await send({"type": "http.response.body", "body": body, "more_body": more})


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk)


async def until_disconnected(receive: Receive, handler: Coroutine[Any, Any, T]) -> T | None:
    """Run ``handler`` until it ends or the client goes away (None), as vLLM aborts a request whose client
    disconnected: the handler is cancelled, which withdraws its sequence from the engine's running batch
    or waiting queue, so a dropped request stops costing decode steps at once.

    The request body must already be read: after it, the ASGI ``receive`` returns only when the
    connection is lost (``http.disconnect``)."""
    task = asyncio.ensure_future(handler)

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)
    if task.cancelled():
        return None
    return task.result()
