"""What ``cpu_finished`` reports of a job that ran (events.jsonl, read by the summary's CPU statistics):
the worker's execute, CPU and serialisation times and the round trip, each to the microsecond (``null``
where the worker measured none), when it started and finished relative to the measurement, its error."""

from __future__ import annotations

from asyncroll.events import CpuFinished
from asyncroll.runtime.virtual_worker import VirtualWorker
from asyncroll.workers.process import CallResult
from asyncroll.workers.protocol import JobReply, JobRequest
from tests.dispatcher_rig import Rig, Scripted, run_rig, sleep_job


class Measured(VirtualWorker):
    """A job of the tool ``measured`` reports CPU and serialisation times, and its reply arrives
    11.1111 ms after it finished (the round trip is the runtime's, not the worker's execute time)."""

    async def call(
        self,
        request: JobRequest,
        timeout: float,  # noqa: ASYNC109 - as a worker
        *,
        large: bool = False,
    ) -> CallResult:
        if request.tool != "measured":
            return await super().call(request, timeout)
        plain = await super().call(JobRequest(request.job_id, "sleep_ms", request.arguments), timeout)
        r = plain.reply
        reply = JobReply(r.job_id, True, 7, None, r.started, r.finished, r.execute_s, 0.0012344, 0.0000123)
        await self._clock.sleep(0.0111111)
        return CallResult(reply, plain.sent, self._clock.now())


def test_a_finished_jobs_times_are_logged_to_the_microsecond() -> None:
    sent: list[float] = []

    async def scenario(rig: Rig) -> None:
        await rig.clock.sleep(0.0012345)
        for tool in ("measured", "sleep_ms", "no_such_tool"):
            sent.append(rig.clock.now())
            await rig.dispatcher.run(sleep_job(12.3456, tool=tool))

    capture = run_rig(scenario, Scripted(), worker=Measured)
    measured, plain, failed = capture.of(CpuFinished)
    assert (measured.ok, measured.execute_s, measured.cpu_s, measured.serialize_s) == (
        True,
        0.012346,
        0.001234,
        0.000012,
    )
    assert measured.roundtrip_s == round(0.0123456 + 0.0111111, 6) == 0.023457
    assert (measured.started, measured.finished) == (round(sent[0], 6), round(sent[0] + 0.0123456, 6))
    assert (plain.ok, plain.execute_s, plain.cpu_s, plain.serialize_s) == (True, 0.012346, None, None)
    assert (plain.roundtrip_s, plain.error) == (0.012346, None)
    assert plain.started == round(sent[1], 6) and plain.finished == round(sent[1] + 0.0123456, 6)
    assert (failed.ok, failed.error) == (
        False,
        "virtual worker cannot execute 'no_such_tool' (not a built-in)",
    )
