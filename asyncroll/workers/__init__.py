"""Persistent tool worker processes, their IPC protocol and the built-in tools.

The protocol names are imported eagerly (stdlib only). :class:`ProcessWorker` and :class:`CallResult`
load on first use, because ``python -m asyncroll.workers.child`` imports this package too and a
worker must not pay for asyncio and psutil at start-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asyncroll.workers.builtin import BUILTIN_TOOLS
from asyncroll.workers.protocol import JobReply, JobRequest, ProtocolError, Ready, StartupFailed, ToolSpec

if TYPE_CHECKING:
    from asyncroll.workers.process import CallResult, ProcessWorker

__all__ = [
    "BUILTIN_TOOLS",
    "CallResult",
    "JobReply",
    "JobRequest",
    "ProcessWorker",
    "ProtocolError",
    "Ready",
    "StartupFailed",
    "ToolSpec",
]


def __getattr__(name: str) -> Any:
    if name in ("CallResult", "ProcessWorker"):
        from asyncroll.workers import process

        return getattr(process, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
