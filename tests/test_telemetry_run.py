"""Telemetry in a whole run: a loopback server sampled (starvation with coverage), one without metrics,
one failing or restarting mid-run, a model filter matching nothing, the virtual clock, the flags and
the metrics URL each backend implies."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from asyncroll.config import build_config
from asyncroll.errors import UsageError
from asyncroll.events import ResourceProbe, ResourceSample, parse_event
from asyncroll.schemas import SummaryModel
from tests.conftest import REPO, tool_problem, write_workload
from tests.metrics_loopback import MetricsServer, idle_vllm, real_clock_run


def _cli_run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``asyncroll run ARGS`` in a process of its own (80 s at most), its output captured."""
    command = [sys.executable, "-m", "asyncroll.cli", "run", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=80, cwd=REPO)


@pytest.mark.timeout(90)
def test_cli_run_samples_a_loopback_server_and_reports_starvation_with_coverage(
    tmp_path: Path, metrics_server: Callable[..., MetricsServer]
) -> None:
    server = metrics_server(idle_vllm)
    workload = write_workload(
        tmp_path / "w.jsonl", [tool_problem("p1", model_ms=20, cpu_ms=250, turns=3, tool="sleep_ms")]
    )
    out = tmp_path / "run"
    result = _cli_run(
        *("--workload", workload, "--output", out),
        *("--max-active-trajectories", "1", "--cpu-workers", "1", "--model", "sim"),
        *("--metrics-url", server.url, "--telemetry-interval", "0.1", "--dedicated-gpu"),
    )
    assert result.returncode == 0, result.stderr
    assert "warning: telemetry" not in result.stderr  # the source answered
    events = [parse_event(line) for line in (out / "events.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    receipt = json.loads((out / "run.json").read_text())
    SummaryModel.model_validate(summary)

    [probe] = [e for e in events if isinstance(e, ResourceProbe)]
    assert probe.t < 0  # before the measurement clock
    [status] = probe.sources
    assert status.source == "server_metrics" and status.available and status.reason is None
    assert status.detail["flavor"] == "vllm" and status.detail["other_models"] == ["busy"]
    assert receipt["telemetry"]["sources"][0]["available"] is True
    assert receipt["exports"]["trace.json"]["ok"] and receipt["exports"]["timeline.html"]["ok"]
    assert "server_metrics.available" in (out / "timeline.html").read_text()  # the telemetry table

    samples = [e for e in events if isinstance(e, ResourceSample)]
    assert len(samples) >= 5  # ≈ 0.85 s of run at 0.1 s, plus the final sample
    assert all(s.server_running == 0.0 and s.server_waiting == 0.0 for s in samples)  # "busy" ignored
    assert all(s.collection_s["server_metrics"] > 0 for s in samples)
    assert [s.seq for s in samples] == list(range(1, len(samples) + 1))
    assert samples[0].prompt_tokens_per_s is None  # no previous reading
    assert all(s.prompt_tokens_per_s is not None and s.prompt_tokens_per_s > 0 for s in samples[1:])
    nan_kv = [s for s in samples if s.kv_cache_usage is None]
    assert nan_kv and all(s.nulls == {"kv_cache_usage": "invalid"} for s in nan_kv)

    tele, res = summary["telemetry"], summary["resources"]
    assert tele["probed"] and tele["sources"]["server_metrics"]["available"]
    assert tele["samples"] == len(samples) and tele["errors"] == 0
    assert tele["nulls"] == {"kv_cache_usage": {"invalid": len(nan_kv)}}
    makespan = summary["makespan_s"]
    blocked = summary["client_cpu_blocked"]["seconds"]
    assert blocked > 0.5  # three 250 ms tool calls with nothing for the model
    assert 0.5 * makespan < res["server_coverage_s"] <= makespan + 1e-6
    assert res["windows"]["server_covered"] >= 4
    starvation = res["sampled_starvation_s"]
    assert starvation is not None and res["sampled_starvation_reason"] is None
    # idle at every sample: all blocked time inside covered windows is starvation
    assert starvation == pytest.approx(res["blocked_in_server_coverage_s"], abs=1e-6)
    assert 0.5 * blocked < starvation <= blocked + 1e-6
    assert res["sampled_starvation_coverage_s"] == res["server_coverage_s"]
    assert res["cpu_idle_candidate_s"] is None
    assert "--nvml-device not given" in res["cpu_idle_candidate_reason"]
    gpu_hour = summary["throughput"]["completed_per_gpu_hour"]
    assert gpu_hour == pytest.approx(1 / (makespan / 3600), rel=1e-4)
    assert server.scrapes >= len(samples) + 1  # the probe, then every sample


@pytest.mark.timeout(60)
def test_a_server_without_metrics_is_unavailable_not_zeros(
    tmp_path: Path, metrics_server: Callable[..., MetricsServer]
) -> None:
    server = metrics_server(lambda n: (404, '{"detail":"Not Found"}'))
    outcome, capture, summary = real_clock_run(
        tmp_path,
        [tool_problem("p1", model_ms=5, cpu_ms=50)],
        metrics_url=server.url,
        telemetry_interval=0.02,
    )
    assert outcome.status == "complete"
    [probe] = capture.of(ResourceProbe)
    [status] = probe.sources
    assert not status.available and "HTTP 404" in (status.reason or "")
    assert capture.of(ResourceSample) == []  # no samples, hence no zeros
    res = summary["resources"]
    assert res["sampled_starvation_s"] is None and "HTTP 404" in res["sampled_starvation_reason"]
    assert res["server_coverage_s"] == 0.0 and res["server_coverage_fraction"] == 0.0
    assert summary["telemetry"]["sources"]["server_metrics"]["available"] is False
    assert server.scrapes == 1


@pytest.mark.timeout(90)
def test_the_command_warns_of_a_requested_source_that_was_unavailable(
    tmp_path: Path, metrics_server: Callable[..., MetricsServer]
) -> None:
    """A run that asked for telemetry and measured without it says so on stderr, with the reason, not
    only in summary.json: its numbers must not pass for a run measured with it."""
    server = metrics_server(lambda n: (404, '{"detail":"Not Found"}'))
    result = _cli_run(
        "--no-progress",
        "--workload",
        REPO / "examples" / "smoke.jsonl",
        "--output",
        tmp_path / "run",
        "--metrics-url",
        server.url,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith(
        f"warning: telemetry: server_metrics unavailable (GET {server.url}: HTTP 404"
    )
    assert result.stderr.endswith("this run has no server_metrics values (summary.json: telemetry.sources)\n")


@pytest.mark.timeout(60)
def test_a_server_that_fails_mid_run_gives_null_samples_with_errors(
    tmp_path: Path, metrics_server: Callable[..., MetricsServer]
) -> None:
    # up for the probe and the first samples, then 500s: samples continue, nulls are counted as errors
    server = metrics_server(lambda n: idle_vllm(n) if n <= 3 else (500, "engine dead"))
    outcome, capture, summary = real_clock_run(
        tmp_path,
        [tool_problem("p1", model_ms=5, cpu_ms=400)],
        metrics_url=server.url,
        telemetry_interval=0.02,
        model="sim",
    )
    assert outcome.status == "complete"
    samples = capture.of(ResourceSample)
    failed = [s for s in samples if s.errors]
    assert [s.seq for s in samples if not s.errors] == [1, 2] and len(failed) >= 1
    assert all(s.server_running is None and s.nulls["server_running"] == "error" for s in failed)
    assert all("HTTP 500" in s.errors[0] for s in failed)
    tele = summary["telemetry"]
    assert tele["errors"] == len(failed) and tele["nulls"]["server_running"]["error"] == len(failed)
    res = summary["resources"]
    # at most the one window between the two good samples (none if they were > 3 intervals apart)
    assert res["windows"]["server_covered"] <= 1
    assert res["server_coverage_s"] <= 3 * 0.02 + 1e-6
    assert (res["sampled_starvation_s"] is None) == (res["windows"]["server_covered"] == 0)


@pytest.mark.timeout(60)
def test_model_filter_that_matches_nothing_is_reported_at_the_probe(
    tmp_path: Path, metrics_server: Callable[..., MetricsServer]
) -> None:
    server = metrics_server(idle_vllm)
    _, capture, _ = real_clock_run(
        tmp_path, [tool_problem("p1", model_ms=5, cpu_ms=5)], metrics_url=server.url, model="typo"
    )
    [status] = capture.of(ResourceProbe)[0].sources
    assert not status.available and "model_name='typo'" in (status.reason or "")
    assert "'busy'" in (status.reason or "") and "'sim'" in (status.reason or "")


@pytest.mark.timeout(60)
def test_a_server_restart_mid_run_is_a_counted_counter_reset_not_a_negative_rate(
    tmp_path: Path, metrics_server: Callable[..., MetricsServer]
) -> None:
    def restarting(n: int) -> tuple[int, str]:
        tokens = 1000.0 * n if n < 4 else 5.0 * (n - 3)  # the 4th scrape sees a fresh server
        return 200, (
            'vllm:num_requests_running{model_name="sim"} 0\nvllm:num_requests_waiting{model_name="sim"} 0\n'
            f'vllm:prompt_tokens_total{{model_name="sim"}} {tokens}\n'
            f'vllm:generation_tokens_total{{model_name="sim"}} {tokens / 10}\n'
        )

    server = metrics_server(restarting)
    _, capture, summary = real_clock_run(
        tmp_path,
        [tool_problem("p1", model_ms=5, cpu_ms=400)],
        metrics_url=server.url,
        telemetry_interval=0.02,
        model="sim",
    )
    samples = capture.of(ResourceSample)
    assert len(samples) >= 4
    [reset] = [s for s in samples if s.counter_resets]
    assert reset.seq == 3 and reset.counter_resets == 2  # scrape 4 = sample 3 (the probe was scrape 1)
    rates = [s.prompt_tokens_per_s for s in samples if s.prompt_tokens_per_s is not None]
    assert rates and all(r >= 0 for r in rates)
    assert summary["telemetry"]["counter_resets"] == 2
    # no KV gauge served: missing in every sample; the first sample's absent rate is not counted
    assert summary["telemetry"]["nulls"] == {"kv_cache_usage": {"missing": len(samples)}}


def test_on_a_virtual_clock_no_source_is_read(virtual_run: Any) -> None:
    outcome, capture, _ = virtual_run(
        [tool_problem("p1", model_ms=5, cpu_ms=5)], metrics_url="http://127.0.0.1:9/metrics", nvml_device=0
    )
    assert outcome.status == "complete"
    statuses = capture.of(ResourceProbe)[0].sources
    assert [s.source for s in statuses] == ["server_metrics", "nvml"]
    assert all(not s.available and "virtual clock" in (s.reason or "") for s in statuses)
    assert capture.of(ResourceSample) == []
    assert outcome.summary is not None
    assert "virtual clock" in outcome.summary["resources"]["sampled_starvation_reason"]


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({}, "a simulation (virtual clock) reads no server or GPU telemetry"),
        ({"telemetry": False}, "telemetry off (--no-telemetry)"),
    ],
)
def test_without_sources_the_summary_says_why_for_this_run(
    virtual_run: Any, settings: dict[str, Any], why: str
) -> None:
    outcome, capture, out = virtual_run([tool_problem("p1", model_ms=5, cpu_ms=5)], **settings)
    assert outcome.status == "complete" and capture.of(ResourceProbe) == []
    assert outcome.summary is not None
    res = outcome.summary["resources"]
    assert outcome.summary["telemetry"]["note"] == why  # this run's reason, not a list of every possible one
    assert res["sampled_starvation_reason"] == why and res["cpu_idle_candidate_reason"] == why
    assert json.loads((out / "run.json").read_text())["telemetry"]["note"] == why  # run.json says the same


def test_telemetry_flags_validate() -> None:
    base = {"workload": "w.jsonl", "output": "out"}
    with pytest.raises(UsageError, match="--metrics-url 'localhost:8000/metrics': must be an http"):
        build_config({**base, "metrics_url": "localhost:8000/metrics"})
    with pytest.raises(UsageError, match="--no-telemetry conflicts"):
        build_config({**base, "telemetry": False, "nvml_device": 0})
    cfg = build_config({**base, "dedicated_gpu": True, "nvml_device": 0, "metrics_url": "http://h/metrics"})
    assert cfg.unavailable_features() == []


def test_metrics_url_and_names_follow_the_backend_and_the_declared_server_kind() -> None:
    from asyncroll.telemetry.sampler import metrics_flavor, metrics_url

    base = {"workload": "w.jsonl", "output": "out"}
    assert metrics_url(build_config(base)) is None  # scripted: nothing to scrape unless asked
    vllm = build_config({**base, "backend": "vllm", "model": "m", "endpoint": "http://127.0.0.1:8000/"})
    # --backend vllm declares vllm (run.json says so): its metric names are vLLM's, not detected
    assert metrics_url(vllm) == "http://127.0.0.1:8000/metrics" and metrics_flavor(vllm) == "vllm"
    probed = build_config({**base, "backend": "openai", "model": "m", "metrics_url": "http://h:1/metrics"})
    assert metrics_flavor(probed) == "auto"  # nothing declared: detected from the text at the probe
    generic = build_config({**base, "backend": "openai", "model": "m"})
    assert metrics_url(generic) is None  # nothing is assumed of another server
    sglang = build_config({**base, "backend": "openai", "model": "m", "server_kind": "sglang"})
    assert metrics_url(sglang) == "http://localhost:8000/metrics" and metrics_flavor(sglang) == "sglang"
    off = build_config({**base, "backend": "vllm", "model": "m", "telemetry": False})
    assert metrics_url(off) is None
    explicit = build_config({**base, "metrics_url": "http://10.0.0.2:9090/metrics"})
    assert metrics_url(explicit) == "http://10.0.0.2:9090/metrics"
