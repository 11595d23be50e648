"""Strict coercion of tool arguments to their declared input types.

Strict means: an ``int`` is never a ``bool``, a string is never a number, a float with a fractional part
is never an ``int``. The only conversions are the lossless ones JSON forces on us (an ``int`` where a
``float`` is declared; a float with no fractional part, ``2.0``, where an ``int`` is — JSON does not tell
them apart, and the JSON Schema sent to the server as ``integer`` accepts it; integer-literal string keys
for ``dict[int, int]``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

TYPE_NAMES = (
    "str",
    "int",
    "float",
    "bool",
    "number",
    "dict[int, int]",
    "list[int]",
    "List[int]",
    "list[float]",
    "List[float]",
    "list[list[int]]",
    "List[List[int]]",
    "list[list[float]]",
    "List[List[float]]",
)


class CoercionError(ValueError):
    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}")


#: The declared input types as one pattern (spaces allowed around each token), printed in the workload's
#: JSON Schema so that the schema is exactly as strict as validation.
#: A list's element may itself be a list (ToolMATH's matrices and point lists); ``list`` and ``List`` mix.
#: It ends in ``(?!\n)$``: Python's ``$`` (a JSON Schema validator's, in Python) also matches before a final
#: newline, and the schema accepted ``"int\n"``, which validation refuses.
TYPE_PATTERN = (
    r"^ *(?:str|int|float|bool|number|dict *\[ *int *, *int *\]"
    r"|(?:list|List) *\[ *(?:(?:list|List) *\[ *(?:int|float) *\]|int|float) *\]) *(?!\n)$"
)
_TYPE = re.compile(TYPE_PATTERN)


def canonical_type(type_name: str) -> str:
    """A declared type's one spelling: no spaces, ``List`` as ``list`` (``List[ List[float] ]`` →
    ``list[list[float]]``)."""
    return type_name.replace(" ", "").replace("List[", "list[")


def check_type_name(arg: str, type_name: str) -> None:
    if _TYPE.fullmatch(type_name) is None:
        raise ValueError(
            f"input {arg!r} has unsupported type {type_name!r}; supported: {', '.join(TYPE_NAMES)}"
        )


def _shown(value: Any) -> str:
    """``repr(value)`` for an error message, at most 200 characters (an int of more than 4,300 digits
    cannot be written in decimal at all)."""
    try:
        return repr(value)[:200]
    except ValueError:
        return f"<an {type(value).__name__} too large to show>"


def _int(v: Any, path: str) -> int:
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise CoercionError(path, f"expected int, got {type(v).__name__} {_shown(v)}")
    return v


def _float(v: Any, path: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise CoercionError(path, f"expected float, got {type(v).__name__} {_shown(v)}")
    try:
        return float(v)
    except OverflowError:
        raise CoercionError(path, f"{_shown(v)} is too large for a float") from None


def _number(v: Any, path: str) -> int | float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise CoercionError(path, f"expected number, got {type(v).__name__} {_shown(v)}")
    return v


def _str(v: Any, path: str) -> str:
    if not isinstance(v, str):
        raise CoercionError(path, f"expected str, got {type(v).__name__}")
    return v


def _bool(v: Any, path: str) -> bool:
    if not isinstance(v, bool):
        raise CoercionError(path, f"expected bool, got {type(v).__name__} {_shown(v)}")
    return v


def _list_of(item: Callable[[Any, str], Any]) -> Callable[[Any, str], list[Any]]:
    def convert(v: Any, path: str) -> list[Any]:
        if not isinstance(v, list):
            raise CoercionError(path, f"expected a list, got {type(v).__name__}")
        return [item(x, f"{path}[{i}]") for i, x in enumerate(v)]

    return convert


#: A ``dict[int, int]`` key as JSON spells it: an integer's one canonical decimal form (no sign on 0, no
#: leading zeros, ASCII digits), so that two keys are never one integer — ``int()`` would also take
#: "01", " 1 ", "+1", "1_000" and other scripts' digits. The JSON Schema sent to the server says the same.
INT_KEY_PATTERN = "^(0|-?[1-9][0-9]*)$"
_INT_KEY = re.compile(INT_KEY_PATTERN)


def _int_key(k: Any, path: str) -> int:
    if isinstance(k, str):
        if not _INT_KEY.match(k):  # as the schema's validator reads it ("$" allows one final newline)
            raise CoercionError(path, f"key {_shown(k)} is not an integer literal")
        try:
            return int(k)
        except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
            raise CoercionError(path, f"key of {len(k):,} digits is too long an integer") from None
    return _int(k, path)


def _dict_int_int(v: Any, path: str) -> dict[int, int]:
    if not isinstance(v, dict):
        raise CoercionError(path, f"expected a dict, got {type(v).__name__}")
    out: dict[int, int] = {}
    spelled: dict[int, Any] = {}
    for k, x in v.items():
        where = f"{path}[{_shown(k)}]"
        key = _int_key(k, where)
        if key in out:  # 1 and "1" (bound arguments): keeping the last would drop a value silently
            raise CoercionError(where, f"key {k!r} is the integer {key} again (as {spelled[key]!r})")
        out[key], spelled[key] = _int(x, where), k
    return out


_CONVERTERS: dict[str, Callable[[Any, str], Any]] = {
    "str": _str,
    "int": _int,
    "float": _float,
    "bool": _bool,
    "number": _number,
    "dict[int,int]": _dict_int_int,
    "list[int]": _list_of(_int),
    "list[float]": _list_of(_float),
    "list[list[int]]": _list_of(_list_of(_int)),
    "list[list[float]]": _list_of(_list_of(_float)),
}


def coerce_value(value: Any, type_name: str, path: str = "") -> Any:
    return _CONVERTERS[canonical_type(type_name)](value, path)


def coerce_arguments(
    arguments: Mapping[str, Any], inputs: Mapping[str, str], bound: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Check ``arguments`` name exactly the declared inputs not already bound, and coerce each; add the
    bound ones, coerced the same way (validation refuses one that does not coerce: see
    :func:`bound_errors`). Raises the first :class:`CoercionError`; :func:`argument_errors` lists all."""
    out, errors = _coerce(arguments, inputs, bound or {})
    if errors:
        raise errors[0]
    return out


def argument_errors(
    arguments: Mapping[str, Any], inputs: Mapping[str, str], bound: Mapping[str, Any] | None = None
) -> list[CoercionError]:
    """Every reason :func:`coerce_arguments` would refuse ``arguments`` (unexpected or missing names, then
    each argument of the wrong type, in order); empty when it would accept them."""
    return _coerce(arguments, inputs, bound or {})[1]


def _coerce(
    arguments: Mapping[str, Any], inputs: Mapping[str, str], bound: Mapping[str, Any]
) -> tuple[dict[str, Any], list[CoercionError]]:
    expected = set(inputs) - set(bound)
    given = set(arguments)
    errors: list[CoercionError] = []
    if given - expected:
        errors.append(
            CoercionError("", f"unexpected arguments {sorted(given - expected)}; expected {sorted(expected)}")
        )
    if expected - given:
        errors.append(CoercionError("", f"missing arguments {sorted(expected - given)}"))
    out: dict[str, Any] = {}
    for name, value in arguments.items():
        if name in expected:
            try:
                out[name] = coerce_value(value, inputs[name], f".{name}")
            except CoercionError as exc:
                errors.append(exc)
    for name, value in bound.items():
        try:
            out[name] = coerce_value(value, inputs[name], f".{name}")
        except (KeyError, CoercionError):  # undeclared, or of the wrong type: validation refuses both
            out[name] = value
    return out, errors


def bound_errors(bound: Mapping[str, Any], inputs: Mapping[str, str]) -> list[CoercionError]:
    """Each bound argument whose value its declared input type refuses (undeclared ones are skipped)."""
    errors: list[CoercionError] = []
    for name, value in bound.items():
        if name in inputs:
            try:
                coerce_value(value, inputs[name], f".{name}")
            except CoercionError as exc:
                errors.append(exc)
    return errors
