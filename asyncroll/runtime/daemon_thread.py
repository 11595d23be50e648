"""Await a blocking function run in a daemon thread (:func:`in_daemon_thread`)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable


async def in_daemon_thread(fn: Callable[[], None]) -> None:
    """Run ``fn`` in a daemon thread and await it. Unlike ``asyncio.to_thread``, an interrupted run does
    not wait for it at exit (importing scikit-learn takes seconds; Ctrl-C during start-up should not)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if not done.done():
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

    def target() -> None:
        error: BaseException | None = None
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody is waiting
            loop.call_soon_threadsafe(settle, error)

    threading.Thread(target=target, name=f"asyncroll-{fn.__name__}", daemon=True).start()
    await done
