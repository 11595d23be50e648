"""LiveCodeBench's answer comparison, reimplemented: stdout text for stdin problems, values for
functional (LeetCode) problems.

stdin problems (LiveCodeBench ``grade_stdio``): strip both texts, split into lines, strip each line;
the line counts must match; a pair of lines matches when equal, or else when both split on whitespace
into tokens that all parse as :class:`~decimal.Decimal` and the two token lists are equal (so ``1.50``
matches ``1.5`` and ``1e3`` matches ``1000``, but ``0.333`` does not match ``0.3333``: there is no
tolerance, exactly as in LiveCodeBench).

Functional problems (``grade_call_based``): the expected output is one JSON value; the program's
return value (a top-level tuple already turned into a list by the harness) must be ``==`` to it.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from asyncroll.evaluator.lcb_json import lcb_loads_value


def stripped_lines(text: str) -> list[str]:
    """``text`` stripped, split on newlines, each line stripped (LiveCodeBench's normalisation)."""
    return [line.strip() for line in text.strip().split("\n")]


def _decimals(tokens: list[str]) -> list[Decimal] | None:
    try:
        return [Decimal(token) for token in tokens]
    except (InvalidOperation, ValueError):
        return None


def _same_numbers(a: list[Decimal], b: list[Decimal]) -> bool:
    try:
        return a == b
    except InvalidOperation:  # a signalling NaN refuses comparison
        return False


def compare_stdout(got: str, expected: str) -> str | None:
    """``None`` when ``got`` is accepted for ``expected``; otherwise why not, in words."""
    got_lines, expected_lines = stripped_lines(got), stripped_lines(expected)
    if len(got_lines) != len(expected_lines):
        return f"mismatched output length: got {len(got_lines)} lines, expected {len(expected_lines)}"
    for number, (line, want) in enumerate(zip(got_lines, expected_lines, strict=True), start=1):
        if line == want:
            continue
        # Token counts first: lists of different lengths never compare equal, and parsing every token of
        # a multi-megabyte line as a Decimal costs the worker seconds no test limit covers.
        got_tokens, want_tokens = line.split(), want.split()
        if len(got_tokens) != len(want_tokens):
            return f"line {number}: {line[:200]!r} != {want[:200]!r}"
        got_numbers, want_numbers = _decimals(got_tokens), _decimals(want_tokens)
        if got_numbers is None or want_numbers is None or not _same_numbers(got_numbers, want_numbers):
            return f"line {number}: {line[:200]!r} != {want[:200]!r}"
    return None


def parse_expected(output: str) -> Any:
    """The expected value of a functional test (one JSON value, its ints of up to 50,000 digits as
    LiveCodeBench reads them, those past :data:`~.lcb_json.LONG_INT_DIGITS` kept as text as in the
    program's result); ``ValueError`` if it is not JSON."""
    return lcb_loads_value(output)


def compare_value(got: Any, expected: Any) -> str | None:
    """``None`` when the returned value equals the expected one under ``==``; otherwise why not."""
    if got == expected:
        return None
    return "returned value differs from the expected value"
