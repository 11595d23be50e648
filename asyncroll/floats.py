"""Float arithmetic that gives the same bits on every Python version, and a float shown as it was given."""

from __future__ import annotations

from collections.abc import Iterable


def left_to_right_sum(values: Iterable[float]) -> float:
    """``values`` added one by one from the first: the bits ``sum`` gave on Python 3.11, on every Python.
    ``sum`` of floats compensates rounding errors from 3.12 on, so the same predictions could add up a bit
    apart on 3.11 and 3.12 and a rule's comparison at that bit choose another job (a simulation would then
    differ by Python version), and a written mean or bound could round the other way."""
    total = 0.0
    for value in values:
        total += value
    return total


def shown(value: float) -> str:
    """``value`` as short as ``:g`` writes it where that reads back as the same number, else in full: a
    refused value just past a bound (86400001 ms, 0.0099999) must not read as the bound itself."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)
