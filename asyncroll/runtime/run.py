"""One run, start to finish: the lifecycle of SPEC §3.

validate (before this module: :func:`~asyncroll.runtime.prepare.prepare`) → receipt ``preparing`` →
start workers (preload + dummy call) → untimed model warm-up → ``measurement_started`` → trajectories →
``measurement_finished`` → CPU-cost readings → summary → exports (trace, timeline) outside the timed
window → receipt final.

The real workers and backend it runs with, unless given others, are built in
:mod:`asyncroll.runtime.collaborators`.

Cancellation (a stop signal at the CLI edge) propagates; cleanup — killing worker trees, closing files,
writing the summary and the receipt marked ``interrupted`` — runs shielded from a second cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from asyncroll.backends.base import Backend
from asyncroll.clock import Clock
from asyncroll.errors import AsyncrollError, OutputWriteError
from asyncroll.event_log import EventLog, Subscriber
from asyncroll.events import MeasurementFinished, MeasurementStarted
from asyncroll.outputs.cpu_cost import client_cpu, cpu_cost
from asyncroll.outputs.lines import json_line
from asyncroll.outputs.receipt import exit_code, file_sha256
from asyncroll.outputs.rundir import ExportStop, RunDirectory, open_run_files
from asyncroll.policies.base import Policy
from asyncroll.policies.predictor import warm_import
from asyncroll.process_limits import limit_note
from asyncroll.runtime.assembly import Parts, Window, assemble
from asyncroll.runtime.cleanup import cleanup, shielded
from asyncroll.runtime.collaborators import (
    default_backend,
    process_worker_factory,
)
from asyncroll.runtime.daemon_thread import in_daemon_thread
from asyncroll.runtime.pool import WorkerFactory
from asyncroll.runtime.prepare import PreparedRun as PreparedRun  # re-exported: a run's entry points
from asyncroll.runtime.prepare import prepare as prepare
from asyncroll.runtime.receipt_body import receipt_body
from asyncroll.runtime.task_group import OrderedTaskGroup
from asyncroll.runtime.trajectory import TrajectoryResult
from asyncroll.runtime.transcript import transcript_line
from asyncroll.telemetry.nvtx import Ranges, make_ranges
from asyncroll.workload import Problem, iter_problems

Status = Literal["complete", "failed", "interrupted"]
#: How long a run waits for its final progress line before writing its outputs (a terminal draws it at
#: once; one paused with Ctrl-S is waited for only after them)
LINE_WAIT_S = 1.0


@dataclass
class RunOutcome:
    status: str
    exit_code: int
    summary: dict[str, Any] | None
    error: str | None = None
    late_signal: str | None = None  # a stop signal that came after every trajectory had finished
    #: exports (trace.json, timeline.html) that could not be written → why (run.json has them too)
    exports_failed: dict[str, str] = field(default_factory=dict)
    #: where the run's directory was moved while it ran (its last files were written there), if it was
    moved_to: Path | None = None
    gone: bool = False  # its directory was removed while it ran: what is at --output now is not its own
    opened: bool = True  # False: no room for the run's first files; nothing was written, nothing ran

    def output(self, given: Path) -> Path:
        """Where the run's files are: ``given`` (``--output``), or where it was moved to."""
        return self.moved_to or given


@dataclass
class _Execution:
    """One execution of a run: its parts and files, and how far it got (what its phases share)."""

    parts: Parts
    files: RunDirectory
    events: EventLog
    window: Window  # the measured window's ends, once known
    ranges: Ranges
    status: Status = "failed"  # "complete" once every trajectory has ended (_end may still change it)
    error: str | None = None
    cpu_start: tuple[float, float | None] | None = None  # (client, workers) CPU seconds as the window opens
    cpu_end: tuple[float, float | None] | None = None  # and as it closes
    run_range: Any = None  # the window's NVTX range
    watch: asyncio.Task[None] | None = None  # the loop watch, while it watches
    watch_handlers: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)  # its SIGCONT handler


class Run:
    """Executes a prepared run. Collaborators can be swapped (virtual workers, other backends) for tests."""

    def __init__(
        self,
        prepared: PreparedRun,
        clock: Clock,
        *,
        worker_factory: WorkerFactory | None = None,
        backend: Backend | None = None,
        subscribers: tuple[Subscriber, ...] = (),
        receipt_extra: dict[str, Any] | None = None,
        model_capacity: int | None = None,
        record: bool = True,
        ranges: Ranges | None = None,
        policy: Policy | None = None,
    ) -> None:
        """``receipt_extra`` adds sections to run.json (the simulator's settings); ``model_capacity`` is
        the server's own concurrency limit where known (a simulated batch size), for the lower bound;
        ``record=False`` writes no files at all (a sweep cell needs only the returned summary), and its
        ``cpu_selected`` events, which only the summary and ``subscribers`` see, list no candidates;
        ``policy`` replaces the configured one (a bench's oracle rule that reads the scripted future; the
        receipt and summary still name the configured policy)."""
        self._prepared = prepared
        self.config = prepared.config
        self.scan = prepared.scan
        self.argv = prepared.argv
        self._isolation = prepared.isolation
        self.clock = clock
        self.out = prepared.config.output
        self._sha256: dict[Path, str] = {}
        self._files: RunDirectory | None = None  # once execute has opened them
        self._factory = worker_factory or process_worker_factory(
            prepared.config, prepared.scan, self._tool_sha256, self._output
        )
        self._backend = backend or default_backend(prepared.config, clock)
        self._subscribers = subscribers
        self._policy = policy
        self.interrupt_reason: str | None = None
        self.exports_stop: ExportStop | None = None  # set by interruptible: a stop signal skips the exports
        self.exports_failed: dict[str, str] = {}  # once finished, as RunOutcome's (an interrupted run too)
        self.moved_to: Path | None = None  # once finished, as RunOutcome's, and so is gone
        self.gone = False
        self._receipt_extra = receipt_extra or {}
        self._model_capacity = model_capacity
        self._record = record
        self._ranges = ranges  # NVTX ranges; None: real ones with --nvtx, else no-ops

    def _output(self) -> Path:
        """The run's directory where it is now (it may have been moved while the run ran)."""
        return self.out if self._files is None or self._files.out is None else self._files.here()

    def _stopped_by(self, exc: BaseException) -> str:
        """For run.json: the stop signal recorded, else the one a KeyboardInterrupt stands for (SIGINT, what
        Python raises it for, unless it names another, as the CLI's handlers do), else a cancellation."""
        if self.interrupt_reason is not None:
            return self.interrupt_reason
        if isinstance(exc, KeyboardInterrupt):
            return str(exc) if str(exc) in ("SIGTERM", "SIGHUP") else "SIGINT"
        return "cancellation"

    def _tool_sha256(self, path: Path) -> str:
        """A tool file's SHA-256, read once: what run.json records is what every worker checks."""
        if path not in self._sha256:
            self._sha256[path] = file_sha256(path)
        return self._sha256[path]

    async def execute(self) -> RunOutcome:
        """The run's files opened and its parts assembled, then its phases: :meth:`_measure` (the start, the
        measured window, the clean-up) and :meth:`_end` (the summary and the receipt, however it ended)."""
        cfg, clock = self.config, self.clock
        ranges = self._ranges or make_ranges(cfg.nvtx)  # before any output exists: it can refuse
        out = self.out if self._record else None
        try:
            body = receipt_body(
                self._prepared,
                simulated=clock.virtual,
                tool_sha256=self._tool_sha256,
                extra=self._receipt_extra,
            )
            files, events = open_run_files(out, body, clock, transcripts=cfg.transcripts)
        except OutputWriteError as exc:  # no room for the run's files: nothing has started
            return RunOutcome("failed", exit_code("failed"), None, str(exc), opened=False)
        self._files = files
        window = Window()  # the measured window's ends, once known
        try:  # a failure (or a stop) before the run's own try below: its files closed, run.json says why
            parts = assemble(
                cfg,
                clock,
                events,
                factory=self._factory,
                backend=self._backend,
                scan=self.scan,
                subscribers=self._subscribers,
                policy=self._policy,
                ranges=ranges,
                record=self._record,
                out=self.out,
                window=window,
            )
        except BaseException as exc:
            events.close()
            if isinstance(exc, Exception):
                files.abandon(_describe(exc), clock.wall())
            else:  # Ctrl-C, SIGTERM or SIGHUP, a cancellation: as the run's own try says it
                files.abandon(f"interrupted by {self._stopped_by(exc)}", clock.wall(), "interrupted")
            raise
        ex = _Execution(parts, files, events, window, ranges)
        try:
            async with OrderedTaskGroup() as outer:
                await self._measure(ex, outer)
        except asyncio.CancelledError:
            if ex.status == "complete" and self.interrupt_reason is not None:
                # The signal came after every trajectory had finished (the cleanup ran to its end anyway):
                # the measurement is whole, so the run stays complete; the caller reports the signal.
                _uncancel()
            else:
                ex.status = "interrupted"
                ex.error = f"interrupted by {self.interrupt_reason or 'cancellation'}"
                raise
        except KeyboardInterrupt as exc:  # no handler of ours took the signal: Python's own raised it
            if ex.status != "complete":  # after every trajectory finished the measurement is whole, as above
                ex.status, ex.error = "interrupted", f"interrupted by {self._stopped_by(exc)}"
            raise
        except Exception as exc:  # noqa: BLE001 - recorded in run.json, then reported by the CLI
            ex.status, ex.error = "failed", _describe(exc)
        finally:
            result = await self._end(ex)
        outcome = RunOutcome(
            ex.status, exit_code(ex.status), result, ex.error, exports_failed=self.exports_failed
        )
        outcome.moved_to, outcome.gone = self.moved_to, self.gone
        return outcome

    async def _measure(self, ex: _Execution, outer: OrderedTaskGroup) -> None:
        """The workers' start to the clean-up after the last trajectory; ``ex.status`` is ``complete`` once
        every trajectory has ended. The measured window's end is read before any clean-up."""
        cfg, parts, files = self.config, ex.parts, ex.files
        trajectories, admission = parts.trajectories, parts.admission

        async def trajectory(index: int, item: tuple[int, str, Problem]) -> None:
            _line, traj_id, problem = item
            result: TrajectoryResult = await trajectories.run(index, traj_id, problem, admission.active)
            files.write_result(json_line(result.to_json()))
            if result.messages is not None:  # --transcripts
                files.write_transcript(json_line(transcript_line(result, result.messages)))

        if parts.live is not None and (metrics := parts.live.start(outer)) is not None:
            files.update(metrics=metrics)
        # scikit-learn takes ~1 s to import: load it while the workers start, before the clock.
        importing = outer.create_task(in_daemon_thread(warm_import))
        try:  # from the first worker on, the cleanup below closes whatever was started
            await self._start(ex, outer, importing)
            self._open_window(ex, outer)
            # closed however the batch ends: a run stopped midway held the file open for as long as
            # its outcome's traceback lived (the generator closes it only when read through)
            problems = iter_problems(cfg.workload, cfg.limit, identity=self.scan.identity)
            with contextlib.closing(problems):
                async with OrderedTaskGroup() as tg:
                    await admission.run(tg, problems, trajectory)
            ex.status = "complete"
        finally:
            try:
                self._close_window(ex)
            finally:  # whatever reading the window's end raised, everything started is closed

                async def leftovers() -> None:
                    if self._isolation is not None:  # real workers ran untrusted code
                        from asyncroll.evaluator.evaluate import remove_dead_workers_leftovers

                        remove_dead_workers_leftovers()

                await cleanup(
                    None if parts.live is None else parts.live.aclose,
                    parts.sampler.stop,
                    parts.pool.aclose,
                    leftovers,
                    self._backend.aclose,
                )

    async def _start(self, ex: _Execution, outer: OrderedTaskGroup, importing: asyncio.Task[None]) -> None:
        """Workers started and warm, scikit-learn imported, the backend started and warmed up (untimed),
        telemetry probed; run.json records each as it becomes known."""
        files = ex.files
        await ex.parts.pool.start(outer)
        await importing
        describe = getattr(self._backend, "describe", None)
        try:  # run.json names the server, its probed kind and the warm-up's retries, also
            await self._backend.start(outer)  # when the start or the warm-up fails
            warm = await self._backend.warmup(self.config.warmup_requests)
        finally:  # a run.json that cannot be written must not hide why the start failed
            if describe is not None:
                files.update(backend=describe(), best_effort=sys.exception() is not None)
        files.update(warmup={"requested": self.config.warmup_requests, "sent": warm})
        await ex.parts.sampler.probe()
        files.update(telemetry=ex.parts.sampler.receipt())

    def _open_window(self, ex: _Execution, outer: OrderedTaskGroup) -> None:
        """run.json ``running``, the CPU read, ``measurement_started`` (t = 0), then telemetry sampling and
        the loop watch."""
        clock, limits, events, loop_watch = self.clock, self.config.limits, ex.events, ex.parts.loop_watch
        # run.json says "running" before the window opens: its write (fsync, rename) takes ~10 ms
        # on a local disk and seconds on a busy NFS, time no trajectory could use
        ex.files.transition("running", clock.wall())
        # CPU read first (psutil takes ~1 ms per worker): measurement_started is at t = 0
        ex.cpu_start = (client_cpu(), ex.parts.pool.cpu_seconds())
        origin = ex.window.origin = events.start_measurement()
        ex.run_range = ex.ranges.start("run")
        events.emit(
            MeasurementStarted(
                wall_time=clock.wall(),
                policy=self.config.policy_name,
                max_active_trajectories=limits.max_active_trajectories,
                max_inflight_model_requests=limits.max_inflight_model_requests,
                cpu_workers=limits.cpu_workers,
                clock="virtual" if clock.virtual else "monotonic",
            ),
            at=origin,  # t = 0: every other t is seconds since this event
        )
        outer.create_task(ex.parts.sampler.run())
        if loop_watch is not None:
            events.emit(loop_watch.announce(), at=origin)
            ex.watch_handlers.enter_context(loop_watch.continued_handled())
            ex.watch = outer.create_task(loop_watch.run())

    def _close_window(self, ex: _Execution) -> None:
        """The measured window ends, however the batch ended: its end and the CPU read while workers live."""
        parts, window = ex.parts, ex.window
        window.finished_at = parts.trajectories.window_end(ex.status == "complete")
        if ex.watch is not None:
            ex.watch.cancel()
        ex.watch_handlers.close()
        ex.cpu_end = (client_cpu(), parts.pool.cpu_seconds())
        if window.origin is not None:  # telemetry sampled during the cleanup is clipped to it
            parts.summary.end_window(window.finished_at - window.origin)
        ex.ranges.end(ex.run_range)

    async def _end(self, ex: _Execution) -> dict[str, Any] | None:
        """``measurement_finished``, the summary, run.json final, however the run ended (shielded where it
        waits); the summary built, if it could be. A cancellation while the live view closed is raised
        after the outputs are written; an error there fails the run, its outputs written all the same."""
        cfg, clock, files, events, parts = self.config, self.clock, ex.files, ex.events, ex.parts
        live, window = parts.live, ex.window
        late: asyncio.CancelledError | None = None
        if live is not None:  # idempotent; here for a failure before _measure's clean-up ran
            try:
                await shielded(live.aclose())
                # its final line drawn before the exports' note on stderr, unless the terminal holds it
                await shielded(live.drained(LINE_WAIT_S))
            except asyncio.CancelledError as exc:  # the summary and the receipt are written first
                late = exc
                if ex.status == "complete" and self.interrupt_reason is not None:
                    _uncancel()
                    late = None  # after every trajectory finished: the run stays complete
                elif ex.status != "interrupted":
                    ex.status = "interrupted"
                    ex.error = f"interrupted by {self.interrupt_reason or 'cancellation'}"
            except Exception as exc:  # noqa: BLE001 - the outputs are still written, run.json saying why
                ex.status = "interrupted" if ex.status == "interrupted" else "failed"
                ex.error = "; ".join(
                    filter(None, (ex.error, f"live view: cannot be closed ({_describe(exc)})"))
                )
        # No trajectory writes results.jsonl (transcripts.jsonl) now: the last lines queued (a real run's,
        # written by threads) are on disk, or failed, before measurement_finished says how the run ended.
        closed = files.close_lines()
        lost = events.write_error or closed  # an event's: swallowed where it was raised
        if ex.status == "complete" and lost is not None:
            ex.status, ex.error = "failed", str(lost)
        # a simulation's window can end at virtual time 0.0: an end all the same, not a missing one
        end = clock.now() if window.finished_at is None else window.finished_at
        makespan = None if window.origin is None else end - window.origin
        completed = parts.summary.status["completed"]
        cost = cpu_cost(ex.cpu_start, ex.cpu_end, parts.pool.replaced_any, completed, clock.virtual)
        if makespan is not None:
            with contextlib.suppress(OutputWriteError):  # its line found no room: failed just below
                events.emit(
                    MeasurementFinished(status=ex.status, makespan_s=round(makespan, 6), reason=ex.error)
                )
            if ex.status == "complete" and events.write_error is not None:
                ex.status, ex.error = "failed", str(events.write_error)
        events.close()  # before the summary: it counts the start-up events held when no window opened
        if ex.status == "complete" and events.write_error is not None:  # the last lines queued (a thread's)
            ex.status, ex.error = "failed", str(events.write_error)
        peaks = {
            "active_trajectories": parts.admission.snapshot().peak_holding,
            "inflight_model_requests": parts.gate.snapshot().peak_inflight,
            "busy_workers": parts.pool.snapshot().peak_busy,
            "queued_cpu_jobs": parts.dispatcher.snapshot().peak_queued,
        }
        result: dict[str, Any] | None = None
        try:
            result = parts.summary.build(
                makespan_s=makespan,
                policy=cfg.policy_name,
                limits=cfg.limits.model_dump(),
                cpu_cost=cost,
                peaks=peaks,
                status=ex.status,
                model_capacity=self._model_capacity,
                server_batch_s=getattr(self._backend, "batch_seconds", None),
                dedicated_gpu=cfg.dedicated_gpu,
                no_telemetry_source=parts.sampler.no_source_note(),
                virtual=clock.virtual,
            )
        except Exception as exc:  # noqa: BLE001 - no summary.json; run.json says why, events stay whole
            ex.status = "interrupted" if ex.status == "interrupted" else "failed"
            ex.error = "; ".join(filter(None, (ex.error, f"summary: cannot be built ({_describe(exc)})")))
        telemetry = {} if parts.sampler.probed else {"telemetry": parts.sampler.receipt()}  # why not probed
        unwritten = files.finish(result, ex.status, clock.wall(), ex.error, self.exports_stop, **telemetry)
        self.exports_failed, self.moved_to, self.gone = files.exports_failed, files.moved_to, files.gone
        if unwritten is not None:  # summary.json found no room on the disk
            ex.status, ex.error = "interrupted" if ex.status == "interrupted" else "failed", unwritten
            if result is not None:
                result["status"] = ex.status  # the summary printed says what run.json says
        if live is not None:  # the final line on the terminal before anything the caller says there;
            # after the outputs: a terminal paused with Ctrl-S held the run's end (no summary.json,
            # run.json "running", its workers alive) until resumed
            try:
                await shielded(live.drained())
            except asyncio.CancelledError:
                if self.interrupt_reason is None:
                    raise
                _uncancel()  # the signal is recorded: the caller reports it, and the outcome written stays
        if late is not None:
            raise late
        return result


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return str(exc) if isinstance(exc, AsyncrollError) else f"{type(exc).__name__}: {exc}{limit_note(exc)}"


def _uncancel() -> None:
    """This task's cancellation taken back, where a stop signal's is recorded (``interrupt_reason``: the
    caller reports it) and the outcome written stays the outcome: one after every trajectory had finished,
    or one while the final progress line is drawn."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
