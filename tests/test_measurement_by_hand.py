"""MEASUREMENT.md's definitions against a whole run worked out by hand: five trajectories through the real
runtime on a virtual clock (one worker, two active, one model slot), whose schedule is exact, so each
number a user reads is pinned to its definition end to end: the events the runtime writes and the summary
built from them. ``tests/test_summary_numbers.py`` pins the builder on a hand-made event stream; this pins
what a run of a workload gives.

The schedule (ms; requests r1… and jobs j1… numbered as the run numbers them)::

    a: r1 model 0–50 | j1 sleep 50–150 | r3 model 150–200 | j3 grade queued 200–350, 0 s | done 350
    b: r2 queued 0–50, model 50–100 | j2 queued 100–150, sleep 150–350 | r4 350–400 | j4 grade 400 | 400
    c: admitted 350 | r5 queued 350–400, model 400–430 | j5 raises after 40 ms: 430–470 | failed 470
    d: admitted 400 | r6 queued 400–430, model 430–450 fails (HTTP 500) | failed 450
    e: admitted 450 | r7 model 450–460, final, no reference | completed 460
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import VirtualRun

MS = 0.001


def _tool(ms: float, latency_ms: float, **declared: Any) -> dict[str, Any]:
    arguments = {"milliseconds": ms}
    return {"type": "tool", "name": "sleep_ms", "arguments": arguments, "latency_ms": latency_ms, **declared}


def _problem(pid: str, script: list[dict[str, Any]], reference: str | None = None) -> dict[str, Any]:
    problem: dict[str, Any] = {"id": pid, "prompt": pid, "tools": [{"name": "sleep_ms"}], "script": script}
    if reference is not None:
        problem["reference_answer"] = reference
    return problem


WORKLOAD = [
    _problem("a", [_tool(100, 50), {"type": "final", "answer": "ok", "latency_ms": 50}], "ok"),
    _problem("b", [_tool(200, 50), {"type": "final", "answer": "no", "latency_ms": 50}], "ok"),
    _problem("c", [_tool(0, 30, cpu_ms=40, raises="boom")]),
    _problem("d", [{"type": "error", "kind": "http_status", "status": 500, "latency_ms": 20}], "ok"),
    _problem("e", [{"type": "final", "answer": "x", "latency_ms": 10}]),
]


@pytest.fixture
def summary(virtual_run: VirtualRun) -> dict[str, Any]:
    outcome, _, _ = virtual_run(
        WORKLOAD, cpu_workers=1, max_active_trajectories=2, max_inflight_model_requests=1, policy="fifo"
    )
    assert outcome.summary is not None
    return outcome.summary


def test_makespan_rates_accuracy_and_throughput(summary: dict[str, Any]) -> None:
    assert summary["makespan_s"] == pytest.approx(470 * MS)  # c's failure, the last trajectory to end
    assert summary["counts"] == {
        "trajectories": 5, "finished": 5, "completed": 3, "failed": 2, "max_turns": 0, "unfinished": 0
    }  # fmt: skip
    # completed (a, b, e) ÷ started; six chat completions received, the HTTP 500 is no response
    assert summary["rates"] == {"success_rate": 0.6, "validity_rate": 1.0, "validity_denominator": 6}
    accuracy = summary["accuracy"]
    # graded: a (correct) and b (wrong); c, d, e have no verdict; referenced: a, b and d (failed: not correct)
    assert (accuracy["correct"], accuracy["denominator"], accuracy["exact"]) == (1, 2, 0.5)
    assert accuracy["ungraded"] == 3
    assert (accuracy["referenced"], accuracy["exact_of_referenced"]) == (3, round(1 / 3, 6))
    throughput = summary["throughput"]
    assert throughput["completed_per_wall_hour"] == pytest.approx(3 / 0.47 * 3600, abs=1e-6)
    assert throughput["trajectories_per_wall_hour"] == pytest.approx(5 / 0.47 * 3600, abs=1e-6)


def test_model_requests_tools_and_workers(summary: dict[str, Any]) -> None:
    model = summary["model"]
    assert (model["requests"], model["finished"], model["failed"]) == (7, 6, {"http_status": 1})
    tools = summary["tools"]
    # three tool calls (j1, j2, j5), one raised: 1 ÷ 3 reached an outcome; two grade jobs
    assert (tools["calls"], tools["errors"], tools["error_rate"]) == (3, 1, round(1 / 3, 6))
    assert tools["calls_per_trajectory"] == 0.6
    assert tools["jobs_by_kind"] == {"tool": 3, "grade": 2} and tools["failures"] == {}
    assert summary["workers"] == {"restarts": 0, "restarts_by_reason": {}}


def test_phases_sum_each_wait_and_service_over_the_finished_trajectories(summary: dict[str, Any]) -> None:
    phases = summary["phases"]
    expected = {
        "model_queue_s": (50 + 50 + 30) * MS,  # r2, r5, r6 waited for the one slot
        "model_service_s": (4 * 50 + 30 + 20 + 10) * MS,  # the failed r6 included
        "cpu_queue_s": (50 + 150) * MS,  # j2 behind j1; a's grade j3 behind j2
        "cpu_execute_s": (100 + 200 + 40) * MS,  # j5 raised after 40 ms; grades take 0 s
        "trajectory_total_s": (350 + 400 + 120 + 50 + 10) * MS,
    }
    for key, seconds in expected.items():
        assert phases[key] == pytest.approx(seconds), key
    for key, fraction in phases["fractions_of_trajectory_time"].items():
        assert fraction == pytest.approx(expected[key] / expected["trajectory_total_s"], abs=1e-6), key


def test_client_cpu_blocked_is_the_time_with_cpu_work_pending_and_no_request_outstanding(
    summary: dict[str, Any],
) -> None:
    # 100–150 (j1 runs, j2 queued, r3 not yet sent), 200–350 (j2 and a's grade), 460–470 (j5 alone)
    blocked = summary["client_cpu_blocked"]
    assert blocked["seconds"] == pytest.approx(210 * MS) and blocked["intervals"] == 3
    assert blocked["fraction_of_makespan"] == pytest.approx(210 / 470, abs=1e-6)


def test_bounds_terms_from_the_runs_own_work(summary: dict[str, Any]) -> None:
    bounds = summary["bounds"]
    work = {"a": 200, "b": 300, "c": 70, "d": 20, "e": 10}  # each trajectory's model + CPU ms
    assert bounds["terms"] == pytest.approx(
        {
            "model_service_s": 260 * MS,  # Σ latencies ÷ min(1 slot, 2 active)
            "cpu_execute_s": 340 * MS,  # Σ execute ÷ 1 worker
            "trajectory_work_s": sum(work.values()) / 2 * MS,  # ÷ 2 active
            "longest_trajectory_s": 300 * MS,  # b
            # a [0, 200] and b [0, 300] on two slots; c 200–270, d 270–290, e 290–300
            "admission_order_s": 300 * MS,
        }
    )
    assert (bounds["binding"], bounds["lower_bound_s"]) == ("cpu_execute_s", pytest.approx(340 * MS))
    assert bounds["efficiency"] == pytest.approx(340 / 470, abs=1e-6)


def test_scheduler_counts_its_decisions(summary: dict[str, Any]) -> None:
    scheduler = summary["scheduler"]
    assert (scheduler["decisions"], scheduler["eligible_decisions"], scheduler["reorders"]) == (5, 0, 0)
    assert scheduler["activation_rate"] is None and scheduler["reasons"] == {"fifo": 5}
    assert scheduler["max_queue_depth"] == summary["peaks"]["queued_cpu_jobs"] == 1
    prediction = scheduler["prediction"]
    # j1 and j2 finished ok (j5 raised, grades are left out): too few pairs for a correlation
    assert (prediction["pairs"], prediction["pairs_first"], prediction["pairs_repairs"]) == (2, 2, 0)
    assert prediction["pearson_log"] is None
    assert prediction["pearson_null_reasons"]["pearson_log"] == "fewer than 3 pairs (2)"
