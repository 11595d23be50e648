"""The pressure-aware rules and their predictor in the real runtime on a virtual clock: the mechanism
fires on the synthetic workload, the tail's rules take over, what the running jobs have left, timeouts
in the fit, features that never read declared results, and the dispatcher's table of running jobs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from asyncroll.events import CpuSelected
from asyncroll.policies import JobView, Prediction, QueueSnapshot, get_policy
from asyncroll.policies.predictor import DurationPredictor
from asyncroll.policies.registry import PRESSURE_POLICIES
from bench import synthetic
from tests.conftest import VirtualRun
from tests.pressure_policies import BALANCED


def _synthetic(n: int) -> tuple[list[dict[str, object]], dict[str, str]]:
    return synthetic.make(n, 400.0, 500.0, 3), {synthetic.TOOLS_FILE: synthetic.TOOLS_SOURCE}


def test_mechanism_fires_on_the_synthetic_workload(virtual_run: VirtualRun) -> None:
    problems, files = _synthetic(120)
    outcome, cap, _ = virtual_run(
        problems,
        simulate_tools=True,
        tool_files=files,
        policy="asyncroll",
        max_active_trajectories=8,
        max_inflight_model_requests=4,
        cpu_workers=2,
        max_turns=6,
    )
    assert outcome.summary is not None
    sched = outcome.summary["scheduler"]
    assert sched["eligible_decisions"] >= 0.2 * sched["decisions"]
    assert sched["reorders"] >= 10
    assert sched["prediction"]["pearson_log"] >= 0.7
    selected = cap.of(CpuSelected)
    # honest flags: an eligible decision is never a hard-aging pick, a reorder is logged as such
    assert all(not (e.eligible and e.reason == "hard_starvation_fifo") for e in selected)
    assert all(e.reordered == (e.job_id != e.oldest_job_id) for e in selected)
    assert all(e.threshold == 4 and e.predicted_s and len(e.candidates) <= 8 for e in selected)
    assert selected[0].observations == 0 and selected[0].prediction_source == "prior"


def test_predictions_are_logged_under_fifo_and_reset_per_run(virtual_run: VirtualRun) -> None:
    problems, files = _synthetic(30)
    for _ in range(2):
        outcome, cap, _ = virtual_run(
            problems, simulate_tools=True, tool_files=files, policy="fifo", max_turns=6
        )
        selected = cap.of(CpuSelected)
        assert selected[0].prediction_source == "prior" and selected[0].observations == 0
        assert all(not e.reordered and e.predicted_s for e in selected)
        assert outcome.summary is not None and outcome.summary["scheduler"]["prediction"]["pairs"] > 0


def test_hard_aging_in_the_runtime(virtual_run: VirtualRun) -> None:
    problems, files = _synthetic(60)
    outcome, cap, _ = virtual_run(
        problems,
        simulate_tools=True,
        tool_files=files,
        policy="asyncroll_seed",  # absolute aging only (the unlock rule also ages relative to the queue)
        aging_seconds=0.5,
        max_active_trajectories=16,
        cpu_workers=1,
        max_turns=6,
    )
    aged = [e for e in cap.of(CpuSelected) if e.reason == "hard_starvation_fifo"]
    # an aged pick is the oldest job (the oldest has waited longest), never counted as an eligible reorder
    assert aged and all(not e.eligible and not e.reordered and e.waited_s >= 0.5 for e in aged)
    assert all(e.job_id == e.oldest_job_id for e in aged)
    assert outcome.summary is not None and outcome.summary["counts"]["completed"] == 60


@pytest.mark.parametrize("policy", PRESSURE_POLICIES)
def test_pressure_policies_complete_everything(virtual_run: VirtualRun, policy: str) -> None:
    problems, files = _synthetic(40)
    outcome, _, _ = virtual_run(problems, simulate_tools=True, tool_files=files, policy=policy, max_turns=6)
    assert outcome.summary is not None and outcome.summary["counts"]["completed"] == 40


def test_the_critical_rule_takes_over_in_the_runtime_tail(virtual_run: VirtualRun) -> None:
    """In a real (virtual-clock) run the tail's decisions use the remaining-work estimates the run learned
    from its own events; before the tail none does."""
    problems, files = _synthetic(60)
    outcome, cap, _ = virtual_run(
        problems,
        simulate_tools=True,
        tool_files=files,
        policy="asyncroll_critical",
        max_active_trajectories=16,
        cpu_workers=1,
        max_turns=6,
    )
    assert outcome.summary is not None and outcome.summary["counts"]["completed"] == 60
    selected = cap.of(CpuSelected)
    tail = [e for e in selected if e.reason == "tail_critical_path"]
    assert tail and all(e.eligible for e in tail)
    assert any(e.reordered for e in tail)
    first_tail = selected.index(tail[0])
    assert all(e.reason != "tail_critical_path" for e in selected[:first_tail])
    # the estimates the tail decided on are logged, for the chosen job and every candidate; none before
    assert all(e.remaining_s is None for e in selected[:first_tail])
    assert all(c.remaining_s is None for e in selected[:first_tail] for c in e.candidates)
    assert all(e.candidates and e.candidates[0].remaining_s is not None for e in tail if e.remaining_s)
    chosen = [e for e in tail if e.reordered and e.remaining_s is not None]
    assert chosen and all(
        e.remaining_s >= max(c.remaining_s or 0.0 for c in e.candidates) for e in chosen
    )  # the critical pick has the most work after it among the logged candidates
    assert outcome.summary["scheduler"]["reasons"]["tail_critical_path"] == len(tail)


def test_the_balanced_rule_weighs_what_the_running_jobs_have_left(
    virtual_run: VirtualRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dispatcher tells the policy, in the tail, the predicted seconds the running jobs still have
    (Σ max(0, predicted − time since selected), recomputed here from the run's own cpu_selected and
    cpu_finished events), and the straggler guard fires in a real (virtual-clock) run with two workers."""
    from asyncroll.runtime import assembly

    seen: list[QueueSnapshot] = []

    class Spy:
        name = "asyncroll_balanced"

        def choose(self, snapshot: QueueSnapshot) -> Any:
            seen.append(snapshot)
            return BALANCED.choose(snapshot)

    monkeypatch.setattr(assembly, "get_policy", lambda *a, **k: Spy())
    problems, files = _synthetic(80)
    outcome, cap, _ = virtual_run(
        problems,
        simulate_tools=True,
        tool_files=files,
        policy="asyncroll",
        max_active_trajectories=16,
        max_inflight_model_requests=8,
        cpu_workers=2,
        max_turns=6,
    )
    assert outcome.summary is not None and outcome.summary["counts"]["completed"] == 80
    from asyncroll.events import CpuFailed, CpuFinished

    selected = cap.of(CpuSelected)
    assert len(seen) == len(selected)
    snapshots = dict(zip((id(e) for e in selected), seen, strict=True))
    running: dict[int, tuple[float, float]] = {}  # job → (selected at, predicted s)
    checked = tails = 0
    for event in cap.events:
        if isinstance(event, CpuFinished | CpuFailed):
            running.pop(event.job_id, None)
        elif isinstance(event, CpuSelected):
            snapshot = snapshots[id(event)]
            if snapshot.remaining:  # the tail: the dispatcher weighed the running jobs
                expected = sum(max(0.0, p - (snapshot.now - t)) for t, p in running.values())
                assert snapshot.running_left == pytest.approx(expected, abs=1e-5)
                assert event.running_left_s == round(snapshot.running_left, 6)  # logged with the decision
                checked += expected > 0
                tails += 1
            else:
                assert snapshot.running_left == 0.0 and event.running_left_s is None
            assert event.predicted_s is not None  # the pressure policies predict every job they select
            running[event.job_id] = (snapshot.now, event.predicted_s)
    assert tails and checked  # some tail decisions saw running work
    reasons = outcome.summary["scheduler"]["reasons"]
    assert reasons.get("tail_straggler_longest", 0) > 0 and reasons.get("tail_critical_path", 0) > 0


def test_what_the_running_jobs_have_left_is_capped_at_the_tool_timeout(
    virtual_run: VirtualRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A running job is stopped at the tool timeout, so it cannot have more left than the timeout minus
    the time it has run, however long it was predicted (predictions go up to 60 s): the straggler guard
    must not wait for work that cannot happen."""
    from asyncroll.runtime import assembly

    seen: list[QueueSnapshot] = []

    class Spy:
        name = "asyncroll_balanced"

        def choose(self, snapshot: QueueSnapshot) -> Any:
            seen.append(snapshot)
            return BALANCED.choose(snapshot)

    def predict_long(self: DurationPredictor, jobs: Any) -> list[Prediction]:
        return [Prediction(50.0, "ridge") for _ in jobs]

    monkeypatch.setattr(assembly, "get_policy", lambda *a, **k: Spy())
    # every prediction the dispatcher gets, however it asks (``predict`` or ``update``)
    monkeypatch.setattr(DurationPredictor, "_compute", predict_long)
    problems, files = _synthetic(24)
    outcome, _, _ = virtual_run(
        problems,
        simulate_tools=True,
        tool_files=files,
        policy="asyncroll",
        max_active_trajectories=16,
        max_inflight_model_requests=8,
        cpu_workers=2,
        max_turns=6,
        tool_timeout=5.0,
    )
    assert outcome.summary is not None and outcome.summary["counts"]["completed"] == 24
    tail = [s for s in seen if s.remaining]
    assert tail and any(s.running_left > 0 for s in tail)
    assert all(p.seconds == 50.0 for s in seen for p in s.predictions)  # the long predictions were read
    # one worker runs a job while the other decides: at most one timeout's worth left
    assert all(s.running_left <= 5.0 + 1e-9 for s in tail)


def test_timeouts_enter_the_fit_in_the_runtime(virtual_run: VirtualRun) -> None:
    """A timed-out job is observed censored at the timeout by the dispatcher: the next job is predicted
    from it (not from the prior, as it would be if the slowest jobs were dropped)."""
    from asyncroll.events import CpuFailed
    from tests.conftest import tool_problem

    problems = [tool_problem("slow", model_ms=1, cpu_ms=5000), tool_problem("next", model_ms=2, cpu_ms=10)]
    outcome, cap, _ = virtual_run(problems, policy="fifo", cpu_workers=1, tool_timeout=1.0)
    assert outcome.status == "complete" and [e.reason for e in cap.of(CpuFailed)] == ["timeout"]
    after = next(e for e in cap.of(CpuSelected) if e.id == "next")
    assert after.observations == 1 and after.prediction_source == "ridge"
    assert after.predicted_s > 0.5  # pulled from the 0.1 s prior toward the 1 s timeout


def test_features_never_read_declared_results_or_expected_outputs(
    virtual_run: VirtualRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script's declared ``cpu_ms`` and ``passes`` and the tests' expected outputs (simulation-only or
    hidden) must not reach the predictor's features: the same jobs give the same rows without them."""
    import copy

    import asyncroll.policies.predictor as predictor
    from tests.test_one_repair import _code_problem

    def rows(problems: list[dict[str, Any]]) -> dict[tuple[str, bool], list[float]]:
        seen: dict[tuple[str, bool], list[float]] = {}  # by job: (problem, repair); job ids follow timing
        real = predictor.features

        def record(job: JobView, bucket: int | None = None) -> list[float]:
            row = seen[(job.trajectory_id, job.resubmission)] = real(job, bucket)
            return row

        with monkeypatch.context() as patch:
            patch.setattr(predictor, "features", record)
            outcome, _, _ = virtual_run(
                problems, policy="asyncroll", cpu_workers=1, max_active_trajectories=4
            )
        assert outcome.status == "complete"
        return seen

    plain = [_code_problem(f"p{i}", [False, True]) for i in range(6)]
    loaded = copy.deepcopy(plain)
    for i, problem in enumerate(loaded):
        for action in problem["script"]:
            action["cpu_ms"] = 40 * (i + 1) ** 2
        problem["script"][-1]["passes"] = False  # the last generation: the same path either way
        for test in problem["metadata"]["reference_tests"]:
            test["output"] = "x" * 1000 * (i + 1)
    first = rows(plain)
    assert len(first) == 12 and first == rows(loaded)


def test_every_way_a_job_leaves_its_worker_clears_what_it_had_left() -> None:
    """The straggler guard weighs what the running jobs have left (the dispatcher's slot → (selected at,
    predicted) table): an entry left behind by a job that is gone would count forever (the guard would
    never fire again). A job leaves its worker by finishing, by failing (a tool error), by a timeout (the
    worker replaced), by a stop while it runs, and by a stop in the same loop step as it was handed a
    worker; after each, no entry is left."""
    import asyncio

    from asyncroll.clock import VirtualClock
    from asyncroll.event_log import EventLog
    from asyncroll.events import CpuStarted
    from asyncroll.runtime.dispatcher import CpuDispatcher
    from asyncroll.runtime.jobs import JobSpec
    from asyncroll.runtime.model_gate import ModelGate
    from asyncroll.runtime.pool import WorkerPool
    from asyncroll.runtime.virtual_worker import VirtualWorker

    clock = VirtualClock()

    def job(ms: float, tool: str = "sleep_ms") -> JobSpec:
        return JobSpec("t", "tool", tool, {"milliseconds": ms}, 0)

    async def stopped(task: asyncio.Task[Any]) -> None:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def scenario() -> dict[str, dict[int, tuple[float, float]]]:
        events = EventLog(clock)
        events.start_measurement()
        pool = WorkerPool(2, lambda i, g: VirtualWorker(i, g, clock), clock, events)
        gate = ModelGate(1, clock, events)
        dispatcher = CpuDispatcher(pool, get_policy("asyncroll"), gate, clock, events, tool_timeout=1.0)
        left: dict[str, dict[int, tuple[float, float]]] = {}
        async with asyncio.TaskGroup() as tg:
            await pool.start(tg)
            assert (await dispatcher.run(job(10))).ok
            left["finished"] = dict(dispatcher._running)
            assert not (await dispatcher.run(job(1, tool="no_such_tool"))).ok
            left["tool error"] = dict(dispatcher._running)
            assert (await dispatcher.run(job(5000))).failure == "timeout"
            left["timeout"] = dict(dispatcher._running)
            await clock.sleep(0.1)  # the replacement starts
            running = asyncio.create_task(dispatcher.run(job(500)))
            await clock.sleep(0.1)
            assert len(dispatcher._running) == 1  # it holds a worker
            await stopped(running)
            left["stopped while running"] = dict(dispatcher._running)
            await clock.sleep(0.1)
            # both workers busy, a third job waits; the first to finish hands it a worker, and the run
            # stops it in that same loop step (before its task runs again)
            busy = [asyncio.create_task(dispatcher.run(job(ms))) for ms in (200, 300)]
            await clock.sleep(0.01)
            waiting = asyncio.create_task(dispatcher.run(job(50)))
            await clock.sleep(0.01)
            loop = asyncio.get_running_loop()
            handed: list[int] = []

            def on_started(event: Any) -> None:
                if isinstance(event, CpuStarted) and event.job_id == 7:
                    handed.append(event.job_id)
                    loop.call_soon(waiting.cancel)  # runs before the task wakes with its worker

            events.subscribe(on_started)
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert handed == [7]
            await asyncio.gather(*busy)
            left["stopped as handed a worker"] = dict(dispatcher._running)
            await pool.aclose()
        return left

    left = clock.run(scenario())
    assert len(left) == 5 and all(entries == {} for entries in left.values()), left


@pytest.mark.parametrize(
    ("policy", "reads", "aging_s"),
    [("fifo", False, 30.0), ("tool_first", False, 30.0), ("asyncroll", True, 30.0), ("asyncroll", True, 0.0)],
    ids=["fifo", "tool_first", "asyncroll", "asyncroll-hard-aging"],
)
def test_only_a_policy_that_reads_the_tail_estimates_gets_every_queued_job_estimated(
    policy: str, reads: bool, aging_s: float
) -> None:
    """In the batch's tail the dispatcher estimated the remaining work of every queued job at every
    decision, for every policy (so that FIFO logs them too): with thousands queued that was most of a
    simulation's CPU. A policy that never reads them gets none, and only the jobs its decision logs (its
    own job and the candidates) are estimated, to the same values. A policy that reads them has them made
    at its first read, in one call over the queue: a decision that reads none (a single job queued; hard
    aging, which with every problem admitted at once decided most of them) made none, and its logged jobs
    are estimated one by one, to the same values."""
    import asyncio

    from asyncroll.clock import VirtualClock
    from asyncroll.event_log import EventLog
    from asyncroll.events import MAX_CANDIDATES
    from asyncroll.runtime.dispatcher import CpuDispatcher
    from asyncroll.runtime.jobs import JobSpec
    from asyncroll.runtime.model_gate import ModelGate
    from asyncroll.runtime.pool import WorkerPool
    from asyncroll.runtime.virtual_worker import VirtualWorker
    from tests.conftest import EventCapture

    clock, capture = VirtualClock(), EventCapture()
    calls = [0, 0]  # estimates made; estimate_queue calls

    class Estimator:
        observations = 0

        def estimate(self, job: JobView, predicted: float | None = None) -> float | None:
            calls[0] += 1
            return job.job_id / 8  # exact in binary: logged as is

        def estimate_queue(
            self, jobs: Sequence[JobView], predicted: Sequence[float]
        ) -> tuple[float | None, ...]:
            calls[1] += 1
            return tuple(self.estimate(job, seconds) for job, seconds in zip(jobs, predicted, strict=True))

        def __call__(self, event: object) -> None:
            pass

    chosen = get_policy(policy, aging_seconds=aging_s)
    seen: list[int] = []  # estimates in each snapshot
    made: list[bool] = []  # whether the decision read (and so made) them

    class Watching:
        name = chosen.name
        reads_remaining = getattr(chosen, "reads_remaining", True)

        def choose(self, snapshot: QueueSnapshot) -> Any:
            seen.append(len(snapshot.remaining))
            decision = chosen.choose(snapshot)
            made.append(getattr(snapshot.remaining, "made", False))
            return decision

    async def main() -> None:
        events = EventLog(clock)
        events.subscribe(capture)
        pool = WorkerPool(1, lambda index, generation: VirtualWorker(index, generation, clock), clock, events)
        gate = ModelGate(4, clock, events)
        tail = {"remaining": Estimator(), "admission_pending": lambda: False}
        dispatcher = CpuDispatcher(pool, Watching(), gate, clock, events, 30, **tail)  # type: ignore[arg-type]
        events.start_measurement()
        async with asyncio.TaskGroup() as tg:
            await pool.start(tg)
            spec = JobSpec("t", "tool", "sleep_ms", {"milliseconds": 5}, 0)
            jobs = [tg.create_task(dispatcher.run(spec)) for _ in range(20)]
            for task in jobs:
                assert (await task).ok
            await pool.aclose()

    clock.run(main())
    depths = [e.queue_depth for e in capture.of(CpuSelected)]
    assert len(seen) == len(depths) == 20 and max(depths) > 2 * MAX_CANDIDATES
    one_by_one = [1 + min(n, MAX_CANDIDATES) for n in depths]  # the decision's own job and the candidates
    if reads:  # every queued job where the policy read them (and nothing more: the logged ones are those)
        each = [n if m else k for n, m, k in zip(depths, made, one_by_one, strict=True)]
        assert seen == depths and calls[0] == sum(each)
        assert calls[1] == sum(made) and any(made) == (aging_s > 0) and not made[0]  # made[0]: one job queued
    else:
        assert set(seen) == {0} and calls[0] == sum(one_by_one) and calls[1] == 0
    for event in capture.of(CpuSelected):
        assert event.remaining_s == event.job_id / 8
        assert [c.remaining_s for c in event.candidates] == [c.job_id / 8 for c in event.candidates]
    assert max(len(e.candidates) for e in capture.of(CpuSelected)) == MAX_CANDIDATES


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("policy", "reads"), [("fifo", False), ("tool_first", False), ("asyncroll", True)])
def test_a_decision_predicts_only_the_jobs_queued_since_the_last_one(policy: str, reads: bool) -> None:
    """The predictor caches each queued job's prediction until the model changes, but the dispatcher had
    it look up every queued job twice at every decision (which ones lack a prediction, then all of them,
    for the snapshot): O(queue) per decision whatever the policy, with thousands queued a third of a
    simulation's CPU. The dispatcher now keeps the queue's predictions and has only the newly queued jobs
    predicted (while the model does not change, as here: this predictor learns nothing); a policy that
    never reads them (fifo, tool_first) gets none, and the logged ones are the same."""
    import asyncio

    from asyncroll.clock import VirtualClock
    from asyncroll.event_log import EventLog
    from asyncroll.runtime.dispatcher import CpuDispatcher
    from asyncroll.runtime.jobs import JobSpec
    from asyncroll.runtime.model_gate import ModelGate
    from asyncroll.runtime.pool import WorkerPool
    from asyncroll.runtime.virtual_worker import VirtualWorker
    from tests.conftest import EventCapture

    lookups = [0]  # the predictor's per-job cache operations

    class Counting(dict[int, Prediction]):
        def __contains__(self, key: object) -> bool:
            lookups[0] += 1
            return super().__contains__(key)

        def __getitem__(self, key: int) -> Prediction:
            lookups[0] += 1
            return super().__getitem__(key)

    class Still(DurationPredictor):
        """Learns nothing: the model, and so every prediction made, never changes."""

        def observe(self, job: JobView, seconds: float, *, censored: bool = False) -> None:
            self.forget(job)

    predictor = Still()
    predictor._cache = Counting()
    clock, capture = VirtualClock(), EventCapture()
    chosen = get_policy(policy)
    seen: list[int] = []  # predictions in each snapshot

    class Watching:
        name = chosen.name
        reads_remaining = getattr(chosen, "reads_remaining", True)
        reads_predictions = getattr(chosen, "reads_predictions", True)

        def choose(self, snapshot: QueueSnapshot) -> Any:
            seen.append(len(snapshot.predictions))
            return chosen.choose(snapshot)

    n = 200
    grades = {i for i in range(n) if i % 3 == 0}  # tool_first reorders: grade jobs go last

    async def main() -> None:
        events = EventLog(clock)
        events.subscribe(capture)
        pool = WorkerPool(1, lambda index, generation: VirtualWorker(index, generation, clock), clock, events)
        gate = ModelGate(4, clock, events)
        dispatcher = CpuDispatcher(pool, Watching(), gate, clock, events, 30, predictor=predictor)  # type: ignore[arg-type]
        events.start_measurement()
        async with asyncio.TaskGroup() as tg:
            await pool.start(tg)
            specs = [
                JobSpec(f"t{i}", "grade" if i in grades else "tool", "sleep_ms", {"milliseconds": 5}, 0)
                for i in range(n)
            ]
            jobs = [tg.create_task(dispatcher.run(spec)) for spec in specs]
            for task in jobs:
                assert (await task).ok
            await pool.aclose()

    clock.run(main())
    depths = [e.queue_depth for e in capture.of(CpuSelected)]
    assert len(depths) == n and max(depths) >= n - 1
    # each job predicted once and read back once (it was 2 × the queue at each decision: ~40,000 here)
    assert lookups[0] <= 3 * n, lookups[0]
    assert seen == (depths if reads else [0] * n)
    for event in capture.of(CpuSelected):
        assert event.predicted_s == 0.1 and event.prediction_source == "prior"
        assert all(c.predicted_s == 0.1 and c.source == "prior" for c in event.candidates)
    if policy == "tool_first":
        assert sum(e.reordered for e in capture.of(CpuSelected)) > 0
