"""The real runtime (admission, model gate, dispatcher, pool, policies) on a virtual clock.

Every timing here is exact: scripted model latencies and job durations run in virtual time.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from asyncroll.events import (
    CpuFinished,
    CpuSelected,
    CpuStarted,
    Event,
    ModelFinished,
    ModelStarted,
    TrajectoryFinished,
    TrajectoryStarted,
    WorkerRestarting,
)
from tests.conftest import VirtualRun, tool_problem


def _peak(events: list[Event], up: type[Event], down: type[Event]) -> int:
    level = peak = 0
    for e in events:
        if isinstance(e, up):
            level += 1
        elif isinstance(e, down):
            level -= 1
        peak = max(peak, level)
    return peak


def _problems(n: int, **kw: Any) -> list[dict[str, Any]]:
    return [tool_problem(f"p{i}", **kw) for i in range(n)]


@pytest.mark.parametrize(
    ("limits", "bound"),
    [
        ({"max_active_trajectories": 2, "max_inflight_model_requests": 64, "cpu_workers": 8}, "active"),
        ({"max_active_trajectories": 64, "max_inflight_model_requests": 3, "cpu_workers": 8}, "inflight"),
        ({"max_active_trajectories": 64, "max_inflight_model_requests": 64, "cpu_workers": 2}, "workers"),
    ],
)
def test_each_limit_bounds_concurrency_on_its_own(
    virtual_run: VirtualRun, limits: dict[str, int], bound: str
) -> None:
    outcome, cap, _ = virtual_run(_problems(20, model_ms=10, cpu_ms=10, turns=2), **limits)
    assert outcome.status == "complete"
    assert outcome.summary is not None
    assert outcome.summary["counts"]["completed"] == 20
    peaks = outcome.summary["peaks"]
    active = _peak(cap.events, TrajectoryStarted, TrajectoryFinished)
    inflight = _peak(cap.events, ModelStarted, ModelFinished)
    busy = _peak(cap.events, CpuStarted, CpuFinished)
    observed = {"active": active, "inflight": inflight, "workers": busy}
    limit_of = {
        "active": limits["max_active_trajectories"],
        "inflight": limits["max_inflight_model_requests"],
        "workers": limits["cpu_workers"],
    }
    # the bound under test is reached exactly, as seen both in events and in the limiters' snapshots
    assert observed[bound] == limit_of[bound]
    assert peaks == {
        "active_trajectories": active,
        "inflight_model_requests": inflight,
        "busy_workers": busy,
        "queued_cpu_jobs": peaks["queued_cpu_jobs"],
    }
    for name, value in observed.items():
        assert value <= limit_of[name]


def test_exact_virtual_timings_for_one_trajectory(virtual_run: VirtualRun) -> None:
    outcome, cap, _ = virtual_run([tool_problem("a", model_ms=100, cpu_ms=50, turns=2)])
    assert outcome.summary is not None
    assert outcome.summary["makespan_s"] == pytest.approx(0.4, abs=1e-9)  # 3 model turns + 2 jobs
    finished = cap.of(CpuFinished)
    assert [round(e.t, 6) for e in finished] == [0.15, 0.3]
    assert cap.of(TrajectoryFinished)[0].duration_s == pytest.approx(0.4)


def test_sync_runs_one_trajectory_at_a_time(virtual_run: VirtualRun) -> None:
    outcome, cap, _ = virtual_run(
        _problems(3, model_ms=10, cpu_ms=20), policy="sync", max_active_trajectories=16
    )
    assert outcome.summary is not None
    assert outcome.summary["makespan_s"] == pytest.approx(3 * 0.04)
    assert _peak(cap.events, TrajectoryStarted, TrajectoryFinished) == 1
    assert outcome.summary["limits"]["max_active_trajectories"] == 1


def _queueing_workload() -> list[dict[str, Any]]:
    """One worker. ``hog`` holds it 0–110 ms; a grade job (``grader``) queues at 20 ms, a tool job
    (``tooler``) at 30 ms. FIFO then runs the grade first; tool_first runs the tool first."""
    return [
        tool_problem("hog", model_ms=10, cpu_ms=100, final_ms=1),
        {
            "id": "grader",
            "prompt": "p",
            "reference_answer": "42",
            "script": [{"type": "final", "answer": "42", "latency_ms": 20}],
        },
        tool_problem("tooler", model_ms=30, cpu_ms=5, final_ms=1),
    ]


@pytest.mark.parametrize(
    ("policy", "first", "reason", "reordered"),
    [
        ("fifo", "grader", "fifo", False),
        ("tool_first", "tooler", "tool_before_grade", True),
        ("gpu_first", "tooler", "tool_before_grade", True),
    ],
)
def test_dispatch_order_by_policy(
    virtual_run: VirtualRun, policy: str, first: str, reason: str, reordered: bool
) -> None:
    outcome, cap, _ = virtual_run(_queueing_workload(), policy=policy, cpu_workers=1)
    assert outcome.status == "complete"
    selected = cap.of(CpuSelected)
    # the decision taken when the hog's job ends at t = 0.110, with two jobs waiting
    contested = next(e for e in selected if e.queue_depth == 2)
    assert contested.t == pytest.approx(0.11)
    assert contested.id == first
    assert contested.reason == reason
    assert contested.reordered is reordered
    assert outcome.summary is not None
    assert outcome.summary["accuracy"] == {
        "exact": 1.0,
        "correct": 1,
        "denominator": 1,
        "ungraded": 2,
        "exact_of_referenced": 1.0,
        "referenced": 1,
        "one_repair": None,
    }
    assert outcome.summary["scheduler"]["reorders"] == int(reordered)


def test_fifo_serves_jobs_in_arrival_order(virtual_run: VirtualRun) -> None:
    problems = [tool_problem(f"p{i}", model_ms=1 + i, cpu_ms=50) for i in range(6)]
    _, cap, _ = virtual_run(problems, policy="fifo", cpu_workers=1)
    order = [e.job_id for e in cap.of(CpuSelected)]
    assert order == sorted(order)
    assert all(not e.reordered for e in cap.of(CpuSelected))


def test_timeout_replaces_worker_and_next_job_succeeds(virtual_run: VirtualRun) -> None:
    problems = [tool_problem("slow", model_ms=1, cpu_ms=5000), tool_problem("next", model_ms=2, cpu_ms=10)]
    outcome, cap, _ = virtual_run(problems, cpu_workers=1, tool_timeout=1.0)
    assert outcome.status == "complete"
    restarts = cap.of(WorkerRestarting)
    assert [(r.reason, r.generation) for r in restarts] == [("timeout", 1)]
    finished = {e.id: e for e in cap.of(TrajectoryFinished)}
    assert finished["slow"].status == "failed" and "ran past 1s" in (finished["slow"].error or "")
    assert finished["next"].status == "completed"
    started = [e for e in cap.of(CpuStarted) if e.id == "next"]
    assert started[0].generation == 1
    assert outcome.summary is not None
    assert outcome.summary["workers"]["restarts"] == 1
    assert outcome.summary["tools"]["failures"] == {"timeout": 1}
    assert outcome.summary["tools"]["error_rate"] == 0.5


def test_a_referenced_trajectory_that_failed_before_grading_is_not_correct_of_the_referenced(
    virtual_run: VirtualRun,
) -> None:
    """exact leaves a trajectory that failed before its answer was graded out of its denominator;
    exact_of_referenced counts it as not correct, as an evaluation would."""
    code = {
        "id": "code",
        "prompt": "p",
        "tools": [{"name": "lcb_evaluate"}],
        "script": [{"type": "submit", "code": "print(1)", "passes": True}],
        "metadata": {
            "reference_tests": [{"input": "1", "output": "1", "testtype": "stdin"}],
            "prompt_metadata": {"protocol": "one_repair", "max_generations": 2},
        },
    }
    problems = [
        {**tool_problem("slow", model_ms=1, cpu_ms=5000), "reference_answer": "ok"},
        {**tool_problem("fine", model_ms=1, cpu_ms=10), "reference_answer": "ok"},
        {**tool_problem("wrong", model_ms=1, cpu_ms=10), "reference_answer": "no"},
        tool_problem("free", model_ms=1, cpu_ms=10),
        {**code, "reference_answer": "1"},  # a passing program: correct (in exact), judged by its tests
    ]
    outcome, _, _ = virtual_run(problems, tool_timeout=1.0)
    assert outcome.summary is not None
    accuracy = outcome.summary["accuracy"]
    assert (accuracy["correct"], accuracy["denominator"], accuracy["ungraded"]) == (2, 3, 2)
    assert (accuracy["exact_of_referenced"], accuracy["referenced"]) == (round(1 / 3, 6), 3)


def test_a_negative_sleep_is_no_time_in_a_simulation_as_for_real(virtual_run: VirtualRun) -> None:
    """The built-ins clamp their milliseconds at 0; a virtual worker took -50 ms as a duration (negative
    execute times and bound terms, and a run its replay refused)."""
    outcome, cap, _ = virtual_run([tool_problem("p", model_ms=1, cpu_ms=-50)])
    assert [e.execute_s for e in cap.of(CpuFinished)] == [0.0]
    assert outcome.summary is not None and outcome.summary["bounds"]["terms"]["cpu_execute_s"] >= 0


def test_tool_error_rate_is_over_tool_calls_only(virtual_run: VirtualRun) -> None:
    """Evaluations that time out are failures (by reason) but not tool errors: the rate's numerator and
    denominator both count tool calls only (it read 2.0: two evaluation failures over one tool call)."""
    code = {
        "prompt": "p",
        "tools": [{"name": "lcb_evaluate"}],
        "script": [{"type": "submit", "code": "print(1)", "latency_ms": 10, "cpu_ms": 5000, "passes": True}],
        "metadata": {
            "reference_tests": [{"input": "1", "output": "1", "testtype": "stdin"}],
            "prompt_metadata": {"protocol": "one_repair", "max_generations": 2},
        },
    }
    problems = [tool_problem("ok", model_ms=10, cpu_ms=1), {"id": "b", **code}, {"id": "c", **code}]
    outcome, _, _ = virtual_run(problems, tool_timeout=1.0)
    assert outcome.summary is not None
    tools = outcome.summary["tools"]
    assert (tools["calls"], tools["error_rate"], tools["failures"]) == (1, 0.0, {"timeout": 2})


@pytest.mark.parametrize(("mode", "status"), [("fail", "failed"), ("observe", "completed")])
def test_tool_error_fails_trajectory_or_is_observed(
    virtual_run: VirtualRun, tmp_path: Path, mode: str, status: str
) -> None:
    # A virtual worker cannot execute a trusted file tool: its reply is a tool error, as a raise would be.
    (tmp_path / "tool.py").write_text("def boom(x):\n    raise ValueError(x)\n")
    bad = {
        "id": "bad",
        "prompt": "p",
        "tools": [{"name": "boom", "inputs": {"x": "int"}, "implementation": "tool.py"}],
        "script": [{"type": "tool", "name": "boom", "arguments": {"x": 1}}, {"type": "final", "answer": "x"}],
    }
    outcome, cap, _ = virtual_run([bad], tool_errors=mode)
    finished = cap.of(TrajectoryFinished)[0]
    assert finished.status == status
    assert cap.of(CpuFinished)[0].ok is False
    assert outcome.summary is not None and outcome.summary["tools"]["errors"] == 1
    if mode == "fail":
        assert "boom" in (finished.error or "")


def test_an_observed_tool_error_is_cut_to_max_observation_chars_like_a_result(
    virtual_run: VirtualRun, tmp_path: Path
) -> None:
    """docs/TOOLS.md: under --tool-errors observe the error text is the observation, and an observation
    longer than --max-observation-chars is cut, with its note, and counted (an error of up to 2,000
    characters reached the model whole)."""
    name = "boom_" + "x" * 120
    (tmp_path / "tool.py").write_text(f"def {name}(x):\n    raise ValueError(x)\n")
    bad = {
        "id": "bad",
        "prompt": "p",
        "tools": [{"name": name, "inputs": {"x": "int"}, "implementation": "tool.py"}],
        "script": [{"type": "tool", "name": name, "arguments": {"x": 1}}, {"type": "final", "answer": "x"}],
    }
    outcome, cap, out = virtual_run([bad], tool_errors="observe", max_observation_chars=100, transcripts=True)
    row = json.loads((out / "transcripts.jsonl").read_text())
    shown = row["messages"][2]["content"]
    assert shown.startswith(f"tool {name!r} failed: "[:100])
    assert shown.endswith("]") and "\n[tool result cut: the first 100 of " in shown
    assert len(shown.split("\n[tool result cut:")[0]) == 100
    assert cap.of(TrajectoryFinished)[0].observations_cut == 1
    assert outcome.summary is not None and outcome.summary["tools"]["observations_cut"] == 1


def test_model_failure_is_isolated_to_its_trajectory(virtual_run: VirtualRun) -> None:
    short = {
        "id": "short",
        "prompt": "p",
        "tools": [{"name": "add"}],
        "script": [{"type": "tool", "name": "add", "arguments": {"a": 1, "b": 2}}],
    }
    outcome, cap, _ = virtual_run([short, tool_problem("ok", model_ms=1, cpu_ms=1)])
    assert outcome.status == "complete" and outcome.exit_code == 0
    finished = {e.id: e for e in cap.of(TrajectoryFinished)}
    assert finished["short"].status == "failed"
    assert "script_exhausted" in (finished["short"].error or "")
    assert finished["ok"].status == "completed"
    assert outcome.summary is not None and outcome.summary["model"]["failed"] == {"script_exhausted": 1}


def test_max_turns(virtual_run: VirtualRun) -> None:
    outcome, cap, _ = virtual_run([tool_problem("long", model_ms=1, cpu_ms=1, turns=5)], max_turns=3)
    assert cap.of(TrajectoryFinished)[0].status == "max_turns"
    assert cap.of(TrajectoryFinished)[0].turns == 3
    assert outcome.summary is not None and outcome.summary["counts"]["max_turns"] == 1


def test_admission_streams_and_keeps_order(virtual_run: VirtualRun) -> None:
    outcome, cap, _ = virtual_run(_problems(50, model_ms=3, cpu_ms=2), max_active_trajectories=4)
    assert [e.index for e in cap.of(TrajectoryStarted)] == list(range(50))
    assert outcome.summary is not None and outcome.summary["counts"]["completed"] == 50


def test_limiter_survives_cancelled_waiters() -> None:
    import asyncio

    from asyncroll.clock import VirtualClock
    from asyncroll.runtime.limiter import FifoLimiter

    async def main() -> tuple[int, int]:
        limiter = FifoLimiter(1)
        await limiter.acquire()
        waiters = [asyncio.ensure_future(limiter.acquire()) for _ in range(3)]
        await asyncio.sleep(0)
        waiters[0].cancel()
        waiters[1].cancel()
        limiter.release()  # drops the cancelled waiters, grants the third
        await asyncio.gather(*waiters, return_exceptions=True)
        granted = limiter.snapshot()
        limiter.release()
        return granted.holding, limiter.snapshot().holding

    assert VirtualClock().run(main()) == (1, 0)


def test_a_virtual_run_waits_for_the_default_executors_threads_in_real_time() -> None:
    """``asyncio.Runner`` gives the default executor 300 s to join its threads; Python 3.13 times that
    with the loop's clock, which a virtual loop would jump past at once (threads abandoned, a warning)."""
    import asyncio
    import time

    from asyncroll.clock import VirtualClock

    async def main() -> None:
        asyncio.get_running_loop().run_in_executor(None, time.sleep, 0.2)  # still running when main ends

    clock = VirtualClock()
    clock.run(main())  # the suite turns warnings into errors
    assert clock.now() == 0.0


@pytest.mark.timeout(20)
@pytest.mark.parametrize("start", [0.0, 2.0**24 - 0.5, 2.0**24, 2.0**33, 1e12])
def test_virtual_timers_fire_however_far_time_has_run(start: float) -> None:
    """From 2^24 s (≈ 194 days: 195 one-day model turns in a row) ``now + 1e-9`` rounds back to ``now``,
    and asyncio judged a timer due only when it lies below ``now`` + the loop's 1 ns resolution: time
    reached the timer, the timer never fired and the loop spun for ever. Each timer fires at its time."""
    import asyncio

    from asyncroll.clock import VirtualClock

    clock = VirtualClock(start=start)
    fired: list[float] = []

    async def main() -> None:
        for delay in (0.1, 86_400.0, 0.0, 1e-9, 3.0):
            await asyncio.sleep(delay)
            fired.append(clock.now())
        await asyncio.wait_for(asyncio.sleep(5.0), timeout=60.0)  # a timer that is cancelled, too
        fired.append(clock.now())

    clock.run(main())
    expected = start
    for delay in (0.1, 86_400.0, 0.0, 1e-9, 3.0, 5.0):
        expected += delay
        assert fired.pop(0) == pytest.approx(expected, rel=1e-12, abs=1e-9)


def test_results_keep_answers_of_any_size(virtual_run: VirtualRun) -> None:
    import json

    huge = 10**40
    problem = {"id": "big", "prompt": "p", "script": [{"type": "final", "answer": huge}]}
    outcome, _, out = virtual_run([problem])
    assert outcome.status == "complete"
    row = json.loads((out / "results.jsonl").read_text())
    assert row["answer"] == huge and row["status"] == "completed"


def test_a_jobs_queue_wait_includes_the_dispatch_decision(tmp_path: Path) -> None:
    """``waited_s`` runs from ``cpu_enqueued`` to the selection itself: a slow decision (here a policy
    that takes 0.25 virtual seconds to choose) is part of the job's wait, as the events' times say."""
    from asyncroll.clock import VirtualClock
    from asyncroll.config import build_config
    from asyncroll.event_log import EventCapture
    from asyncroll.events import CpuEnqueued
    from asyncroll.policies.base import Decision, QueueSnapshot
    from asyncroll.runtime.run import Run, prepare
    from asyncroll.runtime.virtual_worker import virtual_factory
    from tests.conftest import write_workload

    clock = VirtualClock()

    class SlowFifo:
        name = "fifo"

        def choose(self, snapshot: QueueSnapshot) -> Decision:
            clock.advance(0.25)
            return Decision(snapshot.jobs[0].job_id, "fifo")

    problems = [tool_problem(f"p{i}", model_ms=10, cpu_ms=100, turns=2) for i in range(3)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    cfg = build_config({"workload": workload, "output": tmp_path / "run", "cpu_workers": 1})
    capture = EventCapture()
    run = Run(
        prepare(cfg, ["test"]),
        clock,
        worker_factory=virtual_factory(clock),
        subscribers=(capture,),
        policy=SlowFifo(),
    )
    assert clock.run(run.execute()).status == "complete"
    enqueued = {e.job_id: e.t for e in capture.of(CpuEnqueued)}
    selected = capture.of(CpuSelected)
    assert len(selected) == 6  # two tool calls each (no reference answer: nothing to grade)
    for event in selected:
        assert event.waited_s >= 0.25
        assert event.waited_s == pytest.approx(event.t - enqueued[event.job_id], abs=2e-6)


def test_a_simulated_runs_cpu_cost_is_unknown_not_the_simulators_own(virtual_run: VirtualRun) -> None:
    """The simulator's host CPU is not a cost of the run it models (and made two identical simulations'
    summaries differ): null, with the reason."""
    outcome, _, _ = virtual_run([tool_problem("p", model_ms=10, cpu_ms=20)])
    assert outcome.summary is not None
    cost = outcome.summary["cpu_cost"]
    assert cost["client_cpu_s"] is None and cost["total_cpu_s"] is None
    assert "simulated" in cost["reason"]


def test_tool_calls_per_trajectory_counts_the_finished_trajectories_own_calls(
    virtual_run: VirtualRun,
) -> None:
    """In a run that stopped with trajectories unfinished, ``calls`` counts every call, but the
    per-trajectory mean is over finished trajectories and their own calls (it divided all calls by the
    finished trajectories)."""
    from asyncroll.events import TrajectoryFinished
    from asyncroll.outputs.summary import SummaryBuilder

    problems = [tool_problem(f"p{i}", model_ms=10, cpu_ms=5, turns=1 + i % 3) for i in range(6)]
    outcome, capture, _ = virtual_run(problems)
    assert outcome.summary is not None and outcome.summary["tools"]["calls_per_trajectory"] == 2.0
    unfinished = {"p2", "p5"}  # three calls each: as if the run had been stopped before they finished
    builder = SummaryBuilder()
    for event in capture.events:
        if not (isinstance(event, TrajectoryFinished) and event.id in unfinished):
            builder(event)
    limits = {"max_active_trajectories": 16, "max_inflight_model_requests": 4, "cpu_workers": 2}
    tools = builder.build(
        makespan_s=1.0, policy="fifo", limits=limits, cpu_cost={}, peaks={}, status="interrupted"
    )["tools"]
    assert tools["calls"] == 12 and tools["calls_per_trajectory"] == 1.5  # (1 + 2 + 1 + 2) / 4


def test_a_virtual_worker_answers_a_result_the_model_reads_as_a_real_worker_does() -> None:
    """``observation_chars`` gives the result's JSON text, cut, and its length (what the trajectory
    reads), from a virtual worker as from a real one; without it, the value itself."""
    from asyncroll.clock import VirtualClock
    from asyncroll.runtime.virtual_worker import virtual_factory
    from asyncroll.workers.protocol import JobRequest

    clock = VirtualClock()
    worker = virtual_factory(clock)(0, 0)

    async def go() -> list[object]:
        requests = [
            JobRequest(1, "add", {"a": 1000, "b": 234}, observation_chars=2),
            JobRequest(2, "add", {"a": 1000, "b": 234}, observation_chars=100),
            JobRequest(3, "add", {"a": 1000, "b": 234}),
        ]
        return [(await worker.call(r, timeout=5)).reply.value for r in requests]

    assert clock.run(go()) == [("12", 4), ("1234", 4), 1234]


def test_a_summary_that_cannot_be_built_fails_the_run_and_says_why(
    virtual_run: VirtualRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever breaks while the summary is built (a defect, an unexpected value), the run ends failed:
    run.json says so with the reason, events.jsonl and results.jsonl are whole, the exports are written,
    and no summary.json is left half-made (run.json used to stay 'running', with nothing written after
    the events)."""
    import json

    from asyncroll.outputs.summary import SummaryBuilder

    def broken(self: SummaryBuilder, **_: Any) -> dict[str, Any]:
        raise ValueError("a value the summary cannot take")

    monkeypatch.setattr(SummaryBuilder, "build", broken)
    outcome, _, out = virtual_run(_problems(3, model_ms=10, cpu_ms=10))
    assert (outcome.status, outcome.exit_code, outcome.summary) == ("failed", 1, None)
    assert outcome.error is not None and "summary: cannot be built" in outcome.error
    receipt = json.loads((out / "run.json").read_text())
    assert receipt["status"] == "failed" and "a value the summary cannot take" in receipt["error"]
    assert not (out / "summary.json").exists()
    lines = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert lines[-1]["event"] == "measurement_finished"  # the measurement itself ended; the run did not
    assert len((out / "results.jsonl").read_text().splitlines()) == 3
    assert (out / "trace.json").exists() and (out / "timeline.html").exists()


def test_start_up_restarts_of_a_run_that_never_started_are_counted_in_the_summary(tmp_path: Path) -> None:
    """A worker killed each time it starts is replaced (``startup_failed``) until the slot's third start
    fails the run: the held ``worker_restarting`` events are written at the end, and summary.json counts
    them as events.jsonl has them (the summary used to be built before they were flushed: 0 restarts)."""
    from asyncroll.clock import VirtualClock
    from asyncroll.config import build_config
    from asyncroll.errors import WorkerStartupError
    from asyncroll.runtime.run import Run, prepare
    from asyncroll.runtime.virtual_worker import VirtualWorker, virtual_factory
    from tests.conftest import write_workload

    clock = VirtualClock()
    virtual = virtual_factory(clock)

    class KilledAtStart(VirtualWorker):
        async def start(self) -> None:
            raise WorkerStartupError(f"worker {self.index} died during start-up: SIGKILL", retry=True)

    def factory(index: int, generation: int) -> VirtualWorker:
        worker = virtual(index, generation)
        return worker if index else KilledAtStart(index, generation, clock)

    workload = write_workload(tmp_path / "w.jsonl", _problems(2, model_ms=10, cpu_ms=10))
    cfg = build_config({"workload": workload, "output": tmp_path / "run", "cpu_workers": 2})
    outcome = clock.run(Run(prepare(cfg, ["test"]), clock, worker_factory=factory).execute())
    assert (outcome.status, outcome.exit_code) == ("failed", 1)
    lines = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    restarts = [e["reason"] for e in lines if e["event"] == "worker_restarting"]
    assert restarts == ["startup_failed", "startup_failed"]  # three starts of slot 0: two replacements
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["workers"] == {"restarts": 2, "restarts_by_reason": {"startup_failed": 2}}


def _open_under(folder: Path) -> list[str]:
    """The files this process holds open in ``folder`` (Linux: /proc/self/fd)."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, gone by now
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target == str(folder) or target.startswith(f"{folder}/"):
                held.append(target)
    return held


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="Linux: /proc/self/fd")
@pytest.mark.parametrize(
    ("raised", "status", "error"),
    [
        (RuntimeError("no policy today"), "failed", "RuntimeError: no policy today"),
        # Python's handler raises it for SIGINT: run.json said "interrupted by cancellation", the CLI SIGINT
        (KeyboardInterrupt(), "interrupted", "interrupted by SIGINT"),
        # one that names its signal, as CommandSignals raises it
        (KeyboardInterrupt("SIGTERM"), "interrupted", "interrupted by SIGTERM"),
    ],
)
def test_a_failure_while_the_run_is_assembled_closes_its_files(
    virtual_run: VirtualRun,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    raised: BaseException,
    status: str,
    error: str,
) -> None:
    # Run.execute opened run.json, events.jsonl and results.jsonl (and its directory), then built the
    # policy, the pool and the rest before its try: a failure there left every one open, and run.json
    # saying "starting" for ever.
    from asyncroll.runtime import assembly

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise raised

    monkeypatch.setattr(assembly, "get_policy", broken)
    with pytest.raises(type(raised)):
        virtual_run([tool_problem("p", model_ms=1, cpu_ms=2, turns=1)])
    assert _open_under(tmp_path) == []
    receipt = json.loads((tmp_path / "run0" / "run.json").read_text())
    assert (receipt["status"], receipt["error"]) == (status, error)


def test_a_keyboard_interrupt_while_the_trajectories_run_is_recorded_as_sigint(
    virtual_run: VirtualRun, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A KeyboardInterrupt no handler of the run's took (Python's own raises it for SIGINT) once the window
    had opened left run.json and measurement_finished saying "failed" with no reason; the CLI said SIGINT."""
    from asyncroll.runtime import run as run_module

    def interrupted(*_args: Any, **_kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(run_module, "iter_problems", interrupted)
    with pytest.raises(KeyboardInterrupt):
        virtual_run([tool_problem("p", model_ms=1, cpu_ms=2, turns=1)])
    receipt = json.loads((tmp_path / "run0" / "run.json").read_text())
    assert (receipt["status"], receipt["error"]) == ("interrupted", "interrupted by SIGINT")
    lines = [json.loads(line) for line in (tmp_path / "run0" / "events.jsonl").read_text().splitlines()]
    (finished,) = [e for e in lines if e["event"] == "measurement_finished"]
    assert (finished["status"], finished["reason"]) == ("interrupted", "interrupted by SIGINT")
