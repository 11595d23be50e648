"""The tool worker process: preload tools, then serve jobs until the runtime closes the input pipe.

Run as ``python -m asyncroll.workers.child --in-fd N --out-fd M --tools-json '[...]'``. It imports
only the stdlib and :mod:`asyncroll.workers.protocol`/:mod:`~asyncroll.workers.builtin`, so that a
(replacement) worker is ready in tens of milliseconds. Jobs arrive on ``--in-fd`` and replies leave on
``--out-fd``; the process's own stdout/stderr are a log file (or /dev/null), so a tool that prints
cannot corrupt the channel. Module state persists across jobs: a worker is a warm, long-lived process.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO

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
    read_payload,
    write_all,
)

PING = "__ping__"
"""The dummy call's tool name: answers the worker's pid."""
ERROR_LIMIT = 2000
MAX_DEPTH = 64

_SCALARS = (str, int, float, bool, type(None))


class ToolLoadError(Exception):
    """A tool could not be preloaded; the message names the file and the function."""


def load_tools(specs: list[ToolSpec]) -> dict[str, Callable[..., Any]]:
    """Import each tool file once; map every ``ToolSpec.key`` and every bare name to its callable.

    A bare name shared by tools from different files answers with an error naming the keys to use.
    """
    by_key: dict[str, Callable[..., Any]] = {PING: os.getpid}
    modules: dict[Path, ModuleType] = {}
    names: dict[str, set[str]] = {}
    for spec in specs:
        if spec.path is None:
            function = BUILTIN_TOOLS.get(spec.name)
            if function is None:
                known = ", ".join(sorted(BUILTIN_TOOLS))
                raise ToolLoadError(f"unknown built-in tool {spec.name!r} (built-ins: {known})")
        else:
            module = modules.get(spec.path)
            if module is None:
                module = modules[spec.path] = _load_module(spec.path, len(modules))
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


def _load_module(path: Path, index: int) -> ModuleType:
    stem = "".join(c if c.isalnum() else "_" for c in path.stem)
    name = f"_asyncroll_tool_{index}_{stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ToolLoadError(f"{path}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    module.__dict__["math"] = math  # ToolMATH tool files use math without importing it
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # any import failure is a start-up failure
        sys.modules.pop(name, None)
        import traceback

        trace = "".join(traceback.format_exception(exc, limit=-4))
        raise ToolLoadError(f"{path}: import failed: {describe(exc)}\n{trace}") from exc
    return module


def describe(exc: BaseException) -> str:
    """``ExcType: message``, cut to :data:`ERROR_LIMIT` characters."""
    return f"{type(exc).__name__}: {exc}"[:ERROR_LIMIT]


def to_jsonable(value: Any, depth: int = 0) -> Any:
    """A JSON-safe copy of a tool's return value (ints stay ints, also as dict keys)."""
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    if depth > MAX_DEPTH:
        return _repr(value)
    for base in (bool, int, float, str):  # subclasses (IntEnum, numpy.float64, ...) → the base type
        if isinstance(value, base):
            return base(value)
    if isinstance(value, dict):
        return {_key(k, depth): to_jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v, depth + 1) for v in value]
    if isinstance(value, set | frozenset):
        items = [to_jsonable(v, depth + 1) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return sorted(items, key=repr)
    for method in ("tolist", "item"):  # numpy arrays and scalars, torch tensors
        convert = getattr(value, method, None)
        if callable(convert):
            try:
                return to_jsonable(convert(), depth + 1)
            except Exception:  # noqa: BLE001 - fall back to repr below
                break
    return _repr(value)


def _key(key: Any, depth: int) -> Any:
    converted = to_jsonable(key, depth + 1)
    return converted if isinstance(converted, _SCALARS) else str(key)


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not kill the worker
        return f"<unrepresentable {type(value).__name__}>"


def run_job(tools: dict[str, Callable[..., Any]], payload: bytes) -> bytes:
    """Decode one request, run it and return the encoded reply frame."""
    t0 = time.monotonic()
    request = decode(payload)
    if not isinstance(request, JobRequest):
        raise ProtocolError(f"expected a job request, got {type(request).__name__}")
    decode_s = time.monotonic() - t0
    function = tools.get(request.tool)
    ok, result, error = False, None, None
    cpu0, children0 = time.process_time(), _children_cpu()
    started = time.monotonic()
    try:
        if function is None:
            raise KeyError(f"unknown tool {request.tool!r}")
        result = function(**request.arguments)
        ok = True
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a failing tool is a result, not a crash
        error = describe(exc)
    finished = time.monotonic()
    cpu_s = time.process_time() - cpu0 + _children_cpu() - children0
    t1 = time.monotonic()
    try:
        blob = dumps(to_jsonable(result))
    except Exception as exc:  # noqa: BLE001 - e.g. a value too deep or too large to pickle
        ok, error, blob = False, describe(exc), dumps(None)
    serialize_s = decode_s + time.monotonic() - t1
    reply = JobReply(
        request.job_id, ok, None, error, started, finished, finished - started, cpu_s, serialize_s
    )
    return encode(reply, value_blob=blob)


def _children_cpu() -> float:
    times = os.times()
    return times.children_user + times.children_system


def serve(stream: BinaryIO, out_fd: int, tools: dict[str, Callable[..., Any]]) -> int:
    """Answer jobs until the input pipe reaches end of stream; return the exit status."""
    while True:
        payload = read_payload(stream)
        if payload is None:
            return 0
        write_all(out_fd, run_job(tools, payload))


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this worker when the runtime dies, so a runaway tool cannot outlive it."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asyncroll.workers.child")
    parser.add_argument("--in-fd", type=int, required=True)
    parser.add_argument("--out-fd", type=int, required=True)
    parser.add_argument("--tools-json", required=True)
    args = parser.parse_args(argv)
    _die_with_parent()
    # Descendants that exec must not hold the channel open: the runtime detects death by end of stream.
    os.set_inheritable(args.in_fd, False)
    os.set_inheritable(args.out_fd, False)
    stream = open(args.in_fd, "rb", buffering=1 << 16)  # noqa: SIM115 - lives as long as the process
    started = time.monotonic()
    try:
        specs = [ToolSpec.from_json(item) for item in json.loads(args.tools_json)]
        tools = load_tools(specs)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported to the runtime, then exit
        error = str(exc) if isinstance(exc, ToolLoadError) else describe(exc)
        print(f"asyncroll worker start-up failed: {error}", file=sys.stderr, flush=True)
        write_all(args.out_fd, encode(StartupFailed(error[: 2 * ERROR_LIMIT])))
        return 1
    ready = Ready(os.getpid(), [spec.key for spec in specs], time.monotonic() - started)
    write_all(args.out_fd, encode(ready))
    try:
        return serve(stream, args.out_fd, tools)
    except BrokenPipeError:
        return 1  # the runtime went away


if __name__ == "__main__":
    sys.exit(main())
