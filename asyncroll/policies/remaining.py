"""Online estimate of the work a CPU job unlocks: its trajectory's remaining service after the job ends.

The critical-path rule for a finite batch's tail needs, for each queued job, how much work its trajectory
still has to do once the job is done (later model turns and CPU jobs). That is not knowable from the job
alone (whether a repair follows depends on the verdict), but its *average* is learnable: jobs at the same
point of a trajectory — same kind and tool, first run or resubmission, same turn — leave similar work
behind them.

The estimator subscribes to the run's events. Per running trajectory it keeps one running total of
service (model latency of each finished request, execute time of each finished CPU job, a failed job's
round trip) and, for each finished CPU job, that total at the job's end; when the trajectory finishes,
each job's remaining work is the final total minus its mark, added to a running mean for the job's key
(``kind, tool, resubmission, turn``). Service times, not wall times: the estimate does not depend on the
queueing the schedule caused. Memory: a few floats per job of the active trajectories, and one mean per
key. State lives in one instance per run.

Learning from *finished* trajectories is biased early in a batch: the first to finish are those without a
repair, so on a small batch the work after a first evaluation looks like almost nothing until the end.
:class:`StepwiseWork` learns the same quantity step by step instead — a Markov chain over the job keys:
from each job's key to its trajectory's next queued job (or its end), with the model service in between,
seen one model turn after the job rather than when the whole trajectory ends, plus each key's mean execute
time; the remaining service after a key is the expectation along the chain. The chain rule
(``asyncroll_chain``) reads it, and the repair rule (``asyncroll_repair``, the default) reads it with
``own_repair``: a first evaluation's own predicted time stands for its repair's (which estimator a run
uses: :func:`asyncroll.policies.registry.estimator_for`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from asyncroll.events import (
    CpuEnqueued,
    CpuFailed,
    CpuFinished,
    Event,
    ModelFailed,
    ModelFinished,
    TrajectoryFinished,
)
from asyncroll.policies.base import JobView

Key = tuple[str, str, bool, int]  # (kind, tool, resubmission, turn)
_START: Key = ("", "", False, -1)  # a trajectory before its first job
_END: Key = ("", "", False, -2)  # a finished trajectory
_END_ID = 1  # its number in StepwiseWork (the start is 0)
#: Transitions seen from a key before the chain gives an estimate after it (RESULTS.md: with 1, a
#: 20-trajectory batch at 32 active / 4 inflight / 2 workers was worse than FIFO; 3 and 8 were not).
MIN_TRANSITIONS = 3


class RemainingEstimator(Protocol):
    """What the dispatcher reads in the tail: an event subscriber with an estimate per queued job."""

    observations: int

    def estimate(self, job: JobView, predicted: float | None = None) -> float | None: ...

    def estimate_queue(self, jobs: Sequence[JobView], predicted: Sequence[float]) -> tuple[float | None, ...]:
        """``estimate(job, seconds)`` of every queued job with its predicted seconds, the same values: what
        the dispatcher asks at each decision in the tail, where the queue may hold thousands of jobs."""
        ...

    def __call__(self, event: Event) -> None: ...


def key_of(job: JobView) -> Key:
    return (job.kind, job.tool, job.resubmission, job.turn)


class _Subscriber:
    """Calls the handler registered for the event's type (each event class is final): one lookup per
    event, most of which are of no interest to an estimator."""

    _handlers: dict[type[Event], Callable[[Any], None]]

    def __call__(self, event: Event) -> None:
        handler = self._handlers.get(type(event))
        if handler is not None:
            handler(event)


@dataclass(slots=True)
class _Trajectory:
    service_s: float = 0.0
    marks: list[tuple[Key, float]] = field(default_factory=list)  # (job key, service total at its end)


class RemainingWork(_Subscriber):
    """Mean remaining service after a job, by the job's key; an event subscriber (``log.subscribe``)."""

    def __init__(self) -> None:
        self._running: dict[str, _Trajectory] = {}
        self._queued: dict[int, tuple[str, Key]] = {}  # job id → (trajectory, key), until it ends
        self._sum: dict[Key, float] = {}
        self._count: dict[Key, int] = {}
        self.observations = 0
        self._handlers: dict[type[Event], Callable[[Any], None]] = {
            ModelFinished: self._model_done,
            ModelFailed: self._model_done,
            CpuEnqueued: self._cpu_enqueued,
            CpuFinished: self._cpu_done,
            CpuFailed: self._cpu_done,
            TrajectoryFinished: self._trajectory_finished,
        }

    def estimate(self, job: JobView, predicted: float | None = None) -> float | None:
        """Mean remaining service (seconds) after jobs like this one; None before any has been seen."""
        key = key_of(job)
        count = self._count.get(key)
        return None if count is None else self._sum[key] / count

    def estimate_queue(self, jobs: Sequence[JobView], predicted: Sequence[float]) -> tuple[float | None, ...]:
        total, count = self._sum, self._count
        values: list[float | None] = []
        for job in jobs:
            key = key_of(job)
            seen = count.get(key)
            values.append(None if seen is None else total[key] / seen)
        return tuple(values)

    def _model_done(self, event: ModelFinished | ModelFailed) -> None:
        self._add(event.id, event.latency_s)

    def _cpu_enqueued(self, event: CpuEnqueued) -> None:
        assert event.id is not None
        self._queued[event.job_id] = (event.id, (event.kind, event.tool, event.resubmission, event.turn))

    def _cpu_done(self, event: CpuFinished | CpuFailed) -> None:
        job = self._queued.pop(event.job_id, None)
        if job is not None:
            seconds = event.execute_s if isinstance(event, CpuFinished) else event.roundtrip_s
            trajectory = self._add(job[0], seconds)
            trajectory.marks.append((job[1], trajectory.service_s))

    def _trajectory_finished(self, event: TrajectoryFinished) -> None:
        done = self._running.pop(event.id or "", None)
        if done is not None:
            for key, mark in done.marks:
                self._sum[key] = self._sum.get(key, 0.0) + done.service_s - mark
                self._count[key] = self._count.get(key, 0) + 1
                self.observations += 1

    def _add(self, trajectory_id: str | None, seconds: float) -> _Trajectory:
        trajectory = self._running.get(trajectory_id or "")
        if trajectory is None:
            trajectory = self._running[trajectory_id or ""] = _Trajectory()
        trajectory.service_s += seconds
        return trajectory


@dataclass(slots=True)
class _Step:
    last: int = 0  # the number of the key of the trajectory's last queued job (0: none yet)
    model_s: float = 0.0  # model service since that job was queued


_UNSET = float("nan")  # a memo slot with nothing in it (compared by identity)
Repairs = tuple[tuple[float, float], ...]


class StepwiseWork(_Subscriber):
    """Mean remaining service after a job, by the job's key, from a Markov chain over job keys learned
    step by step; an event subscriber (``log.subscribe``).

    Each key is numbered when first seen and everything about it lives at its number (in lists), so that
    walking the chain costs list indexing, not hashing tuples. The expectations are memoised; an
    observation marks the keys whose own counts it changed, and the next ``estimate`` forgets their
    memoised values and those computed from them (the chain upstream), not the whole memo."""

    def __init__(self, min_transitions: int = MIN_TRANSITIONS, *, own_repair: bool = False) -> None:
        self._min = min_transitions
        self._own_repair = own_repair
        self._active: dict[str, _Step] = {}
        self._queued: dict[int, int] = {}  # job id → its key's number, until it ends
        self._ids: dict[Key, int] = {}  # key → its number
        self._keys: list[Key] = []  # number → key
        self._next: list[dict[int, list[float]]] = []  # next key → [count, Σ model service]
        self._from: list[int] = []  # transitions seen from each key
        self._exec: list[list[float] | None] = []  # [count, Σ execute seconds], None before any
        self._exec_all = [0.0, 0.0]
        self._memo: list[float | None] = []  # the expectation after each key, or _UNSET
        self._repairs: list[Repairs | None] = []  # memo of ``_repairs_after``
        self._parents: list[set[int]] = []  # the keys seen to lead to each key
        self._dirty: set[int] = set()  # keys whose own counts changed since the memos were brought up to date
        self._every_users: set[int] = set()  # memoised keys that read the mean execute time of every job
        self._every_changed = False
        self.observations = 0
        for key in (_START, _END):
            self._number(key)
        self._handlers: dict[type[Event], Callable[[Any], None]] = {
            ModelFinished: self._model_done,
            ModelFailed: self._model_done,
            CpuEnqueued: self._cpu_enqueued,
            CpuFinished: self._cpu_done,
            CpuFailed: self._cpu_done,
            TrajectoryFinished: self._trajectory_finished,
        }

    def _number(self, key: Key) -> int:
        number = self._ids.get(key)
        if number is None:
            number = self._ids[key] = len(self._keys)
            self._keys.append(key)
            self._next.append({})
            self._from.append(0)
            self._exec.append(None)
            self._memo.append(_UNSET)
            self._repairs.append(None)
            self._parents.append(set())
        return number

    def estimate(self, job: JobView, predicted: float | None = None) -> float | None:
        """Expected service (seconds) after jobs like this one; None until enough transitions from its
        key were seen. With ``own_repair``, a first evaluation's ``predicted`` execute time stands for its
        own resubmission's (a repair evaluates nearly the same program on the same tests, and the
        predictor itself predicts a repair by its first evaluation's time) instead of the mean of every
        resubmission after its key: a long first evaluation has a long repair ahead."""
        after, repairs = self._per_key(self._ids.get(key_of(job)))
        if after is not None and predicted is not None:
            for weight, mean in repairs:
                after += weight * (predicted - mean)
        return after

    def estimate_queue(self, jobs: Sequence[JobView], predicted: Sequence[float]) -> tuple[float | None, ...]:
        """Each job's ``estimate(job, seconds)``, the same arithmetic, with the work shared by the jobs of
        one key done once per key: a queue of thousands (every problem admitted at once, CPU the
        bottleneck) holds a few dozen keys. A job's key is read from its ``CpuEnqueued`` (by job id), else
        made from the job."""
        queued, ids = self._queued, self._ids
        per_key: dict[int | None, tuple[float | None, Repairs]] = {}
        values: list[float | None] = []
        for job, seconds in zip(jobs, predicted, strict=True):
            number = queued.get(job.job_id)
            if number is None:
                number = ids.get(key_of(job))
            entry = per_key.get(number)
            if entry is None:
                entry = per_key[number] = self._per_key(number)
            after, repairs = entry
            if repairs and after is not None:
                for weight, mean in repairs:
                    after += weight * (seconds - mean)
            values.append(after)
        return tuple(values)

    def _per_key(self, number: int | None) -> tuple[float | None, Repairs]:
        """A key's expectation after it (None: unknown), and the repairs that a job's own predicted time
        adjusts it by (none: it is used as is; only with ``own_repair``, after a first run)."""
        if number is None or self._from[number] < self._min:
            return None, ()
        if self._dirty or self._every_changed:
            self._forget()
        after = self._memo[number]
        if after is _UNSET:
            after = self._after(number)
        if after is None or not self._own_repair or self._keys[number][2]:
            return after, ()
        repairs = self._repairs[number]
        if repairs is None:
            repairs = self._repairs[number] = self._repairs_after(number)
        return after, repairs

    def _repairs_after(self, number: int) -> Repairs:
        """The resubmissions of the same tool seen to follow a key: (probability, mean execute time)
        each. Memoised, like ``_after``: ``estimate`` runs for every queued job at every decision in the
        tail."""
        total, tool, keys = self._from[number], self._keys[number][1], self._keys
        repairs = []
        for to, (count, _) in self._next[number].items():
            if to != _END_ID and keys[to][2] and keys[to][1] == tool:  # its resubmission, same tool
                executed = self._exec[to]
                if executed is None:
                    self._every_users.add(number)
                    mean = self._mean_exec()
                else:
                    mean = executed[1] / executed[0]
                repairs.append((count / total, mean))
        return tuple(repairs)

    def _forget(self) -> None:
        """Drops the memoised values that the observations since the last estimate changed: those of the
        keys whose own counts changed (a transition from them, a new execute time of a key they lead to),
        of the keys that read the mean of every job when it changed, and the expectations computed from
        those (of their ancestors on the chain; the repairs after a key depend on its own counts only).
        Every other memoised value is what recomputing it would give, on a chain without cycles (a real
        run's: one job per turn, and turns only increase)."""
        changed, memo, repairs, users = self._dirty, self._memo, self._repairs, self._every_users
        if self._every_changed:
            changed |= users
            self._every_changed = False
        for number in changed:
            repairs[number] = None
        users -= changed
        stack = list(changed)
        changed.clear()
        parents = self._parents
        while stack:
            number = stack.pop()
            if memo[number] is not _UNSET:  # and the expectations computed from it
                memo[number] = _UNSET
                stack.extend(parents[number])

    def _forget_all(self) -> None:
        """Drops every memoised value (``bench.decision``'s worst case: the whole chain recomputed)."""
        self._memo[:] = [_UNSET] * len(self._memo)
        self._repairs[:] = [None] * len(self._repairs)
        self._every_users.clear()

    def _mean_exec(self) -> float:
        """The mean execute time of every job seen to finish (0 before any)."""
        return self._exec_all[1] / self._exec_all[0] if self._exec_all[0] else 0.0

    def _step(self, trajectory_id: str | None) -> _Step:
        step = self._active.get(trajectory_id or "")
        if step is None:
            step = self._active[trajectory_id or ""] = _Step()
        return step

    def _model_done(self, event: ModelFinished | ModelFailed) -> None:
        self._step(event.id).model_s += event.latency_s

    def _transition(self, step: _Step, to: int) -> None:
        nexts = self._next[step.last]
        counts = nexts.get(to)
        if counts is None:
            counts = nexts[to] = [0.0, 0.0]
            self._parents[to].add(step.last)
        counts[0] += 1
        counts[1] += step.model_s
        self._from[step.last] += 1
        self._dirty.add(step.last)
        step.last, step.model_s = to, 0.0
        self.observations += 1

    def _cpu_enqueued(self, event: CpuEnqueued) -> None:
        number = self._number((event.kind, event.tool, event.resubmission, event.turn))
        self._queued[event.job_id] = number
        self._transition(self._step(event.id), number)

    def _cpu_done(self, event: CpuFinished | CpuFailed) -> None:
        number = self._queued.pop(event.job_id, None)
        if number is not None:
            seconds = event.execute_s if isinstance(event, CpuFinished) else event.roundtrip_s
            counts = self._exec[number]
            if counts is None:
                counts = self._exec[number] = [0.0, 0.0]
            counts[0] += 1
            counts[1] += seconds
            self._exec_all[0] += 1
            self._exec_all[1] += seconds
            self._dirty.update(self._parents[number])  # they read this key's mean execute time
            self._every_changed = True

    def _trajectory_finished(self, event: TrajectoryFinished) -> None:
        step = self._active.pop(event.id or "", None)
        if step is not None:
            self._transition(step, _END_ID)

    def _after(self, number: int) -> float | None:
        """Σ over next keys of P(next) × (model service before it + its execute time + the service after
        it); a next job of a key not seen to finish counts at the mean execute time of every job, and a key
        whose own estimate is not known yet counts 0 after it. Memoised (see ``_forget``). The keys to
        compute are found first (``_unknown_after``), then computed children first, in one loop: no
        recursion, as a chain is as deep as a trajectory has turns and ``max_turns`` has no upper bound."""
        memo = self._memo
        value = memo[number]
        if value is not _UNSET:
            return value
        executions, counts_from, nexts, users = self._exec, self._from, self._next, self._every_users
        every = None
        for key in self._unknown_after(number):
            total = counts_from[key]
            value = 0.0
            for to, (count, model_s) in nexts[key].items():
                after = model_s / count
                if to != _END_ID:
                    executed = executions[to]
                    if executed is None:
                        users.add(key)
                        if every is None:
                            every = self._mean_exec()
                        mean = every
                    else:
                        mean = executed[1] / executed[0]
                    after += mean + (memo[to] or 0.0)
                value += count / total * after
            memo[key] = value
        return memo[number]

    def _unknown_after(self, number: int) -> list[int]:
        """The keys reachable from ``number`` whose expectation is not memoised, each after every key it
        leads to (depth first, in the order the transitions were first seen). Memoises None for those below
        ``min_transitions`` (they are not listed) and 0 for the listed ones meanwhile: a key met again on
        its own chain (the same key twice in a turn) adds nothing more."""
        memo, counts_from, nexts, least = self._memo, self._from, self._next, self._min
        if counts_from[number] < least:
            memo[number] = None
            return []
        memo[number] = 0.0
        order: list[int] = []
        stack = [(number, iter(nexts[number]))]
        while stack:
            key, children = stack[-1]
            for to in children:
                if to != _END_ID and memo[to] is _UNSET:
                    if counts_from[to] < least:
                        memo[to] = None
                        continue
                    memo[to] = 0.0
                    stack.append((to, iter(nexts[to])))
                    break
            else:  # every key after it is listed (or on the stack: a cycle)
                order.append(key)
                stack.pop()
        return order
