"""What serve-sim "generates": a seeded draw of an instance of the request's JSON schema.

It understands the schema subset that agents send (and asyncroll's per-turn schemas use): ``anyOf`` /
``oneOf`` (one branch drawn), ``const``, ``enum``, ``type`` string / integer / number / boolean / null /
array / object, ``properties`` + ``required``, ``items`` and ``additionalProperties`` schemas. A schema it
cannot satisfy raises :class:`UnsupportedSchema`, which the server answers with 400, as vLLM answers a
schema its grammar backend cannot compile.
"""

from __future__ import annotations

import random
from typing import Any

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
    if kind == "string":
        return f"{rng.choice(_WORDS)}-{rng.randrange(1000)}"
    if kind == "integer":
        return rng.randrange(int(schema.get("minimum", 0)), int(schema.get("maximum", 100)) + 1)
    if kind == "number":
        return round(rng.uniform(float(schema.get("minimum", 0)), float(schema.get("maximum", 100))), 3)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "array":
        items = schema.get("items", {})
        low = int(schema.get("minItems", 1))
        high = max(low, int(schema.get("maxItems", low + 3)))
        return [draw(items, rng, depth + 1) for _ in range(rng.randint(low, high))]
    if kind == "object":
        return _object(schema, rng, depth)
    raise UnsupportedSchema(f"cannot generate for type {kind!r}")


def _object(schema: dict[str, Any], rng: random.Random, depth: int) -> dict[str, Any]:
    properties = schema.get("properties", {})
    out = {name: draw(sub, rng, depth + 1) for name, sub in properties.items()}
    extra = schema.get("additionalProperties")
    if not properties and isinstance(extra, dict):
        # A map (e.g. dict[int, int] arguments): keys must satisfy propertyNames, when it is a pattern of
        # integers, as asyncroll's schemas declare it.
        names = schema.get("propertyNames", {})
        numeric = isinstance(names, dict) and names.get("pattern") == "^-?[0-9]+$"
        for _ in range(rng.randint(1, 3)):
            key = str(rng.randrange(100)) if numeric else rng.choice(_WORDS)
            out[key] = draw(extra, rng, depth + 1)
    return out
