"""A task group that cancels its tasks in the order they were created (:class:`OrderedTaskGroup`).

:class:`asyncio.TaskGroup` keeps its tasks in a set. When one of them fails, or the group's task is
cancelled (a stop signal), it cancels the others in the set's order, which follows their memory
addresses, and each then handles its cancellation in that order. A simulation that stopped or failed at
the same virtual instant therefore wrote its cancelled model requests and CPU jobs in another order from
one process to the next: ``events.jsonl``, ``trace.json``, and ``summary.json``'s sums of floats (a
trajectory's work 1 µs apart). In creation order the run is the same every time, and its events name
the cancelled work in the order it was started."""

from __future__ import annotations

import asyncio
from typing import Any


class _InsertionOrdered(dict[asyncio.Task[Any], None]):
    """The part of a set that ``asyncio.TaskGroup`` uses (``add``, ``discard``, iteration, ``len``),
    iterated in insertion order."""

    def add(self, task: asyncio.Task[Any]) -> None:
        self[task] = None

    def discard(self, task: asyncio.Task[Any]) -> None:
        self.pop(task, None)

    def remove(self, task: asyncio.Task[Any]) -> None:  # not used by 3.11–3.13; a set's, should one be
        del self[task]


class OrderedTaskGroup(asyncio.TaskGroup):
    """:class:`asyncio.TaskGroup` whose tasks are cancelled in creation order (3.11 to 3.13 keep them in
    ``_tasks``, used only through ``add``, ``discard``, iteration and ``len``). Should a later Python
    keep them otherwise, this is a plain task group."""

    def __init__(self) -> None:
        super().__init__()
        if type(getattr(self, "_tasks", None)) is set:
            self._tasks = _InsertionOrdered()  # type: ignore[assignment]
