"""One inference server per arm: its own process group, its log captured, readiness within a deadline,
startup evidence parsed from the log, and a stop that reaches the whole group (TERM → grace → KILL).

Also the subprocess helper the client side shares (``ManagedProcess``): every started process is
recorded with its pid, process group, creation time and origin, so the orphan sweep that resume uses after
a runner was killed (``orphans.py``) never signals a later process reusing the pid. What a server or a
client detaches is found and killed by its origin (``orphans.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import psutil

from asyncroll.clock import SystemClock
from asyncroll.experiment import listener
from asyncroll.experiment.orphans import ORIGIN_ENV, adopted_from, adopted_orphans, kill_adopted
from asyncroll.http_read import (
    MAX_PROBE_BYTES,
    ResponseTooLarge,
    body_text,
    read_bounded,
    request_deadline_s,
)
from asyncroll.json_depth import json_loads
from asyncroll.proctree import all_gone, children, descendants, signal_tree, start_mark

if TYPE_CHECKING:
    import httpx

#: A readiness probe's per-phase timeout (the most of its answer read: ``http_read.MAX_PROBE_BYTES``).
PROBE_TIMEOUT_S = 5.0
#: How long a stop waits for KILLed processes to be gone before it lists what is left as ``leftover``.
KILL_SETTLE_S = 5.0

#: Startup evidence: (key, pattern). The first group, if any, is the value; else the whole line is kept.
EVIDENCE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("vllm_version", re.compile(r"vLLM API server version ([\w.+-]+)", re.I)),
    ("sglang_version", re.compile(r"sglang(?: version)?[ =:]+v?(\d+\.\d+[\w.+-]*)", re.I)),
    # vLLM: "Using Flash Attention backend on V1 engine.", "Using FLASH_ATTN backend.", "Using FLASH_ATTN
    # attention backend out of potential backends: […]", "Using Triton MLA backend on V1 engine." (the
    # name, up to three words, as the log gives it). Not "Using sampling backend: …" (its own key).
    (
        "attention_backend",
        re.compile(
            r"\bUsing (?!sampling\b)((?:[\w.-]+ ){0,2}?[\w.-]+) (?-i:attention )?backend\b(?!\s*:)", re.I
        ),
    ),
    # SGLang's server arguments and vLLM's environment: attention_backend='fa3', VLLM_ATTENTION_BACKEND=X
    ("attention_backend", re.compile(r"attention[_ ]backend\s*[=:]\s*['\"]?([\w-]+)", re.I)),
    ("sampling_backend", re.compile(r"\bsampling[_ ]backend\s*[=:]\s*['\"]?([\w-]+)", re.I)),
    ("cuda_graph", re.compile(r"(Graph capturing finished in [\d.]+ secs?.*)", re.I)),
    ("cuda_graph", re.compile(r"(Capturing (?:CUDA |cuda)?graphs?.*)", re.I)),
    ("cuda_graph_disabled", re.compile(r"(enforce_eager=True|CUDA graph is turned off.*)", re.I)),
    ("compile", re.compile(r"(torch\.compile takes [\d.]+ s.*)", re.I)),
    ("compile", re.compile(r"(Compiling a graph for .*)", re.I)),
    ("weights_loaded", re.compile(r"(Model loading took .*|Loading weights took .*)", re.I)),
    ("kv_cache", re.compile(r"(GPU KV cache size: .*|# GPU blocks: .*)", re.I)),
    ("listening", re.compile(r"(serve-sim listening on \S+.*|Uvicorn running on \S+)", re.I)),
)
_MAX_EVIDENCE = 8


class ServerStartError(RuntimeError):
    """The server exited, or never became ready, within its deadline."""


class ProbeFailed(Exception):
    """One readiness probe got no usable answer (the message says why)."""


class ReadinessTimeout(ServerStartError):
    """The server still ran, but was not ready when the time given to ``wait_ready`` was up."""


def free_port(host: str) -> int:
    """A port the kernel says is free now (there is a short race until the server binds it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    """True when something already accepts connections there (a stale server would answer readiness)."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def startup_evidence(log_text: str) -> dict[str, list[str]]:
    """Lines of the server log that show how it started (versions, attention backend, graphs, compile)."""
    found: dict[str, list[str]] = {}
    for line in log_text.splitlines():
        for key, pattern in EVIDENCE_PATTERNS:
            match = pattern.search(line)
            if match:
                values = found.setdefault(key, [])
                value = match.group(1).strip()[:300]
                if value not in values and len(values) < _MAX_EVIDENCE:
                    values.append(value)
    return found


def exit_words(code: int | None) -> str:
    """How a started process ended, in words: ``exited with code 3``, or for one a signal killed (the OOM
    killer's SIGKILL: code -9) ``was killed by SIGKILL (exit code -9)``."""
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name} (exit code {code})"
    return f"exited with code {code}"


def tail(path: Path, limit: int = 2000) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


@dataclass
class ManagedProcess:
    """A subprocess leading its own session and process group, stdout+stderr to a log file.

    ``origin`` (``role:random``, set by ``start``) is in its environment and so in that of everything it
    starts: ``stop`` finds by it what the process detached."""

    command: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    role: str = "process"
    popen: subprocess.Popen[bytes] | None = None
    origin: str | None = None
    #: The origin ``start`` will give it, known before the spawn: recorded then, a runner killed between
    #: the spawn and its record of the process still leaves the resume a way to find it.
    planned_origin: str = ""

    def __post_init__(self) -> None:
        self.planned_origin = f"{self.role}:{secrets.token_hex(8)}"

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.origin = self.planned_origin
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)  # never through a link
        with os.fdopen(os.open(self.log, flags, 0o666), "ab") as handle:
            self.popen = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env, ORIGIN_ENV: self.origin},
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def record(self) -> dict[str, Any]:
        """What an orphan sweep needs to find this process again, and nothing it could confuse."""
        create_time = None
        with contextlib.suppress(psutil.Error):
            create_time = psutil.Process(self.pid).create_time()
        return {
            "pid": self.pid,
            "pgid": self.pid,
            "create_time": create_time,
            "start_mark": start_mark(self.pid),  # which process, whatever the wall clock does meanwhile
            "log": str(self.log),
            "origin": self.origin,
        }

    def poll(self) -> int | None:
        assert self.popen is not None
        return self.popen.poll()

    def wait(self, timeout: float) -> int | None:
        assert self.popen is not None
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace_s: float) -> dict[str, Any]:
        """TERM the whole group and every descendant, wait ``grace_s``, then KILL what is left; then the
        processes it detached that the runner adopted (its ``origin``): those are ``leftover`` (they
        outlived the group's stop) and ``orphans`` lists what they were and that they were killed.

        Also right for a process that already exited: what it left in its group, and what it detached,
        is stopped and listed as its own; and for one whose spawn a signal cut short after the fork
        (``Popen`` raised, no object came back): the child it left runs all the same, found by origin."""
        began = time.monotonic()
        if self.popen is None:
            spawned = adopted_from(self.origin, exclude=-1)  # never started: origin None, nothing found
            orphans = kill_adopted(spawned, min(grace_s, 5.0)) if spawned else []
            seconds = round(time.monotonic() - began, 3)
            how = "spawn cut short" if orphans else "never spawned"
            cut: dict[str, Any] = {"how": how, "exit_code": None, "seconds": seconds, "leftover": []}
            return {**cut, "orphans": orphans} if orphans else cut
        already = self.popen.poll()
        # once it has exited, its children were re-parented and its pid may be another process's
        tree = [] if already is not None else descendants(self.pid)
        signal_tree(self.pid, signal.SIGTERM, tree)
        code = self.wait(grace_s)
        how = "exited" if already is not None else "term"
        deadline = began + grace_s  # one grace for the leader and its tree together: TERM → grace → KILL
        while not all_gone(tree) and time.monotonic() < deadline:
            time.sleep(0.05)
        if code is None or not all_gone(tree):
            tree = list({p.pid: p for p in [*tree, *descendants(self.pid)]}.values())
            signal_tree(self.pid, signal.SIGKILL, tree)
            code = self.wait(10.0)
            how = "kill"
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)  # anything left in the group (normally nothing)
        # a KILLed process is gone once it is scheduled to die: on a loaded machine not at once (a child
        # still exiting was listed as leftover, a process that outlived the stop)
        settle = time.monotonic() + KILL_SETTLE_S
        while not all_gone(tree) and time.monotonic() < settle:
            time.sleep(0.01)
        leftover = [p.pid for p in tree if not all_gone([p])]
        detached = adopted_from(self.origin, exclude=self.pid)
        orphans = kill_adopted(detached, min(grace_s, 5.0)) if detached else []
        result: dict[str, Any] = {
            "how": how,
            "exit_code": code,
            "seconds": round(time.monotonic() - began, 3),
            "leftover": sorted({*leftover, *(o["pid"] for o in orphans)}) if orphans else leftover,
        }
        if orphans:
            result["orphans"] = orphans
        return result


class InferenceServer:
    """A fresh server for one arm. ``start`` → ``wait_ready`` → ``stop``; every step leaves evidence."""

    def __init__(
        self,
        command: list[str],
        base_url: str,
        log: Path,
        env: dict[str, str],
        served_name: str,
        check_listener: bool = True,
    ) -> None:
        self.process = ManagedProcess(command, log, env, role="server")
        self.base_url = base_url
        self.served_name = served_name
        self.check_listener = check_listener  # false: server.check_listener (a container's daemon listens)
        self._before: set[int] = set()
        #: What the last ``stop`` killed that the runner had adopted from no process of ours.
        self.unattributed: list[dict[str, Any]] = []

    def start(self) -> None:
        self._before = children()  # the runner's children so far: none of them is this server's
        self.process.start()

    def wait_ready(self, paths: list[str], deadline_s: float) -> dict[str, Any]:
        """Poll ``paths`` until one answers 200 and the served model is listed; fail early if it exits.
        Each probe is bounded (:meth:`_get`) and given at most the time left, so a server that trickles
        its answer cannot hold this past ``deadline_s`` by more than a probe's margin (max(1 s, 10%)).
        One event loop and one client for the whole wait (the runner is synchronous here)."""
        return SystemClock().run(self._wait_ready(paths, deadline_s))

    async def _wait_ready(self, paths: list[str], deadline_s: float) -> dict[str, Any]:
        import httpx

        began = time.monotonic()
        last_error = "no answer yet"
        owner: dict[str, Any] | None = None  # who listens on the port, once a probe answered 200
        asked = False  # /v1/models asked before and not answered yet: who listens is looked at again
        limits = httpx.Limits(max_connections=None)  # see http_read: a deadline may leak a pool slot
        async with httpx.AsyncClient(trust_env=False, limits=limits) as client:
            while True:
                code = self.process.poll()
                if code is not None:
                    raise ServerStartError(
                        f"server {exit_words(code)} before it was ready; log tail:\n"
                        + (tail(self.process.log) or "(empty log)")
                    )
                for path in paths:
                    left = deadline_s - (time.monotonic() - began)
                    if left <= 0:
                        raise ReadinessTimeout(
                            f"server not ready within {deadline_s:g}s (last: {last_error}); log tail:\n"
                            + (tail(self.process.log) or "(empty log)")
                        )
                    try:
                        status, _ = await self._get(client, path, min(PROBE_TIMEOUT_S, left))
                    except ProbeFailed as exc:
                        last_error = f"{path}: {exc}"
                        continue
                    if status == 200:
                        # who listens: at the first 200 (another's server answered: said at once), then
                        # once /v1/models lists the model, not at every ask (a scan of every process's
                        # sockets, while a slow /v1/models is asked until the deadline)
                        owner = self._owner() if owner is None else owner
                        left = deadline_s - (time.monotonic() - began)
                        if left <= 0:
                            last_error = f"{path}: HTTP 200, /v1/models not asked before the deadline"
                            continue
                        try:  # given at most the time left, as every probe
                            models = await self._models(client, min(PROBE_TIMEOUT_S, left))
                        except ProbeFailed as exc:  # not yet (a proxy's 502, a 503): until the deadline
                            last_error, asked = str(exc), True
                            continue
                        if asked:
                            owner = self._owner()
                        ready_s = round(time.monotonic() - began, 3)
                        return {"ready_s": ready_s, "via": path, "models": models, "listener": owner}
                    last_error = f"{path}: HTTP {status}"
                await asyncio.sleep(0.1)

    def _owner(self) -> dict[str, Any]:
        """The server's process that listens on the endpoint's port (:mod:`.listener`); a
        :class:`ServerStartError` naming the port and its holder when another process answered."""
        if not self.check_listener:
            return {"verified": False, "why": "not checked: server.check_listener is false"}
        url = urlsplit(self.base_url)
        host = url.hostname or "127.0.0.1"
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            return listener.owner(self.process.pid, self.process.origin, host, port)
        except listener.ForeignListener as exc:
            if exc.shared:  # both bound with SO_REUSEPORT (vLLM does): the kernel spreads connections
                what = (
                    f"{url.netloc}: the server started for this arm (pid {self.process.pid}) listens there, "
                    f"but so does {exc} (the port is shared, SO_REUSEPORT), and the kernel would have sent "
                    "part of the arm's requests to it"
                )
            else:
                what = (
                    f"{url.netloc} answered the readiness probe, but no process of the server started for "
                    f"this arm (pid {self.process.pid}) listens there: {exc} holds that port, and the arm "
                    "would have measured it, not its own server"
                )
            raise ServerStartError(
                f"{what}. Stop it, or choose another port (server.port; 0 picks a free one for each "
                f"arm). Server log {self.process.log}; its tail:\n"
                + (tail(self.process.log) or "(empty log)")
            ) from None

    async def _get(self, client: httpx.AsyncClient, path: str, limit_s: float) -> tuple[int, bytes]:
        """``GET path``: ``limit_s`` per phase, a whole-exchange deadline and a body cap
        (:mod:`asyncroll.http_read`); any failure is :class:`ProbeFailed`."""
        import httpx

        deadline = request_deadline_s(limit_s)
        try:
            request = client.build_request("GET", self.base_url + path, timeout=limit_s)
            response, body = await read_bounded(
                client, request, limit_bytes=MAX_PROBE_BYTES, deadline_s=deadline
            )
        except httpx.HTTPError as exc:
            raise ProbeFailed(type(exc).__name__) from None
        except TimeoutError:
            raise ProbeFailed(f"no complete answer within {deadline:g}s") from None
        except ResponseTooLarge as exc:
            raise ProbeFailed(str(exc)) from None
        return response.status_code, body

    async def _models(self, client: httpx.AsyncClient, limit_s: float) -> list[str]:
        """The served model ids; the configured served name must be one of them. No answer, a 429 or a
        5xx (a server behind a proxy still starting, an overloaded one) is :class:`ProbeFailed`: asked
        again until the readiness deadline; any other answer that is not the list is final."""
        try:
            status, raw = await self._get(client, "/v1/models", limit_s)
        except ProbeFailed as exc:
            raise ProbeFailed(f"/v1/models: {exc}") from None
        if status == 429 or status >= 500:
            raise ProbeFailed(f"/v1/models: HTTP {status}")
        if status != 200:
            raise ServerStartError(f"/v1/models answered HTTP {status}")
        try:
            body = json_loads(raw)
        except (ValueError, RecursionError):
            raise ServerStartError(
                f"/v1/models did not return JSON (it answered {body_text(raw, 200)!r})"
            ) from None
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or not all(isinstance(m, dict) for m in data):
            raise ServerStartError(
                f"/v1/models did not return an OpenAI model list ({{'data': [{{'id': ...}}]}}): {body!r:.200}"
            )
        ids = [str(m.get("id")) for m in data]
        if self.served_name not in ids:
            raise ServerStartError(f"server serves {ids}, not the configured model {self.served_name!r}")
        return ids

    def evidence(self) -> dict[str, list[str]]:
        try:
            text = self.process.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return {}
        return startup_evidence(text)

    def stop(self, grace_s: float) -> dict[str, Any]:
        """Stop the server's group and tree, then the processes it detached (``setsid -f``, a double
        fork: the runner, a child subreaper, adopted them; ``ManagedProcess.stop``); the record lists
        only what the server left.

        The arm's last stop: any other orphan the runner adopted since the server started (one that
        carries no origin; or the client's, if the client's stop was cut short) is killed too and kept
        apart in ``unattributed``, with the origin it carries if any, never listed as the server's."""
        result = self.process.stop(grace_s)
        spawned = set() if self.process.popen is None else {self.process.pid}
        others = adopted_orphans(self._before | spawned)
        self.unattributed = kill_adopted(others, min(grace_s, 5.0)) if others else []
        return result
