"""What serve-sim "generates": a seeded draw of an instance of the request's JSON schema.

It understands the schema subset that agents send (and asyncroll's per-turn schemas use): ``anyOf`` /
``oneOf`` (one branch drawn), ``const``, ``enum``, ``type`` string / integer / number / boolean / null /
array / object, ``properties`` + ``required``, ``items`` and ``additionalProperties`` schemas, integer
keys (``patternProperties`` or ``propertyNames`` of asyncroll's pattern for ``dict[int, int]``), a
``required`` name that ``properties`` does not declare (drawn as an additional property), and the
bounds ``minimum`` / ``maximum`` / ``exclusiveMinimum`` / ``exclusiveMaximum``, ``minLength`` /
``maxLength`` and ``minItems`` / ``maxItems``. A schema it cannot satisfy — bounds nothing meets, or a
constraint it does not honour (``pattern``, ``format``, ``multipleOf``, ``uniqueItems``, ``not``,
``allOf``, ``if``, ``$ref``, ``minProperties``/``maxProperties``, ``prefixItems``, ``contains``,
``dependentRequired``/``dependentSchemas``, ``unevaluated*``, ``propertyNames`` other than integer
keys) — raises :class:`UnsupportedSchema`, which the server answers with 400, as vLLM answers a schema
its grammar backend cannot compile; it never answers with a value that breaks the schema (the server
also checks each draw against the schema, for combinations no rule here foresaw, such as an ``enum``
whose values break the schema's other keywords).
"""

from __future__ import annotations

import math
import random
from typing import Any

from asyncroll.coerce import INT_KEY_PATTERN

_WORDS = ("alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta")


class UnsupportedSchema(ValueError):
    """The schema uses a construct this simulator cannot generate for."""


def draw(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    """A value that conforms to ``schema``, chosen with ``rng``."""
    if depth > 16:
        raise UnsupportedSchema("schema nests deeper than 16 levels")
    if schema is True or schema == {}:
        return rng.choice(_WORDS)
    if not isinstance(schema, dict):
        raise UnsupportedSchema(f"not a schema object: {schema!r}"[:200])
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        if not schema["enum"]:
            raise UnsupportedSchema("empty enum")
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            branches = schema[key]
            if not isinstance(branches, list) or not branches:
                raise UnsupportedSchema(f"{key} must be a non-empty list")
            return draw(rng.choice(branches), rng, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = rng.choice(kind) if kind else None
    if kind is None and "properties" in schema:
        kind = "object"
    _refuse_unsupported(schema)
    if kind == "string":
        return _string(schema, rng)
    if kind == "integer":
        low, high = _integer_range(schema)
        return rng.randrange(low, high + 1)
    if kind == "number":
        return _number(schema, rng)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "array":
        items = schema.get("items", {})
        low = _count(schema, "minItems", 1)
        high = _count(schema, "maxItems", low + 3)
        if "minItems" not in schema:
            low = min(low, high)
        if low > high:
            raise UnsupportedSchema(f"minItems {low} > maxItems {high}")
        return [draw(items, rng, depth + 1) for _ in range(rng.randint(low, high))]
    if kind == "object":
        return _object(schema, rng, depth)
    raise UnsupportedSchema(f"cannot generate for type {kind!r}")


#: Keywords whose constraint a drawn value would not honour: refused (400) rather than violated.
_UNSUPPORTED = (
    "pattern",
    "format",
    "multipleOf",
    "uniqueItems",
    "not",
    "allOf",
    "if",
    "$ref",
    "minProperties",
    "maxProperties",
    "prefixItems",
    "contains",
    "dependentRequired",
    "dependentSchemas",
    "unevaluatedProperties",
    "unevaluatedItems",
)


def _refuse_unsupported(schema: dict[str, Any]) -> None:
    for key in _UNSUPPORTED:
        if key in schema and not (key == "uniqueItems" and schema[key] is False):
            raise UnsupportedSchema(f"{key!r} is not supported by this simulator")


def _bound(schema: dict[str, Any], key: str) -> float | None:
    value = schema.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UnsupportedSchema(f"{key} must be a finite number, got {value!r}"[:200])
    return value


def _count(schema: dict[str, Any], key: str, default: int) -> int:
    value = schema.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UnsupportedSchema(f"{key} must be a non-negative integer, got {value!r}"[:200])
    return value


def _integer_range(schema: dict[str, Any]) -> tuple[int, int]:
    """The integers the schema's bounds allow (inclusive); without a bound, 100 wide from 0 or the
    other bound."""
    lows = [math.ceil(b) for b in (_bound(schema, "minimum"),) if b is not None]
    lows += [math.floor(b) + 1 for b in (_bound(schema, "exclusiveMinimum"),) if b is not None]
    highs = [math.floor(b) for b in (_bound(schema, "maximum"),) if b is not None]
    highs += [math.ceil(b) - 1 for b in (_bound(schema, "exclusiveMaximum"),) if b is not None]
    low = max(lows) if lows else None
    high = min(highs) if highs else None
    if low is None:
        low = 0 if high is None or high >= 0 else high - 100
    if high is None:
        high = low + 100
    if low > high:
        raise UnsupportedSchema(f"no integer satisfies the bounds (from {low} to {high})")
    return low, high


def _number(schema: dict[str, Any], rng: random.Random) -> float:
    minimum, maximum = _bound(schema, "minimum"), _bound(schema, "maximum")
    above, below = _bound(schema, "exclusiveMinimum"), _bound(schema, "exclusiveMaximum")
    lows = [b for b in (minimum, above) if b is not None]
    highs = [b for b in (maximum, below) if b is not None]
    low = max(lows) if lows else (0.0 if not highs or min(highs) >= 0 else min(highs) - 100)
    high = min(highs) if highs else low + 100

    def allowed(x: float) -> bool:
        return (
            (minimum is None or x >= minimum)
            and (maximum is None or x <= maximum)
            and (above is None or x > above)
            and (below is None or x < below)
        )

    value = round(rng.uniform(low, high), 3)
    if not allowed(value):  # rounded onto or past a bound: the exact middle, else nothing fits
        value = low + (high - low) / 2
        if not allowed(value):
            raise UnsupportedSchema(f"no number satisfies the bounds (from {low} to {high})")
    return value


def _string(schema: dict[str, Any], rng: random.Random) -> str:
    low, high = _count(schema, "minLength", 0), schema.get("maxLength")
    text = f"{rng.choice(_WORDS)}-{rng.randrange(1000)}"
    if high is not None:
        high = _count(schema, "maxLength", 0)
        if low > high:
            raise UnsupportedSchema(f"minLength {low} > maxLength {high}")
        text = text[:high]
    return text + "x" * max(0, low - len(text))


def _object(schema: dict[str, Any], rng: random.Random, depth: int) -> dict[str, Any]:
    properties = schema.get("properties", {})
    out = {name: draw(sub, rng, depth + 1) for name, sub in properties.items()}
    extra = schema.get("additionalProperties")
    patterns = schema.get("patternProperties")
    names = schema.get("propertyNames", {})
    numeric = isinstance(names, dict) and names.get("pattern") == INT_KEY_PATTERN
    if names != {} and not numeric:
        raise UnsupportedSchema("'propertyNames' other than a pattern of integer keys is not supported")
    if not properties and patterns:
        # A map whose keys follow a pattern: asyncroll's dict[int, int] arguments, integer keys (a key
        # that matches another pattern cannot be drawn: refused, as "pattern" is)
        if not isinstance(patterns, dict) or list(patterns) != [INT_KEY_PATTERN]:
            raise UnsupportedSchema("'patternProperties' other than integer keys is not supported")
        for _ in range(rng.randint(1, 3)):
            out[str(rng.randrange(100))] = draw(patterns[INT_KEY_PATTERN], rng, depth + 1)
    elif not properties and isinstance(extra, dict):
        # A map whose keys are free, or follow propertyNames when it is a pattern of integers
        for _ in range(rng.randint(1, 3)):
            key = str(rng.randrange(100)) if numeric else rng.choice(_WORDS)
            out[key] = draw(extra, rng, depth + 1)
    required = schema.get("required", [])
    for name in required if isinstance(required, list) else []:
        # a required property that `properties` does not declare: any value allowed for an extra one
        if isinstance(name, str) and name not in out:
            if extra is False:
                raise UnsupportedSchema(f"required property {name!r} is not declared and none may be added")
            out[name] = draw(extra if isinstance(extra, dict) else {}, rng, depth + 1)
    return out
