"""The tool worker process: preload tools, then serve jobs until the runtime closes the input pipe.

Run as ``python -m asyncroll.workers.child --in-fd N --out-fd M``; the first frame on ``--in-fd`` is
the JSON list of tools to preload (:func:`asyncroll.workers.spawn.tools_frame`). It imports
only the stdlib and :mod:`asyncroll.workers.protocol`/:mod:`~asyncroll.workers.builtin`, so that a
(replacement) worker is ready in tens of milliseconds. Jobs arrive on ``--in-fd`` and replies leave on
``--out-fd``; the process's own stdout/stderr are a log file (or /dev/null), so a tool that prints
cannot corrupt the channel. Module state persists across jobs: a worker is a warm, long-lived process.

Each tool file is imported once per worker, with its own folder first on ``sys.path`` (as running it as a
script would), so it can import helper modules that sit next to it. A tool is called with keyword
arguments only; whatever it raises (``SystemExit`` and ``KeyboardInterrupt`` included) is a tool error,
as is returning a coroutine, generator or other awaitable, which nothing would run. A SIGINT the worker
itself receives still ends it, as before. Return values become JSON-safe (:func:`to_jsonable`).

On Linux the worker is a child subreaper: a descendant orphaned by a double fork (``setsid -f``, a
daemon) is re-parented to the worker, not to init, so it stays in the tree the runtime kills. Between
jobs the worker reaps such orphans once they have exited, when more than a few wait (never a child in its
own process group, which a tool may still wait for); a background process a tool leaves running lives on
with the worker (like module state) until the worker is killed, or it closes: then it ends every
descendant itself.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import importlib.util
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any, BinaryIO, NoReturn

from asyncroll.errors import error_text  # stdlib only
from asyncroll.outputs.lines import write_all  # a whole frame, or an error
from asyncroll.workers.builtin import BUILTIN_TOOLS
from asyncroll.workers.protocol import (
    JobReply,
    JobRequest,
    ProtocolError,
    Ready,
    StartupFailed,
    ToolSpec,
    decode,
    dumps,
    encode,
    observation,
    read_payload,
)
from asyncroll.workers.results import check_result, to_jsonable
from asyncroll.workers.upkeep import (
    Baseline,
    adopt_orphans,
    die_with_parent,
    end_descendants,
    outside_children,
    reap_orphans,
    resident_bytes,
)

PING = "__ping__"
"""The dummy call's tool name: answers the worker's pid."""
#: A start-up failure's text (a tool's import error and its traceback): the run's error, no event's.
STARTUP_ERROR_LIMIT = 4000
#: The most characters of a failed job's traceback that the worker log gets (its error text has none).
TRACEBACK_LOG_CHARS = 20_000

_sigint_received = False
"""Set by the worker's SIGINT handler: tells a real SIGINT from a ``KeyboardInterrupt`` a tool raised."""


class ToolLoadError(Exception):
    """A tool could not be preloaded; the message names the file and the function."""


def load_tools(specs: list[ToolSpec]) -> dict[str, Callable[..., Any]]:
    """Import each tool file once; map every ``ToolSpec.key`` and every bare name to its callable.

    A bare name shared by tools from different files answers with an error naming the keys to use.
    """
    by_key: dict[str, Callable[..., Any]] = {PING: os.getpid}
    modules: dict[Path, ModuleType] = {}
    names: dict[str, set[str]] = {}
    folders = 0  # tool folders go first on sys.path, in the order their first file is loaded
    for spec in specs:
        if spec.path is None:
            function = BUILTIN_TOOLS.get(spec.name)
            if function is None:
                known = ", ".join(sorted(BUILTIN_TOOLS))
                raise ToolLoadError(f"unknown built-in tool {spec.name!r} (built-ins: {known})")
        else:
            module = modules.get(spec.path)
            if module is None:
                folder = str(spec.path.parent)
                if folder not in sys.path:  # helper modules next to the tool file, as for a script
                    sys.path.insert(folders, folder)
                    folders += 1
                module = modules[spec.path] = _load_module(spec.path, len(modules), spec.sha256)
            function = getattr(module, spec.name, None)
            if not callable(function):
                raise ToolLoadError(f"{spec.path}: no callable named {spec.name!r}")
        by_key[spec.key] = function
        names.setdefault(spec.name, set()).add(spec.key)
    tools = dict(by_key)
    for name, keys in names.items():
        if name not in by_key:  # a built-in's key is its bare name and wins
            tools[name] = by_key[next(iter(keys))] if len(keys) == 1 else _ambiguous(name, sorted(keys))
    return tools


def _ambiguous(name: str, keys: list[str]) -> Callable[..., Any]:
    def refuse(**_: Any) -> Any:
        raise LookupError(f"tool name {name!r} is ambiguous; use one of {keys}")

    return refuse


def _load_module(path: Path, index: int, sha256: str | None) -> ModuleType:
    """Import ``path`` from the very bytes it hashes (no bytecode cache): when ``sha256`` is given (the
    hash run.json records), a file that no longer has it is refused, not run."""
    stem = "".join(c if c.isalnum() else "_" for c in path.stem)
    name = f"_asyncroll_tool_{index}_{stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ToolLoadError(f"{path}: not a Python source file")
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise ToolLoadError(f"{path}: cannot be read: {describe(exc)}") from exc
    if sha256 is not None and (found := hashlib.sha256(source).hexdigest()) != sha256:
        raise ToolLoadError(
            f"{path}: changed since the run started (run.json records SHA-256 {sha256}, the file now has "
            f"{found}): a worker runs only the tool code the run recorded"
        )
    module = importlib.util.module_from_spec(spec)
    module.__dict__["math"] = math  # ToolMATH tool files use math without importing it
    sys.modules[name] = module
    try:
        exec(compile(source, path, "exec", dont_inherit=True), module.__dict__)  # trusted code
    except BaseException as exc:  # any import failure is a start-up failure, but a real SIGINT
        if _signalled(exc):
            raise
        sys.modules.pop(name, None)
        import traceback

        trace = "".join(traceback.format_exception(exc, limit=-4))
        raise ToolLoadError(f"{path}: import failed: {describe(exc)}\n{trace}") from exc
    return module


def describe(exc: BaseException) -> str:
    """``ExcType: message`` (``ExcType`` alone when the message is empty), cut to ``MAX_ERROR_CHARS``.

    A lone surrogate in the message (a file name decoded with ``surrogateescape``, say) is written as
    its escape, ``\\udcff``: the text goes to events.jsonl and, under ``--tool-errors observe``, to the
    model, and no UTF-8 write takes a lone surrogate (one failed the whole run)."""
    try:
        message = str(exc)
    except BaseException as error:  # a broken __str__ (one that raises SystemExit too) must not kill us
        if _signalled(error):
            raise
        message = "<unprintable>"
    text = error_text(f"{type(exc).__name__}: {message}" if message else type(exc).__name__)
    return error_text(text.encode("utf-8", "backslashreplace").decode("utf-8"))  # an escape is longer


def _no_room(exc: BaseException) -> str:
    """A hint for a tool that met a full disk (or a file size limit, a quota) on a write that names no
    file: its prints go to the run's worker log (``workers/worker-N.log``), so a print failed that way
    too, and a bare ``OSError: [Errno 27] File too large`` did not say so."""
    if not isinstance(exc, OSError) or exc.filename is not None:
        return ""
    if exc.errno not in (errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return ""
    return " (no room for a write that names no file: the tool's prints go to the run's workers/ log)"


def _signalled(exc: BaseException) -> bool:
    """Whether ``exc`` is the ``KeyboardInterrupt`` of a SIGINT sent to the worker (which must end it, as
    it always has), not one that tool code raised (a tool error like any other)."""
    return isinstance(exc, KeyboardInterrupt) and _sigint_received


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    global _sigint_received
    _sigint_received = True
    raise KeyboardInterrupt


def _mark_sigint() -> None:
    """Keep Python's SIGINT behaviour (a ``KeyboardInterrupt``, then death by SIGINT if uncaught) but
    remember that the signal came; only where Python's own handler is installed (not where the runtime
    was started with SIGINT ignored, which its workers inherit)."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)


def run_job(tools: dict[str, Callable[..., Any]], payload: bytes, failures: list[str] | None = None) -> bytes:
    """Decode one request, run it and return the encoded reply frame; a failure's traceback is appended
    to ``failures``, formatted before the reply goes (in this job's time, not its ``execute_s``), for
    :func:`serve` to write to the worker log once the job's fds are restored."""
    t0 = time.monotonic()
    request = decode(payload)
    if not isinstance(request, JobRequest):
        raise ProtocolError(f"expected a job request, got {type(request).__name__}")
    decode_s = time.monotonic() - t0
    function = tools.get(request.tool)
    ok, result, error = False, None, None
    failed: list[tuple[str, BaseException]] = []  # what went wrong and its exception, for failures
    pid = os.getpid()
    cpu0, children0 = time.process_time(), _children_cpu()
    started = time.monotonic()
    try:
        if function is None:
            raise KeyError(f"unknown tool {request.tool!r}")
        result = function(**request.arguments)
        check_result(result)
        ok = True
    except BaseException as exc:  # a failing tool is a result, not a crash; a real SIGINT still ends us
        if _signalled(exc):
            raise
        result, error = None, error_text(describe(exc) + _no_room(exc))
        failed.append(("failed", exc))
    finished = time.monotonic()
    if os.getpid() != pid:
        _leave_fork(request.tool, error)
    cpu_s = time.process_time() - cpu0 + _children_cpu() - children0
    t1 = time.monotonic()
    try:
        value = to_jsonable(result)
        if ok and request.observation_chars is not None:
            value = observation(value, request.observation_chars)
        blob = dumps(value)
    except BaseException as exc:  # e.g. a value too large to encode, or whose __repr__ calls sys.exit()
        if _signalled(exc):
            raise
        ok, error, blob = False, error_text(f"its result could not be encoded: {describe(exc)}"), dumps(None)
        failed.append(("returned a result that could not be encoded", exc))
    serialize_s = decode_s + time.monotonic() - t1
    if failures is not None:
        # Before the reply: a chained exception's __str__ that hangs (or a chain of thousands) times out
        # this job; formatted after it, the worker was busy outside any job and the next one, another
        # trajectory's perhaps, waited and timed out in its place.
        failures.extend(_traceback_text(request, what, exc) for what, exc in failed)
    failed.clear()  # the exceptions hold the tool's frames, and this frame, which holds them
    reply = JobReply(
        request.job_id,
        ok,
        None,
        error,
        started,
        finished,
        finished - started,
        cpu_s,
        serialize_s,
        resident_bytes() if request.report_rss else None,
        outside_children(),
    )
    return encode(reply, value_blob=blob)


def _traceback_text(request: JobRequest, what: str, exc: BaseException) -> str:
    """A failed job's lines for the worker log: the traceback from the tool's own frame down (the error
    text, ``ExcType: message``, says neither the file nor the line), at most ``TRACEBACK_LOG_CHARS``."""
    import traceback  # only once a job fails: not at every (replacement) worker's start-up

    try:
        frames = exc.__traceback__.tb_next if exc.__traceback__ is not None else None  # not run_job's
        text = "".join(traceback.format_exception(type(exc), exc, frames))
    except BaseException as error:  # a broken __str__ (describe copes with it), or a stack too deep
        if _signalled(error):
            raise
        text = describe(exc) + "\n"
    if len(text) > TRACEBACK_LOG_CHARS:
        text = (
            text[:TRACEBACK_LOG_CHARS] + f"\n[traceback cut: the first {TRACEBACK_LOG_CHARS:,} characters]\n"
        )
    return f"asyncroll worker: job {request.job_id} ({request.tool}) {what}:\n{text}"


def _log_failures(failures: list[str]) -> None:
    """Write failed jobs' tracebacks to fd 2, the worker log, after what the tools printed (a full disk
    or a closed log loses them, never the worker)."""
    text = "".join(failures)
    failures.clear()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException as error:  # a stream the tool closed or replaced: its flush may even exit
            if _signalled(error):
                raise
    with contextlib.suppress(OSError):
        write_all(2, text.encode("utf-8", "backslashreplace"))


def _leave_fork(tool: str, error: str | None) -> NoReturn:
    """End a process the tool forked that returned from the tool (or raised ``error`` out of it) instead
    of calling ``os._exit``: it would answer the job in the worker's place (its result, its CPU time,
    negative) and go on serving the next job while the worker waited for it."""
    left = "returned from the tool" if error is None else f"raised {error} out of the tool"
    print(
        f"asyncroll worker: a process that tool {tool!r} forked (pid {os.getpid()}) {left} "
        "instead of calling os._exit(); it exits here with status 1",
        file=sys.stderr,
        flush=True,
    )
    os._exit(1)  # no flush: its stdout buffer holds a copy of the worker's unwritten output


def _children_cpu() -> float:
    times = os.times()
    return times.children_user + times.children_system


def serve(stream: BinaryIO, out_fd: int, tools: dict[str, Callable[..., Any]]) -> int:
    """Answer jobs until the input pipe reaches end of stream; return the exit status."""
    baseline = Baseline()
    failures: list[str] = []
    while True:
        payload = read_payload(stream)
        if payload is None:
            return 0
        write_all(out_fd, run_job(tools, payload, failures))
        baseline.restore()  # after the reply, as the reaping: four system calls when nothing changed
        if failures:  # to the log itself, not to where the failed call left fd 2
            _log_failures(failures)
        reap_orphans()  # one system call unless a child has exited


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asyncroll.workers.child")
    parser.add_argument("--in-fd", type=int, required=True)
    parser.add_argument("--out-fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, default=None)
    args = parser.parse_args(argv)
    die_with_parent()
    if args.parent_pid is not None and os.getppid() != args.parent_pid:
        # The runtime died before the line above (its SIGKILL while this interpreter started): no death
        # signal will come, and importing the tools could take long. Leave now.
        os._exit(1)
    adopt_orphans()
    _mark_sigint()
    try:
        return _run(args)
    finally:
        end_descendants()  # leaving normally (end of stream, start-up failure, broken pipe)


def _run(args: argparse.Namespace) -> int:
    # Descendants that exec must not hold the channel open: the runtime detects death by end of stream.
    os.set_inheritable(args.in_fd, False)
    os.set_inheritable(args.out_fd, False)
    with open(args.in_fd, "rb", buffering=1 << 16) as stream:  # closed on the way out (no ResourceWarning)
        listed = read_payload(stream)
        if listed is None:
            return 1  # the runtime went away before it sent the tools
        started = time.monotonic()
        try:
            specs = [ToolSpec.from_json(item) for item in json.loads(listed)]
            tools = load_tools(specs)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported to the runtime, then exit
            error = str(exc) if isinstance(exc, ToolLoadError) else describe(exc)
            with contextlib.suppress(OSError, ValueError):  # the import closed fd 2 or sys.stderr
                print(f"asyncroll worker start-up failed: {error}", file=sys.stderr, flush=True)
            write_all(args.out_fd, encode(StartupFailed(error[:STARTUP_ERROR_LIMIT])))
            return 1
        ready = Ready(os.getpid(), [spec.key for spec in specs], time.monotonic() - started)
        write_all(args.out_fd, encode(ready))
        try:
            return serve(stream, args.out_fd, tools)
        except BrokenPipeError:
            return 1  # the runtime went away


if __name__ == "__main__":
    sys.exit(main())
