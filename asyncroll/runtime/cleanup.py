"""Awaiting what must not be cut short when a run stops: its cleanup steps, every one of them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any


async def cleanup(*steps: Callable[[], Awaitable[Any]] | None) -> None:
    """Run every cleanup step to its end, in order, even if the caller is cancelled during one or one
    fails (either used to skip the steps after it, the worker pool's among them); then raise the
    cancellation, else the first failure."""
    cancelled: asyncio.CancelledError | None = None
    failed: Exception | None = None
    for step in steps:
        if step is None:
            continue
        try:
            await shielded(step())
        except asyncio.CancelledError as exc:
            cancelled = exc
        except Exception as exc:  # noqa: BLE001 - raised below, after the other steps ran
            failed = failed or exc
    if cancelled is not None:
        raise cancelled
    if failed is not None:
        raise failed


async def shielded(coro: Any) -> None:
    """Await cleanup even if the caller is being cancelled again."""
    task = asyncio.ensure_future(coro)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await task
        raise
