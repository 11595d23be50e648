"""Whether a dotted path (a gate's ``metric``) names a number of ``summary.json``, per its JSON Schema and,
below the sections it types as mappings of fixed keys, the keys the summary builder writes."""

from __future__ import annotations

import functools
from typing import Any

#: Sections the schema types as mappings (or leaves untyped) whose keys are nevertheless fixed: the ones the
#: summary builder writes. A gate's key below them is checked against those (a typo is refused by the
#: config, not found missing after its stage's arms ran); ``model``, ``tools`` and the like stay open.
FIXED_KEYS = (
    "rates",
    "throughput",
    "cpu_cost",
    "client_cpu_blocked",
    "latency",
    "phases",
    "phases.fractions_of_trajectory_time",
    "bounds.terms",
    "bounds.totals",
    "resources.windows",
)


@functools.cache
def written_keys() -> dict[str, frozenset[str]]:
    """The keys of each :data:`FIXED_KEYS` section in a summary the builder writes (every optional one
    included: ``throughput.allocated_gpu_hours`` with ``--dedicated-gpu``, ``bounds.totals.server_batch_s``
    for a simulated server)."""
    from asyncroll.outputs.cpu_cost import cpu_cost
    from asyncroll.outputs.summary import SummaryBuilder

    limits = {"max_active_trajectories": 1, "max_inflight_model_requests": 1, "cpu_workers": 1}
    cost = cpu_cost((0.0, 0.0), (1.0, 1.0), False, 1)
    built = SummaryBuilder().build(
        makespan_s=1.0,
        policy="fifo",
        limits=limits,
        cpu_cost=cost,
        peaks={},
        status="complete",
        dedicated_gpu=True,
        model_capacity=1,
        server_batch_s=0.0,
    )
    keys = {}
    for section in FIXED_KEYS:
        node: Any = built
        for part in section.split("."):
            node = node[part]
        keys[section] = frozenset(node)
    return keys


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
    ``tools``, ``workers``) is not checked below its name, except for the keys of :data:`FIXED_KEYS`."""
    from asyncroll.schemas import SummaryModel

    schema = SummaryModel.model_json_schema()
    defs, node, walked = schema.get("$defs", {}), schema, "summary.json"
    parts = path.split(".")
    for depth, part in enumerate(parts):
        section = ".".join(parts[:depth])
        keys = written_keys().get(section) if section in FIXED_KEYS else None
        if keys is not None and part not in keys:
            return f"summary.json.{section} has no {part!r} (it has {', '.join(sorted(keys))})"
    for part in parts:
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
