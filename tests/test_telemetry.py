"""Telemetry: vLLM/SGLang metrics parsing, the sampler against a real loopback server, NVML's unavailable
path, NVTX ranges, and the coverage-aware derived metrics on hand-made event streams with known answers.

The expositions below have the shape real servers serve: vLLM V1 (``engine`` and ``model_name`` labels,
HELP/TYPE comments, counters with ``_created`` companions, histogram buckets), vLLM V0 (the legacy
``vllm:gpu_cache_usage_perc``) and SGLang (``--enable-metrics``; ``tp_rank``/``engine_type`` labels).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import struct
import subprocess
import sys
import threading
import time
import tracemalloc
import types
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from asyncroll.clock import SystemClock, VirtualClock
from asyncroll.config import build_config
from asyncroll.errors import UsageError
from asyncroll.event_log import EventCapture, EventLog
from asyncroll.events import (
    CpuEnqueued,
    CpuFinished,
    Event,
    ModelEnqueued,
    ModelFinished,
    ModelStarted,
    ResourceProbe,
    ResourceSample,
    SourceStatus,
    TrajectoryFinished,
    TrajectoryStarted,
    parse_event,
)
from asyncroll.outputs.summary import SummaryBuilder
from asyncroll.runtime.run import Run, RunOutcome, prepare
from asyncroll.runtime.virtual_worker import builtin_duration, virtual_factory
from asyncroll.schemas import SummaryModel
from asyncroll.telemetry import nvml as nvml_module
from asyncroll.telemetry.counter_rate import CounterRate
from asyncroll.telemetry.nvml import NvmlSource, NvmlUnavailable
from asyncroll.telemetry.nvtx import NO_RANGES, NvtxRanges, NvtxUnavailable, RangeName, make_ranges
from asyncroll.telemetry.sampler import TelemetrySampler
from asyncroll.telemetry.server_metrics import (
    SGLANG,
    VLLM,
    MetricsUnavailable,
    ServerMetricsSource,
    ServerSample,
    detect_flavor,
    parse_metrics,
)
from tests.conftest import REPO, tool_problem, write_workload
from tests.loopback import LoopbackServer, trickle

MODEL = "Qwen/Qwen2.5-7B-Instruct"

VLLM_V1 = f"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 3.0
vllm:num_requests_running{{engine="1",model_name="{MODEL}"}} 2.0
vllm:num_requests_running{{engine="0",model_name="other/model"}} 9.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} 1.0
vllm:num_requests_waiting{{engine="1",model_name="{MODEL}"}} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="{MODEL}"}} 0.25
vllm:kv_cache_usage_perc{{engine="1",model_name="{MODEL}"}} 0.5
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",model_name="{MODEL}"}} 1000.0
vllm:prompt_tokens_total{{engine="1",model_name="{MODEL}"}} 500.0
# HELP vllm:prompt_tokens_created Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{{engine="0",model_name="{MODEL}"}} 1.7329e+09
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="{MODEL}"}} 250.0
vllm:generation_tokens_total{{engine="1",model_name="{MODEL}"}} 50.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.001",model_name="{MODEL}"}} 0.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="{MODEL}"}} 12.0
vllm:time_to_first_token_seconds_count{{engine="0",model_name="{MODEL}"}} 12.0
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="{MODEL}"}} 0.84
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="8192"}} 1.0
"""

VLLM_V0 = """# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="/models/llama-2-7b"} 4.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="/models/llama-2-7b"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="/models/llama-2-7b"} 2.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="/models/llama-2-7b"} 0.75
# HELP vllm:cpu_cache_usage_perc CPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:cpu_cache_usage_perc gauge
vllm:cpu_cache_usage_perc{model_name="/models/llama-2-7b"} 0.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="/models/llama-2-7b"} 7.0e+03
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="/models/llama-2-7b"} 1.2e+03
"""

SGL = 'engine_type="unified",model_name="meta-llama/Llama-3.1-8B-Instruct",tp_rank="0"'
SGLANG_TEXT = f"""# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{{{SGL}}} 8.128902e+06
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{{{SGL}}} 7.557572e+06
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{{{SGL}}} 0.28
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{{SGL}}} 6.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{{SGL}}} 3.0
# HELP sglang:cache_hit_rate The cache hit rate
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{{{SGL}}} 0.0075
"""


# --- parsing --------------------------------------------------------------------------------------------


def test_vllm_v1_exposition_is_filtered_by_model_and_summed_over_engines() -> None:
    reading = parse_metrics(VLLM_V1, VLLM, MODEL)
    assert reading.running == 5.0  # two engines; the other model's 9 is ignored
    assert reading.waiting == 1.0
    assert reading.kv_cache_usage == 0.5 and reading.kv_cache_metric == "vllm:kv_cache_usage_perc"
    assert sorted(reading.prompt_tokens.values()) == [500.0, 1000.0]
    assert sum(reading.generation_tokens.values()) == 300.0
    assert reading.nulls == {}
    assert reading.other_models == ("other/model",)
    # without a model filter every series counts
    assert parse_metrics(VLLM_V1, VLLM, None).running == 14.0


def test_legacy_gpu_cache_usage_name_is_the_fallback() -> None:
    reading = parse_metrics(VLLM_V0, VLLM, "/models/llama-2-7b")
    assert (reading.running, reading.waiting) == (4.0, 2.0)
    assert reading.kv_cache_usage == 0.75 and reading.kv_cache_metric == "vllm:gpu_cache_usage_perc"
    assert reading.nulls == {}
    # when both names are served the current one wins
    both = VLLM_V0 + 'vllm:kv_cache_usage_perc{model_name="/models/llama-2-7b"} 0.1\n'
    assert parse_metrics(both, VLLM, None).kv_cache_usage == 0.1


def test_sglang_names_are_read_and_auto_detected() -> None:
    assert detect_flavor(SGLANG_TEXT) == "sglang"
    assert detect_flavor(VLLM_V1) == "vllm" and detect_flavor(VLLM_V0) == "vllm"
    assert detect_flavor("python_gc_objects_collected_total 3\n") is None
    reading = parse_metrics(SGLANG_TEXT, SGLANG, "meta-llama/Llama-3.1-8B-Instruct")
    assert (reading.running, reading.waiting, reading.kv_cache_usage) == (6.0, 3.0, 0.28)
    assert list(reading.prompt_tokens.values()) == [8.128902e06]
    assert reading.nulls == {}


def test_missing_series_and_nan_are_null_and_named_never_zero() -> None:
    text = VLLM_V1.replace(
        f'vllm:num_requests_running{{engine="1",model_name="{MODEL}"}} 2.0',
        f'vllm:num_requests_running{{engine="1",model_name="{MODEL}"}} NaN',
    )
    text = "\n".join(line for line in text.splitlines() if not line.startswith("vllm:num_requests_waiting"))
    text = text.replace(f'vllm:generation_tokens_total{{engine="1",model_name="{MODEL}"}} 50.0', "")
    text += f'\nvllm:generation_tokens_total{{engine="2",model_name="{MODEL}"}} +Inf\n'
    reading = parse_metrics(text, VLLM, MODEL)
    assert reading.running is None and reading.nulls["running"] == "invalid"
    assert reading.waiting is None and reading.nulls["waiting"] == "missing"
    assert reading.kv_cache_usage == 0.5  # untouched quantities still read
    # an infinite counter series is dropped and named; the finite one stays
    assert list(reading.generation_tokens.values()) == [250.0]
    assert reading.nulls["generation_tokens"] == "invalid"
    # no KV series under either name: missing, not 0
    bare = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
    empty = parse_metrics(bare, VLLM, None)
    assert empty.kv_cache_usage is None and empty.nulls["kv_cache_usage"] == "missing"
    assert empty.nulls["prompt_tokens"] == "missing" and empty.running == 0.0


def test_a_malformed_line_spoils_only_its_own_quantity() -> None:
    text = VLLM_V1 + f'vllm:num_requests_waiting{{engine="3",model_name="{MODEL}"}} not-a-number\n'
    reading = parse_metrics(text, VLLM, MODEL)
    assert reading.waiting is None and reading.nulls == {"waiting": "invalid"}
    assert reading.running == 5.0


def test_counter_rates_detect_a_reset() -> None:
    rate = CounterRate()
    a, b = (("engine", "0"),), (("engine", "1"),)
    assert rate.update({a: 100.0, b: 10.0}, at=0.0) == (None, 0, 0)  # first reading: no rate
    assert rate.update({a: 150.0, b: 20.0}, at=1.0) == (60.0, 0, 0)
    # engine 0 restarted: its counter fell to 30 → its increase is 30, not -120
    assert rate.update({a: 30.0, b: 40.0}, at=2.0) == (50.0, 1, 0)
    assert rate.resets == 1
    assert rate.update({}, at=3.0) == (None, 0, 0)  # a missing reading keeps the last good one
    assert rate.update({a: 90.0, b: 40.0}, at=4.0) == (30.0, 0, 0)  # (60 + 0) over 2 s
    # a series seen for the first time contributes only from its second reading
    c = (("engine", "2"),)
    assert rate.update({a: 90.0, b: 40.0, c: 1000.0}, at=5.0) == (0.0, 0, 0)


def test_a_counter_that_falls_a_little_is_invalid_and_only_a_fall_to_half_is_a_reset() -> None:
    """A restarted server's counter starts again near zero; 1000100 → 1000099 is no restart (read as
    one, it was a 1,000,099-token interval: D9). The reading has no rate, the series keeps its last good
    value, so the next increase spans the gap."""
    rate = CounterRate()
    a, b = (("engine", "0"),), (("engine", "1"),)
    assert tuple(rate.update({a: 1000000.0, b: 10.0}, at=0.0)) == (None, 0, 0)
    assert tuple(rate.update({a: 1000100.0, b: 20.0}, at=1.0)) == (110.0, 0, 0)
    assert tuple(rate.update({a: 1000099.0, b: 30.0}, at=2.0)) == (None, 0, 1)  # b still advances
    assert tuple(rate.update({a: 1000300.0, b: 40.0}, at=3.0)) == (110.0, 0, 0)  # a: 200 over 2 s
    assert tuple(rate.update({a: 500151.0, b: 50.0}, at=4.0)) == (None, 0, 1)  # just above half
    assert tuple(rate.update({a: 500151.0, b: 60.0}, at=5.0)) == (None, 0, 1)  # still too little
    assert tuple(rate.update({a: 500000.0, b: 70.0}, at=6.0)) == (166676.666667, 1, 0)  # 500000/3 + 10
    assert rate.resets == 1


# --- a real loopback metrics server ---------------------------------------------------------------------


#: A hostile answer: ``raw(handler, n, closing)`` writes the n-th scrape's whole response itself and
#: returns True, or returns False to leave it to ``render``; ``closing`` is set when the server shuts down.
Raw = Callable[[BaseHTTPRequestHandler, int, threading.Event], bool]


class MetricsServer(LoopbackServer):
    """A loopback ``/metrics`` server; ``render(n)`` gives (status, body) of the n-th scrape, unless
    ``raw(handler, n)`` answered it (returned True). ``closing`` is set at shutdown, for a raw answer that
    never ends by itself."""

    def __init__(self, render: Callable[[int], tuple[int, str]], raw: Raw | None = None) -> None:
        self.render = render
        self.scrapes = 0
        self.closing = threading.Event()
        owner = self
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with lock:
                    owner.scrapes += 1
                    n = owner.scrapes
                if raw is not None and raw(self, n, owner.closing):
                    return
                status, body = owner.render(n)
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                return None

        super().__init__(Handler)
        self.url += "/metrics"

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        super().__exit__(*exc)


def read_samples(url: str, reads: int) -> list[ServerSample]:
    """Probe ``url`` once, then take ``reads`` samples 1 s apart on a made-up clock (exact rates)."""
    times = iter(float(i) for i in range(reads))

    async def go() -> list[ServerSample]:
        source = ServerMetricsSource(url, flavor="vllm", model="sim", timeout=5.0)
        try:
            await source.probe(5.0)
            return [await source.read(lambda: next(times)) for _ in range(reads)]
        finally:
            await source.aclose()

    return asyncio.run(go())


@pytest.mark.timeout(30)
def test_an_invalid_series_nulls_its_rate_and_keeps_its_last_good_reading(
    metrics_server: Callable[..., MetricsServer],
) -> None:
    """Two engines, +10 and +100 tokens per scrape; engine 1's counter reads NaN on scrapes 4 and 6. The
    rate is null (never engine 0's alone) while a series is invalid, and the next rate spans the gap."""

    def partial_nan(n: int) -> tuple[int, str]:
        engine1 = "NaN" if n in (4, 6) else str(100.0 * n)
        return 200, (
            'vllm:num_requests_running{engine="0",model_name="sim"} 1\n'
            'vllm:num_requests_waiting{engine="0",model_name="sim"} 0\n'
            f'vllm:generation_tokens_total{{engine="0",model_name="sim"}} {10.0 * n}\n'
            f'vllm:generation_tokens_total{{engine="1",model_name="sim"}} {engine1}\n'
        )

    samples = read_samples(metrics_server(partial_nan).url, 6)  # scrapes 2..7 (1 was the probe)
    assert [s.generation_tokens_per_s for s in samples] == [None, 110.0, None, 110.0, None, 110.0]
    assert [s.nulls.get("generation_tokens") for s in samples] == [
        None,
        None,
        "invalid",
        None,
        "invalid",
        None,
    ]
    assert all(s.counter_resets == 0 for s in samples)


@pytest.mark.timeout(30)
def test_duplicate_series_are_invalid_and_make_no_bogus_resets(
    metrics_server: Callable[..., MetricsServer],
) -> None:
    def duplicated(n: int) -> tuple[int, str]:
        return 200, (
            'vllm:num_requests_running{model_name="sim"} 1\nvllm:num_requests_running{model_name="sim"} 1\n'
            'vllm:num_requests_waiting{model_name="sim"} 0\n'
            f'vllm:generation_tokens_total{{model_name="sim"}} {10 * n}\n'
            f'vllm:generation_tokens_total{{model_name="sim"}} {1000 - n}\n'
        )

    samples = read_samples(metrics_server(duplicated).url, 4)
    assert [(s.running, s.generation_tokens_per_s, s.counter_resets) for s in samples] == [
        (None, None, 0)
    ] * 4
    assert all(
        s.nulls
        == {
            "running": "invalid",
            "generation_tokens": "invalid",
            "kv_cache_usage": "missing",
            "prompt_tokens": "missing",
        }
        for s in samples
    )
    assert samples[0].waiting == 0.0  # other quantities still read


@pytest.mark.timeout(30)
def test_a_small_counter_dip_is_an_invalid_rate_and_a_fall_to_near_zero_a_reset(
    metrics_server: Callable[..., MetricsServer],
) -> None:
    """1000100 → 1000099 is a bad reading, not a restart (it was read as 1,000,099 tokens in one
    second: D9); a fall to near zero is a restart."""
    tokens = {2: 1000000.0, 3: 1000100.0, 4: 1000099.0, 5: 1000300.0, 6: 40.0}

    def dipping(n: int) -> tuple[int, str]:
        return 200, (
            'vllm:num_requests_running{model_name="sim"} 1\nvllm:num_requests_waiting{model_name="sim"} 0\n'
            f'vllm:generation_tokens_total{{model_name="sim"}} {tokens.get(n, 999000.0)}\n'
        )

    samples = read_samples(metrics_server(dipping).url, 5)  # scrapes 2..6, 1 s apart
    assert [s.generation_tokens_per_s for s in samples] == [None, 100.0, None, 100.0, 40.0]
    assert [s.nulls.get("generation_tokens") for s in samples] == [None, None, "invalid", None, None]
    assert [s.counter_resets for s in samples] == [0, 0, 0, 0, 1]


def idle_vllm(n: int) -> tuple[int, str]:
    """An idle vLLM server whose token counters still grow (prefix-cached work from elsewhere), with a
    busy *other* model that the model filter must ignore, and a NaN KV-cache reading every 4th scrape."""
    kv = "NaN" if n % 4 == 0 else "0.125"
    return 200, (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="sim"} 0.0\n'
        'vllm:num_requests_running{engine="0",model_name="busy"} 7.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="sim"} 0.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="busy"} 3.0\n'
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="sim"}} {kv}\n'
        "# TYPE vllm:prompt_tokens_total counter\n"
        f'vllm:prompt_tokens_total{{engine="0",model_name="sim"}} {100.0 * n}\n'
        f'vllm:generation_tokens_total{{engine="0",model_name="sim"}} {10.0 * n}\n'
    )


@pytest.fixture
def metrics_server() -> Iterator[Callable[..., MetricsServer]]:
    servers: list[MetricsServer] = []

    def start(render: Callable[[int], tuple[int, str]], raw: Raw | None = None) -> MetricsServer:
        server = MetricsServer(render, raw).__enter__()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.__exit__()


def real_clock_run(
    tmp_path: Path, problems: list[dict[str, Any]], **settings: Any
) -> tuple[RunOutcome, EventCapture, dict[str, Any]]:
    """A run on the real clock with virtual workers (no processes): real sockets, real time."""
    workload = write_workload(tmp_path / "w.jsonl", problems)
    cfg = build_config({"workload": workload, "output": tmp_path / "run", **settings})
    clock = SystemClock()
    capture = EventCapture()
    run = Run(
        prepare(cfg, ["test"]),
        clock,
        worker_factory=virtual_factory(clock, builtin_duration),
        subscribers=(capture,),
    )
    outcome = asyncio.run(run.execute())
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    SummaryModel.model_validate(summary)
    return outcome, capture, summary


@pytest.mark.timeout(90)
def test_cli_run_samples_a_loopback_server_and_reports_starvation_with_coverage(
    tmp_path: Path, metrics_server: Callable[..., MetricsServer]
) -> None:
    server = metrics_server(idle_vllm)
    workload = write_workload(
        tmp_path / "w.jsonl", [tool_problem("p1", model_ms=20, cpu_ms=250, turns=3, tool="sleep_ms")]
    )
    out = tmp_path / "run"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "asyncroll.cli", "run"),
            *("--workload", str(workload), "--output", str(out)),
            *("--max-active-trajectories", "1", "--cpu-workers", "1", "--model", "sim"),
            *("--metrics-url", server.url, "--telemetry-interval", "0.1", "--dedicated-gpu"),
        ],
        capture_output=True,
        text=True,
        timeout=80,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
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


# --- NVML ----------------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_nvml_unavailable_on_this_machine_is_reported_with_its_reason(tmp_path: Path) -> None:
    """No NVIDIA driver here (the GPU path itself can only be checked on a GPU host)."""
    outcome, capture, summary = real_clock_run(
        tmp_path, [tool_problem("p1", model_ms=5, cpu_ms=5)], nvml_device=0
    )
    assert outcome.status == "complete"
    [status] = capture.of(ResourceProbe)[0].sources
    assert status.source == "nvml" and not status.available
    assert status.reason is not None and (
        "NVML could not initialise" in status.reason or "nvidia-ml-py" in status.reason
    )
    assert capture.of(ResourceSample) == []
    assert summary["resources"]["cpu_idle_candidate_s"] is None
    assert summary["telemetry"]["sources"]["nvml"]["reason"] == status.reason


def test_nvml_without_the_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(NvmlUnavailable, match=r"asyncroll\[telemetry\]"):
        NvmlSource(0).probe()


def test_nvml_without_a_driver_says_so() -> None:
    pytest.importorskip("pynvml")
    with pytest.raises(NvmlUnavailable, match="NVML could not initialise"):
        NvmlSource(0).probe()


class _FakeNVMLError(Exception):
    pass


def _fake_pynvml(*, count: int, util_supported: bool) -> types.ModuleType:
    """A stand-in for the ``pynvml`` bindings with the calls NvmlSource makes (no GPU here)."""
    fake = types.ModuleType("pynvml")
    fake.NVMLError = _FakeNVMLError  # type: ignore[attr-defined]
    calls: list[str] = []

    def utilization(handle: object) -> Any:
        if not util_supported:
            raise _FakeNVMLError("Not Supported")
        return types.SimpleNamespace(gpu=37, memory=12)

    fake.__dict__.update(
        calls=calls,
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: count,
        nvmlDeviceGetHandleByIndex=lambda i: ("handle", i),
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetUUID=lambda h: "GPU-1234",
        nvmlSystemGetDriverVersion=lambda: "550.54",
        nvmlDeviceGetUtilizationRates=utilization,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=10 * 2**30, total=80 * 2**30, free=0),
    )
    return fake


def test_nvml_reads_through_the_bindings_and_nulls_what_the_device_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The calls and the handling of their answers, against a binding-level double: the values reach the
    sample, an unsupported reading is null with its error, an unknown index is refused. (On a real GPU
    this code calls the same functions of nvidia-ml-py; that path is not exercised on this machine.)"""
    fake = _fake_pynvml(count=2, util_supported=True)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    source = NvmlSource(1)
    detail = source.probe()
    assert detail == {"index": 1, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-1234", "driver": "550.54"}
    sample = source.read()
    assert (sample.util_pct, sample.mem_util_pct, sample.mem_used_bytes) == (37.0, 12.0, 10 * 2**30)
    assert sample.nulls == {} and sample.error is None
    source.close()
    source.close()
    assert fake.calls == ["init", "shutdown"]

    with pytest.raises(NvmlUnavailable, match=r"NVML sees 2 device\(s\)"):
        NvmlSource(2).probe()

    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(count=1, util_supported=False))
    mig = NvmlSource(0)
    assert mig.probe()["unsupported_at_probe"] == ["gpu_mem_util_pct", "gpu_util_pct"]
    sample = mig.read()
    assert sample.util_pct is None and sample.nulls["gpu_util_pct"] == "invalid"
    assert sample.mem_total_bytes == 80 * 2**30 and "Not Supported" in (sample.error or "")
    assert nvml_module.EXTRA_HINT in str(NvmlUnavailable(nvml_module.EXTRA_HINT))


# --- NVTX ----------------------------------------------------------------------------------------------


class RecordingRanges:
    """Records every range: each started handle must be ended exactly once."""

    enabled = True

    def __init__(self) -> None:
        self.started: list[tuple[int, RangeName, int | None]] = []
        self.ended: list[int] = []

    def start(self, name: RangeName, payload: int | None = None) -> Any:
        handle = len(self.started)
        self.started.append((handle, name, payload))
        return handle

    def end(self, handle: Any) -> None:
        self.ended.append(handle)

    def count(self, name: RangeName) -> int:
        return sum(1 for _, n, _ in self.started if n == name)


def test_nvtx_ranges_start_and_end_around_every_wait_and_request(tmp_path: Path) -> None:
    workload = write_workload(
        tmp_path / "w.jsonl",
        [tool_problem(f"p{i}", model_ms=40, cpu_ms=30, turns=2) for i in range(6)],
    )
    cfg = build_config({"workload": workload, "output": tmp_path / "run", "cpu_workers": 2})
    clock = VirtualClock()
    capture = EventCapture()
    ranges = RecordingRanges()
    run = Run(
        prepare(cfg, ["test"]),
        clock,
        worker_factory=virtual_factory(clock, builtin_duration),
        subscribers=(capture,),
        ranges=ranges,
    )
    outcome = clock.run(run.execute())
    assert outcome.status == "complete"
    assert sorted(ranges.ended) == list(range(len(ranges.started)))  # every range closed once
    assert ranges.count("run") == 1
    assert ranges.count("model wait") == len(capture.of(ModelEnqueued)) == 18
    assert ranges.count("model request") == len(capture.of(ModelStarted)) == 18
    assert ranges.count("cpu queue") == len(capture.of(CpuEnqueued)) == 12
    assert ranges.count("cpu execution") == len(capture.of(CpuFinished)) == 12
    request_ids = {p for _, n, p in ranges.started if n == "model request"}
    assert request_ids == {e.request_id for e in capture.of(ModelStarted)}


def test_nvtx_off_is_a_no_op_and_on_uses_the_real_package() -> None:
    assert make_ranges(False) is NO_RANGES and NO_RANGES.start("run") is None
    pytest.importorskip("nvtx")
    ranges = make_ranges(True)
    assert isinstance(ranges, NvtxRanges)
    for name in ("run", "model wait", "model request", "cpu queue", "cpu execution"):
        ranges.end(ranges.start(name, 7))  # real calls (no profiler attached: nvtx's own no-op domain)


def test_nvtx_without_the_package_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nvtx", None)
    with pytest.raises(NvtxUnavailable, match=r"asyncroll\[profiling\]"):
        NvtxRanges()
    workload = write_workload(tmp_path / "w.jsonl", [tool_problem("p1", model_ms=1, cpu_ms=1)])
    cfg = build_config({"workload": workload, "output": tmp_path / "run", "nvtx": True})
    with pytest.raises(UsageError, match=r"--nvtx needs the nvtx package: .*asyncroll\[profiling\]"):
        prepare(cfg, ["test"])
    assert not (tmp_path / "run").exists()  # refused before anything started


def test_nvtx_found_but_broken_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package that exists but fails to import (a broken install) is refused at validation too, not
    with a traceback after the run directory exists."""
    broken = tmp_path / "site"
    broken.mkdir()
    (broken / "nvtx.py").write_text("raise OSError('libnvToolsExt missing')\n")
    monkeypatch.syspath_prepend(str(broken))
    monkeypatch.delitem(sys.modules, "nvtx", raising=False)
    workload = write_workload(tmp_path / "w.jsonl", [tool_problem("p1", model_ms=1, cpu_ms=1)])
    cfg = build_config({"workload": workload, "output": tmp_path / "run", "nvtx": True})
    with pytest.raises(UsageError, match=r"asyncroll\[profiling\]' \(import failed: libnvToolsExt missing\)"):
        prepare(cfg, ["test"])
    assert not (tmp_path / "run").exists()


def test_telemetry_flags_validate() -> None:
    base = {"workload": "w.jsonl", "output": "out"}
    with pytest.raises(UsageError, match="--metrics-url 'localhost:8000/metrics': must be an http"):
        build_config({**base, "metrics_url": "localhost:8000/metrics"})
    with pytest.raises(UsageError, match="--no-telemetry conflicts"):
        build_config({**base, "telemetry": False, "nvml_device": 0})
    cfg = build_config({**base, "dedicated_gpu": True, "nvml_device": 0, "metrics_url": "http://h/metrics"})
    assert cfg.unavailable_features() == []


# --- derived metrics on hand-made event streams ---------------------------------------------------------


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
        CpuFinished(
            t=block_to,
            id="a",
            job_id=1,
            worker=0,
            kind="tool",
            tool="t",
            ok=True,
            execute_s=1,
            cpu_s=1,
            roundtrip_s=1,
        ),
        TrajectoryFinished(
            t=block_to, id="a", status="completed", turns=1, tool_calls=1, duration_s=block_to
        ),
    ]


def _summarise(events: list[Event], makespan: float, **build: Any) -> dict[str, Any]:
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


@pytest.mark.timeout(30)
def test_the_sampler_survives_a_failing_source_and_records_every_failure(
    metrics_server: Callable[..., MetricsServer],
) -> None:
    """An exception inside a source (a bug, not a bad server) is caught, counted and written into that
    sample; sampling goes on, and stop() takes the final sample and closes the sources."""
    from asyncroll.event_log import EventLog
    from asyncroll.telemetry.sampler import TelemetrySampler
    from asyncroll.telemetry.server_metrics import ServerMetricsSource

    server = metrics_server(idle_vllm)

    class Flaky(ServerMetricsSource):
        calls = 0

        async def read(self, now: Callable[[], float]) -> Any:
            Flaky.calls += 1
            if Flaky.calls in (2, 3):
                raise RuntimeError(f"boom {Flaky.calls}")
            return await super().read(now)

    async def main() -> list[ResourceSample]:
        clock = SystemClock()
        events = EventLog(clock)
        capture = EventCapture()
        events.subscribe(capture)
        enough = asyncio.Event()
        events.subscribe(lambda e: enough.set() if len(capture.of(ResourceSample)) >= 5 else None)
        source = Flaky(server.url, model="sim", timeout=1.0)
        sampler = TelemetrySampler(clock, events, interval=0.01, server=source)
        await sampler.probe()
        events.start_measurement()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(sampler.run())
            await enough.wait()
            await sampler.stop()
        assert sampler.errors == 2 and source._client is None  # closed
        return capture.of(ResourceSample)

    samples = asyncio.run(main())
    assert len(samples) >= 6  # five, then the final one
    broken = [s for s in samples if s.errors]
    assert [s.errors for s in broken] == [
        ["server_metrics: RuntimeError: boom 2"],
        ["server_metrics: RuntimeError: boom 3"],
    ]
    assert all(s.server_running is None and s.nulls["server_running"] == "error" for s in broken)
    assert all(s.server_running == 0.0 for s in samples if not s.errors)
    assert [s.seq for s in samples] == list(range(1, len(samples) + 1))


@pytest.mark.timeout(30)
def test_the_metrics_source_detects_sglang_and_honours_a_declared_kind(
    metrics_server: Callable[..., MetricsServer],
) -> None:
    from asyncroll.telemetry.server_metrics import MetricsUnavailable, ServerMetricsSource

    sglang = metrics_server(lambda n: (200, SGLANG_TEXT))

    async def main() -> None:
        auto = ServerMetricsSource(sglang.url, model=None, timeout=2.0)
        detail = await auto.probe(2.0)
        assert detail["flavor"] == "sglang" and detail["kv_cache_metric"] == "sglang:token_usage"
        got = await auto.read(SystemClock().now)
        assert (got.running, got.waiting, got.kv_cache_usage, got.error) == (6.0, 3.0, 0.28, None)
        await auto.aclose()
        declared = ServerMetricsSource(sglang.url, flavor="vllm", model=None, timeout=2.0)
        with pytest.raises(MetricsUnavailable, match="no vllm:num_requests_running in the response"):
            await declared.probe(2.0)
        await declared.aclose()
        nothing = metrics_server(lambda n: (200, "python_gc_objects_collected_total 1.0\n"))
        unknown = ServerMetricsSource(nothing.url, model=None, timeout=2.0)
        with pytest.raises(MetricsUnavailable, match=r"no vLLM .* or SGLang .* metrics in the response"):
            await unknown.probe(2.0)
        await unknown.aclose()

    asyncio.run(main())


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


# --- a hostile metrics server: whatever /metrics does, the client stays bounded -------------------------


def _gzip_zeros(mib: int) -> bytes:
    """A valid gzip stream of ``mib`` MiB of zeros in about ``mib`` KB: one full-flushed deflate block of
    1 MiB repeated (each stands alone), then the trailer."""
    block = b"\0" * (1 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    flushed = deflate.compress(block) + deflate.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(mib):
        crc = zlib.crc32(block, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    return header + flushed * mib + deflate.flush() + struct.pack("<II", crc, (mib << 20) & 0xFFFFFFFF)


def _trickle(handler: BaseHTTPRequestHandler, closing: threading.Event) -> bool:
    trickle(handler, closing, "text/plain; version=0.0.4", every_s=0.02)
    return True


def _probe_error(url: str, limit_s: float, hard_limit_s: float) -> tuple[str, float]:
    """The probe's MetricsUnavailable message and how long it took (``hard_limit_s``: a hang fails)."""

    async def go() -> tuple[str, float]:
        source = ServerMetricsSource(url, flavor="vllm", model="sim", timeout=limit_s)
        began = time.monotonic()
        try:
            async with asyncio.timeout(hard_limit_s):
                with pytest.raises(MetricsUnavailable) as caught:
                    await source.probe(limit_s)
        finally:
            await source.aclose()
        return str(caught.value), time.monotonic() - began

    return asyncio.run(go())


@pytest.mark.timeout(30)
def test_a_gzip_bomb_at_metrics_is_refused_as_too_large_in_bounded_memory(
    metrics_server: Callable[..., MetricsServer],
) -> None:
    """256 MiB of zeros in 260 KB of gzip: the read stops at the 16 MiB cap on the *decoded* body (D2)."""
    bomb = _gzip_zeros(256)

    def serve_bomb(handler: BaseHTTPRequestHandler, n: int, closing: threading.Event) -> bool:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain; version=0.0.4")
        handler.send_header("Content-Encoding", "gzip")
        handler.send_header("Content-Length", str(len(bomb)))
        handler.end_headers()
        with contextlib.suppress(OSError):  # the client hangs up at its cap
            handler.wfile.write(bomb)
        return True

    server = metrics_server(idle_vllm, serve_bomb)
    tracemalloc.start()
    try:
        message, _ = _probe_error(server.url, 5.0, hard_limit_s=20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert message.startswith(f"GET {server.url}: the response body is longer than 16,777,216 bytes")
    # Bounded, but above the cap by what one network read inflates to: httpx decodes a whole 64 KiB read
    # at once (up to ~64 MiB of zeros), and read_bounded appends it before it compares (peak ~140 MiB);
    # without a cap the whole 256 MiB, and its text, were held.
    assert peak < 192 << 20, f"peak {peak / 2**20:.0f} MiB"


@pytest.mark.timeout(30)
def test_a_trickling_metrics_ends_within_the_deadline(metrics_server: Callable[..., MetricsServer]) -> None:
    """Each byte comes in time for httpx's per-phase timeout (0.2 s), the whole body never (D6)."""
    server = metrics_server(idle_vllm, lambda handler, n, closing: _trickle(handler, closing))
    message, took = _probe_error(server.url, 0.2, hard_limit_s=5)
    assert message == f"GET {server.url}: no complete response within 0.7 s"  # 0.2 s + the 0.5 s margin
    assert 0.6 < took < 3.0  # its 0.6 s deadline (slack: a loaded machine); it hung before


def _sampler_until_stopped(
    source: ServerMetricsSource, reading: threading.Event, hard_limit_s: float
) -> tuple[float, list[ResourceSample]]:
    """Probe, sample every 50 ms, and once ``reading`` is set (a sample is inside its read) stop():
    how long stop() took, and the samples."""

    async def go() -> tuple[float, list[ResourceSample]]:
        clock = SystemClock()
        events = EventLog(clock)
        capture = EventCapture()
        events.subscribe(capture)
        sampler = TelemetrySampler(clock, events, interval=0.05, server=source)
        await sampler.probe()
        assert sampler.sampling
        events.start_measurement()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(sampler.run())
            assert await asyncio.to_thread(reading.wait, 5)
            began = time.monotonic()
            async with asyncio.timeout(hard_limit_s):
                await sampler.stop()
            took = time.monotonic() - began
        assert source._client is None  # closed
        return took, capture.of(ResourceSample)

    return asyncio.run(go())


@pytest.mark.timeout(30)
def test_stop_is_bounded_when_the_metrics_trickle_after_the_probe(
    metrics_server: Callable[..., MetricsServer],
) -> None:
    """The probe is answered, every later scrape trickles: the loop's sample and the final one each end
    at the read's deadline, so a finished run ends (D7: it hung, and SIGTERM could not end it)."""
    trickling = threading.Event()

    def after_the_probe(handler: BaseHTTPRequestHandler, n: int, closing: threading.Event) -> bool:
        if n == 1:
            return False
        trickling.set()
        return _trickle(handler, closing)

    server = metrics_server(idle_vllm, after_the_probe)
    source = ServerMetricsSource(server.url, flavor="vllm", model="sim", timeout=0.1)
    took, samples = _sampler_until_stopped(source, trickling, hard_limit_s=6)
    assert took < 2 * 0.6 + 2.0  # two reads, each ending at its 0.6 s deadline (slack: a loaded machine)
    assert len(samples) == 2  # the loop's one, then the final one
    assert all(
        s.errors == [f"server_metrics: GET {server.url}: no complete response within 0.6 s"]
        and s.nulls["server_running"] == "error"
        for s in samples
    )


@pytest.mark.timeout(30)
def test_stop_cancels_a_sampling_loop_stuck_past_its_deadline(
    metrics_server: Callable[..., MetricsServer],
) -> None:
    """A source that hangs beyond its own deadline (a bug): stop() cancels the loop after the read's
    deadline plus a margin, and the final sample says so instead of reading the stuck source again."""
    server = metrics_server(idle_vllm)
    reading = threading.Event()

    class Stuck(ServerMetricsSource):
        async def read(self, now: Callable[[], float]) -> ServerSample:
            reading.set()
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

    source = Stuck(server.url, flavor="vllm", model="sim", timeout=0.1)
    took, samples = _sampler_until_stopped(source, reading, hard_limit_s=6)
    assert 1.0 < took < 3.5  # the 0.6 s deadline + the 0.5 s margin, then no read (slack: load)
    [final] = samples
    assert final.errors == [
        "server_metrics: sampling did not stop within 1.1 s (a read hung); cancelled, not read again"
    ]
    assert final.nulls["server_running"] == "error"


@pytest.mark.timeout(30)
def test_a_large_exposition_is_parsed_off_the_event_loop(
    metrics_server: Callable[..., MetricsServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """5,000 wanted lines (1,000 series of each quantity) take the parser a while: it runs in a worker
    thread, never on the event loop's, so the run's own latencies are not inflated by it (D8: 2 MB of
    wanted lines per scrape stretched a 3 s run to ~50 s). Checked by thread identity, not by timing."""
    from asyncroll.telemetry import server_metrics

    names = [n for n in VLLM.all if n != "vllm:gpu_cache_usage_perc"]  # the legacy name is not read
    body = "".join(f'{name}{{engine="{i}",model_name="sim"}} 1\n' for name in names for i in range(1000))
    server = metrics_server(lambda n: (200, body))
    parsed_on: list[int] = []
    parse = server_metrics.parse_metrics

    def recording(*args: Any, **kwargs: Any) -> Any:
        parsed_on.append(threading.get_ident())
        return parse(*args, **kwargs)

    monkeypatch.setattr(server_metrics, "parse_metrics", recording)

    async def go() -> ServerSample:
        source = ServerMetricsSource(server.url, flavor="vllm", model="sim", timeout=5.0)
        await source.probe(5.0)
        got = await source.read(time.monotonic)
        await source.aclose()
        return got

    got = asyncio.run(go())
    assert (got.running, got.waiting, got.kv_cache_usage) == (1000.0, 1000.0, 1.0)
    assert len(parsed_on) == 2 and threading.get_ident() not in parsed_on  # the probe's and the read's


def test_past_1024_lines_of_one_quantity_it_is_invalid_and_the_rest_is_not_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server has a few dozen series of a quantity; 16 MiB of lines would cost seconds per sample.
    Counted in parser calls, not timed."""
    from asyncroll.telemetry import server_metrics

    def series(name: str, n: int) -> str:
        return "".join(f'{name}{{engine="{i}",model_name="sim"}} 1\n' for i in range(n))

    reading = parse_metrics(series(VLLM.running, 1025) + series(VLLM.waiting, 1024), VLLM, "sim")
    assert reading.running is None and reading.nulls["running"] == "invalid"
    assert reading.waiting == 1024.0
    parsed: list[str] = []
    parse = server_metrics.text_string_to_metric_families

    def counting(text: str) -> Any:
        parsed.append(text)
        return parse(text)

    monkeypatch.setattr(server_metrics, "text_string_to_metric_families", counting)
    parse_metrics(series(VLLM.running, 20_000), VLLM, "sim")
    assert len(parsed) == server_metrics.MAX_SERIES_LINES  # not 20,000 (~100 µs each)


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
