"""The active-slot term of the makespan lower bound, with the batch's tail.

asyncroll admits trajectories in workload order, each as soon as one of the ``max_active_trajectories``
slots frees, and a trajectory holds its slot for at least its own work (its model service and CPU
execution are sequential). Placing each trajectory's work, in admission order, on the earliest free slot
(list scheduling) therefore starts every trajectory no later than the run did: by induction, the list
schedule's sorted slot-free times stay element-wise at or below the run's (counting a slot freed before
the current admission as freed at it), whatever extra waiting the run had. Its makespan is a valid lower
bound, never below "trajectory work ÷ active slots" nor the longest trajectory, and it sees the batch's
tail: a long trajectory admitted near the end finishes late whatever the dispatch order.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable


def admission_order_makespan(works: Iterable[float], slots: int) -> float:
    """The makespan of list-scheduling ``works`` (in admission order) on ``slots`` identical slots."""
    free = [0.0] * slots  # a heap of slot-free times
    makespan = 0.0
    for work in works:
        end = heapq.heappop(free) + work
        heapq.heappush(free, end)
        makespan = max(makespan, end)
    return makespan
