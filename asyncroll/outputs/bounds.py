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
from collections.abc import Iterable
from typing import Any

from asyncroll.floats import left_to_right_sum
from asyncroll.outputs.statistics import ratio


class ListSchedule:
    """Works placed, in the order given, each on the earliest free of ``slots`` identical slots.

    Only as many slots as there are works can ever be used: the heap holds no more (an active limit of a
    billion, meaning "all at once", used to allocate eight gigabytes here as the run ended)."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.free: list[float] = []  # a heap of the used slots' free times
        self.makespan = 0.0

    def place(self, work: float) -> None:
        if len(self.free) < self.slots:  # a slot not used yet: free at 0
            end = 0.0 + work
            heapq.heappush(self.free, end)
        else:
            end = heapq.heappop(self.free) + work
            heapq.heappush(self.free, end)
        self.makespan = max(self.makespan, end)

    def copy(self) -> ListSchedule:
        twin = ListSchedule(self.slots)
        twin.free, twin.makespan = list(self.free), self.makespan
        return twin


def admission_order_makespan(works: Iterable[float], slots: int) -> float:
    """The makespan of list-scheduling ``works`` (in admission order) on ``slots`` identical slots."""
    schedule = ListSchedule(slots)
    for work in works:
        schedule.place(work)
    return schedule.makespan


class WorkMeter:
    """Model service and CPU execution (finished or failed), per active trajectory and in total.

    The admission-order term is list-scheduled as the run goes: a trajectory's work is placed once every
    trajectory admitted before it has ended, so the meter keeps only the works that ended ahead of an
    earlier one still running, not one per trajectory (it knows the slots from ``measurement_started``, or
    from :meth:`bounds`' limits)."""

    def __init__(self) -> None:
        # Work (model service + CPU execution) per active trajectory, folded into totals when it ends.
        self._work: dict[str | None, float] = {}
        self.model_work = 0.0
        self.cpu_work = 0.0
        self.durations = 0  # how many (µs-rounded) durations the work sums hold: their rounding error
        self.trajectory_work = 0.0
        self.longest_work = 0.0
        self._admitted = 0  # trajectories admitted so far: the next one's position in admission order
        self._admitted_at: dict[str | None, int] = {}  # active trajectory → its position there
        self._ended: dict[int, float] = {}  # position → work, of trajectories ended but not yet placed
        self._placed = 0  # positions placed on the schedule (every one before it has ended)
        self._schedule: ListSchedule | None = None  # once the slots are known

    def add(self, trajectory: str | None, seconds: float, model: bool) -> None:
        """A model request's latency or a CPU job's execute time (a failed job: its round trip)."""
        self.durations += 1
        if model:
            self.model_work += seconds
        else:
            self.cpu_work += seconds
        self._work[trajectory] = self._work.get(trajectory, 0.0) + seconds

    def start(self, slots: int) -> None:
        """The run's active limit is known (``measurement_started``): place ended works from now on."""
        if self._schedule is None:
            self._schedule = ListSchedule(slots)
            self._place()

    def admitted(self, trajectory: str | None) -> None:
        """A trajectory started: it takes the next position in admission order."""
        self._admitted_at[trajectory] = self._admitted
        self._admitted += 1

    def finished(self, trajectory: str | None) -> None:
        """A trajectory ended: its work is folded into the totals."""
        work = self._work.pop(trajectory, 0.0)
        position = self._admitted_at.pop(trajectory, None)
        if position is not None:
            self._ended[position] = work
            if position == self._placed:
                self._place()
        self.trajectory_work += work
        self.longest_work = max(self.longest_work, work)

    def _place(self) -> None:
        """Place the ended works that follow the placed ones without a gap (a running trajectory's)."""
        schedule, ended = self._schedule, self._ended
        if schedule is None:
            return
        while self._placed in ended:
            schedule.place(ended.pop(self._placed))
            self._placed += 1

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
        self.start(active)  # where measurement_started did not
        placed = self._schedule
        if placed is None or placed.slots != active:  # one meter, one run: its slots never change
            raise ValueError(f"works placed on {placed and placed.slots} active slots, asked about {active}")
        # the works not placed yet, in admission order: ended ones, and running ones' work so far
        tail = dict(self._ended)
        for trajectory, position in self._admitted_at.items():
            tail[position] = self._work.get(trajectory, 0.0)
        admission_order = placed.copy()
        for position in sorted(tail):
            admission_order.place(tail[position])
        model_term = self.model_work / capacity
        if model_capacity is not None and server_batch_s is not None:
            model_term = max(model_term, server_batch_s / model_capacity)
        terms = {
            "model_service_s": round(model_term, 6),
            "cpu_execute_s": round(self.cpu_work / limits["cpu_workers"], 6),
            "trajectory_work_s": round((self.trajectory_work + unfinished) / active, 6),
            "longest_trajectory_s": round(longest, 6),
            # last, so that a tie keeps the plainer term's name
            "admission_order_s": round(admission_order.makespan, 6),
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
