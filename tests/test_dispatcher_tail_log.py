"""In the batch's tail (no problem waits for admission) each decision also logs the remaining-work
estimates it read (``remaining_s`` of the chosen job and of each candidate: the snapshot's, at the job's
own place in the queue) and what the running jobs have left (``running_left_s``), to the microsecond;
a policy that never reads the estimates gets none but logs the same values."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from asyncroll.event_log import EventCapture
from asyncroll.events import CpuSelected
from asyncroll.policies import JobView, QueueSnapshot
from asyncroll.policies.base import Decision
from tests.dispatcher_rig import Rig, Scripted, run_rig, sleep_job


class Estimator:
    """Remaining work 0.1234567 s per job id: seven decimals, logged rounded to six."""

    observations = 0

    def estimate(self, job: JobView, predicted: float | None = None) -> float | None:
        return job.job_id * 0.1234567

    def estimate_queue(self, jobs: Sequence[JobView], predicted: Sequence[float]) -> tuple[float | None, ...]:
        return tuple(self.estimate(job, seconds) for job, seconds in zip(jobs, predicted, strict=True))

    def __call__(self, event: object) -> None:
        pass


def _newest(snapshot: QueueSnapshot) -> Decision:
    return Decision(snapshot.jobs[-1].job_id, "newest", eligible=True)


def _most_left(snapshot: QueueSnapshot) -> Decision:
    """The job with the most work left after it, read from the snapshot (the newest, with this estimator)."""
    if not snapshot.remaining:
        return _newest(snapshot)
    best = max(range(len(snapshot.jobs)), key=lambda i: snapshot.remaining[i] or 0.0)
    return Decision(snapshot.jobs[best].job_id, "most_left", eligible=True)


class Blind(Scripted):
    reads_remaining = False


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("rule", "choose"), [(Scripted, _most_left), (Blind, _newest)], ids=["reads", "blind"]
)
def test_the_tail_logs_the_estimates_it_decided_on(
    rule: type[Scripted], choose: Callable[[QueueSnapshot], Decision]
) -> None:
    policy = rule(choose)

    capture = _two_running_three_queued(policy, second_ms=12.3456)
    selected = capture.of(CpuSelected)
    decision = next(e for e in selected if e.queue_depth == 3)  # job 2 finished, 3-5 queued
    assert decision.job_id == 5 and decision.reordered
    assert decision.remaining_s == round(5 * 0.1234567, 6) == 0.617283
    assert [(c.job_id, c.remaining_s) for c in decision.candidates] == [
        (j, round(j * 0.1234567, 6)) for j in (3, 4, 5)
    ]
    seen = policy.seen[selected.index(decision)]
    if isinstance(policy, Blind):
        assert seen.remaining == ()
    else:  # read while the policy chose: the logged values are those it read
        assert getattr(seen.remaining, "made", None) is True and decision.reason == "most_left"
        assert tuple(seen.remaining) == tuple(j * 0.1234567 for j in (3, 4, 5))
    # job 1 (predicted p s at 1 ms) has run 12.3456 ms: what it has left, as the policy saw it and logged
    assert seen.now == pytest.approx(0.0133456)
    assert seen.running_left == pytest.approx(selected[0].predicted_s - 0.0123456, abs=1e-6)
    assert seen.running_left > 0.05
    assert decision.running_left_s == round(seen.running_left, 6)


@pytest.mark.timeout(30)
def test_a_running_job_past_its_prediction_has_nothing_left_not_less() -> None:
    """Job 1 (predicted at the 100 ms prior) has run 300 ms when job 2 ends: it counts 0 s left, never
    -0.2 s (which would make the running jobs look shorter than nothing to the straggler guard)."""
    policy = Scripted(_newest)

    capture = _two_running_three_queued(policy, second_ms=300)
    selected = capture.of(CpuSelected)
    assert selected[0].predicted_s == 0.1
    decision = next(e for e in selected if e.queue_depth == 3)  # job 2 finished, 3-5 queued
    seen = policy.seen[selected.index(decision)]
    assert seen.now == pytest.approx(0.301)
    assert (seen.running_left, decision.running_left_s) == (0.0, 0.0)


def _two_running_three_queued(policy: Scripted, second_ms: float) -> EventCapture:
    """Jobs 1 (1 s) and 2 (``second_ms``) start at 1 ms on the two workers; jobs 3-5 (10 ms) queue at
    11 ms: the decision at job 2's end chooses among them."""

    async def scenario(rig: Rig) -> None:
        await rig.clock.sleep(0.001)
        tasks = [rig.submit(sleep_job(1000)), rig.submit(sleep_job(second_ms))]  # both workers busy
        await rig.clock.sleep(0.01)
        tasks += [rig.submit(sleep_job(10)) for _ in range(3)]  # jobs 3-5 queue
        for task in tasks:
            assert (await task).ok

    return run_rig(scenario, policy, workers=2, remaining=Estimator(), admission_pending=lambda: False)
