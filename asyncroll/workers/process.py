"""One warm tool worker process, owned directly by the runtime (no executor in between).

:class:`ProcessWorker` spawns ``python -m asyncroll.workers.child`` in its own session, waits for its
ready handshake and a dummy call under a start-up deadline, then runs one job at a time over two
dedicated pipes. A job that overruns its timeout, or a call that is cancelled, kills the worker's whole
process tree (its process group plus every descendant psutil can see, including ones that called
``setsid`` or were orphaned by a double fork: the worker adopts those as a child subreaper); a killed
worker is never reused. What a worker leaves behind when it dies before it can be killed (re-parented to
the runtime then) is the pool's to kill, by the :attr:`~ProcessWorker.origin` it inherited
(:mod:`asyncroll.workers.orphans`). Owning the process directly keeps a tool round trip near the cost of
two pipe writes and makes kill, reap and CPU accounting exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import psutil

from asyncroll import proctree
from asyncroll.errors import ToolsNotLoaded, WorkerDied, WorkerStartupError, WorkerTimeout
from asyncroll.process_limits import limit_note
from asyncroll.workers.orphans import new_origin
from asyncroll.workers.protocol import (
    HEADER,
    JobReply,
    JobRequest,
    Message,
    ProtocolError,
    Ready,
    StartupFailed,
    ToolSpec,
    decode,
    encode,
    frame_in_slices,
    payload_length,
)
from asyncroll.workers.spawn import log_tail, spawn, tools_frame

_PING_JOB_ID = -1


@dataclass(frozen=True, slots=True)
class CallResult:
    """A worker's reply plus when the runtime sent the job and had the reply (``time.monotonic``)."""

    reply: JobReply
    sent: float
    received: float

    @property
    def round_trip_s(self) -> float:
        return self.received - self.sent


class _JobPipe(asyncio.Protocol):
    """The job pipe's flow control: a large request writes its next piece once the pipe has taken the last
    one, so the transport's buffer never holds (nor copies again on each write) more than a piece of it."""

    def __init__(self) -> None:
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self._paused = False  # the worker is gone: nothing more will be taken, nothing waits for it
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def taken(self) -> None:
        """Once the pipe has taken what was written (down to the transport's low-water mark); the event
        loop runs once at least."""
        if not self._paused:
            await asyncio.sleep(0)
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


class ProcessWorker:
    """A persistent tool worker: preload + dummy call at start, one job at a time, tree kill on timeout."""

    def __init__(
        self,
        index: int,
        tools: Sequence[ToolSpec],
        *,
        generation: int = 0,
        log_path: Path | None = None,
        startup_timeout: float,
    ) -> None:
        self.index = index
        self.generation = generation
        self.tools = tuple(tools)
        self.log_path = log_path
        self.startup_timeout = startup_timeout
        self.origin = new_origin(index, generation)
        """In the worker's environment and so in that of everything it starts (``ORIGIN_ENV``)."""
        self.pid: int | None = None
        self.startup_s: float | None = None
        self.preload_s: float | None = None
        self.rest_rss_bytes: int | None = None
        """Resident memory once its tools are imported (after the dummy call), where it can be read."""
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.StreamReader | None = None
        self._read_transport: asyncio.ReadTransport | None = None
        self._write_transport: asyncio.WriteTransport | None = None
        self._job_pipe = _JobPipe()
        self._pump: asyncio.Task[None] | None = None
        self._exit: asyncio.Task[int] | None = None
        self._killer: asyncio.Task[None] | None = None
        self._pending: asyncio.Future[tuple[Message, float]] | None = None
        self._broken: str | None = None
        self._busy = False
        self._sent = False  # the current call's request was written
        self._log_offset = 0
        self._pipes: list[IO[bytes]] = []
        self._doomed: list[psutil.Process] = []  # descendants already signalled
        self._outside: tuple[int, ...] = ()  # its children outside its group, as its last reply named them

    def __repr__(self) -> str:
        return f"<ProcessWorker {self.index} gen {self.generation} pid {self.pid} rc {self.returncode}>"

    @property
    def returncode(self) -> int | None:
        """The exit status (negative: killed by that signal); ``None`` while running or never started."""
        return None if self._proc is None else self._proc.returncode

    @property
    def alive(self) -> bool:
        """Started, running, not being killed and its channel intact."""
        return (
            self._proc is not None and self.returncode is None and self._killer is None and not self._broken
        )

    async def start(self) -> None:
        """Spawn the worker and wait for its handshake and its answer to the dummy call, all within
        ``startup_timeout``; otherwise raise :class:`WorkerStartupError` with nothing left running."""
        if self._proc is not None:
            raise RuntimeError("a ProcessWorker is started once; make a new one to replace it")
        loop = asyncio.get_running_loop()
        t0, deadline = time.monotonic(), loop.time() + self.startup_timeout
        try:
            async with asyncio.timeout_at(deadline):
                spawned = await spawn(self.log_path, self.origin)
        except TimeoutError as exc:
            raise WorkerStartupError(
                f"worker {self.index}: its process was not spawned within {self.startup_timeout:g}s "
                "(--worker-startup-timeout)"
            ) from exc
        except OSError as exc:
            raise WorkerStartupError(
                f"worker {self.index}: could not spawn: {exc.strerror or repr(exc)}{limit_note(exc)}"
            ) from exc
        self._proc, self._log_offset = spawned.process, spawned.log_offset
        self._pipes = [spawned.replies, spawned.jobs]
        self.pid = self._proc.pid
        self._exit = loop.create_task(self._proc.wait(), name=f"worker-{self.index}-exit")
        self._exit.add_done_callback(self._on_exit)
        self._reader = asyncio.StreamReader()
        reader_protocol = asyncio.StreamReaderProtocol(self._reader)
        self._pending = loop.create_future()  # the handshake is the first frame
        try:
            self._read_transport, _ = await loop.connect_read_pipe(lambda: reader_protocol, self._pipes[0])
            self._write_transport, _ = await loop.connect_write_pipe(lambda: self._job_pipe, self._pipes[1])
            self._write_transport.write(tools_frame(self.tools))  # buffered: the worker reads it first
            self._pump = loop.create_task(self._pump_frames(), name=f"worker-{self.index}-reader")
            async with asyncio.timeout_at(deadline):
                await self._handshake()
        except TimeoutError:
            await self.kill()
            raise WorkerStartupError(
                f"worker {self.index} (pid {self.pid}) was not ready within {self.startup_timeout:g}s "
                "(--worker-startup-timeout)" + log_tail(self.log_path, self._log_offset)
            ) from None
        except WorkerDied as exc:
            if self._broken and self._exit is not None and not self._exit.done():
                # its pipe closed: it is exiting; its status (a signal's?) is known once it is reaped
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._exit), 5.0)
            status = self.returncode  # before the kill below: negative if a signal from outside ended it
            await self.kill()
            raise WorkerStartupError(
                f"worker {self.index} died during start-up: {exc}{log_tail(self.log_path, self._log_offset)}",
                retry=status is not None and status < 0,
            ) from exc
        except BaseException:  # cancelled (Ctrl-C during start-up): nobody will await the handshake
            await self.kill()
            if self._pending is not None:  # else its WorkerDied would be logged as never retrieved
                if not self._pending.done():
                    self._pending.cancel()
                elif not self._pending.cancelled():
                    self._pending.exception()
            raise
        self.startup_s = time.monotonic() - t0

    async def _handshake(self) -> None:
        assert self._pending is not None
        message, _ = await self._pending
        if isinstance(message, StartupFailed):
            raise ToolsNotLoaded(f"worker {self.index} could not load its tools: {message.error}")
        if not isinstance(message, Ready) or message.pid != self.pid:
            raise WorkerDied(f"bad handshake {message!r}")
        self.preload_s = message.preload_s
        result = await self._exchange(JobRequest(_PING_JOB_ID, "__ping__", {}, report_rss=True))
        if not result.reply.ok or result.reply.value != self.pid:
            raise WorkerDied(f"dummy call answered {result.reply!r}")
        self.rest_rss_bytes = result.reply.rss_bytes

    async def call(
        self,
        request: JobRequest,
        timeout: float,  # noqa: ASYNC109
        *,
        large: bool = False,
    ) -> CallResult:
        """Run one job. Raises :class:`WorkerTimeout` (tree killed) past ``timeout`` seconds and
        :class:`WorkerDied` if the worker exits or its channel breaks; a tool's own exception is a
        reply with ``ok=False``. Cancelling the call kills the worker's tree before re-raising, unless
        nothing of the job was sent yet.

        ``timeout`` is a parameter, not the caller's scope, because its expiry must kill the tree; it
        counts the request's encoding too. ``large`` (an evaluation, its tests in the arguments): the
        request's list arguments are pickled a slice at a time, the event loop running in between
        (:func:`~asyncroll.workers.protocol.frame_in_slices`); a small request is encoded in one go.
        """
        assert not self._busy, "a ProcessWorker runs one job at a time"
        self._sent = False
        try:
            async with asyncio.timeout(timeout):
                return await self._exchange(request, large=large)
        except TimeoutError:
            await self.kill()
            raise WorkerTimeout(
                f"worker {self.index} (pid {self.pid}) job {request.job_id} ({request.tool}) ran past "
                f"{timeout:g}s; its process tree was killed"
            ) from None
        except asyncio.CancelledError:
            if not self._sent:  # cancelled while its request was encoded: the worker has none of it
                raise
            # The job was sent: the worker is mid-job, unusable.
            self._broken = self._broken or "was cancelled during a job"
            if self.pid is not None and self.returncode is None:
                self._doomed += proctree.descendants(self.pid)
                proctree.signal_tree(self.pid, signal.SIGKILL, self._doomed)
            with contextlib.suppress(asyncio.CancelledError):
                await self.kill(grace=0.0)
            raise

    async def _exchange(self, request: JobRequest, *, large: bool = False) -> CallResult:
        self._check_channel()
        self._busy = True
        try:
            if large:
                parts: list[bytes] = []
                for _ in frame_in_slices(request, parts):
                    await asyncio.sleep(0)  # the other trajectories run between slices
                self._check_channel()  # it may have died meanwhile
            else:
                parts = [encode(request)]
            assert self._write_transport is not None
            future: asyncio.Future[tuple[Message, float]] = asyncio.get_running_loop().create_future()
            self._pending = future
            sent = time.monotonic()
            self._sent = True  # from here a cancelled call leaves the worker mid-job: it is killed
            parts.reverse()
            while parts:  # each piece is the transport's once written (what the pipe has not taken)
                self._write_transport.write(parts.pop())
                if large and parts:
                    await self._job_pipe.taken()
                    if self._write_transport.is_closing():  # it died: the reply future says how
                        break
            message, received = await future
        finally:
            self._busy = False
            self._pending = None
        if not isinstance(message, JobReply) or message.job_id != request.job_id:
            await self.kill()
            raise WorkerDied(f"worker {self.index} answered job {request.job_id} with {message!r}")
        self._outside = message.children
        return CallResult(message, sent, received)

    def _check_channel(self) -> None:
        if not self.alive or self._write_transport is None or self._write_transport.is_closing():
            raise WorkerDied(self._death_reason())

    async def _pump_frames(self) -> None:
        """Read frames for as long as the worker writes them; hand each to the waiting call."""
        assert self._reader is not None and self._exit is not None
        reader = self._reader
        try:
            while True:
                payload = await reader.readexactly(payload_length(await reader.readexactly(HEADER.size)))
                received = time.monotonic()
                message = decode(payload)
                future = self._pending
                if future is None or future.done():
                    raise ProtocolError(f"unsolicited {type(message).__name__}")
                future.set_result((message, received))
        except (asyncio.IncompleteReadError, ConnectionError):
            reason = "closed its reply pipe"
        except Exception as exc:  # noqa: BLE001 - a corrupt frame means the channel is unusable
            reason = f"broke the protocol ({type(exc).__name__}: {exc})"
        with contextlib.suppress(TimeoutError):  # wait briefly to report how it exited
            await asyncio.wait_for(asyncio.shield(self._exit), 1.0)
        self._fail(reason)

    def _on_exit(self, task: asyncio.Task[int]) -> None:
        # A descendant that inherited the reply pipe can hold it open; do not wait for end of stream
        # forever, but give the reader a moment to deliver a reply written just before the exit.
        if self._pending is not None and not self._pending.done():
            asyncio.get_running_loop().call_later(0.1, self._fail, "exited")

    def _fail(self, reason: str) -> None:
        self._broken = self._broken or reason
        future = self._pending
        if future is not None and not future.done():
            future.set_exception(WorkerDied(self._death_reason()))

    def _death_reason(self) -> str:
        what = self._broken or ("is being killed" if self._killer else "is not running")
        status = self.returncode
        if status is not None:
            how = f"killed by {signal.Signals(-status).name}" if status < 0 else f"exit status {status}"
            what = f"{what}, {how}"
            if status > 0 and self.log_path is not None:  # an exit of its own: the why is in its log
                what = f"{what}; its log: {self.log_path}"
        return f"worker {self.index} (pid {self.pid}) {what}"

    async def wait_exit(self) -> int:
        """Resolve with the exit status once the worker process has exited (for whatever reason)."""
        if self._exit is None:
            raise RuntimeError("worker not started")
        return await asyncio.shield(self._exit)

    @property
    def killed_pids(self) -> set[int]:
        """The descendants :meth:`kill` signalled: those in sessions of their own die after the worker
        and, while the runtime is a child subreaper, are left to it to reap (:mod:`~.orphans`)."""
        return {process.pid for process in self._doomed}

    @property
    def outside_children(self) -> set[int]:
        """Once the worker has died (not a clean exit, which reaps its children first): its children
        outside its process group as its last reply named them. Re-parented to the runtime, those that
        exited are zombies whose environment and session name no worker: the pool reaps them
        (:attr:`~.orphans.Adopter.named`); they would otherwise stay for the whole run."""
        return set(self._outside) if self.returncode not in (None, 0) else set()

    async def kill(self, grace: float = 0.2) -> None:
        """Kill the worker and its whole process tree, reap it and close the channel. Idempotent.

        SIGTERM goes to the process group and every descendant; whatever has not exited after
        ``grace`` seconds (or once the worker itself is gone) gets SIGKILL. Runs as a shielded task,
        so a cancelled caller cannot leave a half-killed worker behind.
        """
        if self._killer is None:
            self._killer = asyncio.get_running_loop().create_task(self._kill(grace))
        await asyncio.shield(self._killer)

    async def _kill(self, grace: float) -> None:
        if self._proc is not None and self._exit is not None:
            pid = self._proc.pid
            if self._proc.returncode is None:
                self._doomed += proctree.descendants(pid)
            proctree.signal_tree(pid, signal.SIGTERM, self._doomed)
            if grace > 0:
                await asyncio.wait({self._exit}, timeout=grace)
            if self._proc.returncode is None:
                self._doomed += proctree.descendants(pid)  # started while we waited
            proctree.signal_tree(pid, signal.SIGKILL, self._doomed)
            await asyncio.wait({self._exit})
        for transport in (self._write_transport, self._read_transport):
            if transport is not None:
                transport.close()
        for pipe in self._pipes:
            pipe.close()  # a no-op for the ones a transport took over
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.wait({self._pump})

    def cpu_seconds(self) -> float | None:
        """User + system CPU of the worker and its reaped children; ``None`` unless it is running."""
        if self.pid is None or self.returncode is not None:
            return None
        return proctree.cpu_seconds(self.pid)

    async def aclose(self, exit_grace: float = 1.0) -> None:
        """Polite shutdown: close the job pipe so the worker exits at end of stream; kill it if it lingers."""
        if self._proc is not None and self._killer is None and self._write_transport is not None:
            self._write_transport.close()
            assert self._exit is not None
            await asyncio.wait({self._exit}, timeout=exit_grace)
        await self.kill()
