"""How a run ends when a phase no other test stops fails or is stopped, on a virtual clock: the telemetry
probe, run.json's ``running``, events.jsonl as the window opens, the live view's close and its final line.

These pin the behaviour ``Run.execute`` had before it was split into phases (2a3b212) and still has
(60b2be2): each test passes on both, except the last two (a window that ends at virtual time 0; a
window end that cannot be read) and an error as the live view closes at the run's end, fixes. A stop
signal is what ``interruptible``'s handler does: the reason recorded, then the run's task cancelled.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

import asyncroll.runtime.run as run_module
from asyncroll.backends.scripted import ScriptedBackend
from asyncroll.clock import VirtualClock
from asyncroll.config import build_config
from asyncroll.errors import OutputWriteError
from asyncroll.outputs.rundir import RunDirectory
from asyncroll.runtime.progress import LiveView
from asyncroll.runtime.run import Run, RunOutcome, prepare
from asyncroll.runtime.trajectory import TrajectoryRunner
from asyncroll.runtime.virtual_worker import builtin_duration, virtual_factory
from asyncroll.telemetry.sampler import TelemetrySampler
from tests.conftest import tool_problem, write_workload
from tests.descriptors import make_writes_fail

pytestmark = pytest.mark.timeout(60)


class ClosedBackend(ScriptedBackend):
    """Records its close: the last step of the clean-up."""

    closed = False

    async def aclose(self) -> None:
        self.closed = True


@dataclasses.dataclass
class Ended:
    outcome: RunOutcome | None
    raised: BaseException | None
    cancelling: int  # the run's task's pending cancellations once execute() returned or raised
    receipt: dict[str, Any]
    events: list[str]
    summary: dict[str, Any] | None
    backend_closed: bool


Stop = Callable[[str | None], None]  # a stop signal (its name), or a bare cancellation (None), of the run


def _end(tmp_path: Path, rig: Callable[[Stop], None]) -> Ended:
    """Two short trajectories, ``rig(stop)`` patching what fails or stops."""
    workload = write_workload(
        tmp_path / "w.jsonl", [tool_problem(f"p{i}", model_ms=100, cpu_ms=50) for i in range(2)]
    )
    out = tmp_path / "run"
    clock = VirtualClock()
    backend = ClosedBackend(clock)
    run = Run(
        prepare(build_config({"workload": workload, "output": out, "cpu_workers": 1}), ["test"]),
        clock,
        worker_factory=virtual_factory(clock, builtin_duration),
        backend=backend,
    )
    got: list[Any] = []
    tasks: list[asyncio.Task[None]] = []

    def stop(reason: str | None) -> None:
        run.interrupt_reason = reason
        tasks[0].cancel()

    rig(stop)

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.append(task)
        try:
            got[:] = [await run.execute(), None]
        except BaseException as exc:  # noqa: BLE001 - what escapes execute() is the subject
            got[:] = [None, exc]
        got.append(task.cancelling())

    clock.run(main())
    summary = out / "summary.json"
    return Ended(
        got[0],
        got[1],
        got[2],
        json.loads((out / "run.json").read_text()),
        [json.loads(line)["event"] for line in (out / "events.jsonl").read_text().splitlines()],
        json.loads(summary.read_text()) if summary.exists() else None,
        backend.closed,
    )


def _measured(ended: Ended) -> list[str]:
    return [e for e in ended.events if e.startswith("measurement_")]


def test_a_telemetry_probe_that_fails_fails_the_run_before_its_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def probe(self: TelemetrySampler) -> None:
        raise RuntimeError("probe broke")

    monkeypatch.setattr(TelemetrySampler, "probe", probe)
    ended = _end(tmp_path, lambda stop: None)
    assert ended.outcome is not None and ended.raised is None
    assert (ended.outcome.status, ended.outcome.error) == ("failed", "RuntimeError: probe broke")
    assert (ended.receipt["status"], ended.receipt["error"]) == ("failed", "RuntimeError: probe broke")
    assert ended.receipt["telemetry"] is not None  # why it was not probed, from the final receipt
    assert _measured(ended) == [] and "trajectory_started" not in ended.events
    assert ended.backend_closed


def test_a_stop_signal_during_the_telemetry_probe_interrupts_the_run_before_its_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def rig(stop: Stop) -> None:
        async def probe(self: TelemetrySampler) -> None:
            stop("SIGTERM")
            await asyncio.sleep(0)

        monkeypatch.setattr(TelemetrySampler, "probe", probe)

    ended = _end(tmp_path, rig)
    assert ended.outcome is None and isinstance(ended.raised, asyncio.CancelledError)
    assert ended.cancelling == 1  # not taken back: the caller (interruptible) handles it
    assert (ended.receipt["status"], ended.receipt["error"]) == ("interrupted", "interrupted by SIGTERM")
    assert _measured(ended) == [] and ended.backend_closed


def test_a_receipt_that_cannot_say_running_fails_the_run_before_its_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = RunDirectory.transition

    def transition(self: RunDirectory, status: Any, wall: float, **fields: Any) -> None:
        if status == "running":
            raise OutputWriteError("run.json: cannot write (no room, scripted)")
        real(self, status, wall, **fields)

    monkeypatch.setattr(RunDirectory, "transition", transition)
    ended = _end(tmp_path, lambda stop: None)
    assert ended.outcome is not None
    assert (ended.outcome.status, ended.outcome.error) == (
        "failed",
        "run.json: cannot write (no room, scripted)",
    )
    assert ended.receipt["status"] == "failed" and ended.receipt["error"] == ended.outcome.error
    assert _measured(ended) == [] and ended.backend_closed


def test_an_event_log_with_no_room_as_the_window_opens_fails_the_run_with_no_measurement_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start-up events held until measurement_started are written as the window opens: the first that
    finds no room raises there, before the origin is set, so neither measurement event is written."""
    real = RunDirectory.transition

    def transition_then_disk_full(self: RunDirectory, status: Any, wall: float, **fields: Any) -> None:
        real(self, status, wall, **fields)
        if status != "running":
            return
        assert self.events_path is not None  # this run writes its files
        make_writes_fail(self.events_path)  # any later write of an event fails

    monkeypatch.setattr(RunDirectory, "transition", transition_then_disk_full)
    ended = _end(tmp_path, lambda stop: None)
    assert ended.outcome is not None and ended.outcome.status == "failed"
    assert ended.outcome.error is not None and ended.outcome.error.startswith("events.jsonl: cannot write")
    assert ended.receipt["status"] == "failed" and ended.receipt["error"] == ended.outcome.error
    assert _measured(ended) == [] and ended.backend_closed


class Live:
    """A live view whose ``n``-th close (the clean-up's is the first, the run's end's the second) or final
    wait stops the run."""

    def __init__(self, stop: Callable[[], None], at: str) -> None:
        self._stop, self._at = stop, at
        self.calls: list[str] = []

    def start(self, tg: asyncio.TaskGroup) -> dict[str, Any] | None:
        return None

    async def _maybe_stop(self, call: str) -> None:
        self.calls.append(call)
        if f"{call}{self.calls.count(call)}" == self._at:
            self._stop()
            await asyncio.sleep(0)

    async def aclose(self) -> None:
        await self._maybe_stop("aclose")

    async def drained(self, at_most_s: float | None = None) -> None:
        await self._maybe_stop("drained")


def _with_live(monkeypatch: pytest.MonkeyPatch, at: str, reason: str | None) -> Callable[[Stop], None]:
    def rig(stop: Stop) -> None:
        real = run_module.assemble

        def assemble(*args: Any, **kwargs: Any) -> Any:
            live = cast(LiveView, Live(lambda: stop(reason), at))  # the two methods a run calls, and start
            return dataclasses.replace(real(*args, **kwargs), live=live)

        monkeypatch.setattr(run_module, "assemble", assemble)

    return rig


@pytest.mark.parametrize("at", ["aclose2", "drained1"])
def test_a_cancellation_as_the_live_view_closes_is_raised_after_the_outputs_say_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: str
) -> None:
    ended = _end(tmp_path, _with_live(monkeypatch, at, None))
    assert (
        ended.outcome is None and isinstance(ended.raised, asyncio.CancelledError) and ended.cancelling == 1
    )
    assert (ended.receipt["status"], ended.receipt["error"]) == ("interrupted", "interrupted by cancellation")
    assert _measured(ended) == ["measurement_started", "measurement_finished"]
    assert ended.summary is not None and ended.summary["status"] == "interrupted"  # built after the stop


@pytest.mark.parametrize("at", ["aclose2", "drained1", "drained2"])
def test_a_stop_signal_as_the_live_view_closes_leaves_a_complete_run_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: str
) -> None:
    ended = _end(tmp_path, _with_live(monkeypatch, at, "SIGTERM"))
    assert ended.raised is None and ended.cancelling == 0 and ended.outcome is not None
    assert (ended.outcome.status, ended.outcome.error) == ("complete", None)
    assert ended.receipt["status"] == "complete" and ended.receipt.get("error") is None
    assert ended.summary is not None and ended.summary["status"] == "complete"


class BrokenLive(Live):
    """A live view whose ``n``-th close or final wait raises an error of its own (not a stop)."""

    async def _maybe_stop(self, call: str) -> None:
        self.calls.append(call)
        if f"{call}{self.calls.count(call)}" == self._at:
            raise RuntimeError(f"live view broke at {self._at}")


@pytest.mark.parametrize("at", ["aclose2", "drained1"])
def test_an_error_as_the_live_view_closes_at_the_end_fails_the_run_with_its_outputs_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: str
) -> None:
    """The run's end closes the live view again (for a failure before the clean-up's close) and waits for
    its final line before the outputs: an error there escaped before them, leaving run.json ``running``
    and no summary.json. (The clean-up's own close, ``aclose1``, already failed the run.)"""

    def rig(stop: Stop) -> None:
        real = run_module.assemble

        def assemble(*args: Any, **kwargs: Any) -> Any:
            live = cast(LiveView, BrokenLive(lambda: None, at))
            return dataclasses.replace(real(*args, **kwargs), live=live)

        monkeypatch.setattr(run_module, "assemble", assemble)

    ended = _end(tmp_path, rig)
    error = f"live view: cannot be closed (RuntimeError: live view broke at {at})"
    assert ended.raised is None and ended.outcome is not None
    assert (ended.outcome.status, ended.outcome.error) == ("failed", error)
    assert (ended.receipt["status"], ended.receipt["error"]) == ("failed", error)
    assert _measured(ended) == ["measurement_started", "measurement_finished"]
    assert ended.summary is not None and ended.summary["status"] == "failed"


def test_a_cancellation_while_the_final_line_is_drawn_is_raised_with_the_outputs_written_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ended = _end(tmp_path, _with_live(monkeypatch, "drained2", None))
    assert (
        ended.outcome is None and isinstance(ended.raised, asyncio.CancelledError) and ended.cancelling == 1
    )
    assert ended.receipt["status"] == "complete"  # written before the final line's wait
    assert ended.summary is not None and ended.summary["status"] == "complete"


def test_a_window_that_ends_at_virtual_time_zero_is_not_stretched_over_the_clean_up(tmp_path: Path) -> None:
    """A simulation's window opens at virtual time 0; one whose trajectories all take no time ends there too.
    That end, 0.0, was read as "not known" (``finished_at or now``): the makespan then ran on to the end of
    the clean-up, here a backend that takes 5 virtual seconds to close, though no trajectory ran past 0.
    (Fails on 2a3b212 and 60b2be2 alike: not the phase split's.)"""

    class SlowToClose(ScriptedBackend):
        async def aclose(self) -> None:
            await self._clock.sleep(5.0)

    final = {"type": "final", "answer": "ok", "latency_ms": 0}
    workload = write_workload(tmp_path / "w.jsonl", [{"id": "p0", "prompt": "x", "script": [final]}])
    out = tmp_path / "run"
    clock = VirtualClock()
    run = Run(
        prepare(build_config({"workload": workload, "output": out}), ["test"]),
        clock,
        worker_factory=virtual_factory(clock, builtin_duration),
        backend=SlowToClose(clock),
    )
    outcome = clock.run(run.execute())
    assert outcome.status == "complete" and outcome.summary is not None
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert [e["t"] for e in events if e["event"] == "trajectory_finished"] == [0.0]
    [finished] = [e for e in events if e["event"] == "measurement_finished"]
    assert finished["makespan_s"] == 0.0
    assert outcome.summary["makespan_s"] == 0.0
    assert clock.now() == 5.0  # the clean-up did take its time, outside the window


def test_a_window_end_that_cannot_be_read_still_closes_everything_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading the window's end (and the CPU, the NVTX range) comes before the clean-up: whatever it
    raised, the workers, the sampler and the backend are closed all the same and the run fails with it
    (the clean-up was skipped: the backend stayed open, and a real run's workers until the process ended)."""

    def window_end(self: TrajectoryRunner, complete: bool) -> float:
        raise RuntimeError("no end")

    monkeypatch.setattr(TrajectoryRunner, "window_end", window_end)
    ended = _end(tmp_path, lambda stop: None)
    assert ended.backend_closed
    assert ended.outcome is not None and ended.raised is None
    assert (ended.outcome.status, ended.receipt["status"]) == ("failed", "failed")
    assert ended.receipt["error"] == "RuntimeError: no end"
