"""JSON of functional tests read and written as LiveCodeBench's grader does: ints of up to 50,000 digits.

LiveCodeBench's metrics module raises Python's limit on int <-> str conversion (4,300 digits by default,
``sys.get_int_max_str_digits``) to 50,000 before it reads any test, so a functional test's input lines and
expected output, and the value a program returns, may hold ints Python refuses to read or write here by
default. The converter, workload validation and the evaluator read and write such JSON under LiveCodeBench's
limit through this module (and the sandboxed program runs under it: :mod:`~asyncroll.evaluator.harness`);
an int past 50,000 digits is refused, as LiveCodeBench refuses it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from asyncroll.json_depth import json_loads

#: LiveCodeBench's limit on int <-> str conversion (its metrics module's ``sys.set_int_max_str_digits``).
LCB_INT_DIGITS = 50_000


@contextmanager
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
