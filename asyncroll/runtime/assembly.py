"""A run's parts, built and wired before its first worker starts: the summary and the other subscribers
of its events, the three limiters (admission, model gate, worker pool), the policy with its duration
predictor and remaining-work estimator, the CPU dispatcher, the trajectory runner, telemetry and, for a
real run that writes its files, the live view. :meth:`~asyncroll.runtime.run.Run.execute` runs them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from asyncroll.backends.base import Backend
from asyncroll.clock import Clock
from asyncroll.config import RunConfig
from asyncroll.event_log import EventLog, Subscriber
from asyncroll.outputs.summary import SummaryBuilder
from asyncroll.policies import get_policy
from asyncroll.policies.base import Policy
from asyncroll.policies.predictor import DurationPredictor
from asyncroll.policies.registry import estimator_for
from asyncroll.runtime.admission import Admission
from asyncroll.runtime.collaborators import evaluator_options, worker_tool_keys
from asyncroll.runtime.dispatcher import CpuDispatcher
from asyncroll.runtime.loop_watch import LoopWatch
from asyncroll.runtime.model_gate import ModelGate
from asyncroll.runtime.pool import WorkerFactory, WorkerPool
from asyncroll.runtime.progress import LiveView, RunView
from asyncroll.runtime.trajectory import TrajectoryRunner
from asyncroll.telemetry.nvtx import Ranges
from asyncroll.telemetry.sampler import TelemetrySampler
from asyncroll.workload.scan import WorkloadScan


@dataclass
class Window:
    """The measured window's ends on the run's clock, once known (the live view reads them)."""

    origin: float | None = None
    finished_at: float | None = None


@dataclass(frozen=True)
class Parts:
    summary: SummaryBuilder
    sampler: TelemetrySampler
    pool: WorkerPool
    gate: ModelGate
    admission: Admission
    dispatcher: CpuDispatcher
    trajectories: TrajectoryRunner
    loop_watch: LoopWatch | None  # real time only
    live: LiveView | None  # real time, files written


def assemble(
    cfg: RunConfig,
    clock: Clock,
    events: EventLog,
    *,
    factory: WorkerFactory,
    backend: Backend,
    scan: WorkloadScan,
    subscribers: tuple[Subscriber, ...],
    policy: Policy | None,
    ranges: Ranges,
    record: bool,
    out: Path,
    window: Window,
) -> Parts:
    """The parts of one run, subscribed to ``events`` in this order: the summary, ``subscribers``, the
    remaining-work estimator. ``policy`` replaces the configured one; ``record=False`` (no files) logs no
    candidates and shows no live view."""
    summary = SummaryBuilder()
    events.subscribe(summary)
    for subscriber in subscribers:
        events.subscribe(subscriber)
    limits = cfg.limits
    sampler = TelemetrySampler.from_config(cfg, clock, events)
    max_rss = None if cfg.worker_max_rss_mb is None else cfg.worker_max_rss_mb << 20
    pool = WorkerPool(limits.cpu_workers, factory, clock, events, max_rss_bytes=max_rss)
    gate = ModelGate(limits.max_inflight_model_requests, clock, events, ranges=ranges)
    admission = Admission(limits.max_active_trajectories, getattr(backend, "wait_available", None))
    bind_events = getattr(backend, "bind_events", None)
    if bind_events is not None:
        bind_events(events)
    policy = policy or get_policy(
        cfg.policy_name, aging_seconds=cfg.aging_seconds, aging_weight=cfg.aging_weight
    )
    remaining = estimator_for(policy.name)  # the chain rule's own; the default's for other policies
    events.subscribe(remaining)
    dispatcher = CpuDispatcher(
        pool,
        policy,
        gate,
        clock,
        events,
        cfg.tool_timeout,
        worker_tool_keys(scan),
        predictor=DurationPredictor(),
        remaining=remaining,
        starvation_threshold=cfg.effective_starvation_threshold,
        admission_pending=lambda: admission.pending,
        ranges=ranges,
        log_candidates=record,
    )
    trajectories = TrajectoryRunner(
        backend,
        gate,
        dispatcher,
        clock,
        events,
        max_turns=cfg.max_turns,
        tool_errors=cfg.tool_errors,
        evaluator_options=evaluator_options(cfg),
        max_observation_chars=cfg.max_observation_chars,
        transcripts=cfg.transcripts and record,
    )
    loop_watch = None if clock.virtual else LoopWatch(clock, events)
    live = None
    if not clock.virtual and record:
        # The live view (progress line, --metrics-port) reads the limiters' snapshots; real time only.
        view = RunView(
            total=scan.count,
            clock=clock,
            admission=admission,
            gate=gate,
            dispatcher=dispatcher,
            pool=pool,
            finished=summary.status,
            origin=lambda: window.origin,
            ended=lambda: window.finished_at,
            loop=loop_watch,
        )
        info = {"policy": cfg.policy_name, "backend": cfg.backend, "output": str(out)}
        live = LiveView(
            view,
            progress=cfg.progress,
            metrics_port=cfg.metrics_port,
            metrics_host=cfg.metrics_host,
            info=info,
        )
    return Parts(summary, sampler, pool, gate, admission, dispatcher, trajectories, loop_watch, live)
