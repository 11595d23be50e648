"""Property-based tests of the policies as pure functions (SPEC §6): for generated queue snapshots every
registered policy returns a queued job, the same one each time, and the documented precedence holds —
hard aging first (the oldest aged job), then eligibility (≥ 2 jobs and model outstanding below the
threshold, with predictions), then the rule's own choice, grade jobs after tool and evaluation jobs where
the docstring of :mod:`asyncroll.policies.pressure` says so.

Derandomised, no example database, no constants drawn from the modules imported so far (as
``tests/test_properties.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncroll.policies.base import JobView, Prediction, QueueSnapshot
from asyncroll.policies.registry import PRESSURE_POLICIES, get_policy

PROPS = settings(derandomize=True, database=None, deadline=None, max_examples=300)
pytestmark = pytest.mark.usefixtures("hypothesis_without_local_constants")
NAMES = ("sync", "fifo", "tool_first", "gpu_first", "asyncroll", *PRESSURE_POLICIES)
#: A few values shared by many jobs, so that ties (equal waits, equal predictions) are common.
SECONDS = st.one_of(st.sampled_from([0.0, 0.001, 0.1, 1.0]), st.floats(0.0, 60.0))


@st.composite
def snapshots(draw: st.DrawFn) -> QueueSnapshot:
    now = draw(st.floats(0.0, 100.0))
    n = draw(st.integers(1, 8))
    # oldest first, as the dispatcher's queue holds them
    enqueued = sorted(draw(st.lists(st.floats(0.0, now), min_size=n, max_size=n)))
    jobs = tuple(
        JobView(
            job_id=10 + i,
            trajectory_id=f"t{draw(st.integers(0, 3))}",
            kind=draw(st.sampled_from(["tool", "grade", "evaluate"])),
            tool="spin_ms",
            turn=draw(st.integers(0, 3)),
            enqueued_at=at,
        )
        for i, at in enumerate(enqueued)
    )
    predictions: tuple[Prediction, ...] = ()
    if draw(st.integers(0, 4)):
        predictions = tuple(Prediction(draw(SECONDS), "ridge") for _ in jobs)
    remaining: tuple[float | None, ...] = ()
    if draw(st.booleans()):
        remaining = tuple(draw(st.none() | SECONDS) for _ in jobs)
    return QueueSnapshot(
        now=now,
        jobs=jobs,
        model_outstanding=draw(st.integers(0, 10)),
        predictions=predictions,
        starvation_threshold=draw(st.integers(1, 8)),
        admission_pending=draw(st.booleans()),
        workers=draw(st.integers(1, 4)),
        remaining=remaining,
        running_left=draw(SECONDS),
    )


KNOBS: dict[str, Any] = {
    "aging_seconds": st.sampled_from([0.01, 1.0, 30.0]),
    "aging_weight": st.sampled_from([0.0, 0.02, 1.0]),
}


@PROPS
@given(snapshot=snapshots(), name=st.sampled_from(NAMES), **KNOBS)
def test_every_policy_returns_a_queued_job_and_the_same_one_again(
    snapshot: QueueSnapshot, name: str, aging_seconds: float, aging_weight: float
) -> None:
    policy = get_policy(name, aging_seconds=aging_seconds, aging_weight=aging_weight)
    decision = policy.choose(snapshot)
    assert decision.job_id in {job.job_id for job in snapshot.jobs}
    assert (
        get_policy(name, aging_seconds=aging_seconds, aging_weight=aging_weight).choose(snapshot) == decision
    )
    oldest = snapshot.oldest.job_id
    if name in ("sync", "fifo"):
        assert decision.job_id == oldest and not decision.eligible
    elif name in ("tool_first", "gpu_first"):
        unlocking = [job.job_id for job in snapshot.jobs if job.kind != "grade"]
        assert decision.job_id == (unlocking[0] if unlocking else oldest) and not decision.eligible


@PROPS
@given(snapshot=snapshots(), name=st.sampled_from(("asyncroll", *PRESSURE_POLICIES)), **KNOBS)
def test_pressure_rules_age_first_then_check_eligibility_then_score(
    snapshot: QueueSnapshot, name: str, aging_seconds: float, aging_weight: float
) -> None:
    decision = get_policy(name, aging_seconds=aging_seconds, aging_weight=aging_weight).choose(snapshot)
    jobs, now = snapshot.jobs, snapshot.now
    oldest = snapshot.oldest.job_id
    if any(now - job.enqueued_at >= aging_seconds for job in jobs):  # 1. hard aging, whatever else holds
        assert (decision.job_id, decision.reason, decision.eligible) == (
            oldest,
            "hard_starvation_fifo",
            False,
        )
        return
    if decision.reason == "hard_starvation_fifo":  # the unlock rule's relative aging: still the oldest
        assert decision.job_id == oldest and not decision.eligible
        return
    eligible = (
        len(jobs) >= 2
        and snapshot.model_outstanding < snapshot.starvation_threshold
        and len(snapshot.predictions) == len(jobs)
    )
    assert decision.eligible == eligible, decision  # 2. eligibility
    if not eligible:
        assert decision.job_id == oldest and decision.reason.startswith("not_eligible_"), decision
        return
    chosen = next(job for job in jobs if job.job_id == decision.job_id)
    grades_last = not snapshot.admission_pending or name in ("asyncroll_seed", "asyncroll_guarded")
    if grades_last and any(job.kind != "grade" for job in jobs):  # 3. grade jobs after the others
        assert chosen.kind != "grade", decision
    if decision.reason == "low_model_supply_predicted_unlock":  # the score: the first of the lowest
        candidates = [i for i, job in enumerate(jobs) if not (grades_last and job.kind == "grade")] or list(
            range(len(jobs))
        )
        scores = [
            snapshot.predictions[i].seconds - aging_weight * (now - jobs[i].enqueued_at) for i in candidates
        ]
        assert chosen is jobs[candidates[scores.index(min(scores))]], decision
