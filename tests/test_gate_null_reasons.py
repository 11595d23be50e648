"""A gate on a metric that a complete arm's summary.json holds as null says the summary's own reason for it:
every reason field a summary can carry, read from a summary the builder wrote (not a hand-made dict)."""

from __future__ import annotations

from typing import Any

from asyncroll.events import ModelEnqueued, ModelFinished, TrajectoryFinished, TrajectoryStarted
from asyncroll.experiment.config import Gate
from asyncroll.experiment.gates import evaluate_gates
from asyncroll.outputs.cpu_cost import cpu_cost
from asyncroll.outputs.summary import SummaryBuilder
from tests.event_records import at

LIMITS = {"max_active_trajectories": 1, "max_inflight_model_requests": 1, "cpu_workers": 1}


def _summary() -> dict[str, Any]:
    """One completed trajectory of a real run with no telemetry source, one of whose workers was replaced
    (its CPU cost unknown) and no code problem (no one-repair figures)."""
    builder = SummaryBuilder()
    for event in (
        at(0.0, TrajectoryStarted(id="a", index=0, prompt_chars=1, active=1)),
        at(0.0, ModelEnqueued(id="a", request_id=1, turn=0, outstanding=1)),
        at(1.0, ModelFinished(id="a", request_id=1, turn=0, latency_s=1.0, action="final")),
        at(1.0, TrajectoryFinished(id="a", status="completed", turns=1, tool_calls=0, duration_s=1.0)),
    ):
        builder(event)
    return builder.build(
        makespan_s=1.0,
        policy="fifo",
        limits=LIMITS,
        cpu_cost=cpu_cost((0.0, 0.0), (0.5, 1.0), True, 1),
        peaks={},
        status="complete",
    )


def _note(metric: str, summary: dict[str, Any]) -> str:
    verdict = evaluate_gates([Gate(metric=metric, op=">=", value=0)], ["a"], {"a": summary})[0]
    assert verdict["observed"] is None, verdict
    return str(verdict["note"])


def test_a_gate_on_a_null_resource_or_cpu_figure_says_the_summarys_reason() -> None:
    """``sampled_starvation_s`` and its fraction stand beside ``sampled_starvation_reason``, the idle-CPU
    figures beside ``cpu_idle_candidate_reason``, and ``cpu_cost`` says why in its ``reason``: each was
    "unknown (null: not measured in this run)", the reason the summary gave left unsaid (QA)."""
    summary = _summary()
    resources = summary["resources"]
    for leaf, reason in (
        ("sampled_starvation_s", "sampled_starvation_reason"),
        ("sampled_starvation_fraction_of_coverage", "sampled_starvation_reason"),
        ("cpu_idle_candidate_s", "cpu_idle_candidate_reason"),
        ("cpu_idle_candidate_fraction_of_coverage", "cpu_idle_candidate_reason"),
    ):
        assert resources[leaf] is None and resources[reason], (leaf, resources)
        assert _note(f"resources.{leaf}", summary) == f"unknown ({resources[reason]})"
    cost = summary["cpu_cost"]
    assert cost["per_completion_s"] is None and "replaced" in cost["reason"], cost
    for leaf in ("per_completion_s", "total_cpu_s", "workers_cpu_s"):
        assert _note(f"cpu_cost.{leaf}", summary) == f"unknown ({cost['reason']})"


def test_a_gate_under_a_null_section_says_which_is_null() -> None:
    """``accuracy.one_repair`` is null where no code problem was evaluated: a gate on its pass rate said
    the metric was not in the summary at all."""
    summary = _summary()
    assert summary["accuracy"]["one_repair"] is None
    assert _note("accuracy.one_repair.pass_rate_final", summary) == "unknown (accuracy.one_repair is null)"
    del summary["accuracy"]["one_repair"]
    assert _note("accuracy.one_repair.pass_rate_final", summary) == "unknown (not in the arm's summary.json)"


def test_a_gate_on_a_key_a_fixed_section_never_holds_is_refused_by_the_config() -> None:
    """``throughput``, ``rates``, ``cpu_cost``, ``client_cpu_blocked``, ``latency``, ``phases``,
    ``bounds.terms`` and ``resources.windows`` are mappings in the schema, so any key was taken: a typo
    (``throughput.completed_per_wall_hr``) passed ``experiment plan`` and failed its stage only after its
    arms had run, "not in the arm's summary.json" (QA). Their keys are the ones the summary builder writes;
    sections whose keys vary stay open."""
    from asyncroll.experiment.summary_paths import metric_problem

    summary = _summary()
    for section in ("throughput", "rates", "cpu_cost", "client_cpu_blocked"):
        for key, value in summary[section].items():
            if isinstance(value, int | float) or value is None:
                assert metric_problem(f"{section}.{key}") is None, (section, key)
    assert metric_problem("throughput.allocated_gpu_hours") is None  # written with --dedicated-gpu only
    assert metric_problem("latency.trajectory_s.p95") is None
    assert metric_problem("phases.fractions_of_trajectory_time.cpu_queue_s") is None
    assert metric_problem("bounds.totals.server_batch_s") is None  # a simulated server's only
    assert metric_problem("bounds.terms.admission_order_s") is None
    assert metric_problem("resources.windows.server_covered") is None
    for typo, wrong in (
        ("throughput.completed_per_wall_hr", "completed_per_wall_hr"),
        ("rates.sucess_rate", "sucess_rate"),
        ("cpu_cost.per_completion", "per_completion"),
        ("client_cpu_blocked.fraction", "fraction"),
        ("latency.trajectory.p95", "trajectory"),
        ("phases.fractions_of_trajectory_time.cpu_queue", "cpu_queue"),
        ("bounds.terms.model_s", "model_s"),
        ("resources.windows.totl", "totl"),
    ):
        problem = metric_problem(typo)
        assert problem is not None and f"has no {wrong!r} (it has " in problem, (typo, problem)
    assert "completed_per_wall_hour" in str(metric_problem("throughput.completed_per_wall_hr"))
    for open_key in ("model.failed.transport", "tools.failures.timeout", "scheduler.reasons.fifo"):
        assert metric_problem(open_key) is None, open_key
