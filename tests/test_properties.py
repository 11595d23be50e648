"""Property-based tests of the runtime's invariants: generated workloads and limits, run through the real
runtime on the simulator's virtual clock (in this process, no CLI per example), checked against the run's
own outputs (events.jsonl, summary.json).

Each example writes a small scripted workload (tool calls mixing ``spin_ms``/``sleep_ms``/``add`` with and
without ``cpu_ms``, finals with and without a ``reference_answer``, scripts that run out, one-repair
submissions that pass, fail or declare nothing), picks a policy, the three limits, ``max_turns``, a
server model and a few pressure knobs, simulates it, and checks:

- at no instant more active trajectories, inflight model requests or busy workers than the limits
  (counted from the events in the order they were written), ``sync`` never two active; the summary's
  ``peaks`` are those counts;
- every CPU job enqueued is selected, started and ended once, in that order; so is every model request;
  each trajectory's events lie between its start and its end; timestamps never go backwards;
- the summary's counts (trajectories by status, model requests, CPU jobs by kind, decisions, eligible
  decisions, reorders, reasons) are what the events show;
- each decision picks a queued job and names the oldest queued one; ``fifo``/``sync`` take the oldest,
  ``tool_first`` the oldest that is not a grade job (a second set of examples, CPU-bound with the
  reordering policies, reorders in about 60% of them: the first set in about 10%);
- lower bound ≤ makespan, 0 < efficiency ≤ 1; client CPU-blocked time is what the events integrate to;
- each trajectory ends as its script alone says it must (status, turns, tool calls, verdict), each job
  takes its declared time and, on the fixed-latency server, each turn its ``latency_ms``;
- every event validates against ``asyncroll schema events``;
- the same simulation twice writes the same summary, results and events (but ``wall_time``), and a
  replay (``simulate --from-run``) of a fixed-latency one takes its latencies and its makespan.

Hypothesis is derandomised with no example database (``PROPS`` in ``tests/property_runs.py``) and draws
no constants from the modules imported so far (``hypothesis_without_local_constants`` in
``tests/conftest.py``), so every run tries the same examples: nothing here depends on the machine's load
or on the tests run before.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import event, given, settings

from asyncroll.schemas import schemas
from asyncroll.simulation.engine import SimulationSettings
from tests.blocked_reference import blocked_reference
from tests.property_runs import (
    LONG_MS,
    OVERHEAD_MS,
    PROPS,
    SERVERS,
    contended_settings,
    run_settings,
    simulated,
    workloads,
)


def event_validators() -> dict[str, jsonschema.Draft202012Validator]:
    """One validator per event name: the events schema's branch that its discriminator maps the name to.

    The same verdict as validating against the whole schema's ``oneOf`` (each branch fixes ``event`` to its
    own name and the mapping names every branch once, both checked here), without trying all 21 branches
    on every event: that took most of the two minutes of the 60-run test below."""
    schema = schemas()["events"]
    mapping = schema["discriminator"]["mapping"]
    assert sorted(mapping.values()) == sorted(branch["$ref"] for branch in schema["oneOf"])
    for name, ref in mapping.items():
        assert schema["$defs"][ref.removeprefix("#/$defs/")]["properties"]["event"]["const"] == name
    return {
        name: jsonschema.Draft202012Validator({"$defs": schema["$defs"], "$ref": ref})
        for name, ref in mapping.items()
    }


EVENT_SCHEMAS = event_validators()
pytestmark = pytest.mark.usefixtures("hypothesis_without_local_constants", "versions_read_once")


def check_limits(events: list[dict[str, Any]], values: dict[str, Any]) -> dict[str, int]:
    """Counts of active trajectories, inflight requests and busy workers after each event never pass the
    limits, and the counts the events carry (``outstanding``, ``inflight``, ``queue_depth``, …) are these;
    their peaks (and the CPU queue's)."""
    active_limit = 1 if values["policy"] == "sync" else values["max_active_trajectories"]
    limits = {
        "active_trajectories": active_limit,
        "inflight_model_requests": values["max_inflight_model_requests"],
        "busy_workers": values["cpu_workers"],
    }
    now = Counter[str]()
    peaks = Counter[str]()
    running: dict[int, int] = {}  # worker → job
    started_requests: set[int] = set()
    outstanding = 0
    for e in events:
        kind = e["event"]
        if kind == "trajectory_started":
            now["active_trajectories"] += 1
            # admission may have let in more whose events follow at the same instant ("this one included")
            assert now["active_trajectories"] <= e["active"] <= active_limit, e
        elif kind == "trajectory_finished":
            now["active_trajectories"] -= 1
        elif kind == "model_enqueued":
            outstanding += 1
            assert e["outstanding"] == outstanding, e
        elif kind == "model_started":
            now["inflight_model_requests"] += 1
            started_requests.add(e["request_id"])
            # as ``active``: a slot freed and taken again at this instant may be counted already
            assert now["inflight_model_requests"] <= e["inflight"] <= limits["inflight_model_requests"], e
        elif kind in ("model_finished", "model_failed") and e["request_id"] in started_requests:
            now["inflight_model_requests"] -= 1
            outstanding -= 1
        elif kind == "cpu_enqueued":
            now["queued_cpu_jobs"] += 1
            assert e["queue_depth"] == now["queued_cpu_jobs"], e
        elif kind == "cpu_selected":
            assert (e["queue_depth"], e["model_outstanding"]) == (now["queued_cpu_jobs"], outstanding), e
            now["queued_cpu_jobs"] -= 1
            assert 0 <= e["worker"] < values["cpu_workers"], e
        elif kind == "cpu_started":
            assert e["worker"] not in running, (
                f"worker {e['worker']} busy with job {running[e['worker']]}: {e}"
            )
            running[e["worker"]] = e["job_id"]
            now["busy_workers"] += 1
        elif kind in ("cpu_finished", "cpu_failed") and running.get(e["worker"]) == e["job_id"]:
            del running[e["worker"]]
            now["busy_workers"] -= 1
        for name, value in now.items():
            assert value >= 0, (name, e)
            assert value <= limits.get(name, value), f"{name} {value} > {limits[name]} at {e}"
            peaks[name] = max(peaks[name], value)
    return dict(peaks)


def check_lifecycles(events: list[dict[str, Any]]) -> None:
    """Time never goes backwards; each job and request goes through its steps once, in order; each
    trajectory's events lie between its start and its end."""
    times = [e["t"] for e in events]
    assert times == sorted(times), "timestamps go backwards"
    steps: dict[tuple[str, int], list[str]] = defaultdict(list)
    for e in events:
        if e["event"].startswith("cpu_"):
            steps["job", e["job_id"]].append(e["event"])
        elif "request_id" in e:
            steps["request", e["request_id"]].append(e["event"])
    for (what, key), seen in steps.items():
        expected = (
            [["cpu_enqueued", "cpu_selected", "cpu_started", end] for end in ("cpu_finished", "cpu_failed")]
            if what == "job"
            else [["model_enqueued", "model_started", end] for end in ("model_finished", "model_failed")]
        )
        assert seen in expected, (what, key, seen)
    state: dict[str, str] = {}
    for e in events:
        tid = e["id"]
        if tid is None:
            continue
        if e["event"] == "trajectory_started":
            assert tid not in state, f"{tid} started twice"
            state[tid] = "active"
        else:
            assert state.get(tid) == "active", f"{e['event']} of {tid} outside its trajectory"
            if e["event"] == "trajectory_finished":
                state[tid] = "ended"
    assert set(state.values()) <= {"ended"}, state


def check_decisions(events: list[dict[str, Any]], values: dict[str, Any]) -> None:
    """Each decision picks a job that is queued, names the oldest queued job as ``oldest_job_id`` and the
    chosen job's wait as ``waited_s``, and follows its rule where the rule is plain: ``fifo``/``sync`` the
    oldest; ``tool_first`` the oldest job that is not a grade job, if any (reason ``tool_before_grade``
    exactly when that reorders); the pressure rules (SPEC §6) hard-age first (a job queued past
    ``aging_seconds`` goes first; the unlock rule's relative aging can fire earlier), then FIFO with the
    reason it is not eligible (one job queued, model outstanding at the threshold), else eligible."""
    policy = values["policy"]
    aging = values.get("aging_seconds", 30.0)
    queued: dict[int, tuple[str, float]] = {}  # job id → (kind, enqueued at), in enqueue order
    for e in events:
        if e["event"] == "cpu_enqueued":
            queued[e["job_id"]] = (e["kind"], e["t"])
        elif e["event"] == "cpu_selected":
            assert e["job_id"] in queued, e
            oldest = next(iter(queued))
            assert e["oldest_job_id"] == oldest, (e, list(queued))
            assert abs(e["waited_s"] - (e["t"] - queued[e["job_id"]][1])) < 2e-6, e
            if policy.startswith("asyncroll"):
                check_pressure_decision(e, e["t"] - queued[oldest][1], len(queued), aging, policy)
            if policy in ("fifo", "sync"):
                assert not e["reordered"] and e["reason"] == "fifo", e
            elif policy == "tool_first":
                first = next((job for job, (kind, _) in queued.items() if kind != "grade"), oldest)
                assert e["job_id"] == first, (e, queued)
                assert e["reason"] == ("tool_before_grade" if e["reordered"] else "fifo"), e
            del queued[e["job_id"]]


def check_pressure_decision(
    e: dict[str, Any], oldest_waited: float, depth: int, aging: float, policy: str
) -> None:
    """One decision of a pressure rule, from the queue the events show (times are rounded to 1 µs: a wait
    within 10 µs of the aging bound may go either way)."""
    aged = e["reason"] == "hard_starvation_fifo"
    if policy != "asyncroll_unlock":  # the unlock rule also ages relative to the queue's predicted drain
        assert aged == (oldest_waited >= aging) or abs(oldest_waited - aging) < 1e-5, (e, oldest_waited)
    if aged:
        assert e["job_id"] == e["oldest_job_id"] and not e["eligible"], e
    elif depth == 1:
        assert e["reason"] == "not_eligible_single_job" and not e["eligible"], e
    elif e["model_outstanding"] >= e["threshold"]:
        assert e["reason"] == "not_eligible_model_supply_ok" and not e["eligible"], e
    else:
        assert e["eligible"] == (e["reason"] != "not_eligible_no_predictions"), e
    if not e["eligible"]:
        assert not e["reordered"], e


def check_summary(summary: dict[str, Any], events: list[dict[str, Any]], peaks: dict[str, int]) -> None:
    """The summary's counts are the events' counts."""
    by = defaultdict(list)
    for e in events:
        by[e["event"]].append(e)
    finished = Counter(e["status"] for e in by["trajectory_finished"])
    counts = summary["counts"]
    assert counts["trajectories"] == len(by["trajectory_started"])
    assert counts["finished"] == len(by["trajectory_finished"]) == counts["trajectories"]
    assert {k: counts[k] for k in ("completed", "failed", "max_turns")} == {
        k: finished[k] for k in ("completed", "failed", "max_turns")
    }
    assert counts["unfinished"] == 0
    model = summary["model"]
    assert model["requests"] == len(by["model_enqueued"])
    assert model["finished"] == len(by["model_finished"])
    assert sum(model["failed"].values()) == len(by["model_failed"])
    jobs = Counter(e["kind"] for e in by["cpu_enqueued"])
    assert summary["tools"]["jobs_by_kind"] == dict(jobs) or (
        not jobs and not summary["tools"]["jobs_by_kind"]
    )
    assert summary["tools"]["calls"] == jobs["tool"]
    scheduler = summary["scheduler"]
    selected = by["cpu_selected"]
    assert scheduler["decisions"] == len(selected)
    assert scheduler["eligible_decisions"] == sum(bool(e.get("eligible")) for e in selected)
    assert scheduler["reorders"] == sum(e["reordered"] for e in selected)
    assert scheduler["reasons"] == dict(Counter(e["reason"] for e in selected))
    for e in selected:
        assert e["reordered"] == (e["job_id"] != e["oldest_job_id"]), e
    assert summary["workers"]["restarts"] == len(by["worker_restarting"])
    assert summary["peaks"] == {
        k: peaks.get(k, 0)
        for k in ("active_trajectories", "inflight_model_requests", "busy_workers", "queued_cpu_jobs")
    }
    ended = by["trajectory_finished"]
    graded = [e for e in ended if e["correct"] is not None]
    accuracy = summary["accuracy"]
    assert accuracy["correct"] == sum(e["correct"] is True for e in graded)
    assert accuracy["denominator"] == len(graded)
    assert accuracy["ungraded"] == len(ended) - len(graded)
    latency = summary["latency"]
    assert latency["trajectory_s"]["count"] == len(ended)
    assert latency["model_latency_s"]["count"] == len(by["model_finished"])
    assert latency["cpu_queue_s"]["count"] == len(selected)
    assert latency["cpu_execute_s"]["count"] == len(by["cpu_finished"])
    assert latency["turns_per_trajectory"]["count"] == len(ended)
    if ended:
        assert latency["turns_per_trajectory"]["max"] == max(e["turns"] for e in ended)
        assert latency["trajectory_s"]["max"] == max(e["duration_s"] for e in ended)
    started_at = {e["id"]: e["t"] for e in by["trajectory_started"]}
    for e in ended:
        assert abs(e["duration_s"] - (e["t"] - started_at[e["id"]])) < 2e-6, e
    blocked_s, intervals = blocked_reference(events)
    assert abs(summary["client_cpu_blocked"]["seconds"] - blocked_s) < 1e-5, (
        summary["client_cpu_blocked"],
        blocked_s,
    )
    assert summary["client_cpu_blocked"]["intervals"] == intervals
    (end,) = by["measurement_finished"]
    assert summary["makespan_s"] == end["makespan_s"]
    bounds = summary["bounds"]
    assert bounds["lower_bound_s"] <= summary["makespan_s"], bounds
    if bounds["lower_bound_s"] > 0:
        assert 0 < bounds["efficiency"] <= 1, bounds
    else:  # no work the bound counts: a run of 0 ms turns and jobs, whose time is all overhead
        assert bounds["efficiency"] in (0, None), bounds


def expected_endings(
    problems: list[dict[str, Any]], values: dict[str, Any], job_overhead_s: float
) -> dict[str, dict[str, Any]]:
    """What each trajectory must end as, walked from its script alone (outcomes do not depend on timing
    in a simulation): status, turns, tool calls, verdict, and each CPU job's execute time in order (the
    job's own cost: the overhead holds its worker, and counts toward its timeout, but is no execution)."""
    timeout = values.get("tool_timeout", 60.0)
    out = {}
    for problem in problems:
        script, turns, calls, jobs = problem["script"], 0, 0, []
        status, correct = "max_turns", None
        for action in script[: values["max_turns"]]:
            turns += 1
            if action["type"] == "final":
                status = "completed"
                if "reference_answer" in problem:
                    jobs.append(0.0)
                    correct = " ".join(action["answer"].split()) == problem["reference_answer"]
                break
            cost = action.get("cpu_ms", action.get("arguments", {}).get("milliseconds", 0)) / 1000
            timed_out = cost + job_overhead_s > timeout
            jobs.append(timeout if timed_out else cost)  # a timed-out job's round trip: the timeout
            if action["type"] == "submit":
                if timed_out:  # an evaluation that timed out has no verdict
                    status = "failed"
                    break
                correct = action.get("passes") is not False
                if correct or turns == 2:
                    status = "completed"
                    break
                continue
            calls += 1
            if timed_out and values["tool_errors"] == "fail":
                status = "failed"
                break
        else:
            if turns < values["max_turns"]:  # the request past the script's end fails the trajectory
                turns += 1
                status = "failed"
        out[problem["id"]] = {"status": status, "turns": turns, "tool_calls": calls, "correct": correct}
        out[problem["id"]]["jobs"] = jobs
    return out


def check_endings(
    problems: list[dict[str, Any]],
    values: dict[str, Any],
    server: SimulationSettings,
    events: list[dict[str, Any]],
) -> None:
    expected = expected_endings(problems, values, server.job_overhead_ms / 1000)
    jobs: dict[str, list[float]] = defaultdict(list)
    for e in events:
        if e["event"] == "cpu_finished":
            jobs[e["id"]].append(e["execute_s"])
        elif e["event"] == "cpu_failed":
            jobs[e["id"]].append(e["roundtrip_s"])
    seen = {}
    for e in events:
        if e["event"] == "trajectory_finished":
            seen[e["id"]] = {k: e[k] for k in ("status", "turns", "tool_calls", "correct")}
            seen[e["id"]]["jobs"] = jobs[e["id"]]
    for pid, want in expected.items():
        got = seen[pid]
        assert len(got["jobs"]) == len(want["jobs"]), (pid, got, want)
        for a, b in zip(got["jobs"], want["jobs"], strict=True):
            assert abs(a - b) < 2e-6, (pid, got, want)
        assert {**got, "jobs": None} == {**want, "jobs": None}, (pid, got, want)
    if server.server == "fixed":
        scripts = {p["id"]: p["script"] for p in problems}
        for e in events:
            if e["event"] == "model_finished":
                latency = (scripts[e["id"]][e["turn"]].get("latency_ms") or 0) / 1000
                assert abs(e["latency_s"] - latency - server.turn_overhead_ms / 1000) < 2e-6, e


@PROPS
@given(problems=workloads(), values=run_settings(), server=SERVERS)
def test_a_simulated_run_keeps_its_limits_and_its_books(
    problems: list[dict[str, Any]], values: dict[str, Any], server: SimulationSettings
) -> None:
    with tempfile.TemporaryDirectory(prefix="props-") as folder:
        summary, events, _ = simulated(Path(folder), problems, values, server)
    for e in events:
        EVENT_SCHEMAS[e["event"]].validate(e)
    peaks = check_limits(events, values)
    check_lifecycles(events)
    check_decisions(events, values)
    check_summary(summary, events, peaks)
    check_endings(problems, values, server, events)


@settings(PROPS, max_examples=30)
@given(problems=workloads(cpu=LONG_MS), values=contended_settings(), server=SERVERS)
def test_a_contended_run_that_reorders_keeps_its_limits_its_books_and_its_rules(
    problems: list[dict[str, Any]], values: dict[str, Any], server: SimulationSettings
) -> None:
    """The checks above where the queue is long: the reordering policies on one or two workers with tool
    jobs longer than most turns. (The examples above reorder in about one run of ten; these in most.)"""
    with tempfile.TemporaryDirectory(prefix="props-") as folder:
        summary, events, _ = simulated(Path(folder), problems, values, server)
    peaks = check_limits(events, values)
    check_lifecycles(events)
    check_decisions(events, values)
    check_summary(summary, events, peaks)
    check_endings(problems, values, server, events)
    event("reordered" if summary["scheduler"]["reorders"] else "kept FIFO order")


def without_wall_time(text: str) -> list[dict[str, Any]]:
    events = [json.loads(line) for line in text.splitlines()]
    for e in events:
        e.pop("wall_time", None)
    return events


@settings(PROPS, max_examples=15)
@given(problems=workloads(), values=run_settings(), server=SERVERS)
def test_the_same_simulation_twice_writes_the_same_summary_and_events(
    problems: list[dict[str, Any]], values: dict[str, Any], server: SimulationSettings
) -> None:
    written = []
    with tempfile.TemporaryDirectory(prefix="props-") as folder:
        for name in ("a", "b"):
            (Path(folder) / name).mkdir()
            _, _, events = simulated(Path(folder) / name, problems, values, server)
            summary = (Path(folder) / name / "run" / "summary.json").read_bytes()
            results = (Path(folder) / name / "run" / "results.jsonl").read_bytes()
            written.append((summary, results, without_wall_time(events)))
    assert written[0] == written[1]


@settings(PROPS, max_examples=15)
@given(problems=workloads(), values=run_settings(), turn_overhead_ms=OVERHEAD_MS, job_overhead_ms=OVERHEAD_MS)
def test_a_replay_of_a_fixed_latency_simulation_takes_its_latencies_and_its_makespan(
    problems: list[dict[str, Any]], values: dict[str, Any], turn_overhead_ms: float, job_overhead_ms: float
) -> None:
    """``simulate --from-run`` replays each turn's recorded latency (docs/SIMULATION.md); a fixed-latency
    simulation
    replayed under its own settings (its ``--job-overhead-ms`` given again: a job's recorded execute time
    leaves the overhead out, as a real one does; the turn overhead is inside the recorded latency) has the
    same schedule, so the same makespan and endings. Not promised, and not true, of a batching server,
    which ends requests due at one instant in batch order, which the replay's timers (in start order) need
    not keep, so ties go to other jobs."""
    from tests.conftest import invoke

    source = SimulationSettings(turn_overhead_ms=turn_overhead_ms, job_overhead_ms=job_overhead_ms)
    with tempfile.TemporaryDirectory(prefix="props-") as folder:
        summary, events, _ = simulated(Path(folder), problems, values, source)
        replay = Path(folder) / "replay"
        again_flag = ["--job-overhead-ms", str(job_overhead_ms)] if job_overhead_ms else []
        done = invoke("simulate", "--from-run", Path(folder) / "run", "--output", replay, *again_flag)
        assert done.exit_code == 0, done.output
        again = json.loads((replay / "summary.json").read_text(encoding="utf-8"))
        replayed = [json.loads(line) for line in (replay / "events.jsonl").read_text().splitlines()]

    def latencies(evs: list[dict[str, Any]]) -> dict[tuple[str, int], float]:
        return {(e["id"], e["turn"]): e["latency_s"] for e in evs if e["event"] == "model_finished"}

    assert latencies(replayed) == latencies(events)
    assert again["makespan_s"] == summary["makespan_s"]
    assert again["counts"] == summary["counts"]
