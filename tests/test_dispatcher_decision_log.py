"""What the dispatcher tells the policy and logs with each decision (``cpu_selected`` in events.jsonl,
MEASUREMENT.md): the queue it saw (depth, oldest job, up to 8 candidates oldest first with their waits
and predictions), the policy's reason and eligibility, whether the pick reordered the queue, and the
counts behind the live view (decisions, reorders, peak queue)."""

from __future__ import annotations

import asyncio

import pytest

from asyncroll.clock import VirtualClock
from asyncroll.errors import PolicyError
from asyncroll.events import CpuEnqueued, CpuSelected, CpuStarted
from asyncroll.policies import QueueSnapshot
from asyncroll.policies.base import Decision
from asyncroll.runtime.dispatcher import DispatcherSnapshot
from tests.dispatcher_rig import Rig, Scripted, run_rig, sleep_job


def _newest(snapshot: QueueSnapshot) -> Decision:
    if len(snapshot.jobs) == 1:
        return Decision(snapshot.oldest.job_id, "alone")
    return Decision(snapshot.jobs[-1].job_id, "newest", eligible=True)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("workers", [1, 2])
def test_a_decision_logs_the_queue_it_saw_and_the_policys_pick(workers: int) -> None:
    """The workers run ``workers`` 100 ms jobs; ten more jobs queue 1.2345 ms apart meanwhile (waits
    logged to the microsecond), and the policy picks the newest each time: the first pick after the queue
    filled skips nine older jobs."""
    policy = Scripted(_newest)
    counts: list[DispatcherSnapshot] = []
    enqueued: list[float] = []

    async def scenario(rig: Rig) -> None:
        counts.append(rig.dispatcher.snapshot())  # nothing queued yet: every count 0
        tasks = [rig.submit(sleep_job(100.0044)) for _ in range(workers)]
        for _ in range(10):
            await rig.clock.sleep(0.0012345)
            enqueued.append(rig.clock.now())
            tasks.append(rig.submit(sleep_job(100)))
        await rig.clock.sleep(0.001)
        counts.append(rig.dispatcher.snapshot())  # ten queued, none picked yet
        for task in tasks:
            assert (await task).ok
        counts.append(rig.dispatcher.snapshot())

    capture = run_rig(scenario, policy, workers=workers, starvation_threshold=3)
    jobs = workers + 10
    assert [e.queue_depth for e in capture.of(CpuEnqueued)] == [1] * workers + list(range(1, 11))
    selected = capture.of(CpuSelected)
    assert len(selected) == len(policy.seen) == jobs
    assert [e.job_id for e in capture.of(CpuStarted)] == [e.job_id for e in selected]

    first = selected[workers]  # the first decision with the ten queued
    first_seen = policy.seen[workers]
    queued = list(range(workers + 1, jobs + 1))
    assert [j.job_id for j in first_seen.jobs] == queued
    assert (first.job_id, first.reason, first.eligible, first.reordered) == (jobs, "newest", True, True)
    assert (first.queue_depth, first.oldest_job_id, first.threshold) == (10, workers + 1, 3)
    assert (first.worker, first.policy) == (0, "scripted")
    assert first_seen.now == pytest.approx(0.1000044)
    assert first.waited_s == round(first_seen.now - enqueued[-1], 6) == 0.087659
    assert [c.job_id for c in first.candidates] == queued[:8]  # the oldest eight, oldest first
    for i, candidate in enumerate(first.candidates):
        assert candidate.waited_s == round(first_seen.now - enqueued[i], 6)
        predicted = first_seen.predictions[i]
        assert (candidate.predicted_s, candidate.source) == (round(predicted.seconds, 6), predicted.source)
    assert first.predicted_s == round(first_seen.predictions[-1].seconds, 6)
    # the model supply the policy saw (no model request here: 0, not the gate's limit of 2), and the
    # predictor's observations: every job finished before the decision
    assert all(
        e.model_outstanding == s.model_outstanding == 0 for e, s in zip(selected, policy.seen, strict=True)
    )
    assert [e.observations for e in selected] == [0] * workers + list(range(1, 11))

    # what the policy was told besides the queue
    for seen in policy.seen:
        assert (seen.workers, seen.starvation_threshold) == (workers, 3)
        assert seen.admission_pending and seen.remaining == () and seen.running_left == 0.0
        assert len(seen.predictions) == len(seen.jobs)

    alone = [e for e in selected if e.reason == "alone"]
    assert alone and all(not e.eligible and not e.reordered and e.oldest_job_id == e.job_id for e in alone)
    reorders = sum(e.reordered for e in selected)
    assert reorders == 10 - workers + (workers - 1)  # every pick from a queue of two or more
    assert counts == [
        DispatcherSnapshot(queued=0, decisions=0, reorders=0, peak_queued=0),
        DispatcherSnapshot(queued=10, decisions=workers, reorders=0, peak_queued=10),
        DispatcherSnapshot(queued=0, decisions=jobs, reorders=reorders, peak_queued=10),
    ]


@pytest.mark.timeout(30)
def test_a_policy_that_chooses_a_job_not_in_its_queue_is_named_with_the_jobs_it_was_shown() -> None:
    """A policy's bug (here: a job id it made up) fails the run with a message that names the policy,
    its pick and the queue it saw, not a bare ``KeyError: 999`` from deep in the dispatcher."""

    async def scenario(rig: Rig) -> None:
        busy = rig.submit(sleep_job(100))  # the one worker: the next ten jobs queue behind it
        await rig.clock.sleep(0.001)
        tasks = [rig.submit(sleep_job(10)) for _ in range(10)]
        await asyncio.gather(busy, *tasks)

    policy = Scripted(lambda s: Decision(s.oldest.job_id if len(s.jobs) == 1 else 999, "made up"))
    with pytest.raises(ExceptionGroup) as raised:
        run_rig(scenario, policy)
    error = raised.value.exceptions[0]
    assert isinstance(error, PolicyError)
    assert str(error) == (
        "policy 'scripted' chose job 999, not one of the 10 queued job(s) it was shown "
        "(ids 2, 3, 4, 5, 6, 7, 8, 9, ...)"
    )


@pytest.mark.timeout(30)
def test_a_slow_decision_counts_in_the_chosen_jobs_wait_not_in_the_candidates_waits() -> None:
    """``waited_s`` of ``cpu_selected`` runs to the selection (the decision's own time included: what the
    job really waited); each candidate's is at the snapshot the policy saw (what it decided on). A policy
    taking 7 ms to choose (the clock advanced inside ``choose``) tells them apart."""
    clocks: list[VirtualClock] = []

    def slow(snapshot: QueueSnapshot) -> Decision:
        clocks[0].advance(0.007)
        return Decision(snapshot.oldest.job_id, "oldest")

    policy = Scripted(slow)

    async def scenario(rig: Rig) -> None:
        clocks.append(rig.clock)
        busy = rig.submit(sleep_job(100))
        await rig.clock.sleep(0.001)
        tasks = [rig.submit(sleep_job(10)) for _ in range(3)]
        await asyncio.gather(busy, *tasks)

    capture = run_rig(scenario, policy, log_candidates=True)
    queued = capture.of(CpuEnqueued)[1].t  # the three queued at once, once the first decision ended
    second = capture.of(CpuSelected)[1]  # the first pick from the three
    seen = policy.seen[1]
    assert (queued, seen.now) == pytest.approx((0.007, 0.107))  # the first job ran 100 ms after it
    assert second.t == pytest.approx(0.114)
    assert second.waited_s == round(second.t - queued, 6) == 0.107
    assert [c.waited_s for c in second.candidates] == [round(seen.now - queued, 6)] * 3 == [0.1] * 3


def test_the_events_schema_bounds_the_candidates_a_decision_logs() -> None:
    """``asyncroll schema events`` said a ``cpu_selected`` event's candidates were an array of any length;
    the dispatcher logs the oldest :data:`MAX_CANDIDATES` queued jobs at most (docs/RUNNING.md,
    MEASUREMENT.md)."""
    from asyncroll.events import MAX_CANDIDATES
    from asyncroll.schemas import schemas

    candidates = schemas()["events"]["$defs"]["CpuSelected"]["properties"]["candidates"]
    assert candidates["maxItems"] == MAX_CANDIDATES == 8, candidates
    assert "oldest" in candidates["description"], candidates
