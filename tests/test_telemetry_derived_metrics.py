"""The coverage-aware derived metrics (sampled starvation, coverage, the CPU-idle candidate) on
hand-made event streams with known answers."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from asyncroll.events import (
    CpuEnqueued,
    Event,
    ModelEnqueued,
    ModelFinished,
    ResourceProbe,
    ResourceSample,
    SourceStatus,
    TrajectoryFinished,
    TrajectoryStarted,
    parse_event,
)
from asyncroll.outputs.resources import gpu_hour
from asyncroll.outputs.summary import SummaryBuilder
from asyncroll.schemas import SummaryModel
from tests.event_records import cpu_finished


def _sample(t: float, seq: int, running: float | None = 0.0, util: float | None = None) -> ResourceSample:
    return ResourceSample(
        t=t,
        seq=seq,
        server_running=running,
        server_waiting=None if running is None else 0.0,
        gpu_util_pct=util,
        nulls={} if running is not None else {"server_running": "missing", "server_waiting": "missing"},
    )


def _blocked_stream(block_from: float, block_to: float) -> list[Event]:
    """One trajectory: a model turn until ``block_from``, then one tool job until ``block_to`` (blocked)."""
    return [
        TrajectoryStarted(t=0.0, id="a", index=0, prompt_chars=1, active=1),
        ModelEnqueued(t=0.0, id="a", request_id=1, turn=0, outstanding=1),
        ModelFinished(t=block_from, id="a", request_id=1, turn=0, latency_s=block_from, action="tool"),
        CpuEnqueued(
            t=block_from, id="a", job_id=1, kind="tool", tool="t", turn=0, arg_bytes=0, queue_depth=0
        ),
        cpu_finished(t=block_to, execute_s=1, cpu_s=1, roundtrip_s=1),
        TrajectoryFinished(
            t=block_to, id="a", status="completed", turns=1, tool_calls=1, duration_s=block_to
        ),
    ]


def _summarise(events: list[Event], makespan: float | None, **build: Any) -> dict[str, Any]:
    builder = SummaryBuilder()
    for event in sorted(events, key=lambda e: e.t):  # stable: equal times keep their order
        builder(event)
    summary = builder.build(
        makespan_s=makespan,
        policy="fifo",
        limits={"max_active_trajectories": 1, "max_inflight_model_requests": 1, "cpu_workers": 1},
        cpu_cost={},
        peaks={},
        status="complete",
        **build,
    )
    SummaryModel.model_validate(summary)
    return summary


def _probe(interval: float, *sources: str) -> ResourceProbe:
    return ResourceProbe(
        t=-0.1,
        interval_s=interval,
        sources=[SourceStatus(source=s, available=True) for s in sources],  # type: ignore[arg-type]
    )


def test_starvation_counts_blocked_time_only_where_the_server_was_idle_at_both_ends() -> None:
    # blocked over [1, 3]; samples every 0.5 s; the server is busy at t=2.0; the GPU is busy at t=2.5
    busy_server, busy_gpu = {2.0}, {2.5}
    samples = [
        _sample(t, i + 1, running=1.0 if t in busy_server else 0.0, util=50.0 if t in busy_gpu else 5.0)
        for i, t in enumerate([0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0])
    ]
    res = _summarise([_probe(0.5, "server_metrics", "nvml"), *_blocked_stream(1.0, 3.0), *samples], 3.0)[
        "resources"
    ]
    assert res["client_cpu_blocked_s"] == 2.0
    assert res["windows"]["total"] == 6 and res["windows"]["too_long"] == 0
    assert res["server_coverage_s"] == 3.0 and res["server_coverage_fraction"] == 1.0
    assert res["blocked_in_server_coverage_s"] == 2.0
    # [1, 1.5] and [2.5, 3] have an idle server at both ends; [1.5, 2] and [2, 2.5] touch t=2.0
    assert res["sampled_starvation_s"] == 1.0
    assert res["sampled_starvation_fraction_of_coverage"] == pytest.approx(1 / 3, abs=1e-6)
    assert res["windows"]["server_idle"] == 4  # [0,.5], [.5,1], [1,1.5], [2.5,3]
    # the GPU is also ≤ 10 % at both ends only in [1, 1.5] among the starved windows
    assert res["joint_coverage_s"] == 3.0 and res["cpu_idle_candidate_s"] == 0.5
    assert res["cpu_idle_candidate_reason"] is None


def test_windows_more_than_three_intervals_apart_or_missing_values_are_not_covered() -> None:
    # blocked over [1, 3]. Samples: 0.0 (running unknown) · 1.0 · 2.5 (exactly 3 intervals: covered)
    # · 4.1 (1.6 s > 3 intervals: not covered) · run ends at 4.1
    samples = [_sample(0.0, 1, running=None), _sample(1.0, 2), _sample(2.5, 3), _sample(4.1, 4)]
    res = _summarise([_probe(0.5, "server_metrics"), *_blocked_stream(1.0, 3.0), *samples], 4.1)["resources"]
    assert res["windows"] == {
        "total": 3,
        "too_long": 1,
        "server_covered": 1,
        "gpu_covered": 0,
        "joint_covered": 0,
        "server_idle": 1,
        "idle_candidate": 0,
    }
    assert res["max_gap_s"] == 1.5
    assert res["server_coverage_s"] == 1.5
    assert res["too_long_s"] == 1.6  # [2.5, 4.1]; [0, 1] lacks a value but is not too long
    assert res["sampled_starvation_s"] == 1.5  # blocked [1, 2.5]; the blocked [2.5, 3] is in the gap
    assert res["client_cpu_blocked_s"] == 2.0
    # no GPU source: the idle candidate is null with the reason, not zero
    assert res["cpu_idle_candidate_s"] is None
    assert res["cpu_idle_candidate_reason"] == "no GPU utilisation source: --nvml-device not given"


def test_the_last_window_is_clipped_at_the_end_of_the_measured_window() -> None:
    samples = [_sample(t, i + 1) for i, t in enumerate([0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.2])]
    res = _summarise([_probe(0.5, "server_metrics"), *_blocked_stream(1.0, 3.1), *samples], 3.1)["resources"]
    assert res["server_coverage_s"] == pytest.approx(3.1)
    assert res["sampled_starvation_s"] == pytest.approx(2.1)
    assert res["server_coverage_fraction"] == 1.0


def test_no_samples_means_null_estimates_with_reasons_and_gpu_hours_need_a_declared_gpu() -> None:
    probe = ResourceProbe(
        t=-0.1,
        interval_s=0.2,
        sources=[SourceStatus(source="server_metrics", available=False, reason="GET u: HTTP 404")],
    )
    summary = _summarise([probe, *_blocked_stream(1.0, 2.0)], 2.0)
    res = summary["resources"]
    assert res["sampled_starvation_s"] is None and res["cpu_idle_candidate_s"] is None
    assert res["sampled_starvation_reason"] == "server source unavailable: GET u: HTTP 404"
    assert res["server_coverage_s"] == 0.0 and res["windows"]["total"] == 0
    assert summary["throughput"]["completed_per_gpu_hour"] is None
    assert summary["throughput"]["completed_per_gpu_hour_reason"] == "only computed with --dedicated-gpu"
    declared = _summarise(_blocked_stream(1.0, 2.0), 2.0, dedicated_gpu=True)
    assert declared["throughput"]["completed_per_gpu_hour"] == 1800.0  # 1 completion in 2 s
    assert declared["throughput"]["allocated_gpu_hours"] == pytest.approx(2 / 3600)
    off = declared["telemetry"]
    assert off["probed"] is False and off["sources"] == {}
    assert declared["resources"]["sampled_starvation_reason"].startswith("no telemetry source probed")


def test_sample_events_round_trip_through_the_jsonl_schema() -> None:
    sample = ResourceSample(
        t=1.5,
        seq=3,
        server_running=0.0,
        server_waiting=None,
        nulls={"server_waiting": "missing"},
        collection_s={"server_metrics": 0.0012},
        errors=[],
    )
    line = json.dumps(sample.model_dump())
    back = parse_event(line)
    assert back == sample and isinstance(back, ResourceSample)
    assert math.isclose(back.collection_s["server_metrics"], 0.0012)


def test_samples_taken_after_the_measured_window_are_clipped_to_it() -> None:
    """The sampler may sample once more during the run's cleanup and again at its stop: both come after
    the window ended (0.65 s). The window [0.6, 0.8] used to be added whole: coverage 0.8 s of 0.65."""
    builder = SummaryBuilder()
    builder(_probe(0.2, "server_metrics"))
    for seq, t in enumerate((0.0, 0.2, 0.4, 0.6), start=1):
        builder(_sample(t, seq))
    builder.end_window(0.65)
    builder(_sample(0.8, 5))
    builder(_sample(0.85, 6))
    res = builder.build(
        makespan_s=0.65,
        policy="fifo",
        limits={"max_active_trajectories": 1, "max_inflight_model_requests": 1, "cpu_workers": 1},
        cpu_cost={},
        peaks={},
        status="complete",
    )["resources"]
    assert res["server_coverage_s"] == 0.65 and res["server_coverage_fraction"] == 1.0


def test_the_telemetry_section_counts_what_the_samples_say_and_averages_only_what_was_read() -> None:
    """Samples, errors, counter resets and nulls are summed over the samples; a null value is left out of
    its quantity's count, mean and max (never read as 0); read times and lateness are distributions (the
    final sample's lateness, null, left out of its)."""

    def sample(seq: int, running: float | None, util: float | None, **fields: Any) -> ResourceSample:
        return ResourceSample(
            t=0.5 * (seq - 1),
            seq=seq,
            server_running=running,
            server_waiting=None if running is None else running / 2,
            gpu_util_pct=util,
            collection_s={"server_metrics": (0.002, 0.004, 0.006)[seq - 1], "nvml": 0.001},
            late_s=0.1 * (seq - 1) if seq < 3 else None,  # the third is the final one: off the grid
            **fields,
        )

    error = {"server_running": "error", "server_waiting": "error"}
    samples = [
        sample(1, 2.0, 40.0, counter_resets=1, kv_cache_usage=0.5),
        sample(2, None, 80.0, nulls=error, errors=["server_metrics: GET u: HTTP 500"]),
        sample(3, 4.0, None, nulls={"gpu_util_pct": "missing"}, counter_resets=2),
    ]
    tele = _summarise([_probe(0.5, "server_metrics", "nvml"), *samples], 1.0)["telemetry"]
    assert (tele["samples"], tele["errors"], tele["counter_resets"]) == (3, 1, 3)
    assert tele["nulls"] == {
        "gpu_util_pct": {"missing": 1},
        "server_running": {"error": 1},
        "server_waiting": {"error": 1},
    }
    assert tele["values"] == {
        "server_running": {"n": 2, "mean": 3.0, "max": 4.0},
        "server_waiting": {"n": 2, "mean": 1.5, "max": 2.0},
        "kv_cache_usage": {"n": 1, "mean": 0.5, "max": 0.5},
        "gpu_util_pct": {"n": 2, "mean": 60.0, "max": 80.0},
    }
    assert tele["collection_s"]["server_metrics"] == {
        "count": 3,
        "mean": 0.004,
        "min": 0.002,
        "p50": 0.004,
        "p95": 0.0058,
        "max": 0.006,
    }
    assert tele["collection_s"]["nvml"]["count"] == 3
    assert (tele["late_s"]["count"], tele["late_s"]["max"]) == (2, 0.1)  # the final sample left out
    assert tele["note"] is None and tele["interval_s"] == 0.5


def test_the_gpu_is_low_at_ten_percent_and_a_window_with_one_unknown_end_is_not_gpu_covered() -> None:
    """``GPU_IDLE_PCT`` is inclusive: 10 % is low, 10.5 % is not. A window whose one end lacks the GPU's
    utilisation is server-covered only: it adds nothing to GPU or joint coverage."""
    utils = {0.25: 10.0, 0.5: 10.0, 1.0: None, 1.5: 10.5, 2.0: 0.0}
    samples = [_sample(t, i + 1, util=u) for i, (t, u) in enumerate(utils.items())]
    # blocked over [0.3, 1.75]: 0.2 s of [0.25, 0.5], 0.25 s of [1.5, 2] (after 1.2 s blocked before it)
    res = _summarise([_probe(0.5, "server_metrics", "nvml"), *_blocked_stream(0.3, 1.75), *samples], 2.0)[
        "resources"
    ]
    assert res["windows"] == {
        "total": 4,
        "too_long": 0,
        "server_covered": 4,
        "gpu_covered": 2,  # [.25, .5] and [1.5, 2]
        "joint_covered": 2,
        "server_idle": 4,
        "idle_candidate": 1,  # [.25, .5]: 10 % at both ends; [1.5, 2] starts at 10.5 %
    }
    assert (res["server_coverage_s"], res["server_coverage_fraction"]) == (1.75, 0.875)
    assert (res["gpu_coverage_s"], res["joint_coverage_s"], res["joint_coverage_fraction"]) == (
        0.75,
        0.75,
        0.375,
    )
    assert (res["blocked_in_server_coverage_s"], res["blocked_in_joint_coverage_s"]) == (1.45, 0.45)
    assert (res["sampled_starvation_s"], res["sampled_starvation_coverage_s"]) == (1.45, 1.75)
    assert (res["cpu_idle_candidate_s"], res["cpu_idle_candidate_coverage_s"]) == (0.2, 0.75)
    assert res["cpu_idle_candidate_fraction_of_coverage"] == 0.266667


def test_a_window_needs_both_server_gauges_and_three_intervals_allow_for_float_sums() -> None:
    """A sample with running but no waiting leaves the server's state unknown: its windows are not
    covered (not "busy"). Samples at 0.6 and 1.5 s, 0.3 s apart, are three intervals apart, though in
    floats 1.5 - 0.6 = 0.9 > 3 × 0.3 = 0.8999999999999999."""
    half = ResourceSample(t=0.5, seq=2, server_running=0.0, nulls={"server_waiting": "missing"})
    res = _summarise([_probe(0.5, "server_metrics"), _sample(0.0, 1), half, _sample(1.0, 3)], 1.0)[
        "resources"
    ]
    assert res["windows"]["total"] == 2 and res["windows"]["server_covered"] == 0
    assert res["sampled_starvation_s"] is None and res["server_coverage_s"] == 0.0
    res = _summarise([_probe(0.3, "server_metrics"), _sample(0.6, 1), _sample(1.5, 2)], 1.5)["resources"]
    assert res["windows"]["too_long"] == 0 and res["server_coverage_s"] == 0.9


def _clipped(end: float, sample_times: tuple[float, ...]) -> dict[str, Any]:
    """The resources section of a run stopped at ``end`` while blocked on a tool call since 0.5 s (its
    end is never seen), with a sample (server idle) at each of ``sample_times``, the later ones taken
    during the run's cleanup."""
    builder = SummaryBuilder()
    events = [_probe(0.2, "server_metrics"), *(e for e in _blocked_stream(0.5, 2.0) if e.t <= end)]
    events += [_sample(t, i + 1) for i, t in enumerate(sample_times)]
    ended = False
    for event in sorted(events, key=lambda e: e.t):
        if event.t > end and not ended:
            builder.end_window(end)
            ended = True
        builder(event)
    limits = {"max_active_trajectories": 1, "max_inflight_model_requests": 1, "cpu_workers": 1}
    summary = builder.build(
        makespan_s=end, policy="fifo", limits=limits, cpu_cost={}, peaks={}, status="complete"
    )
    return dict(summary["resources"])


def test_a_clipped_window_counts_only_the_blocked_time_inside_the_measured_window() -> None:
    """[0.4, 0.7] is clipped at 0.6: the client was blocked 0.1 s of it inside the window (0.2 s of the
    whole window), not the clipped span's 0.2 s. A window that starts where the measured window ends is
    none."""
    res = _clipped(0.6, (0.0, 0.2, 0.4, 0.7))
    assert res["windows"]["total"] == 3 and res["server_coverage_s"] == 0.6
    assert res["sampled_starvation_s"] == 0.1 and res["blocked_in_server_coverage_s"] == 0.1
    at_end = _clipped(0.4, (0.0, 0.2, 0.4, 0.6))
    assert at_end["windows"]["total"] == 2 and at_end["windows"]["server_covered"] == 2
    assert at_end["server_coverage_s"] == 0.4


def test_a_window_that_never_opened_has_null_fractions_and_no_gpu_hours() -> None:
    """The run stopped while starting (no makespan): coverage fractions are null (not a division by a
    zero makespan), and so are GPU-hours, with why; a 0.7 s window still has its per-hour rate."""
    summary = _summarise([_probe(0.5, "server_metrics"), _sample(0.0, 1)], None, dedicated_gpu=True)
    res = summary["resources"]
    assert res["server_coverage_fraction"] is None and res["joint_coverage_fraction"] is None
    assert res["client_cpu_blocked_s"] is None and res["sampled_starvation_s"] is None
    assert summary["throughput"]["completed_per_gpu_hour"] is None
    assert summary["throughput"]["completed_per_gpu_hour_reason"] == "the measured window is empty"
    assert gpu_hour(1, 0.7, True)["completed_per_gpu_hour"] == 5142.857143  # 3600 / 0.7
