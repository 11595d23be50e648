"""JSON of functional tests read and written as LiveCodeBench's grader does: ints of up to 50,000 digits.

LiveCodeBench's metrics module raises Python's limit on int <-> str conversion (4,300 digits by default,
``sys.get_int_max_str_digits``) to 50,000 before it reads any test, so a functional test's input lines and
expected output, and the value a program returns, may hold ints Python refuses to read or write here by
default. The converter, workload validation and the evaluator read and write such JSON under LiveCodeBench's
limit through this module (and the sandboxed program runs under it: :mod:`~asyncroll.evaluator.harness`);
an int past 50,000 digits is refused, as LiveCodeBench refuses it.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Any

from asyncroll.json_depth import json_loads

#: LiveCodeBench's limit on int <-> str conversion (its metrics module's ``sys.set_int_max_str_digits``).
LCB_INT_DIGITS = 50_000


@contextlib.contextmanager
def lcb_digit_limit() -> Iterator[None]:
    """Python's int <-> str limit set to LiveCodeBench's for the block, whatever it was (an environment's
    ``PYTHONINTMAXSTRDIGITS`` included), and put back after.

    The limit is the process's: a worker or converter runs one job on its thread at a time."""
    before = sys.get_int_max_str_digits()
    if before == LCB_INT_DIGITS:
        yield
        return
    sys.set_int_max_str_digits(LCB_INT_DIGITS)
    try:
        yield
    finally:
        sys.set_int_max_str_digits(before)


def lcb_loads(text: str | bytes) -> Any:
    """:func:`~asyncroll.json_depth.json_loads` under LiveCodeBench's digit limit; an int past it is a
    ``ValueError`` that says so (without Python's advice to raise the limit, which no user can take)."""
    with lcb_digit_limit():
        try:
            return json_loads(text)
        except json.JSONDecodeError:
            raise
        except ValueError as exc:
            if "integer string conversion" not in str(exc):
                raise
            raise ValueError(
                f"an int of more than {LCB_INT_DIGITS:,} digits (LiveCodeBench's limit on reading ints)"
            ) from None


def lcb_dumps(value: Any) -> str:
    """``json.dumps(value)`` under LiveCodeBench's digit limit."""
    with lcb_digit_limit():
        return json.dumps(value)


#: The most digits an int of a value read with :func:`lcb_loads_value` is converted with: str -> int is
#: quadratic in CPython 3.11 (15 ms for 50,000 digits), so a done record the program wrote itself, its 16 MiB
#: all 50,000-digit ints, cost the worker seconds outside every limit (and twice that to show as feedback).
#: Longer ints stay text (:class:`LongInt`). Above 309 digits: no such int equals a float.
LONG_INT_DIGITS = 1000


class LongInt:
    """A JSON int of more than :data:`LONG_INT_DIGITS` digits, kept as its text (never converted): JSON
    writes an int one way only, so two are equal exactly when their texts are, and such an int equals no
    other JSON value (a float's ints have at most 309 digits)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LongInt) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return self.text


def int_or_long(text: str) -> int | LongInt:
    """A JSON int's text as an int, or as a :class:`LongInt` past :data:`LONG_INT_DIGITS` digits
    (``json.loads``'s ``parse_int``); ``ValueError`` past LiveCodeBench's limit."""
    digits = len(text) - text.startswith("-")
    if digits <= LONG_INT_DIGITS:
        return int(text)
    if digits > LCB_INT_DIGITS:
        raise ValueError(
            f"an int of more than {LCB_INT_DIGITS:,} digits (LiveCodeBench's limit on reading ints)"
        )
    return LongInt(text)


def lcb_loads_value(text: str | bytes) -> Any:
    """:func:`lcb_loads` for values that are only compared and shown (a functional test's expected value,
    the value a program returned): its ints of more than :data:`LONG_INT_DIGITS` digits as
    :class:`LongInt`, so reading one costs time linear in its size."""
    with lcb_digit_limit():
        return json_loads(text, parse_int=int_or_long)


_DIGITS_AS_ZEROS = bytes(48 if 48 <= byte < 58 else 32 for byte in range(256))  # a digit -> "0", else " "


def lcb_loads_record(line: bytes) -> Any:
    """A line of JSON from the sandbox (the program can write it itself) as :func:`lcb_loads_value` reads
    it, at the C parser's speed when no run of more than :data:`LONG_INT_DIGITS` digits is in it (found in
    tens of milliseconds in 16 MiB): calling ``parse_int`` for every int tripled the time a result of
    millions of small ints took to read. Not depth-limited (Python's own recursion limit only)."""
    with lcb_digit_limit():
        if line.translate(_DIGITS_AS_ZEROS).find(b"0" * (LONG_INT_DIGITS + 1)) < 0:
            return json.loads(line)
        return json.loads(line, parse_int=int_or_long)


class _Full(Exception):
    """Raised by :func:`lcb_dumps_head` once it has written enough."""


def lcb_dumps_head(value: Any, limit: int) -> str:
    """The first ``limit + 1`` characters (or all) of ``json.dumps(value)`` for a value read with
    :func:`lcb_loads_value` (a :class:`LongInt` written as its digits), without writing the rest: feedback
    shows a thousand characters of a returned value that may be 16 MiB of JSON."""
    parts: list[str] = []
    size = 0

    def emit(text: str) -> None:
        nonlocal size
        parts.append(text)
        size += len(text)
        if size > limit:
            raise _Full

    def walk(item: Any) -> None:
        if isinstance(item, LongInt):
            emit(item.text)
        elif isinstance(item, list):
            emit("[")
            for i, element in enumerate(item):
                emit(", " if i else "")
                walk(element)
            emit("]")
        elif isinstance(item, dict):
            emit("{")
            for i, (key, element) in enumerate(item.items()):
                emit((", " if i else "") + json.dumps(key) + ": ")
                walk(element)
            emit("}")
        else:
            emit(json.dumps(item))

    with lcb_digit_limit(), contextlib.suppress(_Full):
        walk(value)
    return "".join(parts)[: limit + 1]
