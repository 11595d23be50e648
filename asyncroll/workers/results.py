"""What a tool returns, made safe to send: refused when nothing ran, else converted to JSON-safe data.

Stdlib only: the worker process imports this module at start-up. docs/TOOLS.md ("From result to
observation") is the table this module implements.
"""

from __future__ import annotations

import io
import json
import math
import re
from collections import Counter
from collections.abc import Iterator
from types import AsyncGeneratorType, CoroutineType, GeneratorType
from typing import Any

MAX_DEPTH = 64
"""Nesting deeper than this is cut to a ``repr``."""

MAX_REPEATED = 1_000_000
"""The most values (items of lists, tuples and sets, dict entries) a result may write out *again*, in
containers it holds in more than one place: a list that holds one list twice, 60 levels down, is 2^60
values once written out. (A large result of distinct containers is the tool's own size; this bounds only
what sharing multiplies, to seconds of the worker's time and a few hundred MB.)"""


class ResultTooLarge(ValueError):
    """A result that writes out more than :data:`MAX_REPEATED` values again."""


_SCALARS = (str, int, float, bool, type(None))
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
"""A memory address in a default ``repr`` (``<object object at 0x7f...>``): different in every run."""
_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
"""Non-finite floats as strings (JSON has no such numbers), as pydantic's ``ser_json_inf_nan="strings"``."""


def without_addresses(text: str) -> str:
    """``text`` without the memory addresses of default reprs (`` at 0x7f…``): different in every run."""
    return _ADDRESS.sub("", text)


def check_result(value: Any) -> None:
    """Refuse what a plain call cannot complete: a coroutine, a generator or another awaitable would be
    returned with the tool's body never run (validation refuses an ``async def`` or generator tool that
    it can see; this catches the rest: decorated ones, assigned ones); and an iterator, whose ``repr``
    (``<map object>``) the model would read as the result."""
    if isinstance(value, CoroutineType):
        value.close()  # no "never awaited" warning in the log
        what = "a coroutine (is the tool an async def?)"
    elif isinstance(value, GeneratorType):
        value.close()
        what = "a generator (does the tool's body contain yield?)"
    elif isinstance(value, AsyncGeneratorType):
        what = "an async generator"
    elif hasattr(type(value), "__await__"):
        what = f"an awaitable {type(value).__name__}"
    elif isinstance(value, Iterator) and not _converted(value):
        # map(), filter(), zip(), reversed(), iter(), re.finditer(), an open file: its repr ("<map object>")
        # says nothing of its items, and reading them could run without end (itertools.count)
        way = (
            "return what it holds, e.g. .read() or .getvalue()"  # a file, StringIO: not its lines as a list
            if isinstance(value, io.IOBase)
            else "return them as a list, e.g. list(...)"
        )
        raise TypeError(
            f"the tool returned an iterator ({type(value).__name__}), whose items a worker does not read "
            f"(it could have no end): {way}"
        )
    else:
        return
    raise TypeError(
        f"the tool returned {what}, which a worker does not run: a tool must be a plain function that "
        "returns its result"
    )


def _converted(value: Any) -> bool:
    """Whether :func:`to_jsonable` reads ``value`` as data, not its ``repr``: a subclass of a scalar or a
    container (its items, whatever else it is), or an object with ``.tolist()`` or ``.item()``."""
    if isinstance(value, str | int | float | dict | list | tuple | set | frozenset):
        return True
    return any(callable(getattr(value, method, None)) for method in ("tolist", "item"))


def to_jsonable(value: Any) -> Any:
    """A JSON-safe copy of a tool's return value (ints stay ints, also as dict keys).

    A container that holds itself (directly or further down) is shown where it recurs as Python's
    ``repr`` shows it, ``[...]`` or ``{...}``: following it, even to :data:`MAX_DEPTH` only, costs
    2^64 steps once it recurs twice (a tree whose nodes point back at their parent). A container met
    again elsewhere (not inside itself) is written out again each time, as ``json.dumps`` would write it,
    up to :data:`MAX_REPEATED` values written again in all; past that :class:`ResultTooLarge`."""
    return _Conversion().convert(value, 0)


class _Conversion:
    __slots__ = ("left", "path", "seen")

    def __init__(self) -> None:
        self.path: set[int] = set()  # the containers being converted, outermost first
        self.seen: set[int] = set()  # every container converted so far (the result keeps them alive)
        self.left = MAX_REPEATED

    def convert(self, value: Any, depth: int) -> Any:
        kind = type(value)
        if kind is str or kind is int or kind is bool or value is None:
            return value
        if kind is float:
            return value if math.isfinite(value) else _NON_FINITE[repr(value)]
        if depth >= MAX_DEPTH:  # the containers at depths 0 to MAX_DEPTH - 1: MAX_DEPTH levels kept
            return _repr(value)
        # a subclass (IntEnum, StrEnum, numpy.float64, ...) → its base value, read through the base type's
        # own method: the subclass may override __int__, __float__ or __str__ (an Enum's str is its name)
        if isinstance(value, int):
            return int.__int__(value)
        if isinstance(value, float):
            return self.convert(float.__float__(value), depth)
        if isinstance(value, str):
            return str.__str__(value)
        if isinstance(value, dict | list | tuple | set | frozenset):
            if id(value) in self.path:
                return "{...}" if isinstance(value, dict) else "[...]"
            if id(value) in self.seen:
                self.left -= len(value)
                if self.left < 0:
                    raise ResultTooLarge(
                        f"containers it holds in several places are written out in each: more than "
                        f"{MAX_REPEATED:,} values written again (return a structure without shared parts, "
                        "or cut it in the tool)"
                    )
            else:
                self.seen.add(id(value))
            self.path.add(id(value))
            try:
                return self._container(value, depth + 1)
            finally:
                self.path.discard(id(value))
        for method in ("tolist", "item"):  # numpy arrays and scalars, torch tensors
            convert = getattr(value, method, None)
            if callable(convert):
                try:
                    converted = convert()
                except Exception:  # noqa: BLE001 - fall back to repr below
                    break
                return self.convert(converted, depth + 1)
        return _repr(value)

    def _container(self, value: _Container, depth: int) -> Any:
        if isinstance(value, dict):
            pairs = [(k, self._key(k, depth), self.convert(v, depth)) for k, v in value.items()]
            keys = _distinct_keys([(k, key) for k, key, _ in pairs])
            return {key: item for key, (_, _, item) in zip(keys, pairs, strict=True)}
        items = [self.convert(v, depth) for v in value]
        if isinstance(value, list | tuple):
            return items
        try:
            return sorted(items)
        except TypeError:
            return sorted(items, key=repr)

    def _key(self, key: Any, depth: int) -> Any:
        converted = self.convert(key, depth)
        if isinstance(converted, _SCALARS):
            return converted
        try:
            return without_addresses(str(key))  # a tuple key holding an object: no address here either
        except Exception:  # noqa: BLE001 - a tuple key holding an object whose __repr__ raises
            return _repr(key)


def _distinct_keys(pairs: list[tuple[Any, Any]]) -> list[Any]:
    """The converted keys of ``(key, converted)`` pairs, with those that JSON would write as one string
    (``1`` and ``"1"``, ``(1, 2)`` and ``"(1, 2)"``) kept apart: each whose key is not a str says its type
    (``"1 (int)"``), and a name already taken (a str key ``"1 (int)"``, two NaN keys) is numbered
    (``"1 (int #2)"``)."""
    texts = Counter(_key_text(converted) for _, converted in pairs)
    if len(texts) == len(pairs):
        return [converted for _, converted in pairs]
    kept = [texts[_key_text(converted)] == 1 or isinstance(key, str) for key, converted in pairs]
    taken = {_key_text(converted) for (_, converted), keep in zip(pairs, kept, strict=True) if keep}
    out: list[Any] = []
    for (key, converted), keep in zip(pairs, kept, strict=True):
        if keep:
            out.append(converted)
            continue
        text, kind = _key_text(converted), type(key).__name__
        name, n = f"{text} ({kind})", 1
        while name in taken:
            n += 1
            name = f"{text} ({kind} #{n})"
        taken.add(name)
        out.append(name)
    return out


def _key_text(key: Any) -> str:
    """The string a JSON object writes for a converted key (``json.dumps`` reads keys this way)."""
    if isinstance(key, str):
        return key
    try:
        return json.dumps(key)
    except ValueError:  # an int past Python's digit limit: no str key of this worker's can equal it
        return f"<int of {key.bit_length()} bits>"


_Container = dict[Any, Any] | list[Any] | tuple[Any, ...] | set[Any] | frozenset[Any]


def _repr(value: Any) -> str:
    """``repr(value)`` without memory addresses, so that the same result reads the same in every run."""
    try:
        return without_addresses(repr(value))
    except Exception:  # noqa: BLE001 - a broken __repr__ must not kill the worker
        return f"<unrepresentable {type(value).__name__}>"
