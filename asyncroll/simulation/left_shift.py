"""The recorded run's schedule, left-shifted: the starting point of :mod:`asyncroll.simulation.optimum`.

A run's own schedule carries its overheads (client, admission, dispatch) as gaps between steps. Hinted as
it is, CP-SAT had to close them itself: on 40 trajectories at one active slot (optimum: the chains back to
back) it returned the run's own schedule at ``--time-limit 10``. Here every step instead starts as early as
its trajectory's previous step, the admission order and the capacities allow, keeping the recorded order of
the steps on each unit of each resource (a model slot, a CPU worker, an active-trajectory slot): the
longest paths of that precedence graph. Every constraint of the solver's model is an edge of the graph, so
the result is a schedule of the floored durations whatever the recorded times were (rounded, overlapping
by a microsecond), and no step of it starts later than the recorded one where those were consistent.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from asyncroll.simulation.run_instance import Instance


@dataclass(frozen=True)
class Shifted:
    """A schedule in ticks: each trajectory's begin, its steps' starts, its end; and the makespan."""

    begins: tuple[int, ...]
    starts: tuple[tuple[int, ...], ...]
    ends: tuple[int, ...]
    makespan: int
    shifted: bool = True  # a schedule by construction; the recorded one floored (False) only mostly is


def solver_hint(instance: Instance, ticks: Callable[[float], int]) -> Shifted | None:
    """The better of the recorded schedule (floored) and its left shift: the solver's hint."""
    recorded = _recorded(instance, ticks)
    shifted = left_shifted(instance, ticks)
    if shifted is None or (recorded is not None and recorded.makespan < shifted.makespan):
        return recorded
    return shifted


def _recorded(instance: Instance, ticks: Callable[[float], int]) -> Shifted | None:
    """The run's own times, floored: a schedule of the floored durations (every interval only shrinks)
    unless the events' rounding to 1 µs made two steps overlap across a tick boundary."""
    if instance.begins is None or any(s.start is None for c in instance.chains for s in c):
        return None
    begins = tuple(ticks(max(0.0, b)) for b in instance.begins)
    starts = tuple(tuple(ticks(max(0.0, s.start or 0.0)) for s in chain) for chain in instance.chains)
    ends = tuple(
        max([b] + [at + ticks(s.seconds) for at, s in zip(row, chain, strict=True)])
        for b, row, chain in zip(begins, starts, instance.chains, strict=True)
    )
    return Shifted(begins, starts, ends, max(ends, default=0), shifted=False)


def left_shifted(
    instance: Instance, ticks: Callable[[float], int], sizes: Sequence[Sequence[int]] | None = None
) -> Shifted | None:
    """The run's schedule left-shifted (module doc), or None where it holds no recorded times. The order
    on each unit is read from the recorded starts and durations; ``sizes`` (each step's, in ticks), when
    given, are the durations the shift places instead of the floored recorded ones (:func:`retimed_s`)."""
    begins = instance.begins
    if begins is None or len(begins) != len(instance.chains):
        return None
    if any(step.start is None for chain in instance.chains for step in chain):
        return None
    # Nodes: trajectory i's begin is node first[i], its k-th step's start first[i] + 1 + k.
    first: list[int] = []
    size: list[int] = []  # each node's duration in ticks (a begin: 0)
    for i, chain in enumerate(instance.chains):
        first.append(len(size))
        size.append(0)
        size.extend([ticks(step.seconds) for step in chain] if sizes is None else sizes[i])
    edges: list[list[int]] = [[] for _ in size]  # u → v: v starts after u ends
    for i, chain in enumerate(instance.chains):
        for k in range(len(chain)):
            edges[first[i] + k].append(first[i] + k + 1)  # the chain's order, from its begin
        if i:
            edges[first[i - 1]].append(first[i])  # admission in workload order

    def last(i: int) -> int:  # the node whose end is trajectory i's end
        return first[i] + len(instance.chains[i])

    def recorded_end(i: int) -> float:
        chain = instance.chains[i]
        return max([begins[i]] + [(s.start or 0.0) + s.seconds for s in chain])

    def sequence(items: list[tuple[float, float, int]], units: int) -> None:
        """Each item (recorded start, recorded end, node) after the previous one on the unit that the
        recorded run freed first: the recorded order kept on every unit."""
        free: list[tuple[float, int, int]] = []  # (recorded end, unit, its last node)
        for index, (_, end, node) in enumerate(sorted(items)):
            if len(free) < units:
                heapq.heappush(free, (end, index, node))
                continue
            _, unit, previous = heapq.heappop(free)
            edges[previous].append(node)
            heapq.heappush(free, (end, unit, node))

    for kind, units in (("model", instance.model_capacity), ("cpu", instance.workers)):
        sequence(
            [
                ((s.start or 0.0), (s.start or 0.0) + s.seconds, first[i] + 1 + k)
                for i, chain in enumerate(instance.chains)
                for k, s in enumerate(chain)
                if s.kind == kind
            ],
            units,
        )
    # The active slots: a trajectory holds one from its begin to its end (its last node's end).
    slots: list[tuple[float, int, int]] = []
    for i in range(len(instance.chains)):
        if len(slots) < instance.active:
            heapq.heappush(slots, (recorded_end(i), i, i))
            continue
        _, unit, previous = heapq.heappop(slots)
        edges[last(previous)].append(first[i])
        heapq.heappush(slots, (recorded_end(i), unit, i))
    at = _longest_paths(edges, size)
    if at is None:  # a cycle (recorded times that contradict each other): no shift
        return None
    ends = tuple(at[last(i)] + size[last(i)] for i in range(len(instance.chains)))
    return Shifted(
        begins=tuple(at[first[i]] for i in range(len(instance.chains))),
        starts=tuple(
            tuple(at[first[i] + 1 + k] for k in range(len(chain))) for i, chain in enumerate(instance.chains)
        ),
        ends=ends,
        makespan=max(ends, default=0),
    )


#: Ticks of the re-timed schedule: 1 µs, the events' own rounding of every duration.
MICROSECOND = 1e-6


def retimed_s(instance: Instance, schedule: Shifted, resolution_s: float) -> float | None:
    """The makespan of ``schedule`` (a schedule of ``instance``'s durations floored to ``resolution_s``,
    in those ticks: the solver's) re-timed with the real durations: the same order on every unit of every
    resource, each step as early as that order allows. A real schedule of this work exists that is this
    long, where the floored one can be shorter than any (a 1.9 ms step counts 1 ms). Where that order has a
    cycle, the steps are listed in the schedule's order instead (:func:`_listed`)."""
    placed = Instance(
        chains=tuple(
            tuple(
                replace(step, seconds=math.floor(step.seconds / resolution_s + 1e-9) * resolution_s, start=at)
                for step, at in zip(chain, (t * resolution_s for t in starts), strict=True)
            )
            for chain, starts in zip(instance.chains, schedule.starts, strict=True)
        ),
        active=instance.active,
        model_capacity=instance.model_capacity,
        workers=instance.workers,
        begins=tuple(b * resolution_s for b in schedule.begins),
    )
    real = [[math.ceil(step.seconds / MICROSECOND - 1e-6) for step in chain] for chain in instance.chains]
    shifted = left_shifted(placed, lambda s: math.ceil(s / MICROSECOND - 1e-6), real)
    if shifted is None:  # a trajectory of 0-tick steps held its slot for no time, inside another's
        return _listed(instance, schedule, real)
    return shifted.makespan * MICROSECOND


def _listed(instance: Instance, schedule: Shifted, real: list[list[int]]) -> float | None:
    """The makespan of a schedule of the real durations (``real``, in µs) built by placing the steps one at
    a time, in the order of ``schedule``'s starts, each on the unit of its resource free first and after its
    trajectory's previous step; a trajectory begins in workload order once an active slot is free. Always a
    schedule of this work (None only where a resource it needs has no unit)."""
    units = {"model": [0] * instance.model_capacity, "cpu": [0] * instance.workers}
    slots = [0] * instance.active  # when each active slot is free
    ready: list[tuple[int, int, int]] = [(schedule.begins[0], 0, -1)] if instance.chains else []
    waiting: tuple[int, int, int] | None = None  # a begin with no free slot yet
    end = [0] * len(instance.chains)  # each trajectory's end so far
    admitted = 0  # the latest begin
    while ready:
        node = heapq.heappop(ready)
        _, i, k = node
        chain = instance.chains[i]
        if k < 0:
            if not slots:
                waiting = node
                continue
            admitted = end[i] = max(admitted, heapq.heappop(slots))
            if i + 1 < len(instance.chains):
                heapq.heappush(ready, (schedule.begins[i + 1], i + 1, -1))
        else:
            free = units[chain[k].kind]
            if not free:
                return None
            end[i] = max(end[i], heapq.heappop(free)) + real[i][k]
            heapq.heappush(free, end[i])
        if k + 1 < len(chain):
            heapq.heappush(ready, (schedule.starts[i][k + 1], i, k + 1))
            continue
        heapq.heappush(slots, end[i])  # trajectory i has ended: its slot is free
        if waiting is not None:
            heapq.heappush(ready, waiting)
            waiting = None
    return None if waiting is not None else max(end, default=0) * MICROSECOND  # (no active slot)


def _longest_paths(edges: list[list[int]], size: list[int]) -> list[int] | None:
    """Each node's earliest start: after every predecessor's end (Kahn's order); None on a cycle."""
    incoming = [0] * len(size)
    for targets in edges:
        for v in targets:
            incoming[v] += 1
    at = [0] * len(size)
    ready = deque(v for v, n in enumerate(incoming) if n == 0)
    done = 0
    while ready:
        u = ready.popleft()
        done += 1
        for v in edges[u]:
            at[v] = max(at[v], at[u] + size[u])
            incoming[v] -= 1
            if incoming[v] == 0:
                ready.append(v)
    return at if done == len(size) else None
