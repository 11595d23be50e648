"""The makespan lower bound on hand-made workloads with known optimal makespans, and the client's measures
beside it: the time its CPU jobs blocked the model, and the CPU cost (unknown rather than zero)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import VirtualRun, tool_problem


def _final(pid: str, ms: float) -> dict[str, Any]:
    return {"id": pid, "prompt": "p", "script": [{"type": "final", "answer": 1, "latency_ms": ms}]}


@pytest.mark.parametrize(
    ("problems", "limits", "optimal", "binding"),
    [
        ([tool_problem("a", model_ms=100, cpu_ms=50)], {}, 0.25, "longest_trajectory_s"),
        (
            [tool_problem(f"c{i}", model_ms=0, cpu_ms=100) for i in range(4)],
            {"cpu_workers": 2},
            0.2,
            "cpu_execute_s",
        ),
        (
            [_final(f"m{i}", 100) for i in range(8)],
            {"max_inflight_model_requests": 2},
            0.4,
            "model_service_s",
        ),
        (
            [tool_problem(f"t{i}", model_ms=50, cpu_ms=50, final_ms=0) for i in range(6)],
            {"max_active_trajectories": 2, "max_inflight_model_requests": 8, "cpu_workers": 8},
            0.3,
            "trajectory_work_s",
        ),
    ],
)
def test_lower_bound_equals_known_optimum(
    virtual_run: VirtualRun,
    problems: list[dict[str, Any]],
    limits: dict[str, int],
    optimal: float,
    binding: str,
) -> None:
    outcome, _, _ = virtual_run(problems, **limits)
    assert outcome.summary is not None
    bounds = outcome.summary["bounds"]
    assert outcome.summary["makespan_s"] == pytest.approx(optimal)
    assert bounds["lower_bound_s"] == pytest.approx(optimal)
    assert bounds["binding"] == binding
    assert bounds["efficiency"] == pytest.approx(1.0)


def test_lower_bound_below_makespan_when_the_schedule_is_not_ideal(virtual_run: VirtualRun) -> None:
    # One worker, one long job that arrives last: FIFO cannot overlap it with anything.
    problems = [tool_problem(f"s{i}", model_ms=10, cpu_ms=10) for i in range(4)]
    problems.append(tool_problem("long", model_ms=60, cpu_ms=200, final_ms=200))
    outcome, _, _ = virtual_run(problems, cpu_workers=1)
    assert outcome.summary is not None
    bounds = outcome.summary["bounds"]
    assert bounds["lower_bound_s"] <= outcome.summary["makespan_s"]
    assert 0 < bounds["efficiency"] <= 1


def test_client_cpu_blocked_time_is_exact(virtual_run: VirtualRun) -> None:
    # One trajectory: 100 ms model, 50 ms job (blocked: nothing for the model), 100 ms model.
    outcome, _, _ = virtual_run([tool_problem("a", model_ms=100, cpu_ms=50)])
    assert outcome.summary is not None
    blocked = outcome.summary["client_cpu_blocked"]
    assert blocked["seconds"] == pytest.approx(0.05) and blocked["intervals"] == 1
    # b's model turns (0-120, 170-290) leave 120-150 with both trajectories in CPU jobs: 30 ms blocked.
    outcome, _, _ = virtual_run(
        [tool_problem("a", model_ms=100, cpu_ms=50), tool_problem("b", model_ms=120, cpu_ms=50)]
    )
    assert outcome.summary is not None
    assert outcome.summary["client_cpu_blocked"]["seconds"] == pytest.approx(0.03)
    # b's model turns (0-160, 210-370) cover a's job and a's (150-250) cover b's: never blocked.
    outcome, _, _ = virtual_run(
        [tool_problem("a", model_ms=100, cpu_ms=50), tool_problem("b", model_ms=160, cpu_ms=50)]
    )
    assert outcome.summary is not None
    assert outcome.summary["client_cpu_blocked"]["seconds"] == pytest.approx(0.0)


def test_cpu_cost_is_unknown_rather_than_zero_when_it_cannot_be_measured() -> None:
    from asyncroll.outputs.cpu_cost import cpu_cost

    known = cpu_cost((1.0, 10.0), (3.0, 16.0), replaced=False, completed=4)
    assert known == {
        "client_cpu_s": 2.0,
        "workers_cpu_s": 6.0,
        "total_cpu_s": 8.0,
        "per_completion_s": 2.0,
        "reason": None,
    }
    assert cpu_cost(None, (3.0, 16.0), False, 4)["client_cpu_s"] is None
    replaced = cpu_cost((1.0, 10.0), (3.0, 16.0), replaced=True, completed=4)
    assert (
        replaced["client_cpu_s"] == 2.0
        and replaced["total_cpu_s"] is None
        and "replaced" in replaced["reason"]
    )
    virtual = cpu_cost((1.0, None), (3.0, None), replaced=False, completed=4)
    assert virtual["workers_cpu_s"] is None and virtual["per_completion_s"] is None
    nothing = cpu_cost((1.0, 10.0), (3.0, 16.0), replaced=False, completed=0)
    assert nothing["total_cpu_s"] == 8.0 and nothing["per_completion_s"] is None
    assert nothing["reason"] == "no trajectory completed"
