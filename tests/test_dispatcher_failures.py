"""How a CPU job that does not run to completion is reported (``cpu_failed`` / ``cpu_finished`` in
events.jsonl, the outcome the trajectory gets, the worker's replacement) and learned from: a timeout is
observed censored at the timeout, a dead worker's job is not observed, a stop while the job runs or
as it is handed a worker says ``cancelled`` and hands the worker back."""

from __future__ import annotations

import asyncio

import pytest

from asyncroll.errors import WorkerDied
from asyncroll.events import CpuFailed, CpuFinished, CpuSelected, WorkerRestarting
from asyncroll.runtime.jobs import JobOutcome
from asyncroll.runtime.virtual_worker import VirtualWorker
from asyncroll.workers.process import CallResult
from asyncroll.workers.protocol import JobReply, JobRequest
from tests.dispatcher_rig import Rig, Scripted, run_rig, sleep_job

LONG = "x" * 3000  # an error longer than an event keeps


class Faulty(VirtualWorker):
    """``die`` kills the worker 0.2500013 s into the job; ``fail_long`` fails with a 3000-char error."""

    async def call(
        self,
        request: JobRequest,
        timeout: float,  # noqa: ASYNC109 - as a worker
        *,
        large: bool = False,
    ) -> CallResult:
        if request.tool == "die":
            await self._clock.sleep(0.2500013)
            self._exited.set()
            raise WorkerDied(LONG)
        if request.tool == "fail_long":
            now = self._clock.now()
            return CallResult(
                JobReply(request.job_id, False, None, LONG, now, now, 0.0, None, None), now, now
            )
        return await super().call(request, timeout)


@pytest.mark.timeout(30)
def test_timeouts_deaths_and_long_errors_are_reported_and_learned_from() -> None:
    outcomes: list[JobOutcome] = []

    async def scenario(rig: Rig) -> None:
        for tool in ("sleep_ms", "die", "fail_long", "sleep_ms"):
            outcomes.append(await rig.dispatcher.run(sleep_job(5000 if tool == "sleep_ms" else 1, tool=tool)))
            await rig.clock.sleep(0.1)  # the replacement (if any) starts

    capture = run_rig(scenario, Scripted(), tool_timeout=1.0, worker=Faulty)
    timeout = "worker 0 (virtual: no process) job 1 (sleep_ms) ran past 1s; the worker was killed"
    assert [(o.ok, o.failure, o.error) for o in outcomes] == [
        (False, "timeout", timeout),
        (False, "worker_died", LONG),
        (False, None, LONG),  # a tool error: the job ran, its worker is fine
        (
            False,
            "timeout",
            "worker 0 (virtual: no process) job 4 (sleep_ms) ran past 1s; the worker was killed",
        ),
    ]
    failed = capture.of(CpuFailed)
    assert [(e.job_id, e.reason, e.worker, e.kind, e.tool) for e in failed] == [
        (1, "timeout", 0, "tool", "sleep_ms"),
        (2, "worker_died", 0, "tool", "die"),
        (4, "timeout", 0, "tool", "sleep_ms"),
    ]
    assert [e.roundtrip_s for e in failed] == [1.0, 0.250001, 1.0]  # to the microsecond
    assert failed[0].error == timeout and failed[1].error == LONG[:1000]
    finished = capture.of(CpuFinished)
    assert [(e.job_id, e.ok, e.error) for e in finished] == [(3, False, LONG[:1000])]
    assert [e.reason for e in capture.of(WorkerRestarting)] == ["timeout", "died", "timeout"]
    # the timeout is observed (censored) before the next job is predicted; the dead worker's job is not
    assert [e.observations for e in capture.of(CpuSelected)] == [0, 1, 1, 2]


@pytest.mark.timeout(30)
def test_a_stop_while_a_job_runs_or_is_handed_a_worker_says_cancelled_and_frees_the_worker() -> None:
    """A job stopped 0.3000017 s into its run is logged ``cancelled`` with that round trip (its worker
    stays taken: only a stopping run does this, and it kills the workers); on the other worker, a queued
    job stopped in the same loop step as it is handed the worker gives it back at once (the next job
    starts on it) and is logged ``cancelled`` too, with no time run."""
    done: list[JobOutcome] = []

    async def scenario(rig: Rig) -> None:
        running = rig.submit(sleep_job(500))
        await rig.clock.sleep(0.3000017)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        busy = rig.submit(sleep_job(100))
        await rig.clock.sleep(0.01)
        handed = rig.submit(sleep_job(50))
        after = rig.submit(sleep_job(20))
        await rig.clock.sleep(0.01)
        loop = asyncio.get_running_loop()

        def stop_when_handed(event: object) -> None:
            if isinstance(event, CpuSelected) and event.job_id == 3:
                loop.call_soon(handed.cancel)  # before its task wakes with the worker

        rig.events.subscribe(stop_when_handed)
        done.append(await busy)
        with pytest.raises(asyncio.CancelledError):
            await handed
        done.append(await after)

    capture = run_rig(scenario, Scripted(), workers=2)
    assert [o.ok for o in done] == [True, True]
    failed = capture.of(CpuFailed)
    assert [(e.job_id, e.reason, e.worker) for e in failed] == [(1, "cancelled", 0), (3, "cancelled", 1)]
    assert [e.roundtrip_s for e in failed] == [0.300002, 0.0]
    assert all(e.error == "the run was stopped while this job held a worker" for e in failed)
    assert [e.job_id for e in capture.of(CpuSelected)] == [1, 2, 3, 4]
    assert [e.job_id for e in capture.of(CpuFinished)] == [2, 4]


@pytest.mark.timeout(30)
def test_a_job_stopped_while_queued_leaves_the_queue_at_once() -> None:
    """It never held a worker (no ``cpu_failed``), the live view's queue count drops at once, and the next
    decision sees neither it nor its prediction (the policy reads the predictions aligned with the jobs)."""
    queued: list[int] = []

    async def scenario(rig: Rig) -> None:
        first = rig.submit(sleep_job(100))
        await rig.clock.sleep(0.01)
        second, doomed = rig.submit(sleep_job(50)), rig.submit(sleep_job(50))
        await rig.clock.sleep(0.1)  # the second runs: both were predicted at that decision
        queued.append(rig.dispatcher.snapshot().queued)
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        queued.append(rig.dispatcher.snapshot().queued)
        later = rig.submit(sleep_job(20))
        for task in (first, second, later):
            assert (await task).ok

    policy = Scripted()
    capture = run_rig(scenario, policy)
    assert queued == [1, 0]
    assert not capture.of(CpuFailed)
    assert [(e.job_id, e.queue_depth) for e in capture.of(CpuSelected)] == [(1, 1), (2, 2), (4, 1)]
    assert [[j.job_id for j in s.jobs] for s in policy.seen] == [[1], [2, 3], [4]]
    assert [len(s.predictions) for s in policy.seen] == [1, 2, 1]


@pytest.mark.timeout(30)
def test_a_job_stopped_as_a_worker_frees_is_dropped_with_its_prediction() -> None:
    """A stop cancels a queued job's wait in the same loop step as a worker frees (here: as the job before
    it finishes): the dispatcher drops it before deciding, and its prediction (made at an earlier
    decision) with it, so the policy reads the remaining jobs' predictions aligned with them."""
    policy = Scripted()

    async def scenario(rig: Rig) -> None:
        first = rig.submit(sleep_job(100))
        await rig.clock.sleep(0.01)
        second, doomed = rig.submit(sleep_job(50)), rig.submit(sleep_job(50))
        await rig.clock.sleep(0.1)  # the second runs: both were predicted at that decision
        later = rig.submit(sleep_job(20))

        def stop_doomed(event: object) -> None:
            if isinstance(event, CpuFinished) and event.job_id == 2:
                doomed.cancel()  # the worker is freed (and the next job picked) before its task runs

        rig.events.subscribe(stop_doomed)
        for task in (first, second, later):
            assert (await task).ok
        with pytest.raises(asyncio.CancelledError):
            await doomed

    capture = run_rig(scenario, policy)
    assert [(e.job_id, e.queue_depth) for e in capture.of(CpuSelected)] == [(1, 1), (2, 2), (4, 1)]
    assert [[j.job_id for j in s.jobs] for s in policy.seen] == [[1], [2, 3], [4]]
    assert [len(s.predictions) for s in policy.seen] == [1, 2, 1]


@pytest.mark.timeout(30)
def test_every_nvtx_range_of_a_stopped_job_is_ended() -> None:
    """``--nvtx``: the queue-wait range of a job stopped while queued, and both ranges of one stopped while
    it runs, are ended (a range left open spans the rest of the profile)."""
    from tests.test_nvtx import RecordingRanges

    ranges = RecordingRanges()

    async def scenario(rig: Rig) -> None:
        running = rig.submit(sleep_job(100))
        await rig.clock.sleep(0.01)
        queued = rig.submit(sleep_job(100))
        await rig.clock.sleep(0.01)
        for task in (queued, running):
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    run_rig(scenario, Scripted(), ranges=ranges)
    assert [name for _, name, _ in ranges.started] == ["cpu queue", "cpu execution", "cpu queue"]
    assert sorted(ranges.ended) == [0, 1, 2]
