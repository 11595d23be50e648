"""Policy names → policy objects; the one place that knows the aliases."""

from __future__ import annotations

from asyncroll.policies.base import Policy
from asyncroll.policies.baseline import Fifo, ToolFirst
from asyncroll.policies.pressure import PressurePolicy

#: What ``--policy asyncroll`` means: the seed's rule, unless measurements make the tail guard default.
DEFAULT_PRESSURE = "asyncroll_seed"


def get_policy(name: str, *, aging_seconds: float = 30.0, aging_weight: float = 0.02) -> Policy:
    """Build a policy by its name (``gpu_first`` is the deprecated alias of ``tool_first``)."""
    if name == "asyncroll":
        name = DEFAULT_PRESSURE
    if name in ("asyncroll_seed", "asyncroll_guarded"):
        return PressurePolicy(name, aging_seconds, aging_weight, tail_guard=name == "asyncroll_guarded")
    if name == "sync":
        return Fifo(name="sync")
    if name == "fifo":
        return Fifo()
    if name in ("tool_first", "gpu_first"):
        return ToolFirst()
    raise ValueError(f"unknown policy {name!r}")
