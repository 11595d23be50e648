"""The facts of one sandboxed test run (:class:`Execution`), as the sandbox collected them and the
evaluator turns them into a verdict, and how the harness's records are read: only a record of the
expected kind counts, and a line the program made unreadable is a fact too, never an exception.

The harness (:mod:`~asyncroll.evaluator.harness`) writes them. A ``done`` record is ``{"kind": "done", "ok":
true}`` (stdin mode), ``{"kind": "done", "ok": true, "result": <JSON>}`` (functional mode), ``{"kind": "done",
"ok": false, "error": "<traceback>"}`` or, for a functional result that LiveCodeBench's ``==`` can never match
against a JSON value (a nested tuple, a set, an int-keyed dict, an object, an int past the digit limit of str
conversion), ``{"kind": "done", "ok": true, "unrepresentable": "<repr>"}``; one whose JSON does not fit in the
memory left beside it, ``{"kind": "done", "ok": true, "too_large": true}``. A ``str``, ``list`` or ``dict``
subclass (``defaultdict``, ``Counter``, ``OrderedDict``, an ``Enum`` mixed with ``str``, a dict keyed by
``str`` subclasses), a ``UserList``, ``UserDict`` or ``UserString`` equals the plain value under ``==``, so it
is sent as its plain string, list or dict; a ``Fraction``, ``Decimal``, ``complex`` (or a numpy scalar) that
equals an int or a float exactly, as that int or float. The program can write to the status fd too; that can
only claim an answer it could have produced honestly, so the runtime treats the records as facts about the
program, not about the test.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from asyncroll.evaluator.lcb_json import lcb_loads_record


@dataclass(slots=True)
class Execution:
    """What one test run produced, as facts; :mod:`~.evaluate` turns them into a verdict."""

    stdout: bytes = b""
    stderr: str = ""
    done: dict[str, object] | None = None
    exit_status: int | None = None
    wall_s: float = 0.0
    timed_out: bool = False
    output_exceeded: bool = False
    memory_limit_hit: bool = False
    status_garbled: bool = False  # the program wrote something unreadable where its done record goes
    record_exceeded: bool = False  # its first line did not end within the cap: twice the stdout cap

    def describe_exit(self) -> str:
        """How the program's process ended, in words (``exited with status 3``, ``was killed by SIGKILL``)."""
        status = self.exit_status
        if status is None:
            return "stopped without a report from the harness"
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            try:
                return f"was killed by {signal.Signals(sig).name}"
            except ValueError:
                return f"was killed by signal {sig}"
        return f"exited with status {os.WEXITSTATUS(status)}"

    def read_records(self, status: bytes, exit_record: bytes) -> None:
        """Take the program's done record (the status pipe's first line) and the harness's exit record."""
        if status.strip():
            self.done = _record(status.split(b"\n", 1)[0], "done")
            self.status_garbled = self.done is None
        record = _record(exit_record.split(b"\n", 1)[0], "exit")
        code = None if record is None else record.get("status")
        if isinstance(code, int) and not isinstance(code, bool) and 0 <= code <= 0xFFFF:
            self.exit_status = code


def _record(line: bytes, kind: str) -> dict[str, object] | None:
    """The JSON object on ``line`` if it is a record of ``kind``; ``None`` for anything else, including a
    line the program made unreadable (not JSON, not UTF-8, nested past the parser's recursion limit, an
    int past LiveCodeBench's 50,000 digits), except a returned value holding such an int: that can never
    match (an ``unrepresentable`` record, as the harness writes it on Python 3.11)."""
    try:
        # a returned int of up to 50,000 digits, as LiveCodeBench reads it; long ones as text (the program
        # can write this line itself, all of it 50,000-digit ints)
        record = lcb_loads_record(line)
    except ValueError as exc:
        # CPython 3.12+ checks the digit limit of a long int -> str only roughly (a few digits more pass):
        # a sandbox interpreter of 3.12 or later wrote a 50,001-digit result the limit should have refused
        result = b'{"kind": "done", "ok": true, "result": '
        if kind != "done" or not line.startswith(result) or "LiveCodeBench's limit" not in str(exc):
            return None
        what = {b"[": "list", b"{": "dict"}.get(line[len(result) : len(result) + 1], "int")
        return {"kind": "done", "ok": True, "unrepresentable": f"<{what} that cannot be shown: {exc}>"}
    except RecursionError:
        return None
    return record if isinstance(record, dict) and record.get("kind") == kind else None
