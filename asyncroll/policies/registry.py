"""Policy names → policy objects; the one place that knows the aliases."""

from __future__ import annotations

from asyncroll.policies.base import Policy
from asyncroll.policies.baseline import Fifo, ToolFirst


def get_policy(name: str) -> Policy:
    """Build a policy by its canonical name (``gpu_first`` is resolved to ``tool_first`` by the config)."""
    if name == "sync":
        return Fifo(name="sync")
    if name == "fifo":
        return Fifo()
    if name in ("tool_first", "gpu_first"):
        return ToolFirst()
    raise ValueError(f"unknown or unavailable policy {name!r}")
