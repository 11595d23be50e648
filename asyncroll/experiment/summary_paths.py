"""Whether a dotted path (a gate's ``metric``) names a number of ``summary.json``, per its JSON Schema."""

from __future__ import annotations

from typing import Any


def _resolved(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """A JSON Schema node with its ``$ref`` followed and a nullable ``anyOf`` reduced to its other branch."""
    while True:
        if "$ref" in node:
            node = defs[node["$ref"].rsplit("/", 1)[-1]]
        elif "anyOf" in node:
            branches = [b for b in node["anyOf"] if b.get("type") != "null"]
            if len(branches) != 1:
                return node
            node = branches[0]
        else:
            return node


def metric_problem(path: str) -> str | None:
    """Why ``path`` names no number of ``summary.json`` (per its schema), or None. A typed record takes
    only its own fields; a mapping (``rates``, ``latency``) any key; an untyped section (``model``,
    ``tools``, ``workers``) is not checked below its name."""
    from asyncroll.schemas import SummaryModel

    schema = SummaryModel.model_json_schema()
    defs, node, walked = schema.get("$defs", {}), schema, "summary.json"
    for part in path.split("."):
        node = _resolved(node, defs)
        fields = node.get("properties")
        if fields is not None and part in fields:
            node = fields[part]
        elif fields is None and isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        elif fields is None and node.get("type") == "object" and node.get("additionalProperties", True):
            return None  # untyped (model, tools, …; pydantic < 2.11 leaves additionalProperties out)
        else:
            known = f" (it has {', '.join(sorted(fields))})" if fields else ""
            return f"{walked} has no {part!r}{known}"
        walked += f".{part}"
    node = _resolved(node, defs)
    kinds = {node.get("type")} | {b.get("type") for b in node.get("anyOf", [])}
    if not kinds & {"number", "integer"}:
        return f"{walked} is not a number"
    return None
