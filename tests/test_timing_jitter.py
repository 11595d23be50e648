"""The seeded timing jitter sweeps rest on: deterministic, mean one and keyed per problem, turn and side;
a jittered workload keeps its actions and scales every declared cost (model latency with its output
tokens, a tool's or a submission's CPU time), capped at a day rather than refused."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from asyncroll.simulation.perturb import factor, perturb_workload
from tests.conftest import tool_problem, write_workload


def test_jitter_is_deterministic_mean_one_and_keyed() -> None:
    draws = [factor(3, f"p{i}", 0, "cpu", 0.5) for i in range(4000)]
    assert statistics.fmean(draws) == pytest.approx(1.0, abs=0.03)
    assert draws == [factor(3, f"p{i}", 0, "cpu", 0.5) for i in range(4000)]
    assert factor(3, "p0", 0, "cpu", 0.5) != factor(4, "p0", 0, "cpu", 0.5)
    assert factor(3, "p0", 0, "cpu", 0.5) != factor(3, "p0", 0, "model", 0.5)
    assert factor(9, "anything", 2, "cpu", 0.0) == 1.0


def test_perturbed_workload_keeps_actions_and_sets_costs(tmp_path: Path) -> None:
    source = write_workload(tmp_path / "w.jsonl", [tool_problem("a", model_ms=100, cpu_ms=50, turns=2)])
    same = tmp_path / "same.jsonl"
    assert perturb_workload(source, same, seed=0, sigma=0.0) == 1  # the problems written
    row = json.loads(same.read_text())
    assert [a["latency_ms"] for a in row["script"]] == [100, 100, 100]
    assert [a.get("cpu_ms") for a in row["script"]] == [50, 50, None]  # sleep_ms argument → cpu_ms
    jittered = tmp_path / "j.jsonl"
    perturb_workload(source, jittered, seed=1, sigma=0.5)
    row = json.loads(jittered.read_text())
    assert row["script"][0]["arguments"] == {"milliseconds": 50}
    assert row["script"][0]["latency_ms"] != 100 and row["script"][0]["cpu_ms"] != 50


def test_jitter_scales_declared_output_tokens_with_the_model_latency(tmp_path: Path) -> None:
    """The batching server model times a turn by its tokens: jittering only latency_ms left it the same
    turns on every seed."""
    problem = tool_problem("a", model_ms=100, cpu_ms=50, turns=2)
    for action, tokens in zip(problem["script"], (40, 3, 1), strict=True):
        action["output_tokens"] = tokens
    problem["script"].append({"type": "final", "answer": 1})  # neither latency nor tokens: untouched
    source = write_workload(tmp_path / "w.jsonl", [problem])
    same = tmp_path / "same.jsonl"
    perturb_workload(source, same, seed=0, sigma=0.0)
    assert [a.get("output_tokens") for a in json.loads(same.read_text())["script"]] == [40, 3, 1, None]
    jittered = tmp_path / "j.jsonl"
    perturb_workload(source, jittered, seed=2, sigma=0.8)
    script = json.loads(jittered.read_text())["script"]
    for turn, (tokens, action) in enumerate(zip((40, 3, 1), script[:3], strict=True)):
        f = factor(2, "a", turn, "model", 0.8)
        assert action["latency_ms"] == pytest.approx(100 * f)
        assert action["output_tokens"] == max(1, round(tokens * f))
    assert script[3].get("output_tokens") is None and script[3].get("latency_ms") is None


def test_jitter_scales_a_submissions_declared_evaluation_cost(tmp_path: Path) -> None:
    """A ``submit`` may declare its evaluation's ``cpu_ms`` (a replay workload of a code run does, for
    every program): only tool actions' costs were jittered, so every seed evaluated each program in the
    same time and a sweep's spread left out the CPU side of a code workload."""
    problem = {
        "id": "c",
        "prompt": "write it",
        "script": [
            {"type": "submit", "code": "print(1)", "latency_ms": 10, "cpu_ms": 400, "passes": False},
            {"type": "submit", "code": "print(2)", "latency_ms": 10, "cpu_ms": 250},
            {"type": "submit", "code": "print(3)", "latency_ms": 10},  # no cost declared: none invented
        ],
        "metadata": {"prompt_metadata": {"protocol": "one_repair", "max_generations": 3}},
    }
    source = write_workload(tmp_path / "w.jsonl", [problem])
    same = tmp_path / "same.jsonl"
    perturb_workload(source, same, seed=0, sigma=0.0)
    assert [a.get("cpu_ms") for a in json.loads(same.read_text())["script"]] == [400, 250, None]
    jittered = tmp_path / "j.jsonl"
    perturb_workload(source, jittered, seed=3, sigma=0.5)
    script = json.loads(jittered.read_text())["script"]
    for turn, cost in enumerate((400, 250)):
        assert script[turn]["cpu_ms"] == pytest.approx(cost * factor(3, "c", turn, "cpu", 0.5))
        assert script[turn]["cpu_ms"] != cost
    assert script[2].get("cpu_ms") is None
    assert [a.get("passes") for a in script] == [False, None, None]


def test_a_jittered_duration_is_capped_at_a_day_not_refused(tmp_path: Path) -> None:
    """A valid long job (80 000 s of a one-day limit) jittered past one day made the seed's workload
    invalid: the sweep stopped with "cpu_ms: Input should be less than or equal to 86400000" about a
    file it wrote itself. Jittered durations are capped at the limit of a declared one."""
    from asyncroll.simulation.engine import SimulationSettings
    from asyncroll.simulation.sweep import SweepSpec, run_sweep
    from asyncroll.workload import MAX_DURATION_MS

    long = 80_000_000.0
    problems = [tool_problem(f"p{i}", model_ms=long, cpu_ms=long, turns=1) for i in range(6)]
    source = write_workload(tmp_path / "w.jsonl", problems)
    jittered = tmp_path / "j.jsonl"
    perturb_workload(source, jittered, seed=0, sigma=1.0)
    costs = [
        (a.get("latency_ms"), a.get("cpu_ms"))
        for line in jittered.read_text().splitlines()
        for a in json.loads(line)["script"]
    ]
    assert all(c is None or c <= MAX_DURATION_MS for pair in costs for c in pair)
    assert any(MAX_DURATION_MS in pair for pair in costs)  # some were drawn past a day
    spec = SweepSpec(("fifo",), (4,), (4,), (2,), 2, 1.0)
    rows = run_sweep(
        source,
        tmp_path,
        {"tool_timeout": 2 * MAX_DURATION_MS / 1000},
        spec,
        SimulationSettings(),
        tmp_path / "s",
    )
    assert [r["completed"] for r in rows] == [6, 6]
