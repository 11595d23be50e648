"""SIGINT/SIGTERM around the end of a run, on a virtual clock: a signal is never lost, a signal mid-run
interrupts, and one that comes after every trajectory has finished leaves a complete run complete."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

import asyncroll.runtime.run as run_module
from asyncroll.backends.scripted import ScriptedBackend
from asyncroll.clock import VirtualClock
from asyncroll.config import build_config
from asyncroll.event_log import EventCapture, EventLog
from asyncroll.events import (
    CpuEnqueued,
    CpuFinished,
    CpuSelected,
    CpuStarted,
    Event,
    MeasurementFinished,
    TrajectoryFinished,
)
from asyncroll.policies import get_policy
from asyncroll.runtime.cleanup import cleanup
from asyncroll.runtime.dispatcher import CpuDispatcher
from asyncroll.runtime.jobs import JobOutcome, JobSpec
from asyncroll.runtime.model_gate import ModelGate
from asyncroll.runtime.pool import WorkerPool
from asyncroll.runtime.run import Run, RunOutcome, prepare
from asyncroll.runtime.signals import interruptible
from asyncroll.runtime.virtual_worker import VirtualWorker
from tests.conftest import tool_problem, write_workload


class ClosingBackend(ScriptedBackend):
    """Records its close; can send a signal to this process while it closes (the last cleanup step)."""

    def __init__(self, clock: VirtualClock, signal_on_close: bool = False) -> None:
        super().__init__(clock)
        self.signal_on_close = signal_on_close
        self.closed = False

    async def aclose(self) -> None:
        if self.signal_on_close:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(3):  # the loop delivers the cancellation at one of these
                await self._clock.sleep(0)
        self.closed = True


def run_with(
    tmp_path: Path,
    *,
    on_event: type[Event] | None = None,
    signal_on_close: bool = False,
    signal_in_worker_close: bool = False,
    sig: signal.Signals = signal.SIGINT,
) -> tuple[RunOutcome, ClosingBackend, Path]:
    """Two short trajectories; SIGINT sent to this process from a subscriber when ``on_event`` is
    emitted (synchronously, as the runtime emits it), or from the cleanup."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    problems = [tool_problem(f"p{i}", model_ms=100, cpu_ms=50) for i in range(2)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    out = tmp_path / "run"
    cfg = build_config({"workload": workload, "output": out, "cpu_workers": 1})
    clock = VirtualClock()
    backend = ClosingBackend(clock, signal_on_close)
    sent: list[bool] = []

    def subscriber(event: Event) -> None:
        if on_event is not None and isinstance(event, on_event) and not sent:
            sent.append(True)
            os.kill(os.getpid(), sig)

    class SignallingWorker(VirtualWorker):
        async def aclose(self) -> None:
            if signal_in_worker_close and not sent:
                sent.append(True)
                os.kill(os.getpid(), signal.SIGINT)
                await clock.sleep(0)
            await super().aclose()

    run = Run(
        prepare(cfg, ["test"]),
        clock,
        worker_factory=lambda index, generation: SignallingWorker(index, generation, clock),
        backend=backend,
        subscribers=(subscriber,),
    )
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        outcome = clock.run(interruptible(run))
    finally:  # the handlers in place before are back
        assert {s: signal.getsignal(s) for s in previous} == previous
    return outcome, backend, out


def status(out: Path) -> str:
    receipt: dict[str, str] = json.loads((out / "run.json").read_text())
    return receipt["status"]


@pytest.mark.timeout(60)
def test_a_signal_mid_run_interrupts(tmp_path: Path) -> None:
    outcome, backend, out = run_with(tmp_path, on_event=TrajectoryFinished)
    assert (outcome.status, outcome.exit_code, outcome.late_signal) == ("interrupted", 130, None)
    assert status(out) == "interrupted" and backend.closed


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("sighup_not_ignored")
def test_sighup_interrupts_a_run_as_ctrl_c_does(tmp_path: Path) -> None:
    """The terminal going away used to kill the run outright, run.json left at "running" for ever."""
    outcome, backend, out = run_with(tmp_path, on_event=TrajectoryFinished, sig=signal.SIGHUP)
    assert (outcome.status, outcome.exit_code, outcome.error) == ("interrupted", 130, "interrupted by SIGHUP")
    assert status(out) == "interrupted" and backend.closed


@pytest.mark.usefixtures("sighup_not_ignored")
def test_command_signals_interrupt_before_the_run_and_only_record_after_it() -> None:
    from asyncroll.runtime.signals import CommandSignals

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    signals = CommandSignals()
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(sig)  # as Ctrl-C does: set-up stops cleanly, exit 130
        assert signals.received == "SIGTERM"  # the first one names the interruption
        signals.received = None
        signals.hold()  # the outcome is final: signals are only recorded from now on
        for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
            signal.raise_signal(sig)
        assert signals.received == "SIGHUP"
    finally:
        signals.restore()
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.mark.timeout(60)
def test_a_signal_during_the_synchronous_tail_is_not_lost(tmp_path: Path) -> None:
    """``measurement_finished`` is emitted while the summary is built, with no await until the run ends:
    a loop-level handler saw such a signal only after it had been removed."""
    outcome, _, out = run_with(tmp_path, on_event=MeasurementFinished)
    assert (outcome.status, outcome.exit_code, outcome.late_signal) == ("complete", 0, "SIGINT")
    assert status(out) == "complete" and outcome.summary is not None
    assert outcome.summary["counts"]["completed"] == 2


@pytest.mark.timeout(60)
def test_a_signal_during_cleanup_keeps_a_complete_run_complete_and_runs_every_step(tmp_path: Path) -> None:
    # from the last cleanup step: the cancellation arrives there
    outcome, backend, out = run_with(tmp_path, signal_on_close=True)
    assert (outcome.status, outcome.late_signal) == ("complete", "SIGINT") and backend.closed
    assert status(out) == "complete"
    # from an earlier step (the pool closing its workers): the steps after it still run
    outcome, backend, out = run_with(tmp_path / "again", signal_in_worker_close=True)
    assert (outcome.status, outcome.late_signal) == ("complete", "SIGINT") and backend.closed
    assert status(out) == "complete"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("depth", [2, 5])
def test_a_signal_with_jobs_queued_interrupts_and_never_fails_the_run(tmp_path: Path, depth: int) -> None:
    """The stop cancels every queued job's wait; a worker freed meanwhile must not hand its slot to one of
    them (that raised InvalidStateError and marked the run failed instead of interrupted)."""
    problems = [tool_problem(f"p{i}", model_ms=1, cpu_ms=30, turns=4) for i in range(40)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    out = tmp_path / "run"
    cfg = build_config({"workload": workload, "output": out, "cpu_workers": 2, "max_active_trajectories": 16})
    clock = VirtualClock()
    sent: list[bool] = []

    def subscriber(event: Event) -> None:
        if isinstance(event, CpuEnqueued) and event.queue_depth >= depth and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)

    run = Run(
        prepare(cfg, ["test"]),
        clock,
        worker_factory=lambda index, generation: VirtualWorker(index, generation, clock),
        subscribers=(subscriber,),
    )
    outcome = clock.run(interruptible(run))
    assert sent and (outcome.status, outcome.exit_code) == ("interrupted", 130), outcome.error
    assert status(out) == "interrupted"


@pytest.mark.timeout(60)
def test_a_freed_worker_never_goes_to_a_job_whose_wait_was_cancelled() -> None:
    """A stop cancels each queued job's wait at once, but the job leaves the queue only when its task
    runs again. A worker freed in between (here: the job that just finished, whose event comes before
    its slot is released) must skip it, not hand it the slot (InvalidStateError: the run failed)."""
    clock = VirtualClock()
    capture = EventCapture()

    async def main() -> None:
        events = EventLog(clock)
        events.subscribe(capture)
        pool = WorkerPool(1, lambda index, generation: VirtualWorker(index, generation, clock), clock, events)
        dispatcher = CpuDispatcher(pool, get_policy("fifo"), ModelGate(1, clock, events), clock, events, 30)
        events.start_measurement()
        async with asyncio.TaskGroup() as tg:
            await pool.start(tg)

            def job(ms: float) -> asyncio.Task[JobOutcome]:
                return tg.create_task(
                    dispatcher.run(JobSpec("t", "tool", "sleep_ms", {"milliseconds": ms}, 0))
                )

            first = job(100)
            await clock.sleep(0)
            doomed, last = job(50), job(20)
            await clock.sleep(0.01)

            def cancel_doomed(e: Event) -> None:
                if isinstance(e, CpuFinished) and e.job_id == 1:
                    doomed.cancel()

            events.subscribe(cancel_doomed)
            assert (await first).ok and (await last).ok
            with pytest.raises(asyncio.CancelledError):
                await doomed
            await pool.aclose()

    clock.run(main())
    started = [e.job_id for e in capture.of(CpuStarted)]
    assert started == [1, 3]  # the cancelled job 2 never got the worker
    assert [e.queue_depth for e in capture.of(CpuSelected)] == [1, 1]  # job 3 was alone once 2 left


@pytest.mark.timeout(60)
def test_a_signal_while_the_predictor_imports_still_closes_the_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the pool's start and the measured window the runtime waits for scikit-learn's import
    (~1 s for real; here it lasts until a worker is closed, 10 s at most, so the stop lands inside it
    however late the sender runs). A stop there must close the workers like any other (the cleanup used to
    begin only after that import, so real worker processes outlived the run)."""
    importing, started, closing = threading.Event(), threading.Event(), threading.Event()
    closed_during_import: list[bool] = []

    def slow_import() -> None:  # lasts until the stop closed a worker (10 s at most): no window to miss
        importing.set()
        closed_during_import.append(closing.wait(10))

    monkeypatch.setattr(run_module, "warm_import", slow_import)
    closed: list[int] = []
    up: list[int] = []
    clock = VirtualClock()

    class Recording(VirtualWorker):
        async def start(self) -> None:
            await super().start()
            up.append(self.index)
            if len(up) == 2:
                started.set()

        async def aclose(self) -> None:
            closed.append(self.index)
            closing.set()
            await super().aclose()

    problems = [tool_problem("p0", model_ms=1, cpu_ms=1)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    cfg = build_config({"workload": workload, "output": tmp_path / "run", "cpu_workers": 2})
    ready: list[bool] = []

    def send_when_ready() -> None:  # the workers are up and the import still runs, however late this runs
        if importing.wait(10) and started.wait(10):
            ready.append(True)
            os.kill(os.getpid(), signal.SIGINT)

    run = Run(
        prepare(cfg, ["test"]),
        clock,
        worker_factory=lambda index, generation: Recording(index, generation, clock),
    )
    sender = threading.Thread(target=send_when_ready, daemon=True)
    sender.start()
    outcome = clock.run(interruptible(run))
    sender.join(5)
    assert ready and outcome.status == "interrupted"
    assert closed_during_import == [True]  # the cleanup did not wait for the import
    assert sorted(closed) == [0, 1]


@pytest.mark.timeout(60)
def test_a_failing_or_cancelled_cleanup_step_does_not_skip_the_next() -> None:
    ran: list[str] = []

    async def fails() -> None:
        ran.append("fails")
        raise RuntimeError("cannot close")

    async def closes() -> None:
        ran.append("closes")

    with pytest.raises(RuntimeError, match="cannot close"):
        asyncio.run(cleanup(fails, None, closes))
    assert ran == ["fails", "closes"]

    async def cancelled_during_the_first() -> None:
        task = asyncio.current_task()
        assert task is not None

        async def slow() -> None:
            ran.append("slow")
            task.cancel()  # the caller is cancelled while this step runs (shielded: it finishes)
            await asyncio.sleep(0.01)

        await cleanup(slow, fails, closes)

    ran.clear()
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(cancelled_during_the_first())
    assert ran == ["slow", "fails", "closes"]  # the cancellation wins over the failure, after all ran


@pytest.mark.timeout(120)
def test_a_signal_as_the_output_directory_appears_leaves_no_directory_without_a_receipt(
    tmp_path: Path,
) -> None:
    """SIGTERM just after ``run`` created its output directory (before the run's own handlers) used to
    kill it and leave an empty directory — no run.json — that blocked the path. Whenever it comes, the
    directory is either removed ("nothing written", exit 130) or holds a receipt that says interrupted."""
    import subprocess
    import sys

    from tests.children import end
    from tests.conftest import REPO
    from tests.simulations import signal_and_wait

    problems = [tool_problem(f"p{i}", model_ms=100, cpu_ms=50) for i in range(20)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    outcomes = set()
    for attempt in range(3):
        out = tmp_path / f"run{attempt}"
        command = ["run", "--workload", str(workload), "--output", str(out), "--no-progress"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "asyncroll.cli", *command],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            while not out.exists() and proc.poll() is None and time.monotonic() < deadline:
                pass  # busy: the window is milliseconds long
            stderr = signal_and_wait(proc, signal.SIGTERM)  # killed after 30 s: a hang fails the test
        finally:
            end(proc)
        assert proc.returncode == 130, stderr
        assert "Traceback" not in stderr
        if out.exists():
            assert status(out) == "interrupted", stderr
            outcomes.add("interrupted")
        else:
            assert "interrupted by SIGTERM; nothing written" in stderr
            outcomes.add("nothing written")
    assert outcomes


def test_a_stop_signal_handled_as_the_stop_signals_are_blocked_leaves_them_unblocked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stop signal that arrived just before ``stop_signals_blocked`` blocked them (Ctrl-C as a sweep
    starts its cell processes) has its handler run inside ``signal.pthread_sigmask``, after the mask is
    set: its KeyboardInterrupt came out of the block's set-up, before the ``try`` that unblocks them, and
    SIGINT, SIGTERM and SIGHUP stayed blocked in the process for good (and in every process it started:
    a pytest process whose later tests' children could not be stopped by SIGINT). A thread sending SIGINT
    every 0.3 ms left them blocked after 25 of 372 interrupts in 5 s; this plays that handler's part."""
    from asyncroll.runtime.signals import STOP_SIGNALS, stop_signals_blocked

    real = signal.pthread_sigmask

    def then_the_pending_handler(how: int, mask: Iterable[int]) -> set[int | signal.Signals]:
        previous = real(how, mask)
        if how == signal.SIG_BLOCK and signal.SIGINT in set(mask):
            raise KeyboardInterrupt  # as Python's handler of a SIGINT pending there does
        return previous

    before = real(signal.SIG_BLOCK, [])
    monkeypatch.setattr(signal, "pthread_sigmask", then_the_pending_handler)
    try:
        with pytest.raises(KeyboardInterrupt), stop_signals_blocked():
            pytest.fail("the block ran")
        after = real(signal.SIG_BLOCK, [])
    finally:
        real(signal.SIG_SETMASK, before)  # this test leaves nothing blocked, whatever it found
    assert not set(STOP_SIGNALS) & after - before, after
