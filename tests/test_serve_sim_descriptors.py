"""serve-sim out of descriptors (``ulimit -n``): asyncio's refused ``accept()`` is said once a minute at
most, not once per try (CPython 3.11 tries the whole backlog each loop pass: 485,000 tracebacks in 2 minutes
under ``ulimit -n 256`` with a client holding 512 connections)."""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

from asyncroll.serve_sim.server import AcceptErrors
from tests.sim_servers import sim


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def _recorded(*names: str) -> Iterator[list[logging.LogRecord]]:
    """Every record logged to these loggers (uvicorn's do not reach the root, so caplog misses them)."""
    handler = _Records()
    loggers = [logging.getLogger(name) for name in names]
    for log in loggers:
        log.addHandler(handler)
    try:
        yield handler.records
    finally:
        for log in loggers:
            log.removeHandler(handler)


def _refusal() -> dict[str, object]:
    listener = socket.socket()
    try:
        return {
            "message": AcceptErrors.MESSAGE,
            "exception": OSError(errno.EMFILE, os.strerror(errno.EMFILE)),
            "socket": listener.fileno(),
        }
    finally:
        listener.close()


def test_refused_accepts_on_the_serve_loop_are_said_once_not_once_each() -> None:
    with sim() as (running, _client), _recorded("asyncio", "uvicorn.error") as records:
        loop = running.loop
        assert loop is not None
        context = _refusal()

        def flood() -> None:
            for _ in range(2048):  # one loop pass's tries at a full backlog
                loop.call_exception_handler(context)

        running.call(flood)
    refusals = [r for r in records if "accept" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage()[:120] for r in refusals[:3]]
    text = refusals[0].getMessage()
    assert "Too many open files" in text and "ulimit -n" in text and "1 refusal(s)" in text


def test_the_note_comes_back_a_minute_later_with_the_count_and_other_errors_pass_through() -> None:
    now = [0.0]
    handler = AcceptErrors(every_s=60.0, clock=lambda: now[0])
    passed: list[dict[str, object]] = []

    class Loop:
        def default_exception_handler(self, context: dict[str, object]) -> None:
            passed.append(context)

    loop = Loop()
    with _recorded("uvicorn.error") as records:
        for t in (0.0, 1.0, 59.9, 60.0, 61.0):
            now[0] = t
            handler(loop, _refusal())  # type: ignore[arg-type]
        handler(loop, {"message": "something else"})  # type: ignore[arg-type]
    assert ["1 refusal(s)" in r.getMessage() for r in records] == [True, False]
    assert "3 refusal(s)" in records[1].getMessage()  # 1.0, 59.9 and 60.0
    assert passed == [{"message": "something else"}]
