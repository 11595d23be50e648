"""The CPU dispatcher: a queue of CPU jobs, a policy that picks the next one, and the worker pool.

Dispatch happens synchronously whenever a job arrives or a worker becomes available: the policy sees a
frozen :class:`~asyncroll.policies.QueueSnapshot` (queue oldest first plus the model gate's outstanding
count) and returns a decision, which is logged as ``cpu_selected``. Jobs are never preempted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from pydantic import TypeAdapter

from asyncroll.clock import Clock
from asyncroll.errors import PolicyError, WorkerDied, WorkerTimeout
from asyncroll.event_log import EventLog
from asyncroll.events import MAX_CANDIDATES as MAX_CANDIDATES  # the oldest queued jobs a decision logs
from asyncroll.events import Candidate, CpuEnqueued, CpuFailed, CpuFinished, CpuSelected, CpuStarted
from asyncroll.policies import JobView, Policy, QueueSnapshot
from asyncroll.policies.base import Prediction
from asyncroll.policies.predictor import DurationPredictor
from asyncroll.policies.queue_estimates import QueueEstimates
from asyncroll.policies.remaining import RemainingEstimator
from asyncroll.runtime.jobs import JobOutcome, JobSpec
from asyncroll.runtime.model_gate import ModelGate
from asyncroll.runtime.pool import WorkerPool
from asyncroll.runtime.slot_wait import SlotWait
from asyncroll.telemetry.nvtx import NO_RANGES, Ranges
from asyncroll.workers.protocol import JobRequest

_CANDIDATES: TypeAdapter[list[Candidate]] = TypeAdapter(list[Candidate])
FailureReason = Literal["timeout", "worker_died", "cancelled"]


@dataclass(slots=True)
class _Queued:
    view: JobView
    spec: JobSpec
    future: asyncio.Future[int] = field(repr=False)  # resolves to the worker slot


@dataclass(frozen=True, slots=True)
class DispatcherSnapshot:
    queued: int
    decisions: int
    reorders: int
    peak_queued: int


class CpuDispatcher:
    def __init__(
        self,
        pool: WorkerPool,
        policy: Policy,
        gate: ModelGate,
        clock: Clock,
        events: EventLog,
        tool_timeout: float,
        tool_keys: Mapping[str, str] | None = None,
        *,
        predictor: DurationPredictor | None = None,
        remaining: RemainingEstimator | None = None,
        starvation_threshold: int = 1,
        admission_pending: Callable[[], bool] = lambda: True,
        ranges: Ranges = NO_RANGES,
        log_candidates: bool = True,
    ) -> None:
        """``predictor`` (one per run) predicts every queued job, once per model (after each refit), whatever
        the policy, so predictions are logged and comparable under FIFO too; it learns from every finished
        job.
        ``remaining`` (one per run, subscribed to the run's events) estimates the work each queued job
        unlocks; it is read only in the batch's tail (no problem waits for admission).
        ``log_candidates=False`` leaves each ``cpu_selected`` event's candidate list empty: a run that
        writes no events file (a sweep cell) has no reader for it, and building it costs CPU at every
        decision."""
        self._pool = pool
        self._policy = policy
        self._gate = gate
        self._clock = clock
        self._events = events
        self._timeout = tool_timeout
        self._tool_keys = dict(tool_keys or {})
        self._predictor = predictor or DurationPredictor()
        self._remaining = remaining
        # whether the policy reads every queued job's remaining-work estimate (a policy that does not say
        # is taken to): for one that does not, only the estimates its decisions log are computed
        self._reads_remaining: bool = getattr(policy, "reads_remaining", True)
        # ... and its predictions: for one that does not, the snapshot holds none (they are still made and
        # logged: the predictions of the queued jobs are kept here, in the queue's order, and only the
        # jobs queued since the last decision are predicted at the next, unless the model changed)
        self._reads_predictions: bool = getattr(policy, "reads_predictions", True)
        self._predicted: dict[int, Prediction] = {}  # the queued jobs' predictions, in the queue's order
        self._unpredicted: list[JobView] = []  # jobs queued since the last prediction, oldest first
        self._cancelled_waits = 0  # waits cancelled since the dispatcher last dropped their jobs
        # worker slot → (selected at, predicted seconds) of the job it runs: what the running jobs have left,
        # which the balanced rule's straggler guard weighs in the tail
        self._running: dict[int, tuple[float, float]] = {}
        self._threshold = starvation_threshold
        self._admission_pending = admission_pending
        self._ranges = ranges  # NVTX ranges (--nvtx) for each job's queue wait and execution
        self._queue: dict[int, _Queued] = {}
        self._views: dict[int, JobView] = {}  # the queued jobs' views, in the queue's order
        self._log_candidates = log_candidates
        self._next_id = 0
        self._workers = pool.snapshot().size
        self._decisions = 0
        self._reorders = 0
        self._peak_queued = 0
        pool.on_available = self._dispatch

    def snapshot(self) -> DispatcherSnapshot:
        return DispatcherSnapshot(len(self._queue), self._decisions, self._reorders, self._peak_queued)

    def trajectory_ended(self, trajectory_id: str) -> None:
        """No job of this trajectory comes again: what the predictor keeps for it goes."""
        self._predictor.end_trajectory(trajectory_id)

    async def run(self, spec: JobSpec) -> JobOutcome:
        """Queue a job, wait until the policy gives it a worker, run it there and return its outcome.

        The job runs in the caller's task (no task per job, no extra hand-off): the policy only decides
        *when*. A caller cancelled while queued leaves the queue; one cancelled while its job runs takes
        the worker down with it (the worker tree is killed), which only happens when the run is stopping.
        """
        self._next_id += 1
        job_id = self._next_id
        view = JobView(
            job_id,
            spec.trajectory_id,
            spec.kind,
            spec.tool,
            spec.turn,
            self._clock.now(),
            spec.arg_bytes,
            spec.resubmission,
            spec.n_tests,
            spec.test_bytes,
            spec.code_bytes,
        )
        queued = _Queued(view, spec, SlotWait(asyncio.get_running_loop(), self._wait_cancelled))
        self._queue[job_id] = queued
        self._views[job_id] = view
        self._unpredicted.append(view)
        self._peak_queued = max(self._peak_queued, len(self._queue))
        self._events.emit(
            CpuEnqueued(
                id=spec.trajectory_id,
                job_id=job_id,
                kind=spec.kind,
                tool=spec.tool,
                turn=spec.turn,
                arg_bytes=spec.arg_bytes,
                queue_depth=len(self._queue),
                resubmission=spec.resubmission,
            ),
            at=view.enqueued_at,
        )
        queue_range = self._ranges.start("cpu queue", job_id)
        self._dispatch()
        if queued.future.done():
            slot = queued.future.result()
        else:
            try:
                slot = await queued.future
            except BaseException:
                self._ranges.end(queue_range)
                if queued.future.done() and not queued.future.cancelled():
                    # Given a worker in the same step as the cancellation: hand the worker back.
                    self._running.pop(queued.future.result(), None)
                    self._cancelled(queued, queued.future.result(), self._clock.now())
                    self._pool.release(queued.future.result())
                elif self._queue.pop(job_id, None) is not None:
                    del self._views[job_id]
                    self._predicted.pop(job_id, None)
                    self._predictor.forget(view)
                raise
        self._ranges.end(queue_range)
        return await self._execute(slot, queued)

    def _wait_cancelled(self) -> None:
        self._cancelled_waits += 1

    def _dispatch(self) -> None:
        """Hand each idle worker the job the policy chooses, while jobs wait (called when a job arrives and
        when a worker becomes available)."""
        if not self._queue or not self._pool.idle:
            # Nothing to decide (half the calls: a job arrives while every worker is busy). A cancelled
            # wait left in the queue is dropped below before any worker can be handed to it.
            return
        if self._cancelled_waits:
            self._drop_cancelled()
        while self._queue:
            slot = self._pool.take_idle()
            if slot is None:
                return
            self._decide(slot)

    def _drop_cancelled(self) -> None:
        """A stop cancels a queued job's wait at once, but the job leaves the queue only when its task runs
        again: one freed worker in between must not be handed to it. (Nothing in :meth:`_dispatch` awaits,
        so no wait is cancelled while it runs.)"""
        self._cancelled_waits = 0
        queue = self._queue
        for job_id in [k for k, q in queue.items() if q.future.cancelled()]:
            del self._views[job_id]
            self._predicted.pop(job_id, None)
            self._predictor.forget(queue.pop(job_id).view)

    def _decide(self, slot: int) -> None:
        """One decision: the policy picks a queued job for worker ``slot``; it is logged (``cpu_selected``,
        ``cpu_started``) and its task given the worker."""
        queue = self._queue
        now = self._clock.now()
        jobs = tuple(self._views.values())
        known = self._predictions(jobs)  # the queue's, in its order
        snapshot = self._snapshot(now, jobs, known)
        decision = self._policy.choose(snapshot)
        if decision.job_id not in queue:
            shown = [str(j.job_id) for j in jobs[:MAX_CANDIDATES]] + ["..."] * (len(jobs) > MAX_CANDIDATES)
            raise PolicyError(
                f"policy {self._policy.name!r} chose job {decision.job_id!r}, not one of the {len(jobs)} "
                f"queued job(s) it was shown (ids {', '.join(shown)})"
            )
        tail = not snapshot.admission_pending and self._remaining is not None  # remaining work is logged
        # the chosen job's place in the queue, where the snapshot's estimates are read if the policy made
        # them (the queue's keys are the jobs' ids, in order); else None: each logged job is estimated alone
        remaining = snapshot.remaining
        index = (
            tuple(queue).index(decision.job_id)
            if isinstance(remaining, QueueEstimates) and remaining.made
            else None
        )
        candidates = [(j, known[j.job_id]) for j in jobs[:MAX_CANDIDATES]] if self._log_candidates else []
        chosen = queue.pop(decision.job_id)
        del self._views[decision.job_id]
        prediction = known.pop(decision.job_id)
        oldest = jobs[0]
        reordered = chosen.view.job_id != oldest.job_id
        self._decisions += 1
        self._reorders += reordered
        # The wait runs to the selection itself, so it includes the prediction and the decision (the
        # snapshot's ``now``, before them, is what the policy and the candidates saw).
        selected_at = self._clock.now()
        self._events.emit(
            CpuSelected(
                id=chosen.spec.trajectory_id,
                job_id=decision.job_id,
                worker=slot,
                policy=self._policy.name,
                reason=decision.reason,
                queue_depth=len(jobs),
                model_outstanding=snapshot.model_outstanding,
                waited_s=round(selected_at - chosen.view.enqueued_at, 6),
                oldest_job_id=oldest.job_id,
                reordered=reordered,
                eligible=decision.eligible,
                threshold=self._threshold,
                predicted_s=round(prediction.seconds, 6),
                prediction_source=prediction.source,
                observations=self._predictor.observations,
                remaining_s=_rounded(self._left(chosen.view, prediction, snapshot, index)) if tail else None,
                running_left_s=round(snapshot.running_left, 6) if tail else None,
                candidates=self._logged(candidates, snapshot, index, tail) if self._log_candidates else [],
            ),
            at=selected_at,
        )
        worker = self._pool.worker(slot)
        self._events.emit(
            CpuStarted(
                id=chosen.spec.trajectory_id,
                job_id=decision.job_id,
                worker=slot,
                pid=worker.pid,
                generation=worker.generation,
            )
        )
        # a job runs at most the tool timeout: a longer prediction would count time it cannot take
        self._running[slot] = (selected_at, min(prediction.seconds, self._timeout))
        chosen.future.set_result(slot)

    def _snapshot(self, now: float, jobs: tuple[JobView, ...], known: dict[int, Prediction]) -> QueueSnapshot:
        """What the policy sees: the queue, its predictions (if the policy reads them), the model gate's
        count and, in the batch's tail (no problem waits for admission), the remaining-work estimates and
        what the running jobs have left."""
        predictions = tuple(known.values()) if self._reads_predictions else ()
        pending = self._admission_pending()
        estimator = None if pending else self._remaining
        # made when the policy first reads one (most tail decisions, hard aging's, read none); else
        # estimated for the logged jobs only (the same values)
        remaining: QueueEstimates | tuple[()] = (
            QueueEstimates(estimator, jobs, predictions or tuple(known.values()))
            if estimator is not None and self._reads_remaining
            else ()
        )
        running_left = 0.0
        if estimator is not None:
            for started, predicted in self._running.values():
                running_left += max(0.0, predicted - (now - started))
        return QueueSnapshot(
            now,
            jobs,
            self._gate.outstanding,
            predictions,
            self._threshold,
            pending,
            self._workers,
            remaining,
            running_left,
        )

    def _logged(
        self,
        candidates: list[tuple[JobView, Prediction]],
        snapshot: QueueSnapshot,
        index: int | None,
        tail: bool,
    ) -> list[Candidate]:
        """The oldest queued jobs as a decision logs them, with their remaining-work estimates in the tail
        (validated into Candidates in one call: 8 Candidate(...) calls took twice as long, each one a
        Python __init__ and a validation; the same records)."""
        now = snapshot.now
        return _CANDIDATES.validate_python(
            [
                {
                    "job_id": j.job_id,
                    "predicted_s": round(p.seconds, 6),
                    "source": p.source,
                    "waited_s": round(now - j.enqueued_at, 6),
                    "remaining_s": _rounded(self._left(j, p, snapshot, None if index is None else i))
                    if tail
                    else None,
                }
                for i, (j, p) in enumerate(candidates)
            ]
        )

    def _predictions(self, jobs: tuple[JobView, ...]) -> dict[int, Prediction]:
        """The queued jobs' predictions (cached per job until the next refit), in the queue's order: only
        the jobs queued since the last call are predicted, unless the model changed."""
        predicted, views = self._predicted, self._views
        new = [v for v in self._unpredicted if v.job_id in views]  # not those cancelled meanwhile
        self._unpredicted.clear()
        prediction = self._predictor.prediction
        for job in self._predictor.update(lambda: jobs, new):
            predicted[job.job_id] = prediction(job.job_id)  # a job already there keeps its place
        return predicted

    def _left(
        self, job: JobView, prediction: Prediction, snapshot: QueueSnapshot, i: int | None
    ) -> float | None:
        """A queued job's remaining-work estimate (the tail only): the snapshot's where the policy made them
        (``i``: the job's place in the queue), else computed now (a pure function of the estimator's state,
        which no decision changes)."""
        if i is not None:
            return snapshot.remaining[i]
        assert self._remaining is not None
        return self._remaining.estimate(job, prediction.seconds)

    def _failed(self, job: _Queued, slot: int, since: float, reason: FailureReason, error: str) -> None:
        self._events.emit(
            CpuFailed(
                id=job.spec.trajectory_id,
                job_id=job.view.job_id,
                worker=slot,
                kind=job.spec.kind,
                tool=job.spec.tool,
                reason=reason,
                roundtrip_s=round(self._clock.now() - since, 6),
                error=error,
            )
        )

    def _cancelled(self, job: _Queued, slot: int, since: float) -> None:
        self._predictor.forget(job.view)
        self._failed(job, slot, since, "cancelled", "the run was stopped while this job held a worker")

    async def _execute(self, slot: int, job: _Queued) -> JobOutcome:
        worker = self._pool.worker(slot)
        spec, view = job.spec, job.view
        tool = self._tool_keys.get(spec.tool, spec.tool)
        # an evaluation's budget counts from here: carrying its tests to the worker takes time too
        stamp = {"called_at": time.monotonic()} if spec.kind == "evaluate" else {}
        request = JobRequest(
            view.job_id,
            tool,
            {**spec.arguments, **stamp},
            spec.cost_s,
            spec.declared,
            spec.observation_chars,
            self._pool.reads_rss,
            spec.declared_error,
            spec.declared_death,
        )
        sent = self._clock.now()
        execution = self._ranges.start("cpu execution", view.job_id)
        try:
            # an evaluation's tests are pickled a slice at a time, the other trajectories running between
            result = await worker.call(request, self._timeout, large=spec.kind == "evaluate")
        except asyncio.CancelledError:
            # The run is stopping: the worker's tree was killed under the job (unless it had none of it yet:
            # its request still being encoded). Say so, then propagate.
            self._cancelled(job, slot, sent)
            raise
        except (WorkerTimeout, WorkerDied) as exc:
            failure: FailureReason = "timeout" if isinstance(exc, WorkerTimeout) else "worker_died"
            self._failed(job, slot, sent, failure, str(exc))
            if failure == "timeout":  # censored at the timeout: the slowest jobs must not vanish
                self._predictor.observe(view, self._timeout, censored=True)
            else:
                self._predictor.forget(view)
            # The replacement starts now, in the pool's task group; the caller gets its answer at once.
            self._pool.replace_soon(slot, "timeout" if failure == "timeout" else "died")
            return JobOutcome(ok=False, error=str(exc), failure=failure)
        finally:
            self._running.pop(slot, None)
            self._ranges.end(execution)
        reply = result.reply
        rel = self._events.rel
        self._events.emit(
            CpuFinished(
                id=spec.trajectory_id,
                job_id=view.job_id,
                worker=slot,
                kind=spec.kind,
                tool=spec.tool,
                ok=reply.ok,
                execute_s=round(reply.execute_s, 6),
                cpu_s=None if reply.cpu_s is None else round(reply.cpu_s, 6),
                roundtrip_s=round(result.received - result.sent, 6),
                serialize_s=None if reply.serialize_s is None else round(reply.serialize_s, 6),
                started=rel(reply.started),
                finished=rel(reply.finished),
                error=reply.error,
            )
        )
        self._predictor.observe(view, reply.execute_s)
        self._pool.job_done(slot, reply.rss_bytes)
        return JobOutcome(ok=reply.ok, value=reply.value, error=reply.error, execute_s=reply.execute_s)


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 6)
