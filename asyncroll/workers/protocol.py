"""The wire protocol between the runtime and a tool worker process.

Each message is one frame: a 4-byte big-endian length, then a pickle (protocol 5) of a plain tuple
``(tag, *fields)``. Only builtin values ever cross the channel (tool values are made JSON-safe in the
worker first), so both ends decode with an unpickler that refuses every global: a frame can carry
data, never a callable. Messages are frozen dataclasses; the tuple form keeps encode/decode a few
microseconds, which matters because a tool round trip is budgeted at ~300 µs. A large job request (an
evaluation's tests) may instead carry its list arguments as further pickles after the tuple, a slice
each (:func:`frame_in_slices`), so that the runtime's event loop runs between them.

The frames travel on two dedicated pipes, never on the worker's stdout/stderr, so a tool that prints
cannot corrupt the channel. Stdlib only: the worker process imports this module at start-up.
"""

from __future__ import annotations

import io
import json
import pickle
import struct
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from operator import attrgetter
from pathlib import Path
from typing import Any, BinaryIO

HEADER = struct.Struct(">I")
"""Frame header: payload length, 4 bytes big-endian."""
MAX_FRAME = 1 << 30
PICKLE_PROTOCOL = 5
SLICE_S = 0.002
"""About how long :func:`frame_in_slices` pickles before it pauses (the slice's length adapts to it)."""


class ProtocolError(Exception):
    """A frame could not be decoded (corrupt channel or a peer speaking another protocol)."""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool a worker must preload: a built-in (``path is None``) or a callable ``name`` in ``path``.

    ``sha256`` is the file's hash as run.json records it: a worker then runs the file only if the bytes
    it reads still have that hash (a file edited during a run would otherwise run, unrecorded, in every
    replacement worker started after the edit)."""

    name: str
    path: Path | None = None
    sha256: str | None = None

    def __post_init__(self) -> None:
        if self.path is not None and not self.path.is_absolute():  # keys must not depend on the cwd
            object.__setattr__(self, "path", self.path.absolute())

    @property
    def key(self) -> str:
        """Unique name of this tool in a worker: ``name`` for a built-in, ``PATH::name`` for a file tool.

        Two problems may define different tools under one name; a request may always use the key, and
        the bare name when only one loaded tool has it.
        """
        return self.name if self.path is None else f"{self.path}::{self.name}"

    def to_json(self) -> dict[str, str | None]:
        path = None if self.path is None else str(self.path)
        return {"name": self.name, "path": path, "sha256": self.sha256}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ToolSpec:
        path, sha256 = data.get("path"), data.get("sha256")
        return cls(
            str(data["name"]), None if path is None else Path(path), None if sha256 is None else str(sha256)
        )


@dataclass(frozen=True, slots=True)
class JobRequest:
    """Run ``tool(**arguments)``. The tool name ``__ping__`` answers the worker's pid (the dummy call).

    ``cost_s`` is the job's declared duration (a workload's ``cpu_ms``, or one recorded in a trace): a
    simulated worker takes exactly that long; a real worker ignores it. ``declared`` is a declared
    result (a scripted submission's verdict): a simulated worker returns it instead of running the
    tool; a real worker ignores it. ``declared_error``, likewise: a simulated worker fails the job with
    it (a scripted action's ``raises``), and ``declared_death``: it dies holding the job after its
    duration, with that message (``worker_dies``); a real worker ignores both. ``observation_chars``
    marks a tool job whose result a model will read: the reply's value is then not the result but
    ``(text, chars)`` from :func:`observation`, so a large result is encoded and cut where it was made —
    never carried through the pipe whole, nor encoded on the runtime's event loop while every other
    trajectory waits. ``report_rss`` asks the worker for its resident memory after the job
    (``--worker-max-rss-mb``).
    """

    job_id: int
    tool: str
    arguments: dict[str, Any]
    cost_s: float | None = None
    declared: Any = None
    observation_chars: int | None = None
    report_rss: bool = False
    declared_error: str | None = None
    declared_death: str | None = None


#: json.dumps(value, default=str, ensure_ascii=False), without a new encoder per call
JSON_TEXT = json.JSONEncoder(default=str, ensure_ascii=False)


def observation(value: Any, limit: int) -> tuple[str, int]:
    """A result as the model reads it: the first ``limit`` characters of its JSON text (anything JSON
    has no type for as its ``str``), and that text's whole length.

    Characters are written as themselves, not as ``\\uXXXX`` escapes (six characters, and several tokens,
    for each letter of a non-English text), except a lone surrogate (a file name decoded with
    ``surrogateescape``), which no UTF-8 request can carry: it keeps its JSON escape. An int of more
    digits than Python writes by default (4,300: ``sys.get_int_max_str_digits``, a guard against
    untrusted input) is written whole: JSON numbers have no such limit, and it is the tool's own
    result."""
    try:
        text = JSON_TEXT.encode(value)
    except ValueError:
        limit_digits = sys.get_int_max_str_digits()
        if not limit_digits:
            raise
        sys.set_int_max_str_digits(0)
        try:
            text = JSON_TEXT.encode(value)
        finally:
            sys.set_int_max_str_digits(limit_digits)
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:  # only inside a JSON string: its escape is the JSON escape
            text = text.encode(errors="backslashreplace").decode()
    return text[:limit], len(text)


@dataclass(frozen=True, slots=True)
class JobReply:
    """The outcome of one job, timed inside the worker.

    ``started``/``finished`` are ``time.monotonic()`` in the worker, the same clock as the runtime's
    on Linux. ``execute_s`` is the tool call's wall time, ``cpu_s`` the worker's CPU time during the
    call (``time.process_time``, plus child processes the tool reaped, at clock-tick resolution) and
    ``serialize_s`` the worker's time to decode the request and encode the reply value. ``rss_bytes``
    is the worker's resident memory after the job, when the request asked for it and it could be read.
    ``children`` are the worker's children outside its process group as it replies, running or exited
    and unreaped (:func:`~asyncroll.workers.upkeep.outside_children`): should the worker die, they become
    the runtime's, which reaps those that are zombies (nothing else attributes a zombie in a session of
    its own to a worker).
    """

    job_id: int
    ok: bool
    value: Any
    error: str | None
    started: float
    finished: float
    execute_s: float
    cpu_s: float | None  # None: no process ran it (a virtual worker)
    serialize_s: float | None
    rss_bytes: int | None = None
    children: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Ready:
    """Handshake: the worker imported every tool in ``preload_s`` seconds and serves ``tools``."""

    pid: int
    tools: list[str]
    preload_s: float


@dataclass(frozen=True, slots=True)
class StartupFailed:
    """Handshake: the worker could not load its tools; ``error`` says which and why."""

    error: str


Message = JobRequest | JobReply | Ready | StartupFailed

_TAGS: dict[type[Any], str] = {JobRequest: "job", JobReply: "reply", Ready: "ready", StartupFailed: "failed"}
_CLASSES: dict[str, type[Any]] = {tag: cls for cls, tag in _TAGS.items()}
_ARITY: dict[str, int] = {tag: len(fields(cls)) for cls, tag in _TAGS.items()}
_SLICED = "job*"
"""A job request whose list arguments follow its message in slices; one more field: ``((key, slices), ...)``
(:func:`frame_in_slices`)."""
_ARITY[_SLICED] = _ARITY["job"] + 1


def _field_getter(cls: type[Any]) -> Callable[[Any], tuple[Any, ...]]:
    names = tuple(f.name for f in fields(cls))
    if len(names) == 1:  # attrgetter of one name returns the value, not a 1-tuple
        name = names[0]
        return lambda message: (getattr(message, name),)
    return attrgetter(*names)


_GETTERS = {cls: _field_getter(cls) for cls in _TAGS}


class _DataOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise ProtocolError(f"frame refers to a global ({module}.{name}); only plain data is allowed")


def _load(stream: io.BytesIO) -> Any:
    """The next pickle in ``stream`` (plain data only), each with a memo of its own."""
    try:
        return _DataOnlyUnpickler(stream).load()
    except ProtocolError:
        raise
    except Exception as exc:  # any unpickling failure means a corrupt frame
        raise ProtocolError(f"undecodable frame: {type(exc).__name__}: {exc}") from exc


def loads(payload: bytes) -> Any:
    """Unpickle plain data; any reference to a class or function is refused."""
    return _load(io.BytesIO(payload))


def dumps(value: Any) -> bytes:
    return pickle.dumps(value, protocol=PICKLE_PROTOCOL)


def frame(payload: bytes) -> bytes:
    """Prefix ``payload`` with its length header."""
    if len(payload) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(payload)} bytes exceeds the {MAX_FRAME}-byte limit")
    return HEADER.pack(len(payload)) + payload


def encode(message: Message, *, value_blob: bytes | None = None) -> bytes:
    """One complete frame (header included) for ``message``.

    A reply's value travels pickled on its own inside the frame, so that the worker can time that
    (possibly large) encoding and still report the time in the same reply; ``value_blob`` passes the
    already pickled value (``message.value`` is then ignored).
    """
    cls = type(message)
    values = _GETTERS[cls](message)
    if cls is JobReply:
        blob = dumps(values[2]) if value_blob is None else value_blob
        values = (*values[:2], blob, *values[3:])
    return frame(dumps((_TAGS[cls], *values)))


def frame_in_slices(request: JobRequest, parts: list[bytes]) -> Iterator[None]:
    """One frame for ``request``, as :func:`encode` makes it but for its list arguments (an evaluation's
    tests), each pickled a slice at a time after the message: a generator that pauses after each slice
    (about :data:`SLICE_S` of pickling), so that an event loop can run between them. A problem's million
    tests took 1.5 s to pickle in one piece, every other trajectory waiting. Once it is exhausted,
    ``parts`` holds the frame, header first, in pieces to write in order."""
    arguments = dict(request.arguments)
    slices: list[bytes] = []
    sliced: list[tuple[str, int]] = []
    for key, value in request.arguments.items():
        if type(value) is not list:
            continue
        start, step, count = 0, 1, 0
        while start < len(value):
            t0 = time.perf_counter()
            slices.append(dumps(value[start : start + step]))
            took = time.perf_counter() - t0
            start, count = start + step, count + 1
            if took < SLICE_S / 2:
                step *= 2
            elif took > SLICE_S * 2:
                step = max(1, step // 2)
            yield
        arguments[key] = None
        sliced.append((key, count))
    values = _GETTERS[JobRequest](request)
    head = dumps((_SLICED, *values[:2], arguments, *values[3:], tuple(sliced)))
    length = len(head) + sum(map(len, slices))
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes exceeds the {MAX_FRAME}-byte limit")
    parts += [HEADER.pack(length), head, *slices]


def _joined(stream: io.BytesIO, data: tuple[Any, ...]) -> tuple[Any, ...]:
    """A sliced job's message (``job*``) as a plain one, its list arguments read back from ``stream``."""
    arguments, sliced = data[3], data[-1]
    if not isinstance(arguments, dict) or not isinstance(sliced, tuple):
        raise ProtocolError("sliced job request without its arguments or slices")
    for entry in sliced:
        # an argument's name (an unhashable one raised TypeError) and how many slices it has
        named = isinstance(entry, tuple) and len(entry) == 2 and type(entry[0]) is str
        if not (named and type(entry[1]) is int and entry[1] >= 0):
            raise ProtocolError(f"sliced job request names its slices as {entry!r}, not (argument, count)")
        key, count = entry
        items: list[Any] = []
        for _ in range(count):
            part = _load(stream)
            if not isinstance(part, list):
                raise ProtocolError(f"a slice of argument {key!r} is a {type(part).__name__}, not a list")
            items += part
        arguments[key] = items
    return ("job", *data[1:-1])


def decode(payload: bytes) -> Message:
    """The message in one frame's payload (header already stripped)."""
    stream = io.BytesIO(payload)
    data = _load(stream)
    if not isinstance(data, tuple) or not data or data[0] not in _ARITY:
        raise ProtocolError(f"not a protocol message: {type(data).__name__}")
    tag = data[0]
    if len(data) - 1 != _ARITY[tag]:
        raise ProtocolError(f"{tag!r} message has {len(data) - 1} fields, expected {_ARITY[tag]}")
    if tag == _SLICED:
        data = _joined(stream, data)
        tag = "job"
    if tag == "reply":
        if not isinstance(data[3], bytes):
            raise ProtocolError("reply value is not a pickled blob")
        data = (*data[:3], loads(data[3]), *data[4:])
    message: Message = _CLASSES[tag](*data[1:])
    return message


def payload_length(header: bytes) -> int:
    """The payload length announced by a 4-byte header."""
    (length,) = HEADER.unpack(header)
    if length > MAX_FRAME:
        raise ProtocolError(f"announced frame of {length} bytes exceeds the {MAX_FRAME}-byte limit")
    return int(length)


def read_payload(stream: BinaryIO) -> bytes | None:
    """Blocking read of one frame's payload; ``None`` on a clean end of stream (worker side)."""
    header = stream.read(HEADER.size)
    if not header:
        return None
    if len(header) < HEADER.size:
        raise ProtocolError("end of stream inside a frame header")
    length = payload_length(header)
    payload = stream.read(length)
    if len(payload) < length:
        raise ProtocolError("end of stream inside a frame")
    return payload
