"""Decision overhead of the pressure-aware policy: one ``choose()`` with 64 queued jobs (predictions for
the whole queue included, as the dispatcher computes them, in the worst case: none cached, as right
after a refit) of the default rule (`asyncroll`) and one predictor refit, with a predictor
warmed on 500 observations. Median over many calls; min/median/max over repeats.

In the batch's tail (no problem waits for admission) the default rule ranks the queue by the work left
after each job instead, which the dispatcher reads from the run's remaining-work estimator (the chain of
:class:`~asyncroll.policies.remaining.StepwiseWork`, warmed here on 300 trajectories' events): measured too,
three ways. Right after a job finished (the usual case in a run: a worker frees, the dispatcher
decides; more trajectories' events are fed and a decision made after each finished job), when the
estimator forgets the estimates that job's execute time changed and those computed from them. With every
memoised estimate dropped before each call (the worst case: the whole chain recomputed). And memoised
(nothing observed since the last decision). The measured tail decision is checked to be
``tail_critical_path``.

Every queued job has waited less than the hard-aging bound (``--aging-seconds``, 30 s): a job past it ends
``choose()`` at its first step (the hard-aging pick, no score computed), which is not the decision this
measures. The measured decision is checked to be the scored one.

Run: ``python -m bench.decision [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Iterator

from asyncroll.events import CpuEnqueued, CpuFinished, Event, ModelFinished, TrajectoryFinished
from asyncroll.policies import JobView, Prediction, QueueSnapshot, get_policy
from asyncroll.policies.predictor import DurationPredictor, warm_import
from asyncroll.policies.registry import estimator_for
from asyncroll.policies.remaining import RemainingEstimator
from bench.common import machine, number_arg, quantiles, run_main

NOW = 100.0
QUEUED = 64
TOOLS = ("crunch", "lookup", "grade_tool", "search")
SCORED = "low_model_supply_predicted_unlock"  # the default rule's scored pick while admission is pending
TAIL = "tail_critical_path"  # its pick in the tail


def make_queue(rng: random.Random) -> tuple[JobView, ...]:
    """``QUEUED`` jobs, oldest first, waiting 0.2 s to 12.8 s at ``NOW``: all under the hard-aging bound."""
    return tuple(
        JobView(
            1000 + i,
            f"q{i}",
            "tool",
            rng.choice(TOOLS),
            i % 4,
            NOW - 0.2 * (QUEUED - i),
            arg_bytes=rng.randint(10, 50_000),
            resubmission=i % 3 == 0,
        )
        for i in range(QUEUED)
    )


def snapshot(queue: tuple[JobView, ...], predictions: tuple[Prediction, ...]) -> QueueSnapshot:
    """Model supply low (0 outstanding, threshold 4), a problem waiting for admission: eligible."""
    return QueueSnapshot(NOW, queue, 0, predictions, 4, True)


def trajectory_events(rng: random.Random, name: str, first_job_id: int) -> Iterator[Event]:
    """One trajectory's events as a run emits them: a job per turn (turns 0–3, a random tool, the same
    tool again as a resubmission), each followed by its model turn, then the trajectory's end."""
    seen: set[str] = set()
    job_id = first_job_id
    for turn in range(rng.randint(1, 4)):
        tool = rng.choice(TOOLS)
        job_id += 1
        yield CpuEnqueued(
            id=name,
            job_id=job_id,
            kind="tool",
            tool=tool,
            turn=turn,
            arg_bytes=100,
            queue_depth=1,
            resubmission=tool in seen,
        )
        seen.add(tool)
        seconds = rng.lognormvariate(-2, 1)
        yield CpuFinished(
            id=name,
            job_id=job_id,
            worker=0,
            kind="tool",
            tool=tool,
            ok=True,
            execute_s=seconds,
            cpu_s=seconds,
            roundtrip_s=seconds,
        )
        yield ModelFinished(id=name, request_id=job_id, turn=turn + 1, latency_s=0.4, action="tool")
    yield TrajectoryFinished(id=name, status="completed", turns=4, tool_calls=4, duration_s=1.0)


def warmed_estimator(rng: random.Random, trajectories: int = 300) -> RemainingEstimator:
    """The default rule's remaining-work estimator after ``trajectories`` finished
    (:func:`trajectory_events`)."""
    estimator = estimator_for("asyncroll")
    for i in range(trajectories):
        for event in trajectory_events(rng, f"w{i}", 10 * i):
            estimator(event)
    return estimator


def announce(estimator: RemainingEstimator, queue: tuple[JobView, ...]) -> None:
    """The queued jobs' ``CpuEnqueued`` events, as a run's log gives them to the estimator before any
    decision sees the jobs (it reads each queued job's key from its event)."""
    for job in queue:
        estimator(
            CpuEnqueued(
                id=job.trajectory_id,
                job_id=job.job_id,
                kind=job.kind,
                tool=job.tool,
                turn=job.turn,
                arg_bytes=job.arg_bytes,
                queue_depth=1,
                resubmission=job.resubmission,
            )
        )


def tail_snapshot(
    queue: tuple[JobView, ...], predictions: tuple[Prediction, ...], estimator: RemainingEstimator
) -> QueueSnapshot:
    """The tail: no problem waits for admission; the remaining work of every queued job read as the
    dispatcher reads it (the estimator, given each job's prediction)."""
    remaining = estimator.estimate_queue(queue, [p.seconds for p in predictions])
    return QueueSnapshot(NOW, queue, 0, predictions, 4, False, 2, remaining, 0.0)


CALLS = 2000  # timed calls per measure in one repeat (the refit: REFITS)
REFITS = 50


def one_repeat(seed: int, calls: int = CALLS) -> tuple[float, ...]:
    rng = random.Random(seed)
    predictor = DurationPredictor()
    for i in range(500):
        job = JobView(i, f"t{i}", "tool", rng.choice(TOOLS), 0, 0.0, arg_bytes=rng.randint(10, 50_000))
        predictor.observe(job, rng.lognormvariate(-2, 1))
    queue = make_queue(rng)
    policy = get_policy("asyncroll")  # the default rule
    decision = policy.choose(snapshot(queue, predictor.predict(queue)))  # fit once, cache the feature rows
    if decision.reason != SCORED:
        raise RuntimeError(f"the measured decision is {decision.reason!r}, not the scored {SCORED!r}")
    choose, predict_only = [], []
    for _ in range(calls):
        predictor._cache.clear()  # worst case: a new model, every queued job predicted again
        began = time.perf_counter()
        predictions = predictor.predict(queue)
        mid = time.perf_counter()
        policy.choose(snapshot(queue, predictions))
        done = time.perf_counter()
        predict_only.append((mid - began) * 1e6)
        choose.append((done - began) * 1e6)
    cached = []
    for _ in range(calls):  # the common case: the model has not changed since the jobs were predicted
        began = time.perf_counter()
        policy.choose(snapshot(queue, predictor.predict(queue)))
        cached.append((time.perf_counter() - began) * 1e6)
    ready = snapshot(queue, predictor.predict(queue))
    alone = []
    for _ in range(calls):  # the policy's decision by itself, on a snapshot already built
        began = time.perf_counter()
        policy.choose(ready)
        alone.append((time.perf_counter() - began) * 1e6)
    estimator = warmed_estimator(rng)
    announce(estimator, queue)
    decision = policy.choose(tail_snapshot(queue, predictor.predict(queue), estimator))
    if decision.reason != TAIL:
        raise RuntimeError(f"the measured tail decision is {decision.reason!r}, not {TAIL!r}")
    tail_cold: list[float] = []
    tail_after: list[float] = []
    tail_warm: list[float] = []
    for _ in range(calls):
        estimator._forget_all()  # type: ignore[attr-defined]  # worst case: the whole chain recomputed
        began = time.perf_counter()
        policy.choose(tail_snapshot(queue, predictor.predict(queue), estimator))
        tail_cold.append((time.perf_counter() - began) * 1e6)
    trajectory = 300
    while len(tail_after) < calls:  # the usual case: a decision right after a job finished
        trajectory += 1
        for event in trajectory_events(rng, f"w{trajectory}", 10 * trajectory):
            estimator(event)
            if isinstance(event, CpuFinished):
                began = time.perf_counter()
                policy.choose(tail_snapshot(queue, predictor.predict(queue), estimator))
                tail_after.append((time.perf_counter() - began) * 1e6)
    for _ in range(calls):
        began = time.perf_counter()
        policy.choose(tail_snapshot(queue, predictor.predict(queue), estimator))
        tail_warm.append((time.perf_counter() - began) * 1e6)
    refits = []
    for i in range(REFITS):
        predictor.observe(JobView(5000 + i, "r", "tool", "crunch", 0, 0.0, arg_bytes=100), 0.1)
        began = time.perf_counter()
        predictor._refit()  # the refit alone is what this measures
        refits.append((time.perf_counter() - began) * 1e6)
    return (
        statistics.median(choose),
        statistics.median(predict_only),
        statistics.median(refits),
        statistics.median(cached),
        statistics.median(alone),
        statistics.median(tail_cold),
        statistics.median(tail_warm),
        statistics.median(tail_after),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=number_arg(int, 1, 1000), default=5)
    args = parser.parse_args()
    warm_import()
    runs = [one_repeat(seed) for seed in range(args.repeats)]
    print(f"machine: {machine()}")
    print(
        f"{args.repeats} repeats (seeds 0–{args.repeats - 1}) of {CALLS} timed calls per measure ({REFITS} "
        f"refits); {QUEUED} queued jobs, a predictor warmed on 500 observations, the rule `asyncroll`"
    )
    print("| measure (µs, median of calls) | min | median | max | target |\n|---|---:|---:|---:|---:|")
    for name, index, target in (
        ("predict 64 jobs + choose(), nothing cached (after a refit)", 0, "≤ 100"),
        ("predict 64 jobs + choose(), predictions cached", 3, "≤ 100"),
        ("choose() alone (64 jobs, scored)", 4, "≤ 100"),
        ("tail: 64 remaining-work estimates + choose(), right after a job finished", 7, "≤ 100"),
        ("tail: 64 remaining-work estimates + choose(), the whole chain recomputed", 5, "≤ 100"),
        ("tail: 64 remaining-work estimates + choose(), estimates memoised", 6, "≤ 100"),
        ("predict 64 jobs alone", 1, ""),
        ("predictor refit (window of 550 observations)", 2, ""),
    ):
        lo, mid, hi = quantiles([r[index] for r in runs])
        print(f"| {name} | {lo:.1f} | {mid:.1f} | {hi:.1f} | {target} |")


if __name__ == "__main__":
    run_main("bench.decision", main)
