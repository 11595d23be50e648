"""``summary.json``: built incrementally from the event stream, so no run keeps its events in memory.

:class:`SummaryBuilder` subscribes to the :class:`~asyncroll.event_log.EventLog`; at the end
:meth:`SummaryBuilder.build` turns its counters and samples into counts, rates, latency distributions
(min/p50/p95/max), the phase breakdown and scheduler diagnostics. A distribution's samples are kept as
packed doubles (8 bytes each) up to 65,536 of them, then in a bounded quantile sketch
(:mod:`asyncroll.outputs.samples`); everything else is a counter, or per *active* trajectory and dropped
when it ends. A value that could not be measured is ``null`` with a reason, never zero.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any

from asyncroll.events import (
    CpuEnqueued,
    CpuFailed,
    CpuFinished,
    CpuSelected,
    Event,
    LoopStalled,
    LoopWatched,
    MeasurementStarted,
    ModelFailed,
    ModelFinished,
    ModelPaused,
    ModelRetrying,
    ModelStarted,
    ProcessStopped,
    ResourceProbe,
    ResourceSample,
    ServerAvailable,
    ServerUnavailable,
    TrajectoryFinished,
    TrajectoryStarted,
    WorkerRestarting,
)
from asyncroll.outputs.blocked import BlockedMeter
from asyncroll.outputs.bounds import WorkMeter
from asyncroll.outputs.pauses import CircuitMeter, LoopStallMeter
from asyncroll.outputs.resources import ResourceMeter, gpu_hour
from asyncroll.outputs.samples import Pairs, Samples
from asyncroll.outputs.statistics import ratio
from asyncroll.policies.registry import canonical_policy

SUMMARY_SCHEMA_VERSION = 1
#: ``model_failed`` kinds that are a response the server sent (HTTP 200) but not a valid action: they
#: are in ``validity_rate``'s denominator. Transport failures, timeouts and error statuses are not.
RECEIVED_INVALID = ("invalid_action", "bad_response")


#: The phase breakdown: where finished trajectories spent their time, summed over them.
PHASES = ("model_queue_s", "model_service_s", "cpu_queue_s", "cpu_execute_s")
MODEL_QUEUE, MODEL_SERVICE, CPU_QUEUE, CPU_EXECUTE = range(len(PHASES))
PHASES_DEFINITION = (
    "over finished trajectories (the denominator's): waits for a model slot and for a worker, model "
    "requests' latency and CPU jobs' execute time, failed ones included (a failed job: its round trip)"
)


#: summary.json's correlations → the pairs each is computed over
PEARSON_FIELDS = {"pearson_log": "all", "pearson_log_repairs": "repairs", "pearson_log_first": "first"}


class SummaryBuilder:
    def __init__(self) -> None:
        self.started = 0
        self.status: Counter[str] = Counter()
        self.graded = 0
        self.referenced = 0  # finished trajectories whose problem has a reference answer, graded or not
        self.referenced_correct = 0  # of those, answered correctly (``correct`` also counts code passes)
        self.correct = 0
        self.code: Counter[str] = Counter()  # one-repair outcomes: passed/failed after 1 or 2 programs
        self.model_finished = 0
        self.model_failed: Counter[str] = Counter()
        self.model_scripted: Counter[str] = Counter()  # of those, failed by a script's error step
        self.model_statuses: Counter[str] = Counter()  # of those of kind http_status, by the status answered
        self.model_retries: Counter[str] = Counter()  # failed attempts that were retried, by error kind
        self.finish_reasons: Counter[str] = Counter()  # finished requests by the server's finish_reason
        self.circuit = CircuitMeter()  # the HTTP backend's server circuit
        self.loop = LoopStallMeter()  # stalls of the client's event loop
        self.tool_calls = 0
        self.tool_failed = 0  # tool calls that failed (timeout, worker died), not cancelled ones
        self.tool_cancelled = 0  # tool calls the run cancelled when it stopped: no outcome
        self.observations_cut = 0  # over finished trajectories
        self.finished_tool_calls = 0  # made by trajectories that finished (the per-trajectory mean's)
        self.tool_errors = 0
        self.cpu_failures: Counter[str] = Counter()
        self.jobs_by_kind: Counter[str] = Counter()
        self.decisions = 0
        self.eligible = 0
        self.reorders = 0
        self.reasons: Counter[str] = Counter()
        self.restarts: Counter[str] = Counter()
        self.blocked = BlockedMeter()
        self.resources = ResourceMeter(self.blocked)  # telemetry samples × blocked intervals
        # Predictions joined to actual execute times by job id (entries live only while a job does).
        self._resubmission: dict[int, bool] = {}
        self._predicted: dict[int, tuple[float, bool]] = {}
        self.prediction_sources: Counter[str] = Counter()
        self.pairs = {k: Pairs() for k in ("all", "repairs", "first")}
        self.work = WorkMeter()  # model service and CPU execution: the makespan lower bound
        # The phase breakdown (PHASES) per active trajectory, folded into ``phase_totals`` when it ends:
        # the breakdown and its denominator (finished trajectories' time) cover the same trajectories.
        self._phases: dict[str | None, list[float]] = {}
        self.phase_totals = [0.0] * len(PHASES)
        self.samples = {
            k: Samples()
            for k in (
                "trajectory_s",
                "model_latency_s",
                "model_queue_s",
                "cpu_queue_s",
                "cpu_execute_s",
                "cpu_roundtrip_s",
                "cpu_dispatch_overhead_s",
                "turns_per_trajectory",
            )
        }
        self._handlers: dict[type[Event], Callable[[Any], None]] = {
            ModelStarted: self._model_started,
            ModelFinished: self._model_finished,
            ModelFailed: self._model_failed,
            ModelRetrying: self._model_retrying,
            ModelPaused: self.circuit.on_paused,
            ServerUnavailable: self.circuit.on_unavailable,
            ServerAvailable: self.circuit.on_available,
            MeasurementStarted: self._measurement_started,
            LoopWatched: self.loop.on_watched,
            LoopStalled: self.loop.on_stalled,
            ProcessStopped: self.loop.on_stopped,
            CpuEnqueued: self._cpu_enqueued,
            CpuSelected: self._cpu_selected,
            CpuFinished: self._cpu_finished,
            CpuFailed: self._cpu_failed,
            TrajectoryStarted: self._trajectory_started,
            TrajectoryFinished: self._trajectory_finished,
            WorkerRestarting: self._worker_restarting,
            ResourceProbe: self.resources.on_probe,
            ResourceSample: self.resources.on_sample,
        }

    def __call__(self, event: Event) -> None:
        self.blocked(event)
        handler = self._handlers.get(type(event))
        if handler is not None:
            handler(event)

    def _phase(self, trajectory: str | None, phase: int, seconds: float) -> None:
        sums = self._phases.get(trajectory)
        if sums is None:
            sums = self._phases[trajectory] = [0.0] * len(PHASES)
        sums[phase] += seconds

    def _measurement_started(self, event: MeasurementStarted) -> None:
        self.loop.on_started(event)
        self.work.start(event.max_active_trajectories)

    def _model_started(self, event: ModelStarted) -> None:
        self.samples["model_queue_s"].append(event.queued_s)
        self._phase(event.id, MODEL_QUEUE, event.queued_s)

    def _add_work(self, trajectory: str | None, seconds: float, model: bool) -> None:
        """Model service or CPU execution, finished or failed (a failed job held its worker)."""
        self.work.add(trajectory, seconds, model)
        self._phase(trajectory, MODEL_SERVICE if model else CPU_EXECUTE, seconds)

    def _model_finished(self, event: ModelFinished) -> None:
        self._add_work(event.id, event.latency_s, model=True)
        self.model_finished += 1
        self.samples["model_latency_s"].append(event.latency_s)
        if event.finish_reason is not None:
            self.finish_reasons[event.finish_reason] += 1

    def _model_failed(self, event: ModelFailed) -> None:
        self._add_work(event.id, event.latency_s, model=True)
        self.model_failed[event.kind] += 1
        if event.kind == "http_status" and event.status is not None:
            self.model_statuses[str(event.status)] += 1
        if event.scripted:
            self.model_scripted[event.kind] += 1

    def _model_retrying(self, event: ModelRetrying) -> None:
        self.model_retries[event.kind] += 1

    def _cpu_enqueued(self, event: CpuEnqueued) -> None:
        self._resubmission[event.job_id] = event.resubmission

    def _cpu_selected(self, event: CpuSelected) -> None:
        resubmission = self._resubmission.pop(event.job_id, False)
        if event.predicted_s is not None:
            self._predicted[event.job_id] = (event.predicted_s, resubmission)
        if event.prediction_source is not None:
            self.prediction_sources[event.prediction_source] += 1
        self.decisions += 1
        self.eligible += event.eligible
        self.reorders += event.reordered
        self.reasons[event.reason] += 1
        self.samples["cpu_queue_s"].append(event.waited_s)
        self._phase(event.id, CPU_QUEUE, event.waited_s)

    def _cpu_finished(self, event: CpuFinished) -> None:
        predicted = self._predicted.pop(event.job_id, None)
        # no grade job: predicted at the floor, run in µs (0 s simulated: no log), they would only raise r
        if predicted is not None and event.ok and event.execute_s > 0 and event.kind != "grade":
            log_pred, log_actual = math.log(predicted[0]), math.log(event.execute_s)
            for key in ("all", "repairs" if predicted[1] else "first"):
                self.pairs[key].append(log_pred, log_actual)
        self._add_work(event.id, event.execute_s, model=False)
        s = self.samples
        self.jobs_by_kind[event.kind] += 1
        if event.kind == "tool":
            self.tool_calls += 1
            self.tool_errors += not event.ok
        s["cpu_execute_s"].append(event.execute_s)
        s["cpu_roundtrip_s"].append(event.roundtrip_s)
        s["cpu_dispatch_overhead_s"].append(max(0.0, round(event.roundtrip_s - event.execute_s, 6)))

    def _cpu_failed(self, event: CpuFailed) -> None:
        self._predicted.pop(event.job_id, None)
        self._add_work(event.id, event.roundtrip_s, model=False)
        self.jobs_by_kind[event.kind] += 1
        self.tool_calls += event.kind == "tool"
        # a job cancelled because the run stopped under it has no outcome: neither error nor success
        cancelled = event.reason == "cancelled"
        self.tool_failed += event.kind == "tool" and not cancelled
        self.tool_cancelled += event.kind == "tool" and cancelled
        self.cpu_failures[event.reason] += 1

    def _trajectory_started(self, event: TrajectoryStarted) -> None:
        self.started += 1
        self.work.admitted(event.id)

    def _trajectory_finished(self, event: TrajectoryFinished) -> None:
        for phase, seconds in enumerate(self._phases.pop(event.id, ())):
            self.phase_totals[phase] += seconds
        self.work.finished(event.id)
        self.status[event.status] += 1
        self.finished_tool_calls += event.tool_calls
        self.observations_cut += event.observations_cut
        if event.has_reference is True:
            self.referenced += 1
            self.referenced_correct += event.correct is True
        self.samples["trajectory_s"].append(event.duration_s)
        self.samples["turns_per_trajectory"].append(float(event.turns))
        if event.correct is not None:
            self.graded += 1
            self.correct += event.correct
        if event.generations is not None:
            self.code[f"{'passed' if event.correct else 'failed'}_after_{min(event.generations, 2)}"] += 1

    def _one_repair(self) -> dict[str, Any] | None:
        """Code problems: pass rate on the first program and after the one repair (denominator: every
        evaluated code trajectory; a trajectory that failed before any verdict is not in it)."""
        code = self.code
        evaluated = sum(code.values())
        if not evaluated:
            return None
        first = code["passed_after_1"]
        repaired = code["passed_after_2"]
        attempted = repaired + code["failed_after_2"]
        return {
            "evaluated": evaluated,
            "passed_first": first,
            "repairs_attempted": attempted,
            "passed_after_repair": repaired,
            "pass_rate_first": ratio(first, evaluated),
            "pass_rate_final": ratio(first + repaired, evaluated),
            "repair_success_rate": ratio(repaired, attempted),
        }

    def _worker_restarting(self, event: WorkerRestarting) -> None:
        self.restarts[event.reason] += 1

    def end_window(self, makespan_s: float) -> None:
        """The measured window has ended (before the run's cleanup): telemetry that comes later is
        clipped to it."""
        self.resources.end_window(makespan_s)

    def build(
        self,
        *,
        makespan_s: float | None,
        policy: str,
        limits: dict[str, int],
        cpu_cost: dict[str, Any],
        peaks: dict[str, int],
        status: str,
        model_capacity: int | None = None,
        server_batch_s: float | None = None,
        dedicated_gpu: bool = False,
        no_telemetry_source: str | None = None,
        virtual: bool = False,
    ) -> dict[str, Any]:
        """``dedicated_gpu``: the user declared one GPU allocated to this run (``completed_per_gpu_hour``);
        ``model_capacity`` and ``server_batch_s``: a simulated server's batch limit and the requests' time in
        its batch (see :meth:`~asyncroll.outputs.bounds.WorkMeter.bounds`). ``makespan_s`` None: the measured
        window never opened (the run failed or was interrupted while starting); whatever depends on it is
        null, never zero. ``no_telemetry_source``: why no telemetry source was probed, as the run knows it
        (else the notes list every possible reason). ``virtual``: the run's clock was virtual (a simulation):
        every duration, the makespan and the per-hour rates are virtual seconds."""
        self.resources.no_source = no_telemetry_source
        measured = makespan_s is not None
        makespan_s = makespan_s or 0.0
        finished = sum(self.status.values())
        completed = self.status["completed"]
        s = self.samples
        invalid = sum(self.model_failed[kind] for kind in RECEIVED_INVALID)
        responses = self.model_finished + invalid
        # rates and fractions are over the makespan as reported (to 1 µs), as the efficiency is: a window
        # that rounds to 0.0 is empty, with no rate over it (not 18 billion an hour beside makespan 0.0)
        shown = round(makespan_s, 6)
        hours = shown / 3600.0
        phase_totals = {name: round(total, 6) for name, total in zip(PHASES, self.phase_totals, strict=True)}
        blocked = self.blocked.total(makespan_s) if measured else None
        trajectory_total = s["trajectory_s"].total()
        return {
            "schema_version": SUMMARY_SCHEMA_VERSION,
            "status": status,
            "policy": policy,
            "limits": limits,
            "clock": "virtual" if virtual else "monotonic",
            "makespan_s": shown if measured else None,
            "counts": {
                "trajectories": self.started,
                "finished": finished,
                "completed": completed,
                "failed": self.status["failed"],
                "max_turns": self.status["max_turns"],
                "unfinished": self.started - finished,
            },
            "rates": {
                "success_rate": ratio(completed, self.started),
                "validity_rate": ratio(self.model_finished, responses),
                "validity_denominator": responses,
            },
            "throughput": {
                "completed_per_wall_hour": ratio(completed, hours),
                "trajectories_per_wall_hour": ratio(finished, hours),
                # null, never 0, with why: per wall hour of a window that never opened or lasted 0 s
                "per_wall_hour_reason": None
                if hours > 0
                else "the measured window is empty (makespan 0)"
                if measured
                else "the measured window never opened",
                **gpu_hour(completed, shown, dedicated_gpu),
            },
            "accuracy": {
                "exact": ratio(self.correct, self.graded),
                "correct": self.correct,
                "denominator": self.graded,
                "ungraded": finished - self.graded,
                # as evaluations count: a trajectory that failed before its answer was graded is not
                # correct (exact leaves it out of its denominator)
                "exact_of_referenced": ratio(self.referenced_correct, self.referenced),
                "referenced": self.referenced,
                "one_repair": self._one_repair(),
            },
            "model": {
                "requests": self.model_finished + sum(self.model_failed.values()),
                "finished": self.model_finished,
                "finish_reasons": dict(self.finish_reasons),
                "failed": dict(self.model_failed),
                # of ``failed``, those a script's error step failed (no server did: it was never asked);
                # absent where there were none, so a summary without them reads as it always did
                **({"scripted_failures": dict(self.model_scripted)} if self.model_scripted else {}),
                # of ``failed``'s http_status, by the status the server answered (absent where none)
                **(
                    {"failed_statuses": dict(sorted(self.model_statuses.items()))}
                    if self.model_statuses
                    else {}
                ),
                "retries": dict(self.model_retries),
                "circuit": self.circuit.build(makespan_s if measured else None),
            },
            "tools": {
                "calls": self.tool_calls,
                "errors": self.tool_errors,
                # over finished trajectories, with their own calls (an interrupted run's unfinished
                # trajectories made calls too: ``calls`` counts them)
                "calls_per_trajectory": ratio(self.finished_tool_calls, finished),
                # tool calls only: an evaluation's or a grade's failure is in ``failures``, not here;
                # over the calls that reached an outcome (``calls`` also counts cancelled ones)
                "error_rate": ratio(
                    self.tool_errors + self.tool_failed, self.tool_calls - self.tool_cancelled
                ),
                "failures": dict(self.cpu_failures),
                "jobs_by_kind": dict(self.jobs_by_kind),
                # results longer than --max-observation-chars, cut before the model saw them
                "observations_cut": self.observations_cut,
            },
            "latency": {name: values.distribution() for name, values in s.items()},
            "phases": {
                **phase_totals,
                "trajectory_total_s": round(float(trajectory_total), 6),
                "fractions_of_trajectory_time": {
                    k: ratio(v, trajectory_total) for k, v in phase_totals.items()
                },
                "definition": PHASES_DEFINITION,
            },
            "scheduler": {
                "policy": policy,
                "policy_rule": canonical_policy(policy),  # the rule it ran (asyncroll: the default rule)
                "decisions": self.decisions,
                "eligible_decisions": self.eligible,
                "reorders": self.reorders,
                "activation_rate": ratio(self.reorders, self.eligible),
                "reasons": dict(self.reasons),
                "max_queue_depth": peaks.get("queued_cpu_jobs"),
                "prediction": {
                    "sources": dict(self.prediction_sources),
                    "pairs": len(self.pairs["all"]),
                    "pearson_log": self.pairs["all"].pearson(),
                    "pearson_log_repairs": self.pairs["repairs"].pearson(),
                    "pearson_log_first": self.pairs["first"].pearson(),
                    # each correlation's own denominator (null below 3 pairs: say how many there were)
                    "pairs_repairs": len(self.pairs["repairs"]),
                    "pairs_first": len(self.pairs["first"]),
                    # why each null correlation is null (a correlation that was computed is not listed)
                    "pearson_null_reasons": {
                        name: why
                        for name, key in PEARSON_FIELDS.items()
                        if (why := self.pairs[key].missing()) is not None
                    },
                    "note": "log-log predicted vs actual execute time: tool and evaluate jobs finished ok",
                },
            },
            "workers": {"restarts": self.restarts.total(), "restarts_by_reason": dict(self.restarts)},
            "bounds": self.work.bounds(makespan_s, limits, model_capacity, server_batch_s)
            if measured
            else None,
            "client_cpu_blocked": {
                "seconds": blocked,
                "fraction_of_makespan": None if blocked is None else ratio(blocked, shown),
                "intervals": self.blocked.intervals(makespan_s) if measured else None,
                "definition": "≥1 active trajectory, 0 model requests outstanding, ≥1 CPU job pending",
            },
            "peaks": peaks,
            "event_loop": self.loop.build(makespan_s if measured else None),
            "cpu_cost": cpu_cost,
            "telemetry": self.resources.telemetry(),
            "resources": self.resources.build(makespan_s, measured),
        }
