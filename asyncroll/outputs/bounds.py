"""The makespan lower bound from the run's own work (``summary.json``'s ``bounds``).

:class:`WorkMeter` sums model service and CPU execution per trajectory as :class:`SummaryBuilder
<asyncroll.outputs.summary.SummaryBuilder>` sees them; :meth:`WorkMeter.bounds` turns them into terms no
schedule of this work could beat, and efficiency = bound ÷ makespan.

The active-slot term, with the batch's tail (:func:`admission_order_makespan`): asyncroll admits trajectories
in workload order, each as soon as one of the ``max_active_trajectories`` slots frees, and a trajectory holds
its slot for at least its own work (its model service and CPU execution are sequential). Placing each
trajectory's work, in admission order, on the earliest free slot (list scheduling) therefore starts every
trajectory no later than the run did: by induction, the list schedule's sorted slot-free times stay
element-wise at or below the run's (counting a slot freed before the current admission as freed at it),
whatever extra waiting the run had. Its makespan is a valid lower bound, never below "trajectory work ÷ active
slots" nor the longest trajectory, and it sees the batch's tail: a long trajectory admitted near the end
finishes late whatever the dispatch order.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Sequence
from typing import Any

from asyncroll.floats import left_to_right_sum
from asyncroll.outputs.statistics import ratio


def admission_order_makespan(works: Sequence[float], slots: int) -> float:
    """The makespan of list-scheduling ``works`` (in admission order) on ``slots`` identical slots.

    Only as many slots as there are works can ever be used: the heap holds no more (an active limit of a
    billion, meaning "all at once", used to allocate eight gigabytes here as the run ended)."""
    free = [0.0] * min(slots, len(works))  # a heap of slot-free times
    makespan = 0.0
    for work in works:
        end = heapq.heappop(free) + work
        heapq.heappush(free, end)
        makespan = max(makespan, end)
    return makespan


class WorkMeter:
    """Model service and CPU execution (finished or failed), per active trajectory and in total."""

    def __init__(self) -> None:
        # Work (model service + CPU execution) per active trajectory, folded into totals when it ends.
        self._work: dict[str | None, float] = {}
        self.model_work = 0.0
        self.cpu_work = 0.0
        self.durations = 0  # how many (µs-rounded) durations the work sums hold: their rounding error
        self.trajectory_work = 0.0
        self.longest_work = 0.0
        # Each trajectory's work in admission order (packed doubles), for the admission-order slot term.
        self._admitted_work = array("d")
        self._admitted_at: dict[str | None, int] = {}  # active trajectory → its position there

    def add(self, trajectory: str | None, seconds: float, model: bool) -> None:
        """A model request's latency or a CPU job's execute time (a failed job: its round trip)."""
        self.durations += 1
        if model:
            self.model_work += seconds
        else:
            self.cpu_work += seconds
        self._work[trajectory] = self._work.get(trajectory, 0.0) + seconds

    def admitted(self, trajectory: str | None) -> None:
        """A trajectory started: it takes the next position in admission order."""
        self._admitted_at[trajectory] = len(self._admitted_work)
        self._admitted_work.append(0.0)

    def finished(self, trajectory: str | None) -> None:
        """A trajectory ended: its work is folded into the totals."""
        work = self._work.pop(trajectory, 0.0)
        position = self._admitted_at.pop(trajectory, None)
        if position is not None:
            self._admitted_work[position] = work
        self.trajectory_work += work
        self.longest_work = max(self.longest_work, work)

    def bounds(
        self,
        makespan_s: float,
        limits: dict[str, int],
        model_capacity: int | None = None,
        server_batch_s: float | None = None,
    ) -> dict[str, Any]:
        """The makespan lower bound from the run's own work, and efficiency = bound ÷ makespan.

        Each term is a duration no schedule of *this* work could beat: model latency spread over the requests
        the client can have in flight (inflight and active limits), CPU execution over the workers, each
        trajectory's own work over the active slots, the longest single trajectory (its model turns and jobs
        are sequential), and each trajectory's work placed on the active slots in admission order
        (:func:`admission_order_makespan`: sees the batch's tail). Where the server's batch limit is known
        (``model_capacity``, a simulated server's ``max_num_seqs``) the model term is also at least the
        requests' time *in* the batch (``server_batch_s``, without their wait to join it) over that limit —
        never their latency over it: a latency includes the wait, so with fewer batch slots than requests in
        flight that quotient could exceed the makespan. Computed from measured durations, each term is at most
        the makespan; it assumes a request or job would not have been faster at another concurrency. Durations
        are rounded to 1 µs, so a term may exceed the makespan by their summed rounding; such an excess is
        clamped to the makespan (``rounding_clamped``)."""
        active = limits["max_active_trajectories"]
        capacity = min(limits["max_inflight_model_requests"], active)
        unfinished = left_to_right_sum(self._work.values())
        longest = max([self.longest_work, *self._work.values()])
        admitted = array("d", self._admitted_work)
        for trajectory, position in self._admitted_at.items():
            admitted[position] = self._work.get(trajectory, 0.0)
        model_term = self.model_work / capacity
        if model_capacity is not None and server_batch_s is not None:
            model_term = max(model_term, server_batch_s / model_capacity)
        terms = {
            "model_service_s": round(model_term, 6),
            "cpu_execute_s": round(self.cpu_work / limits["cpu_workers"], 6),
            "trajectory_work_s": round((self.trajectory_work + unfinished) / active, 6),
            "longest_trajectory_s": round(longest, 6),
            # last, so that a tie keeps the plainer term's name
            "admission_order_s": round(admission_order_makespan(admitted, active), 6),
        }
        binding = max(terms, key=lambda k: terms[k])
        bound = terms[binding]
        shown = round(makespan_s, 6)
        clamped = shown < bound <= shown + 5e-7 * self.durations + 1e-6
        if clamped:
            bound = shown
        totals = {"model_service_s": round(self.model_work, 6), "cpu_execute_s": round(self.cpu_work, 6)}
        if server_batch_s is not None:
            totals["server_batch_s"] = round(server_batch_s, 6)
        # against the makespan as reported (to 1 µs), like the bound: a bound equal to it is efficiency 1,
        # never 1.000016 against the unrounded clock reading a few hundred ns below it
        efficiency = ratio(bound, shown)
        return {
            "lower_bound_s": bound,
            "binding": binding,
            "efficiency": efficiency,
            "terms": terms,
            "model_capacity": capacity,
            "server_batch_capacity": model_capacity,
            "rounding_clamped": clamped,
            "totals": totals,
        }
