"""The chain rule's remaining-work estimate (:class:`StepwiseWork`): learned step by step, from each job's
key to its trajectory's next job, so it knows a repair follows before any trajectory with one finishes."""

from __future__ import annotations

import random
from typing import Any

import pytest

from asyncroll.events import (
    CpuEnqueued,
    CpuFailed,
    CpuFinished,
    CpuSelected,
    Event,
    ModelFailed,
    ModelFinished,
    TrajectoryFinished,
)
from asyncroll.policies import JobView, get_policy
from asyncroll.policies.base import JobKind
from asyncroll.policies.pressure import PressurePolicy
from asyncroll.policies.registry import estimator_for
from asyncroll.policies.remaining import RemainingWork, StepwiseWork
from bench import synthetic
from tests.conftest import VirtualRun

FIRST = JobView(1, "x", "tool", "crunch", 0, 0.0)
REPAIR = JobView(2, "x", "tool", "crunch", 1, 0.0, resubmission=True)
GRADE = JobView(3, "x", "grade", "__grade__", 2, 0.0)


class Script:
    """Feeds hand-made events of one trajectory to every estimator given."""

    def __init__(self, tid: str, *estimators: Any) -> None:
        self.tid, self.estimators, self.next_id = tid, estimators, 0

    def _emit(self, event: Any) -> None:
        for estimator in self.estimators:
            estimator(event)

    def model(self, turn: int, seconds: float) -> None:
        self._emit(ModelFinished(id=self.tid, request_id=turn, turn=turn, latency_s=seconds, action="tool"))

    def job(self, turn: int, seconds: float, *, resub: bool = False, failed: bool = False) -> None:
        self.next_id += 1
        kind: JobKind = "grade" if turn == 2 else "tool"
        fields: dict[str, Any] = {
            "id": self.tid,
            "job_id": hash((self.tid, self.next_id)) % 10**9,
            "kind": kind,
            "tool": "__grade__" if kind == "grade" else "crunch",
        }
        self._emit(CpuEnqueued(**fields, turn=turn, arg_bytes=1, queue_depth=1, resubmission=resub))
        if failed:  # a timed-out job counts at its round trip
            self._emit(
                CpuFailed(**fields, worker=0, reason="timeout", roundtrip_s=seconds, error="timed out")
            )
        else:
            self._emit(
                CpuFinished(**fields, worker=0, ok=True, execute_s=seconds, cpu_s=None, roundtrip_s=seconds)
            )

    def finish(self) -> None:
        self._emit(TrajectoryFinished(id=self.tid, status="completed", turns=3, tool_calls=2, duration_s=9.0))


def _whole(tid: str, repair: bool, *estimators: Any) -> Script:
    s = Script(tid, *estimators)
    s.model(0, 0.4)
    s.job(0, 0.3)  # the first evaluation
    if repair:
        s.model(1, 0.4)
        s.job(1, 1.0, resub=True, failed=True)
    s.model(2, 0.2)
    s.job(2, 0.0)  # the grade
    s.finish()
    return s


def test_the_chain_gives_the_expected_service_after_each_key() -> None:
    """From finished trajectories the chain's expectation equals the per-trajectory mean on this example:
    after the first evaluation half go on to a repair (0.4 s model + 1.0 s + 0.2 s model + the grade),
    half straight to the grade (0.2 s model): 0.9 s."""
    chain, means = StepwiseWork(min_transitions=1), RemainingWork()
    assert chain.estimate(FIRST) is None
    _whole("a", True, chain, means)
    _whole("b", False, chain, means)
    assert chain.estimate(FIRST) == pytest.approx(0.5 * (0.4 + 1.0 + 0.2) + 0.5 * 0.2)
    assert means.estimate(FIRST) == pytest.approx(0.9)
    assert chain.estimate(REPAIR) == pytest.approx(0.2)
    assert chain.estimate(GRADE) == pytest.approx(0.0)  # the grade ends its trajectory


def test_the_chain_learns_a_repair_before_its_trajectory_finishes() -> None:
    """A trajectory whose first evaluation failed queues its repair one model turn later: the chain counts
    that at once, the per-trajectory means only when the trajectory ends (on a small batch, the end)."""
    chain, means = StepwiseWork(min_transitions=1), RemainingWork()
    _whole("a", True, chain, means)
    _whole("b", False, chain, means)
    c = Script("c", chain, means)
    c.model(0, 0.4)
    c.job(0, 0.3)
    c.model(1, 0.4)
    c.job(1, 1.0, resub=True)  # queued and run; the trajectory has not finished
    assert means.estimate(FIRST) == pytest.approx(0.9)  # unchanged until c finishes
    # from the first evaluation: a repair 2 of 3 times (0.4 s model + 1.0 s mean + 0.2 s after it)
    assert chain.estimate(FIRST) == pytest.approx(2 / 3 * (0.4 + 1.0 + 0.2) + 1 / 3 * 0.2)


def test_the_chain_waits_for_enough_transitions_and_survives_a_key_that_repeats() -> None:
    """No estimate after a key until ``min_transitions`` were seen from it (one early trajectory must not
    steer the tail); a job whose next job has the same key (two calls in one turn: made by hand here, the
    runtime runs one job per turn) ends the walk; a next key never seen to finish counts at the mean
    execute time of every finished job."""
    chain = StepwiseWork()  # the default: 3 transitions
    _whole("a", True, chain)
    _whole("b", False, chain)
    assert chain.estimate(FIRST) is None
    _whole("c", False, chain)
    # the repair's own key has 1 transition from it: nothing known after it yet, counted 0
    assert chain.estimate(FIRST) == pytest.approx(1 / 3 * (0.4 + 1.0) + 2 / 3 * 0.2)
    assert chain.estimate(REPAIR) is None
    loop = StepwiseWork(min_transitions=1)
    s = Script("d", loop)
    s.model(0, 0.1)
    s.job(0, 0.5)
    s.job(0, 0.7)  # the same key again, no model turn between
    s.model(1, 0.3)
    s.finish()
    # from the key: half the time itself again (0 model, its 0.6 s mean, then nothing more counted on
    # that loop), half the end (0.3 s model)
    assert loop.estimate(FIRST) == pytest.approx(0.5 * 0.6 + 0.5 * 0.3)
    unseen = StepwiseWork(min_transitions=1)
    s = Script("e", unseen)
    s.model(0, 0.1)
    s.job(0, 0.5)
    s.model(1, 0.2)
    unseen(CpuEnqueued(id="e", job_id=99, kind="tool", tool="crunch", turn=1, arg_bytes=1, queue_depth=1))
    assert unseen.estimate(FIRST) == pytest.approx(0.2 + 0.5)  # the next job at the mean of all (0.5 s)


def test_the_repair_rule_counts_a_first_evaluations_repair_at_its_own_predicted_time() -> None:
    """With ``own_repair`` the repair after a first evaluation counts at the job's own predicted time
    (2.0 s here) instead of the mean repair (1.0 s): a long first evaluation has a long repair ahead. A
    repair's own estimate, a grade's, and the chain rule's (no ``own_repair``) are unchanged."""
    repair, chain, means = StepwiseWork(1, own_repair=True), StepwiseWork(1), RemainingWork()
    _whole("a", True, repair, chain, means)
    _whole("b", False, repair, chain, means)
    mean = 0.5 * (0.4 + 1.0 + 0.2) + 0.5 * 0.2
    assert repair.estimate(FIRST) == pytest.approx(mean)  # no prediction given: the chain's
    assert repair.estimate(FIRST, 2.0) == pytest.approx(mean + 0.5 * (2.0 - 1.0))
    assert repair.estimate(FIRST, 0.1) == pytest.approx(mean + 0.5 * (0.1 - 1.0))
    assert repair.estimate(REPAIR, 2.0) == pytest.approx(0.2)
    assert repair.estimate(GRADE, 2.0) == pytest.approx(0.0)
    assert chain.estimate(FIRST, 2.0) == pytest.approx(mean)
    assert means.estimate(FIRST, 2.0) == pytest.approx(0.9)


def test_the_repair_rules_memoised_repairs_follow_every_new_observation() -> None:
    """The repairs after a key are memoised between observations (``estimate`` runs for every queued job
    at every decision in the tail); a new repair, or a new execute time, must show at once."""
    repair = StepwiseWork(1, own_repair=True)
    _whole("a", True, repair)
    _whole("b", False, repair)
    before = repair.estimate(FIRST, 2.0)
    assert before == repair.estimate(FIRST, 2.0)  # memoised: the same value
    s = Script("c", repair)  # a third trajectory, with a 3 s repair: the mean repair is now 2 s
    s.model(0, 0.4)
    s.job(0, 0.3)
    s.model(1, 0.4)
    s.job(1, 3.0, resub=True)
    chain = repair.estimate(FIRST)
    assert chain is not None
    # 2 of 3 first evaluations were followed by a repair, of mean execute time 2.0 s
    assert repair.estimate(FIRST, 2.0) == pytest.approx(chain + 2 / 3 * (2.0 - 2.0))
    assert repair.estimate(FIRST, 5.0) == pytest.approx(chain + 2 / 3 * (5.0 - 2.0))
    assert repair.estimate(FIRST, 2.0) != before


def test_each_rule_reads_its_own_estimator_and_other_policies_log_the_defaults() -> None:
    for rule, own in (("asyncroll_chain", False), ("asyncroll_repair", True)):
        estimator = estimator_for(rule)
        assert isinstance(estimator, StepwiseWork) and estimator._own_repair is own
    for rule in ("asyncroll_critical", "asyncroll_balanced"):
        assert type(estimator_for(rule)) is RemainingWork
    default = get_policy("asyncroll")
    assert default.name == "asyncroll_repair"
    for other in ("fifo", "tool_first", "sync", "asyncroll_seed"):
        logged = estimator_for(other)
        assert isinstance(logged, StepwiseWork) and logged._own_repair  # the default's
    chain = get_policy("asyncroll_chain")
    assert isinstance(chain, PressurePolicy) and chain.critical_path and chain.unlock
    assert chain.drain_multiple is None and not chain.straggler


@pytest.mark.parametrize("policy", ["asyncroll_chain", "asyncroll_repair"])
def test_a_chain_rule_run_decides_its_tail_on_the_chains_estimates(
    virtual_run: VirtualRun, policy: str
) -> None:
    """In a real (virtual-clock) run of a chain rule, every estimate logged at a tail decision (each
    candidate's ``remaining_s``) is what a chain fed the run's own events up to that decision gives (the
    repair rule's with each candidate's logged prediction standing for its repair's), and the tail is
    ordered by it."""
    problems, files = synthetic.make(40, 400.0, 500.0, 3), {synthetic.TOOLS_FILE: synthetic.TOOLS_SOURCE}
    outcome, cap, _ = virtual_run(
        problems,
        simulate_tools=True,
        tool_files=files,
        policy=policy,
        max_active_trajectories=16,
        max_inflight_model_requests=4,
        cpu_workers=2,
        max_turns=6,
    )
    assert outcome.summary is not None and outcome.summary["counts"]["completed"] == 40
    own = policy == "asyncroll_repair"
    chain, views, checked, differ = StepwiseWork(own_repair=own), {}, 0, 0
    for event in cap.events:
        if isinstance(event, CpuEnqueued):
            views[event.job_id] = JobView(
                event.job_id, event.id or "", event.kind, event.tool, event.turn, 0.0,
                resubmission=event.resubmission,
            )  # fmt: skip
        elif isinstance(event, CpuSelected) and event.reason == "tail_critical_path":
            for candidate in event.candidates:
                view = views[candidate.job_id]
                expected = chain.estimate(view, candidate.predicted_s)
                assert candidate.remaining_s == (
                    None if expected is None else pytest.approx(expected, abs=1e-5)
                )
                checked += expected is not None
                differ += expected is not None and expected != chain.estimate(view)
            if event.reordered and event.remaining_s is not None:  # the pick has the most work after it
                assert event.remaining_s >= max(c.remaining_s or 0.0 for c in event.candidates)
        chain(event)
    assert checked > 20
    assert (differ > 0) is own  # the repair rule's estimates are its own, not the chain's
    reasons = outcome.summary["scheduler"]["reasons"]
    assert reasons.get("tail_critical_path", 0) > 0


def _random_stream(seed: int, trajectories: int = 60) -> list[Any]:
    """Events of ``trajectories`` interleaved trajectories, as a run emits them: per trajectory a job per
    turn (turns only increase), a model turn between, a resubmission of a tool already run, some jobs
    failed, some not yet finished when the next trajectory's events come."""
    rng = random.Random(seed)
    tools = ("crunch", "lookup", "search")
    scripts: list[list[Any]] = []
    job_id = 0
    for i in range(trajectories):
        tid, seen = f"r{i}", set()
        events: list[Any] = []
        for turn in range(rng.randint(1, 5)):
            events.append(
                ModelFinished(id=tid, request_id=turn, turn=turn, latency_s=rng.random(), action="tool")
            )
            tool = rng.choice(tools)
            job_id += 1
            common: dict[str, Any] = {"id": tid, "job_id": job_id, "kind": "tool", "tool": tool}
            events.append(
                CpuEnqueued(**common, turn=turn, arg_bytes=1, queue_depth=1, resubmission=tool in seen)
            )
            seen.add(tool)
            seconds = rng.lognormvariate(-2, 1)
            if rng.random() < 0.1:
                events.append(CpuFailed(**common, worker=0, reason="timeout", roundtrip_s=seconds, error="x"))
            else:
                events.append(
                    CpuFinished(
                        **common, worker=0, ok=True, execute_s=seconds, cpu_s=None, roundtrip_s=seconds
                    )
                )
        events.append(TrajectoryFinished(id=tid, status="completed", turns=5, tool_calls=5, duration_s=1.0))
        scripts.append(events)
    return _interleaved(rng, scripts, 8)


def _interleaved(rng: random.Random, scripts: list[list[Any]], width: int) -> list[Any]:
    """The trajectories' events, ``width`` trajectories running at a time, their events interleaved at
    random (each trajectory's in order)."""
    stream: list[Any] = []
    running, waiting = [iter(s) for s in scripts[:width]], iter(scripts[width:])
    while running:
        current = rng.choice(running)
        event = next(current, None)
        if event is None:
            running.remove(current)
            following = next(waiting, None)
            if following is not None:
                running.append(iter(following))
        else:
            stream.append(event)
    return stream


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_kept_estimates_equal_a_whole_recomputation_after_every_event(seed: int) -> None:
    """After an observation only the changed keys' estimates and those computed from them are forgotten
    (the tail's decisions read every queued job's estimate after nearly every event): after every event of
    interleaved trajectories, each key's estimate — the chain's and the repair rule's with a prediction —
    equals what a whole recomputation gives (every memoised value dropped)."""
    chain, repair = StepwiseWork(2), StepwiseWork(2, own_repair=True)
    views: dict[tuple[str, bool, int], JobView] = {}
    compared = 0
    for event in _random_stream(seed):
        chain(event)
        repair(event)
        if isinstance(event, CpuEnqueued):
            views.setdefault(
                (event.tool, event.resubmission, event.turn),
                JobView(0, "v", "tool", event.tool, event.turn, 0.0, resubmission=event.resubmission),
            )
        kept = [(chain.estimate(v), repair.estimate(v, 0.3)) for v in views.values()]
        chain._forget_all()
        repair._forget_all()
        fresh = [(chain.estimate(v), repair.estimate(v, 0.3)) for v in views.values()]
        assert kept == fresh
        compared += sum(a is not None for a, _ in fresh)
    assert compared > 500


def _odd_trajectory(rng: random.Random, tid: str, first_job_id: int) -> list[Event]:
    """One trajectory's events as the runtime emits them, odd but legal ones included: one job per turn
    (turns only increase), a one-repair trajectory's evaluation and resubmissions or tool calls and a grade;
    a model failure, or an answer with no job (possibly at turn 0: a trajectory with no job at all); a
    timed-out job (counted at its round trip; with ``--tool-errors fail`` it ends the trajectory); a job
    cancelled while running, or never finished, because the run was stopped (no ``trajectory_finished``)."""
    events: list[Event] = []
    evaluates, tools_run, job_id = rng.random() < 0.4, set(), first_job_id
    for turn in range(rng.randint(0, 6)):
        latency = rng.random()
        if rng.random() < 0.05:
            events.append(
                ModelFailed(id=tid, request_id=turn, turn=turn, latency_s=latency, kind="x", error="x")
            )
            break
        events.append(ModelFinished(id=tid, request_id=turn, turn=turn, latency_s=latency, action="tool"))
        if rng.random() < 0.15:
            break  # a final answer with no reference: no grade job
        kind: JobKind
        if evaluates:
            kind, tool = "evaluate", "lcb_evaluate"
        elif rng.random() < 0.1:
            kind, tool = "grade", "__grade__"
        else:
            kind, tool = "tool", rng.choice(("crunch", "lookup"))
        job_id += 1
        common: dict[str, Any] = {"id": tid, "job_id": job_id, "kind": kind, "tool": tool}
        events.append(
            CpuEnqueued(**common, turn=turn, arg_bytes=1, queue_depth=1, resubmission=tool in tools_run)
        )
        tools_run.add(tool)
        seconds, fate = round(rng.lognormvariate(-2, 1), 6), rng.random()
        if fate < 0.05:
            return events  # never finished: the run was stopped
        if fate < 0.1:
            events.append(CpuFailed(**common, worker=0, reason="cancelled", roundtrip_s=seconds, error="x"))
            return events
        if fate < 0.2:
            events.append(CpuFailed(**common, worker=0, reason="timeout", roundtrip_s=seconds, error="x"))
            if rng.random() < 0.5:
                break
        else:
            events.append(
                CpuFinished(**common, worker=0, ok=True, execute_s=seconds, cpu_s=None, roundtrip_s=seconds)
            )
        if kind == "grade":
            break
    if rng.random() < 0.95:  # else the run was stopped between two of its turns
        events.append(TrajectoryFinished(id=tid, status="completed", turns=1, tool_calls=1, duration_s=1.0))
    return events


def _odd_stream(rng: random.Random) -> list[Event]:
    """The events of 5 to 40 trajectories from :func:`_odd_trajectory`, 1 to 8 running at a time, their
    events interleaved at random."""
    scripts = [_odd_trajectory(rng, f"r{i}", 100 * i) for i in range(rng.randint(5, 40))]
    return _interleaved(rng, scripts, rng.randint(1, 8))


def test_the_kept_estimates_equal_a_whole_recomputation_over_many_odd_runs() -> None:
    """The kept memo over a whole run, never brought back to a fresh state: an estimator fed odd streams
    (:func:`_odd_trajectory`) and asked, after a random event, for a random subset of keys (so some
    memoised values outlive many observations unread) gives what an estimator that drops every memoised
    value before each estimate gives, with thresholds of 1 to 3 transitions being crossed, and the
    repair rule's estimate with and without a prediction, a repair key not yet seen to finish included."""
    compared = repaired = 0
    for seed in range(150):
        rng = random.Random(seed)
        minimum, own = rng.choice((1, 2, 3)), rng.random() < 0.6
        kept, fresh = StepwiseWork(minimum, own_repair=own), StepwiseWork(minimum, own_repair=own)
        views: dict[tuple[str, str, bool, int], JobView] = {}
        for event in _odd_stream(rng):
            kept(event)
            fresh(event)
            if isinstance(event, CpuEnqueued):
                key = (event.kind, event.tool, event.resubmission, event.turn)
                views.setdefault(
                    key,
                    JobView(0, "v", event.kind, event.tool, event.turn, 0.0, resubmission=event.resubmission),
                )
            if not views or rng.random() < 0.3:
                continue
            for view in rng.sample(list(views.values()), rng.randint(1, len(views))):
                predicted = rng.choice((None, 0.3, rng.random()))
                fresh._forget_all()
                expected = fresh.estimate(view, predicted)
                assert kept.estimate(view, predicted) == expected, (seed, event, view, predicted)
                compared += expected is not None
                repaired += own and predicted is not None and expected != fresh.estimate(view)
    assert compared > 20_000 and repaired > 3000


def test_a_chain_deeper_than_the_recursion_limit_is_estimated() -> None:
    """A chain is as deep as a trajectory has turns, and ``max_turns`` has no upper bound: the estimate
    after the first job of a 3000-turn trajectory (each turn a 0.1 s model turn and a 0.01 s job) is the
    work of the 2999 turns after it, not a RecursionError."""
    chain = StepwiseWork(1)
    turns = 3000
    for turn in range(turns):
        common: dict[str, Any] = {"id": "deep", "job_id": turn, "kind": "tool", "tool": "crunch"}
        chain(ModelFinished(id="deep", request_id=turn, turn=turn, latency_s=0.1, action="tool"))
        chain(CpuEnqueued(**common, turn=turn, arg_bytes=1, queue_depth=1))
        chain(CpuFinished(**common, worker=0, ok=True, execute_s=0.01, cpu_s=None, roundtrip_s=0.01))
    chain(TrajectoryFinished(id="deep", status="max_turns", turns=turns, tool_calls=turns, duration_s=1.0))
    assert chain.estimate(FIRST) == pytest.approx((turns - 1) * (0.1 + 0.01))
    assert (
        chain.estimate(JobView(9, "x", "tool", "crunch", turns - 1, 0.0)) == 0.0
    )  # the last job: nothing after
