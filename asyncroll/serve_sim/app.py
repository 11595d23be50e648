"""The serve-sim ASGI app: OpenAI chat completions served by the batching engine in real time.

Request flow of ``POST /v1/chat/completions``: validate the body (400/404 with an OpenAI error object,
as vLLM answers) → draw this request's faults → optional slow-down → choose the reply → run a sequence of
the reply's size through :class:`~asyncroll.backends.server_model.BatchingServer` → answer with the
OpenAI response shape, ``usage`` included — or, with ``"stream": true``, a stream of chunks as the engine
decodes (:mod:`asyncroll.serve_sim.stream`). A client that disconnects first (a timeout, a cancelled
trajectory, Ctrl-C) aborts its request as vLLM does: the sequence leaves the batch at once and the request
is counted under status 499 in ``/sim/stats``. A connection the server itself drops (``--reset-rate``,
``--truncate-rate``) sent no complete response: it is counted under ``reset`` or ``truncated``, never
under the status line a truncated reply began with.

**The reply.** If the request carries ``X-Asyncroll-Action`` (asyncroll's replay mode puts the scripted
action there), that action is echoed. Otherwise, with a ``json_schema`` response format, a schema-valid
instance is drawn from a seeded policy (:mod:`asyncroll.serve_sim.policy`); with no schema the simulated
model still speaks asyncroll's protocol and answers ``{"type": "final", "answer": ...}`` as text. With
enforcement on (the default, like vLLM's guided decoding) an echoed action that violates the request's
schema is refused with 400; with ``--no-enforce-schema`` (like ``transformers serve``) it is sent as is,
and ``--invalid-action-rate`` makes some replies plain prose.

**Sizes** (:mod:`asyncroll.serve_sim.sizes`, the rule ``simulate --server batching`` applies to the
same messages). Prompt tokens = characters of all message contents ÷ ``chars_per_token`` (rounded up).
The reply's tokens are its characters ÷ ``chars_per_token``; ``min_tokens`` raises that, ``ignore_eos``
makes it exactly ``max_tokens``; a reply longer than ``max_tokens`` is cut there with
``finish_reason: "length"``, as a real server cuts it. A reply that ends before ``max_tokens`` (``min_tokens``
below it included: the model stops once it may) ends with ``"stop"``; one that reaches ``max_tokens`` —
carried there by ``ignore_eos`` or ``min_tokens``, or exactly that long — with ``"length"``.
A ``stop`` string the reply meets (once ``min_tokens`` are out) ends it there with ``"stop"``, as in vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import socket
import struct
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from asyncroll import __version__ as asyncroll_version
from asyncroll.backends.server_model import BatchingServer, ServerSnapshot
from asyncroll.clock import Clock, SystemClock
from asyncroll.json_depth import json_loads
from asyncroll.serve_sim import sizes
from asyncroll.serve_sim.config import SimConfig
from asyncroll.serve_sim.faults import FaultPlan
from asyncroll.serve_sim.fields import checked_fields
from asyncroll.serve_sim.metrics import EngineCollector, exposition, registry_for
from asyncroll.serve_sim.policy import UnsupportedSchema, draw
from asyncroll.serve_sim.request import (
    BadRequest,
    check_media_type,
    checked_messages,
    error_body,
    first_stop,
    lengths,
    no_route,
    parse_body,
    refuse_unsupported,
    reply_role_and_echo,
    response_schema,
    stop_strings,
    validator,
)
from asyncroll.serve_sim.stream import (
    CLIENT_CLOSED,
    Outcome,
    StreamPlan,
    StreamReply,
    stream_settings,
    until_disconnected,
)

ACTION_HEADER = "x-asyncroll-action"
PROSE = "Let me think about this step by step. The answer is probably 42."


def abort_connection(transport: asyncio.BaseTransport | None, *, reset: bool = True) -> None:
    """End the TCP connection: with RST (SO_LINGER 0), as a crashed peer or a proxy reset does, or
    (``reset=False``) with a plain FIN after what was written, as a server that died mid-body does."""
    if transport is None:
        return
    if not reset:
        transport.close()
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()  # type: ignore[attr-defined]


class _Abort(Response):
    """Resets the connection at once, or sends headers and part of the body and then closes it."""

    def __init__(self, sim: SimApp, headers_and_part: tuple[int, dict[str, str], bytes] | None) -> None:
        super().__init__()
        self._sim = sim
        self._part = headers_and_part

    @property
    def outcome(self) -> str:
        """The ``/sim/stats`` key of this fault: no complete response was sent, so no status."""
        return "reset" if self._part is None else "truncated"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._part is not None:
            status, headers, part = self._part
            raw = [(k.encode(), v.encode()) for k, v in headers.items()]
            await send({"type": "http.response.start", "status": status, "headers": raw})
            await send({"type": "http.response.body", "body": part, "more_body": True})
        client = scope.get("client")
        transport = self._sim.transports.get(tuple(client)) if client else None
        abort_connection(transport, reset=self._part is None)
        await asyncio.sleep(0)  # let the server see the connection is lost before the app returns


class SimApp:
    """State of one simulated server; ``.app`` is the ASGI application."""

    def __init__(self, config: SimConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.engine = BatchingServer(config.engine, clock or SystemClock())
        self.faults = FaultPlan(config.faults, config.seed, enforce_schema=config.enforce_schema)
        self._rng = random.Random(config.seed + 1)
        #: client (host, port) → its connection's transport; filled by the tracking protocol (server.py).
        self.transports: dict[tuple[Any, ...], asyncio.BaseTransport] = {}
        self.inflight = 0
        self.peak_inflight = 0
        #: Set when the server starts to stop (``server.stop``): requests cancelled from then on get 503.
        self.stopping = False
        self.requests = 0
        #: HTTP status (or ``reset``/``truncated``: no complete response sent) → requests
        self.statuses: Counter[int | str] = Counter()
        self._seq = 0
        #: The last chat request bodies with the scripted-action header, for tests and debugging.
        self.recent_requests: deque[dict[str, Any]] = deque(maxlen=64)
        self._in_engine: dict[int, int] = {}  # arrival-ordered: request seq → reserved KV tokens
        self._registry = registry_for(EngineCollector(config.metrics_flavor, config.model, self._read))
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/health", self.health, methods=["GET"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/version", self.version, methods=["GET"]),
                Route("/metrics", self.metrics, methods=["GET"]),
                Route("/sim/stats", self.stats, methods=["GET"]),
                Route("/sim/reset-stats", self.reset_stats, methods=["POST"]),
            ],
            lifespan=self._lifespan,
            exception_handlers={404: no_route, 405: no_route},
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        engine = asyncio.create_task(self.engine.serve())
        try:
            yield
        finally:
            self.engine.close()
            engine.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await engine

    def _read(self) -> tuple[ServerSnapshot, float]:
        """The engine snapshot and KV use: prompt + output tokens reserved by the running sequences.

        Admission is FCFS, so the running sequences are the oldest ones still in the engine."""
        snap = self.engine.snapshot()
        reserved = sum(list(self._in_engine.values())[: snap.running])
        return snap, min(1.0, reserved / self.config.kv_cache_tokens)

    # --- small endpoints ---------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def models(self, request: Request) -> Response:
        card = {
            "id": self.config.model,
            "object": "model",
            "created": 0,
            "owned_by": self.config.metrics_flavor,
            "root": self.config.model,
            "max_model_len": self.config.max_model_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def version(self, request: Request) -> Response:
        """As vLLM and SGLang answer it; a client's run.json records it (``backend.server_version``)."""
        return JSONResponse({"version": f"asyncroll serve-sim {asyncroll_version}"})

    async def metrics(self, request: Request) -> Response:
        return Response(exposition(self._registry), media_type="text/plain; version=0.0.4; charset=utf-8")

    def stats_dict(self) -> dict[str, Any]:
        snap, kv = self._read()
        return {
            "inflight": self.inflight,
            "peak_inflight": self.peak_inflight,
            "requests": self.requests,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items(), key=lambda kv: str(kv[0]))},
            "faults": dict(self.faults.injected),
            "engine": asdict(snap),
            "kv_cache_usage": kv,
        }

    async def stats(self, request: Request) -> Response:
        return JSONResponse(self.stats_dict())

    async def reset_stats(self, request: Request) -> Response:
        """Zero the request, status and fault counters (the peak restarts from the requests in flight now).
        The engine's counters stay cumulative: ``/metrics`` exports them as Prometheus counters, which a
        scraper would read as a reset."""
        self.peak_inflight = self.inflight
        self.requests = 0
        self.statuses.clear()
        self.faults.injected.clear()
        self.recent_requests.clear()
        return JSONResponse(self.stats_dict())

    # --- chat completions --------------------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        response: Response | None = None
        self.inflight += 1
        self.peak_inflight = max(self.peak_inflight, self.inflight)
        self.requests += 1
        try:
            raw = await request.body()
            answer = await until_disconnected(request.receive, self._chat(request, raw))
            response = Response(status_code=CLIENT_CLOSED) if answer is None else answer
        except ClientDisconnect:  # gone while sending its body: aborted as any other client that left
            response = Response(status_code=CLIENT_CLOSED)
        except BadRequest as exc:
            response = JSONResponse(error_body(str(exc), exc.status, exc.kind), status_code=exc.status)
        except asyncio.CancelledError:
            if not self.stopping:
                raise
            # uvicorn cancels what outlives its graceful shutdown: answer as a server going away does (a
            # 503, which a client's circuit breaker reads as the server down), not a 500 and a traceback
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            message = "serve-sim is shutting down: the request was aborted"
            response = JSONResponse(error_body(message, 503, "ServiceUnavailableError"), status_code=503)
        finally:
            if not isinstance(response, StreamReply):  # a stream is in flight until it ends: stream_ended
                self.inflight -= 1
        if not isinstance(response, StreamReply):
            self.statuses[response.outcome if isinstance(response, _Abort) else response.status_code] += 1
        return response

    def stream_ended(self, outcome: Outcome) -> None:
        self.inflight -= 1
        self.statuses[outcome] += 1

    @contextlib.contextmanager
    def reserve(self, seq: int, tokens: int) -> Iterator[None]:
        """Request ``seq``'s prompt and output tokens, held in the KV cache while its sequence is in the
        engine."""
        self._in_engine[seq] = tokens
        try:
            yield
        finally:
            self._in_engine.pop(seq, None)

    def transport(self, scope: Scope) -> asyncio.BaseTransport | None:
        """The request's connection (None where the server does not track them; server.py does)."""
        client = scope.get("client")
        return self.transports.get(tuple(client)) if client else None

    def close_connection(self, scope: Scope, *, now: bool = False) -> None:
        """End the request's connection with a FIN after what was written; ``now``: with a reset if some
        of it is still buffered (a reader that stopped reading would hold the FIN back for good)."""
        transport = self.transport(scope)
        buffered = isinstance(transport, asyncio.WriteTransport) and transport.get_write_buffer_size() > 0
        abort_connection(transport, reset=now and buffered)

    async def _chat(self, request: Request, raw: bytes) -> Response:
        cfg = self.config
        check_media_type(request.headers.get("content-type"))
        body = parse_body(raw)
        self.recent_requests.append({"body": dict(body), "action_header": request.headers.get(ACTION_HEADER)})
        checked_fields(body)  # vLLM's field types: 400 before anything else, as its pydantic model answers
        if body.get("model") not in (cfg.model, None, ""):  # none named: the served one, as in vLLM
            raise BadRequest(f"The model `{body.get('model')}` does not exist.", 404, "NotFoundError")
        refuse_unsupported(body)
        stream, include_usage, continuous_usage = stream_settings(body)
        messages = checked_messages(body.get("messages"))
        prompt_tokens = sizes.prompt_tokens(messages, cfg.chars_per_token)
        role, echo = reply_role_and_echo(body, messages)  # vLLM's echo: not generated, only sent first
        max_tokens, min_tokens, ignore_eos = lengths(body, cfg.max_model_len - prompt_tokens)
        stops = stop_strings(body.get("stop"))
        if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            if prompt_tokens >= cfg.max_model_len:  # no room for one token: vLLM's words for this case
                raise BadRequest(
                    f"This model's maximum context length is {cfg.max_model_len} tokens. However, you "
                    f"requested {prompt_tokens} tokens in the messages, Please reduce the length of the "
                    "messages."
                )
        elif prompt_tokens + max_tokens > cfg.max_model_len:
            raise BadRequest(
                f"This model's maximum context length is {cfg.max_model_len} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in "
                "the completion). Please reduce the length of the messages or completion."
            )
        schema = response_schema(body.get("response_format"))
        if schema is not None and cfg.faults.reject_schema:
            raise BadRequest(
                "The provided JSON schema contains features not supported by the structured-output backend "
                "(serve-sim --reject-schema)."
            )
        fault, slow = self.faults.draw()
        if slow:
            await asyncio.sleep(cfg.faults.slow_s)
        if fault in ("http_429", "http_500", "http_503"):
            return self._status_fault(int(fault.removeprefix("http_")))
        if fault == "reset":
            return _Abort(self, None)
        content = self._reply(request.headers.get(ACTION_HEADER), schema)
        if fault == "invalid_action":
            content = PROSE
        content_tokens = sizes.tokens(len(content), cfg.chars_per_token)
        tokens = max_tokens if ignore_eos else min(max(content_tokens, min_tokens), max_tokens)
        # "length" once max_tokens is reached (cut there; EOS ignored or held back by min_tokens up to it;
        # or a reply exactly that long: its EOS would have been one token more), else the model stopped
        finish = "length" if tokens == max_tokens else "stop"
        stop = first_stop(content, stops, lambda end: sizes.tokens(end, cfg.chars_per_token) >= min_tokens)
        stop_reason = None  # as vLLM's: the stop string that ended the reply, else null
        if stop is not None and sizes.tokens(stop[1], cfg.chars_per_token) <= max_tokens:
            # a stop string ends the reply (even with ignore_eos), left out of the text as vLLM leaves it
            # unless include_stop_str_in_output (vLLM's own field) keeps it
            stop_reason = content[stop[0] : stop[1]]
            end = stop[1] if body.get("include_stop_str_in_output") else stop[0]
            content, tokens, finish = content[:end], sizes.tokens(stop[1], cfg.chars_per_token), "stop"
        elif content_tokens > max_tokens:
            content = content[: sizes.chars(max_tokens, cfg.chars_per_token)]
        self._seq += 1
        seq = self._seq
        if stream:
            fault_now = fault if fault in ("truncate", "malformed") else None
            plan = StreamPlan(
                f"chatcmpl-sim-{seq}", int(time.time()), cfg.model, prompt_tokens, tokens, content, finish,
                stop_reason, cfg.chars_per_token, include_usage, continuous_usage, fault_now, role, echo,
            )  # fmt: skip
            return StreamReply(plan, seq, self)
        with self.reserve(seq, prompt_tokens + tokens):
            generation = await self.engine.generate(prompt_tokens, tokens)
        payload = orjson.dumps(
            {
                "id": f"chatcmpl-sim-{seq}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": cfg.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": role, "content": echo + content},
                        "logprobs": None,
                        "finish_reason": finish,
                        "stop_reason": stop_reason,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": generation.output_tokens,
                    "total_tokens": prompt_tokens + generation.output_tokens,
                },
            }
        )
        headers = {"content-type": "application/json"}
        if fault == "malformed":
            return Response(payload[: len(payload) // 2] + b"<!-- upstream error -->", 200, headers)
        if fault == "truncate":
            full = {**headers, "content-length": str(len(payload))}
            return _Abort(self, (200, full, payload[: len(payload) // 2]))
        return Response(payload, 200, headers)

    def _status_fault(self, status: int) -> Response:
        names = {429: "RateLimitError", 500: "InternalServerError", 503: "ServiceUnavailableError"}
        headers: dict[str, str] = {}
        retry_after = self.config.faults.retry_after_s
        if status == 429 and retry_after is not None:
            headers = {
                "retry-after": str(math.ceil(retry_after)),
                "retry-after-ms": str(round(retry_after * 1000)),
            }
        message = f"injected fault: HTTP {status} (serve-sim fault injection)"
        return JSONResponse(error_body(message, status, names[status]), status, headers)

    def _reply(self, scripted: str | None, schema: dict[str, Any] | None) -> str:
        if scripted is not None:
            try:
                action = json_loads(scripted)
            except (ValueError, RecursionError) as exc:  # not JSON, or past Python's limits
                raise BadRequest(f"{ACTION_HEADER} is not JSON: {exc}") from exc
            if schema is not None and self.config.enforce_schema:
                try:
                    errors = list(validator(schema).iter_errors(action))
                except RecursionError as exc:
                    raise BadRequest(
                        f"the JSON schema is nested too deeply to check {ACTION_HEADER}"
                    ) from exc
                if errors:
                    raise BadRequest(
                        f"the scripted action in {ACTION_HEADER} violates the request's schema under "
                        f"enforcement: {errors[0].message}"
                    )
            return json.dumps(action)
        if schema is not None:
            try:
                value = draw(schema, self._rng)
            except UnsupportedSchema as exc:
                raise BadRequest(f"unsupported JSON schema: {exc}") from exc
            except (ValueError, TypeError, OverflowError) as exc:  # a schema no check above foresaw
                raise BadRequest(f"unsupported JSON schema: {type(exc).__name__}: {exc}") from exc
            # the draw's promise, kept whatever keyword combination it did not foresee: never a reply
            # that breaks the schema (enforced or not), but the 400 of a schema it cannot generate for
            broken = next(validator(schema).iter_errors(value), None)
            if broken is not None:
                raise BadRequest(
                    f"unsupported JSON schema: the simulator cannot draw a value for it ({broken.message})"
                )
            return json.dumps(value)
        return json.dumps({"type": "final", "answer": f"answer-{self._rng.randrange(1000)}"})
