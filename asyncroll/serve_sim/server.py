"""Running serve-sim on uvicorn: in the foreground (the CLI) or on a background thread (tests, benches).

The listening socket is bound (and listening) *before* uvicorn starts, so the port is known at once, even
with ``--port 0``, and a client that connects early waits in the backlog instead of being refused: no
readiness polling anywhere. uvicorn's h11 protocol is subclassed only to remember each connection's
transport, which the fault injector needs to reset a connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from asyncroll.cli_signals import put_back
from asyncroll.errors import OutputWriteError
from asyncroll.process_limits import limit_note, open_files_for_server
from asyncroll.serve_sim.app import SimApp
from asyncroll.serve_sim.config import SimConfig


def tracking_protocol(sim: SimApp) -> type[H11Protocol]:
    """uvicorn's h11 protocol, registering each connection's transport in ``sim.transports``."""

    class TrackingH11(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if self.client is not None:
                sim.transports[tuple(self.client)] = transport

        def connection_lost(self, exc: Exception | None) -> None:
            if self.client is not None:
                sim.transports.pop(tuple(self.client), None)
            super().connection_lost(exc)

    return TrackingH11


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket; ``port`` 0 picks a free one (read it back with ``getsockname``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP (not 0): asyncio sets TCP_NODELAY only on sockets that say they are TCP, and
    # accepted sockets inherit it; without it Nagle + delayed ACK add ~40 ms to every response.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class _GraceNote(logging.Filter):
    """uvicorn's ``ERROR: Cancel N running task(s), timeout graceful shutdown exceeded`` is serve-sim's
    documented stop (those requests are answered 503, or their streams cut): said as a warning, in words
    of what happened."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith("Cancel %s running task(s)"):
            record.msg = (
                "%s request(s) still running after the 2 s grace: answered 503, or a stream cut "
                "(serve-sim stopping)"
            )
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


class AcceptErrors:
    """The serve loop's exception handler: an ``accept()`` refused for want of a descriptor (``ulimit -n``)
    is said once a minute at most, with the count since, and anything else as asyncio says it. asyncio
    logs each such refusal with a traceback, and CPython 3.11 tries the whole backlog (2,048) each loop
    pass: under ``ulimit -n 256``, a client holding 512 connections had serve-sim write 485,000
    tracebacks (196 MB of log) in 2 minutes."""

    MESSAGE = "socket.accept() out of system resource"

    def __init__(self, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self._clock = every_s, clock
        self._said: float | None = None
        self._since = 0  # refusals since the last note

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != self.MESSAGE:
            loop.default_exception_handler(context)
            return
        self._since += 1
        now = self._clock()
        if self._said is not None and now - self._said < self.every_s:
            return
        exc = context.get("exception")
        note = limit_note(exc) if isinstance(exc, BaseException) else ""
        logging.getLogger("uvicorn.error").warning(
            "cannot accept a connection: %s%s; connections wait in the backlog until one closes (%d "
            "refusal(s) since the last note; said once a minute at most)",
            exc,
            note,
            self._since,
        )
        self._said, self._since = now, 0


def make_server(sim: SimApp, *, log_level: str = "warning") -> uvicorn.Server:
    config = uvicorn.Config(
        sim.app,
        http=tracking_protocol(sim),
        lifespan="on",
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=2,
        timeout_keep_alive=30,
        # scope["client"] stays the TCP peer: SimApp.transport finds a request's connection by it (a local
        # proxy's X-Forwarded-For rewrote it by default, and the connection faults missed their connection)
        proxy_headers=False,
    )
    log = logging.getLogger("uvicorn.error")  # configured by the Config just made
    if not any(isinstance(f, _GraceNote) for f in log.filters):
        log.addFilter(_GraceNote())
    return uvicorn.Server(config)


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@dataclass
class RunningSim:
    """A serve-sim on a background thread; ``sim`` is its state (read ``sim.stats_dict()``)."""

    url: str
    sim: SimApp
    server: uvicorn.Server
    thread: threading.Thread
    loop: asyncio.AbstractEventLoop | None = None

    def call(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` on the server's loop and return its result (thread-safe state reads)."""
        assert self.loop is not None

        async def run() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=10)

    def stats(self) -> dict[str, Any]:
        return dict(self.call(self.sim.stats_dict))


def start_thread(
    sock: socket.socket, sim: SimApp, server: uvicorn.Server, *, done: threading.Event | None = None
) -> RunningSim:
    """Serve on a daemon thread with its own event loop (uvicorn installs no signal handlers off the main
    thread); ``done`` is set when the server stops, for whatever reason."""
    started = threading.Event()
    running = RunningSim(url_of(sock), sim, server, threading.Thread())

    def main() -> None:
        async def serve() -> None:
            running.loop = asyncio.get_running_loop()
            running.loop.set_exception_handler(AcceptErrors())
            started.set()
            await server.serve(sockets=[sock])

        try:
            asyncio.run(serve())
        finally:
            started.set()
            if done is not None:
                done.set()

    running.thread = threading.Thread(target=main, name=f"serve-sim {running.url}", daemon=True)
    running.thread.start()
    started.wait()
    return running


def _cancel_requests(server: uvicorn.Server) -> None:
    """What uvicorn does to the requests still running when its graceful shutdown times out."""
    for task in list(server.server_state.tasks):
        task.cancel()


def stop(running: RunningSim, timeout: float, *, hurry: Callable[[], bool] | None = None) -> None:
    """Stop gracefully within ``timeout``. A server still starting is let finish its start-up first:
    uvicorn 0.30 (the floor) told to exit mid-start-up cancelled the lifespan's receive and logged a
    traceback (serve-sim whose listening line could not be written stopped at once). Once ``hurry()``
    says so (a second Ctrl-C), the grace is cut short, as uvicorn's own second Ctrl-C cuts it: the
    requests still running are cancelled at once, as at the grace's end (503, or a stream cut), and the
    app still shuts down (uvicorn's ``force_exit`` skipped that and logged the lifespan's traceback)."""
    deadline = time.monotonic() + timeout
    while not running.server.started and running.thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
    running.sim.stopping = True  # before uvicorn can cancel a request: it answers 503 (SimApp.chat)
    running.server.should_exit = True
    hurried = False
    while running.thread.is_alive() and (left := deadline - time.monotonic()) > 0:
        running.thread.join(min(left, 0.05) if hurry is not None else left)
        if not hurried and hurry is not None and hurry() and running.loop is not None:
            hurried = True
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing left to cancel
                running.loop.call_soon_threadsafe(_cancel_requests, running.server)
    if running.thread.is_alive():
        raise RuntimeError(f"serve-sim at {running.url} did not stop within {timeout}s")


@contextlib.contextmanager
def serve_in_thread(
    config: SimConfig, host: str = "127.0.0.1", port: int = 0, *, stop_timeout: float = 10.0
) -> Iterator[RunningSim]:
    """Serve ``config`` on ``host``:``port`` (0: a free port) from a daemon thread for the ``with`` block."""
    sock = bind(host, port)
    sim = SimApp(config)
    try:
        running = start_thread(sock, sim, make_server(sim))
        try:
            yield running
        finally:
            stop(running, stop_timeout)
    finally:
        sock.close()


def serve_forever(config: SimConfig, host: str, port: int, *, log_level: str = "warning") -> int:
    """The CLI: bind, print the URL (and the port, for ``--port 0``), serve until SIGINT, SIGTERM or
    SIGHUP (one that ``nohup`` ignores stays ignored), then shut down gracefully and return 0 (1 if the
    server stopped on its own, e.g. a failed start-up). The soft open-files limit is raised first, as
    vLLM's server raises its own (:func:`~asyncroll.process_limits.open_files_for_server`)."""
    open_files_for_server()
    sock = bind(host, port)
    sim = SimApp(config)
    server = make_server(sim, log_level=log_level)
    done = threading.Event()
    signalled: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        # only recorded: done.set() here takes the lock that the done.wait() it interrupted may hold, and
        # a SIGTERM in that window hung the server for good (seen on Python 3.12, by chance on any)
        signalled.append(signum)

    stops = [signal.SIGINT, signal.SIGTERM]
    hangup = getattr(signal, "SIGHUP", None)
    if hangup is not None and signal.getsignal(hangup) != signal.SIG_IGN:
        stops.append(hangup)
    previous = {sig: signal.signal(sig, on_signal) for sig in stops}
    try:
        running = start_thread(sock, sim, server, done=done)
        try:
            print(
                f"serve-sim listening on {running.url} (model {config.model!r}, "
                f"metrics {config.metrics_flavor}, port {sock.getsockname()[1]})",
                flush=True,
            )
        except OSError as exc:  # stdout closed or full: no one can learn the URL (nor is it a bind error)
            stop(running, 30.0)
            why = exc.strerror or exc
            raise OutputWriteError(f"stdout: cannot write ({why}); serve-sim stopped") from exc
        while not signalled and not done.wait(0.1):  # a signal is seen within 0.1 s
            pass
        stop(running, 30.0, hurry=lambda: len(signalled) > 1)  # a second signal: no more grace
    finally:
        for sig, handler in previous.items():
            put_back(sig, handler)
        sock.close()
    return 0 if signalled else 1
