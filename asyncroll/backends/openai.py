"""The OpenAI-compatible HTTP backend (``--backend vllm|openai``, SPEC §7).

One persistent :class:`httpx.AsyncClient` per run, its connections in a few pools
(:mod:`asyncroll.backends.transport`) each keeping up to the inflight limit's connections alive, sends
``POST {endpoint}/v1/chat/completions``. Two modes:

* **agent** (default): the server's reply *is* the action. With structured output (the default) the
  request carries the turn's JSON schema (:mod:`asyncroll.backends.action_schema`); with
  ``--no-structured-output`` it does not, code workloads may answer with plain source, and everything
  else must still be a JSON action. A reply that does not parse or validate fails the request
  (``invalid_action``), whatever the server claims to enforce: never a silent fallback.
* **replay** (``--replay``): the action comes from the workload's script, while the server does real
  work of the scripted size: ``max_tokens`` = the action's ``output_tokens`` (else ``--max-tokens``), plus
  ``min_tokens``/``ignore_eos`` on vLLM and SGLang, or a fixed length in ``generation_config`` on
  ``transformers serve``. The scripted action also travels in the ``X-Asyncroll-Action`` header (up to
  8 KiB), which ``asyncroll serve-sim`` echoes and every other server ignores. A script's ``error`` step
  sends nothing: the request fails after its ``latency_ms``, as the scripted backend's does. The bodies
  and the header are :mod:`asyncroll.backends.request_body`; the settings,
  :mod:`asyncroll.backends.http_settings`.

Failures are classified and carried on :class:`~asyncroll.errors.ModelError` (status, whether a complete
response arrived, parse seconds, attempts): ``transport`` and ``timeout`` (no response), ``http_status``
and ``schema_rejected`` (a response), ``bad_response`` (a 2xx whose body is not an OpenAI completion) and
``invalid_action`` (a completion whose content is not a valid action). One exchange — the request timeout,
the whole-request deadline, the body cap, what a hostile reply makes httpx raise — is
:mod:`asyncroll.backends.exchange`; this module owns the client, the retries around each exchange and the
reading of the reply into an action.

The pool has no connection limit of its own: the model gate is the one limit of requests in flight, and a
leaked slot blocks nothing. (A cancellation delivered inside httpcore's pool while it holds a connection
that is not yet open leaves that connection counted for ever — encode/httpcore#1093 — and a pool
*limited* to the inflight limit then locks up: every later request times out against a healthy server.)
The probes (``/v1/models``, ``/health``) have the same whole-exchange deadline and a cap
(:mod:`asyncroll.http_read`). Whatever a 2xx body holds, reading it (:mod:`asyncroll.backends.completion`)
never raises anything else: a message ``content`` given as a list of text parts is joined, as
OpenAI-compatible servers mean it; any other shape is ``bad_response``; a ``usage`` that is not an object
is ignored (token counts ``null``). Retries and the server circuit are in
:mod:`asyncroll.backends.retry`; the circuit's openings and closings are events (``server_unavailable``,
``server_available``), and a request that waited for it says so (``model_paused``).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any
from urllib.parse import urlsplit

import httpx

from asyncroll.backends.action_schema import is_code_workload, parse_action, tool_call, turn_schema
from asyncroll.backends.base import ModelRequest, ModelResponse
from asyncroll.backends.completion import NotACompletion, read_completion
from asyncroll.backends.exchange import AttemptFailed, post_chat
from asyncroll.backends.http_errors import mask_key, quoted_body
from asyncroll.backends.http_settings import HttpSettings
from asyncroll.backends.probes import NotReady, healthy, probe_kind, probe_version
from asyncroll.backends.request_body import REPLAY_FIXED_LENGTH, action_headers, chat_body, warmup_body
from asyncroll.backends.retry import Circuit, is_retryable
from asyncroll.backends.scripted import scripted_failure, scripted_step
from asyncroll.backends.transport import pools_transport
from asyncroll.clock import Clock
from asyncroll.config import ServerKind
from asyncroll.errors import SERVER_DOWN_SAID, InvalidActionError, ModelError
from asyncroll.event_log import EventLog
from asyncroll.events import ModelPaused, ModelRetrying, ServerAvailable, ServerUnavailable
from asyncroll.http_proxy import client_settings, environment_problem, environment_proxy, proxies_in_play
from asyncroll.workload import Action, ErrorStep, ToolAction

__all__ = ["HttpSettings", "OpenAIBackend"]

#: Seconds an idle connection is kept for reuse: below the 5 s after which uvicorn closes one.
KEEPALIVE_S = 4.0


class OpenAIBackend:
    """``--backend vllm|openai``: see the module docstring."""

    def __init__(
        self, settings: HttpSettings, clock: Clock, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.settings = settings
        self.name = settings.backend_name
        self._clock = clock
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._pool_count: int | None = None  # the client's connection pools (1: httpx's own), once made
        self._events: EventLog | None = None
        self._rng = random.Random(settings.seed)
        self.circuit = Circuit(settings.circuit_failures)
        self._kind: ServerKind | None = settings.server_kind
        self._kind_source = "declared" if settings.server_kind else "unknown"
        self._version: tuple[str | None, str] = (None, "not asked yet (the backend did not start)")
        self._watch: asyncio.Task[None] | None = None
        self.retries = 0
        self.warmup_retries = 0
        self._last_probe = "none yet"  # what the last health probe of an open circuit got

    # --- lifecycle ---------------------------------------------------------------------------------

    @property
    def server_kind(self) -> ServerKind | None:
        return self._kind

    def bind_events(self, events: EventLog) -> None:
        """Where retry attempts are recorded (the run's event log)."""
        self._events = events

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            try:
                self._client = self._new_client()
            # the environment's proxy (InvalidURL: one httpx cannot parse) or CA file
            except (ImportError, ValueError, OSError, httpx.InvalidURL) as exc:
                problem = environment_problem(exc)
                if problem is None:
                    raise
                raise ModelError("transport", problem) from exc
        return self._client

    def _new_client(self) -> httpx.AsyncClient:
        n = self.settings.inflight
        key = self.settings.api_key
        settings = client_settings(self.settings.endpoint)  # no environment proxy for this machine
        # no max_connections: the model gate limits requests (see the module docstring). Idle
        # connections are dropped before uvicorn (vLLM's and SGLang's server) drops them at 5 s:
        # at httpx's own 5 s a request could be sent on a connection the server is closing, and
        # fail as transport, charged to a healthy request and to the circuit
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=n, keepalive_expiry=KEEPALIVE_S)
        return httpx.AsyncClient(
            base_url=self.settings.endpoint,
            headers={} if key is None else {"authorization": f"Bearer {key}"},
            timeout=httpx.Timeout(self.settings.request_timeout),
            limits=limits,
            transport=self._transport or self._pools(limits, settings),
            **settings,
        )

    def _pools(self, limits: httpx.Limits, settings: dict[str, Any]) -> httpx.AsyncBaseTransport | None:
        """The client's connections in a few pools (:mod:`asyncroll.backends.transport`), or None (httpx's
        one pool) where the environment's proxies are in play: a client given a transport takes none of
        them, and a proxied request goes through the proxy's own transport anyway."""
        pools = (
            None
            if proxies_in_play(self.settings.endpoint)
            else pools_transport(self.settings.inflight, limits, settings)
        )
        self._pool_count = 1 if pools is None else len(pools.pools)
        return pools

    async def start(self, tg: asyncio.TaskGroup) -> None:
        """Open the client, learn the server kind (declared, else probed) and start the circuit watch."""
        client = self._http()
        if self._kind is None:
            self._kind, self._kind_source = await self._probe_kind(client)
        self._version = await probe_version(client, self._kind, self.settings.request_timeout)
        self._watch = tg.create_task(self._watch_circuit())

    async def _probe_kind(self, client: httpx.AsyncClient) -> tuple[ServerKind, str]:
        """The server's kind and how it was found (:func:`~asyncroll.backends.probes.probe_kind`), the
        probe retried as the warm-up's requests are (``--max-retries``; no reply, or 408/429/5xx from a
        server still starting), counted with them in ``warmup_retries``."""
        retry, attempt = self.settings.retry, 0
        while True:
            attempt += 1
            try:
                return await probe_kind(client, self.settings.endpoint, self.settings.request_timeout)
            except ModelError as exc:
                if attempt > retry.max_retries or not is_retryable(exc.kind, exc.status):
                    if attempt == 1:
                        raise
                    tries = f"{exc} (after {attempt} attempts)"
                    raise ModelError(exc.kind, tries, status=exc.status, attempts=attempt) from exc
                self.warmup_retries += 1  # before the clock: counted in run.json, not as events
                headers = exc.headers if isinstance(exc, NotReady) else None  # its retry-after, honoured
                await self._clock.sleep(retry.delay(attempt, self._rng, headers))

    def describe(self) -> dict[str, Any]:
        """The backend's settings for run.json: what was declared, probed and sent."""
        s = self.settings
        return {
            "name": self.name,
            "endpoint": s.endpoint,
            "model": s.model,
            "mode": "replay" if s.replay else "agent",
            "structured_output": s.structured and not s.replay,  # a replay sends no response_format
            "server_kind": self._kind,
            "server_kind_source": self._kind_source,
            # the engine's version (vLLM, SGLang: GET /version), or null and why not
            "server_version": self._version[0],
            "server_version_source": self._version[1],
            "replay_fixed_length": REPLAY_FIXED_LENGTH.get(self._kind or "") if s.replay else None,
            "pool_connections": s.inflight,
            "connection_pools": self._pool_count,  # null: no client was made (or a transport was given)
            "max_retries": s.retry.max_retries,
            "warmup_retries": self.warmup_retries,
            "circuit_failures": s.circuit_failures,
            "server_down_timeout_s": s.server_down_timeout,
            "api_key": None if s.api_key_env is None else f"from the environment variable {s.api_key_env}",
            # the environment's proxy the requests went through (its password masked), or None: a proxied
            # run's latencies include the proxy's
            "proxy": environment_proxy(s.endpoint),
        }

    async def aclose(self) -> None:
        """Stop the circuit watch and close the HTTP client (always, whatever the watch did).

        A watch that failed (``--server-down-timeout``) already failed the run through the task group
        that owns it: its error is consumed here, not raised a second time."""
        watch, self._watch = self._watch, None
        try:
            if watch is not None:
                watch.cancel()
                await asyncio.wait((watch,))  # never raises the watch's own error; our cancellation does
                if not watch.cancelled():
                    watch.exception()  # retrieved: reported once, by the task group
        finally:
            if self._client is not None:
                client, self._client = self._client, None
                await client.aclose()

    async def wait_available(self) -> None:
        """Admission awaits this before admitting a trajectory: returns at once unless the server is down."""
        await self.circuit.wait_closed()

    async def _watch_circuit(self) -> None:
        """While the circuit is open, probe the server (:meth:`_healthy`); fail the run if it stays down
        too long."""
        while True:
            await self.circuit.wait_opened()
            opened = self.circuit.snapshot().open_since
            if opened is None:  # closed again meanwhile
                continue
            probes = 0
            while self.circuit.is_open:
                probes += 1
                if await self._healthy():
                    self.circuit.close()
                    if self._events is not None:
                        now = self._clock.now()
                        paused = round(now - opened, 6)
                        self._events.emit(ServerAvailable(paused_s=paused, probes=probes), at=now)
                    break
                down = self._clock.now() - opened
                if down >= self.settings.server_down_timeout:
                    raise ModelError(
                        "server_down",
                        f"the server at {self.settings.endpoint} {SERVER_DOWN_SAID} {down:.1f}s "
                        f"(--server-down-timeout {self.settings.server_down_timeout:g}; last probe: "
                        f"{self._last_probe}); admission was paused meanwhile",
                    )
                await self._clock.sleep(self.settings.probe_interval)

    async def _healthy(self) -> bool:
        """Whether the server answers its health probe (:func:`~asyncroll.backends.probes.healthy`);
        what the probe got is kept for the error of a server that stays down."""
        ok, self._last_probe = await healthy(self._http(), self.settings.request_timeout)
        return ok

    # --- requests ----------------------------------------------------------------------------------

    async def warmup(self, requests: int) -> int:
        """Send ``requests`` small untimed requests, each retried like a turn (``--max-retries``); a
        request that still fails, or whose reply is no chat completion (a page a wrong --endpoint
        serves with 200), fails the run before the clock starts. Its content is not judged."""
        body = warmup_body(self.settings, self._kind)
        retry = self.settings.retry
        for i in range(requests):
            attempt = 0
            while True:
                attempt += 1
                try:
                    status, payload = await post_chat(self._http(), body, {}, self.settings.request_timeout)
                    read_completion(payload)
                    break
                except NotACompletion as exc:  # as a turn's reply would be: bad_response, not retried
                    raise ModelError(
                        "bad_response",
                        f"warm-up request {i + 1}/{requests}: {self._not_a_completion(status, exc, payload)}",
                        status=status,
                    ) from exc
                except AttemptFailed as exc:
                    if attempt <= retry.max_retries and is_retryable(exc.kind, exc.status):
                        self.warmup_retries += 1  # before the clock: counted in run.json, not as events
                        await self._clock.sleep(retry.delay(attempt, self._rng, exc.headers))
                        continue
                    tries = f" after {attempt} attempts" if attempt > 1 else ""
                    raise ModelError(
                        exc.kind,
                        f"warm-up request {i + 1}/{requests} failed{tries}: {exc}{self._where(exc)}",
                        status=exc.status,
                    ) from exc
        return requests

    def _where(self, exc: AttemptFailed) -> str:
        """Where a failed warm-up went, for its error: a request that got no reply names its URL, and
        one sent through the environment's proxy names the proxy (the one not answering, or answering)."""
        proxy = environment_proxy(self.settings.endpoint)
        via = "" if proxy is None else f" through the environment's proxy {proxy}"
        if exc.received:
            return f" (sent{via})" if via else ""
        url = f"{self.settings.endpoint}/v1/chat/completions"
        if exc.kind == "timeout" and not exc.no_connection:  # connected: a server slower than the timeout
            return f" (POST {url}{via})"
        hint = "check that the server runs at --endpoint"
        if via:
            host = urlsplit(self.settings.endpoint).hostname
            hint += f", and that the proxy runs and reaches it (or go around it: no_proxy={host})"
        return f" (POST {url}{via}); {hint}"

    def build_body(self, request: ModelRequest, scripted: Action | None) -> dict[str, Any]:
        """The ``/v1/chat/completions`` body for one turn (public so tests can pin the exact payload)."""
        return chat_body(self.settings, self._kind, request, scripted)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        s = self.settings
        scripted = scripted_step(request) if s.replay else None
        if isinstance(scripted, ErrorStep):  # a failure the script replays: no request is sent
            await scripted_failure(scripted, request.turn, self._clock)
        body, headers = self.build_body(request, scripted), action_headers(scripted)
        attempt = 0
        while True:
            attempt += 1
            if self.circuit.is_open:
                await self._wait_for_server(request, attempt)
            try:
                status, payload = await post_chat(self._http(), body, headers, s.request_timeout)
                break
            except AttemptFailed as exc:
                # A reply that never came (kind timeout, connected) is a slow server or a frozen one: the
                # health probe tells them apart, and a frozen one counts towards the circuit (no probe
                # when --circuit-failures 0 turned the circuit off: nothing would count it).
                frozen = (
                    exc.kind == "timeout"
                    and not exc.unavailable
                    and self.circuit.threshold > 0
                    and not await self._healthy()
                )
                if self.circuit.record_failure(
                    exc.unavailable or frozen, exc.status is not None, self._clock.now()
                ):
                    self._opened(exc, self._last_probe if frozen else None)
                if attempt <= s.retry.max_retries and is_retryable(exc.kind, exc.status):
                    delay = s.retry.delay(attempt, self._rng, exc.headers)
                    self.retries += 1
                    if self._events is not None:
                        self._events.emit(
                            ModelRetrying(
                                id=request.trajectory_id,
                                turn=request.turn,
                                attempt=attempt,
                                kind=exc.kind,
                                status=exc.status,
                                delay_s=round(delay, 6),
                                error=str(exc)[:500],
                            )
                        )
                    await self._clock.sleep(delay)
                    continue
                tries = f" (after {attempt} attempts)" if attempt > 1 else ""  # results.jsonl says so too
                raise ModelError(
                    exc.kind,
                    f"{exc}{tries}",
                    status=exc.status,
                    response_received=exc.received,
                    attempts=attempt,
                ) from exc
        self.circuit.record_success()
        return self._parse(request, scripted, status, payload, attempt)

    def _opened(self, exc: AttemptFailed, probe: str | None) -> None:
        """The circuit just opened on ``exc`` (``probe``: what the health probe after a timeout got):
        record it (admission pauses from now on)."""
        if self._events is not None:
            snap = self.circuit.snapshot()
            reason = f"{exc.kind}: {exc}" + ("" if probe is None else f"; then {probe}")
            self._events.emit(
                ServerUnavailable(
                    failures=snap.consecutive_failures, reason=reason[:500], opened=snap.opened
                ),
                at=snap.open_since,  # paused_s, in server_available, runs from here
            )

    async def _wait_for_server(self, request: ModelRequest, attempt: int) -> None:
        """Wait for the open circuit to close before an attempt, and record how long that took — also
        when the wait ends otherwise (the run stops, or the server stays down too long)."""
        began = self._clock.now()
        try:
            await self.circuit.wait_closed()
        finally:
            if self._events is not None:
                waited = round(self._clock.now() - began, 6)
                self._events.emit(
                    ModelPaused(id=request.trajectory_id, turn=request.turn, attempt=attempt, waited_s=waited)
                )

    def _not_a_completion(self, status: int, exc: NotACompletion, payload: bytes) -> str:
        """What a 2xx body that is no chat completion was, its head quoted; the API key masked (a
        gateway that echoes it would have it written to events, results and run.json)."""
        headers = self._http().headers
        why, head = mask_key(str(exc), headers), quoted_body(payload, 200, headers)
        return f"HTTP {status} body is not an OpenAI chat completion ({why}): {head}"

    def _parse(
        self, request: ModelRequest, scripted: Action | None, status: int, payload: bytes, attempts: int
    ) -> ModelResponse:
        parse_start = self._clock.now()
        try:
            completion = read_completion(payload)
        except NotACompletion as exc:
            raise ModelError(
                "bad_response",
                self._not_a_completion(status, exc, payload),
                status=status,
                response_received=True,
                parse_s=round(self._clock.now() - parse_start, 6),
                attempts=attempts,
            ) from exc
        if scripted is not None:
            action: Action = scripted
        else:
            try:
                action = parse_action(
                    completion.content,
                    turn_schema(request.problem, request.turn),
                    structured=self.settings.structured,
                    code=is_code_workload(request.problem),
                )
                if isinstance(action, ToolAction):
                    tool_call(request.problem, action)
            except InvalidActionError as exc:
                err = InvalidActionError(
                    f"{exc}{completion.why_invalid()}",
                    status=status,
                    parse_s=round(self._clock.now() - parse_start, 6),
                )
                err.attempts = attempts
                err.prompt_tokens = completion.prompt_tokens  # the server did the work: its usage is kept
                err.completion_tokens = completion.completion_tokens
                err.text = completion.content
                err.finish_reason = completion.finish_reason_text
                raise err from exc
        return ModelResponse(
            action=action,
            prompt_tokens=completion.prompt_tokens,
            completion_tokens=completion.completion_tokens,
            finish_reason=completion.finish_reason_text,
            text=completion.content,
            read_from_text=scripted is None,
        )
