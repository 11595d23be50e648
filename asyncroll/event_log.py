"""The one writer of ``events.jsonl`` (:class:`EventLog`: stamps each record's time, writes it as one
whole line, hands it to synchronous subscribers) and an in-memory subscriber for tests."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel

from asyncroll.clock import Clock
from asyncroll.errors import OutputWriteError
from asyncroll.events import Event
from asyncroll.outputs.lines import LineFile

Subscriber = Callable[[Event], None]


def _fields(value: Any) -> Any:
    """orjson's fallback for nested records (a decision's candidates)."""
    if isinstance(value, BaseModel):
        return value.__dict__
    raise TypeError(f"cannot encode {type(value).__name__}")


def _stamp(event: Event, t: float) -> None:
    """Set ``t`` on a record the writer owns. Events are frozen for everyone else: the writer stamps the
    time once, before the record is written or any subscriber sees it (a copy would double the cost of
    every event on the hot path)."""
    event.__dict__["t"] = t


class EventLog:
    """The single writer of ``events.jsonl`` (or of nothing, for tests), with synchronous subscribers."""

    def __init__(self, clock: Clock, path: Path | None = None) -> None:
        self._clock = clock
        self._origin: float | None = None
        self._pending: list[Event] = []
        self._subscribers: list[Subscriber] = []
        # A real run's lines are written by a thread: a slow file system (NFS) never holds up the loop.
        self._file: LineFile | None = None if path is None else LineFile(path, background=not clock.virtual)

    @property
    def origin(self) -> float | None:
        """Monotonic time of ``measurement_started``, once it happened."""
        return self._origin

    def subscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.append(subscriber)

    def rel(self, monotonic: float) -> float:
        """Seconds since measurement start of a monotonic time (relative to now if not started yet)."""
        origin = self._origin if self._origin is not None else self._clock.now()
        return round(monotonic - origin, 6)

    def start_measurement(self) -> float:
        """Fix the time origin; events emitted earlier are written now with negative ``t``."""
        self._origin = self._clock.now()
        pending, self._pending = self._pending, []
        for event in pending:
            _stamp(event, round(event.t - self._origin, 6))
            self._write(event)
        return self._origin

    def emit(self, event: Event, at: float | None = None) -> None:
        """Stamp ``t`` on a freshly built event, write it as one line and hand it to the subscribers.
        ``at``: the clock reading the event happened at, when its caller read one for a duration the
        event carries (that duration then equals the difference of the events' ``t``); else now."""
        now = self._clock.now() if at is None else at
        if self._origin is None:
            # Hold the pre-measurement events with their absolute time; written at start or close. All of
            # them: they are bounded by the configuration (a worker_ready and at most a few start-up
            # restarts per worker, the telemetry probe), and a cap of 10,000 dropped the workers past it.
            _stamp(event, now)
            self._pending.append(event)
            return
        event.__dict__["t"] = round(now - self._origin, 6)  # _stamp, spelled out on the hot path
        self._write(event)

    @property
    def write_error(self) -> OutputWriteError | None:
        """Why ``events.jsonl`` stopped being written (a full disk), if it did: the run has failed."""
        return None if self._file is None else self._file.error

    def _write(self, event: Event) -> None:
        if self._file is not None:
            # A pydantic record's __dict__ holds exactly its fields, in order, all JSON-native values;
            # orjson encodes it several times faster than model_dump_json, on the hot path of every run.
            fields = event.__dict__
            if event.absent_when_none:  # a field added later, written only where it has a value
                fields = {k: v for k, v in fields.items() if v is not None or k not in event.absent_when_none}
            line = orjson.dumps(fields, default=_fields, option=orjson.OPT_APPEND_NEWLINE)
            try:
                self._file.write(line)  # whole or not at all; raises once, the first time it fails
            finally:
                for subscriber in self._subscribers:  # the summary still sees every event
                    subscriber(event)
            return
        for subscriber in self._subscribers:
            subscriber(event)

    def close(self) -> None:
        """Write anything still pending (relative to now) and close the file, once every line queued for
        it is written. Idempotent; never raises: a line that finds no room is recorded
        (:attr:`write_error`), as during the run."""
        if self._pending:
            origin = self._clock.now()
            pending, self._pending = self._pending, []
            for event in pending:
                _stamp(event, round(event.t - origin, 6))
                with contextlib.suppress(OutputWriteError):  # raised once; the later lines are dropped
                    self._write(event)
        if self._file is not None:
            self._file.close()


class EventCapture:
    """An in-memory subscriber for tests: assert on data, not on log text."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type[Event]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]
