"""A queued CPU job's wait for a worker slot (:class:`~asyncroll.runtime.dispatcher.CpuDispatcher`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class SlotWait(asyncio.Future[int]):
    """A queued job's wait for a worker slot. A stop cancels it at once, but the job leaves the queue
    only when its task runs again; each cancellation is counted as it happens, so that the dispatcher
    looks for such jobs only after one (it looked through the whole queue at every decision: O(queue)
    per decision, with thousands queued most of a simulation's CPU)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_cancel: Callable[[], None]) -> None:
        super().__init__(loop=loop)
        self._on_cancel = on_cancel

    def cancel(self, msg: Any | None = None) -> bool:
        cancelled = super().cancel(msg)
        if cancelled:
            self._on_cancel()
        return cancelled
