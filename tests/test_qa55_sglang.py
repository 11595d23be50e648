"""asyncroll's SGLang telemetry against expositions shaped as real SGLang serves them, and serve-sim's
``--metrics-flavor sglang`` against the same labels.

The fixtures were produced by ``prometheus_client`` in multiprocess mode (as SGLang runs it: scheduler
gauges ``multiprocess_mode="mostrecent"``, one process per scheduler) with SGLang's label sets
(``python/sglang/srt/observability/metrics_collector.py`` and ``scheduler_metrics_mixin.py``): scheduler
gauges carry ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank``, ``dp_rank`` (with
``--dp-size`` > 1) and ``priority`` (with ``--enable-priority-scheduling``: the total under
``priority=""``, a per-priority breakdown under ``priority="<n>"``); the tokenizer's counters carry
``model_name``, ``engine_type`` and the request's ``priority``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from asyncroll.telemetry.exposition import SGLANG, parse_metrics
from tests.metrics_loopback import MetricsServer, probe_and_read
from tests.sim_servers import body, sim

M = "Qwen/Qwen3-8B"
R0 = f'dp_rank="0",engine_type="unified",model_name="{M}",moe_ep_rank="0",pp_rank="0"'
R1 = f'dp_rank="1",engine_type="unified",model_name="{M}",moe_ep_rank="0",pp_rank="0"'

#: Two DP ranks (tp_rank 0 and 4 lead them) with priority scheduling: 5 + 9 running, 2 + 2 waiting.
DP_PRIORITY = f"""# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{{R0},priority="",tp_rank="0"}} 5.0
sglang:num_running_reqs{{{R0},priority="0",tp_rank="0"}} 3.0
sglang:num_running_reqs{{{R0},priority="10",tp_rank="0"}} 2.0
sglang:num_running_reqs{{{R1},priority="",tp_rank="4"}} 9.0
sglang:num_running_reqs{{{R1},priority="0",tp_rank="4"}} 3.0
sglang:num_running_reqs{{{R1},priority="10",tp_rank="4"}} 6.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{{R0},priority="",tp_rank="0"}} 2.0
sglang:num_queue_reqs{{{R0},priority="0",tp_rank="0"}} 2.0
sglang:num_queue_reqs{{{R1},priority="",tp_rank="4"}} 2.0
sglang:num_queue_reqs{{{R1},priority="0",tp_rank="4"}} 2.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{{{R0},priority="",tp_rank="0"}} 0.25
sglang:token_usage{{{R1},priority="",tp_rank="4"}} 0.5
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{{engine_type="unified",model_name="{M}",priority="0"}} 1000.0
sglang:prompt_tokens_total{{engine_type="unified",model_name="{M}",priority="10"}} 500.0
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{{engine_type="unified",model_name="{M}",priority="0"}} 80.0
"""


def pipeline(running: float, waiting: float) -> str:
    """``--pp-size 2``: every stage's scheduler holds the same requests (a later stage receives each from
    the stage before it), so each stage reports the same queues under its own ``pp_rank``."""
    lines = []
    for pp in ("0", "1"):
        labels = f'engine_type="unified",model_name="{M}",moe_ep_rank="0",pp_rank="{pp}",tp_rank="0"'
        lines += [
            f"sglang:num_running_reqs{{{labels}}} {running}",
            f"sglang:num_queue_reqs{{{labels}}} {waiting}",
            f"sglang:token_usage{{{labels}}} 0.125",
        ]
    lines.append(f'sglang:prompt_tokens_total{{engine_type="unified",model_name="{M}"}} 10.0')
    lines.append(f'sglang:generation_tokens_total{{engine_type="unified",model_name="{M}"}} 4.0')
    return "\n".join(lines) + "\n"


def test_the_per_priority_breakdown_is_not_added_to_the_totals_it_breaks_down() -> None:
    reading = parse_metrics(DP_PRIORITY, SGLANG, M)
    # each DP rank's own queue, summed; priority="" is the total, priority="<n>" its breakdown
    assert (reading.running, reading.waiting) == (14.0, 4.0)
    assert reading.kv_cache_usage == 0.5  # the fullest rank
    # counters: each request is counted once, under its own priority: all series add up
    assert sum(reading.prompt_tokens.values()) == 1500.0
    assert sum(reading.generation_tokens.values()) == 80.0
    assert reading.nulls == {}


def test_pipeline_stages_reporting_the_same_requests_are_counted_once() -> None:
    reading = parse_metrics(pipeline(4.0, 3.0), SGLANG, M)
    assert (reading.running, reading.waiting, reading.kv_cache_usage) == (4.0, 3.0, 0.125)
    assert reading.nulls == {}


def test_a_breakdown_with_no_total_beside_it_is_still_read() -> None:
    """A server whose only series carry a priority (no ``priority=""`` total) is read whole, not as none."""
    text = f'sglang:num_running_reqs{{model_name="{M}",priority="3"}} 2\n'
    text += f'sglang:num_running_reqs{{model_name="{M}",priority="7"}} 1\n'
    text += f'sglang:num_queue_reqs{{model_name="{M}"}} 0\n'
    reading = parse_metrics(text, SGLANG, M)
    assert (reading.running, reading.waiting) == (3.0, 0.0)


@pytest.mark.timeout(30)
def test_the_metrics_source_reads_a_priority_scheduling_sglang_over_loopback(
    metrics_server: Callable[..., MetricsServer],
) -> None:
    """Probe (flavour detected) and two samples of the real source: running/waiting are SGLang's totals,
    and the token rate sums every priority's series."""
    later = DP_PRIORITY.replace('priority="0"} 1000.0', 'priority="0"} 1300.0')
    assert later != DP_PRIORITY
    server = metrics_server(lambda n: (200, DP_PRIORITY if n <= 2 else later))
    detail, samples = probe_and_read(server.url, M, [0.0, 1.0])
    assert detail["flavor"] == "sglang" and detail["missing_at_probe"] == []
    assert [(s.running, s.waiting) for s in samples] == [(14.0, 4.0), (14.0, 4.0)]
    assert samples[1].prompt_tokens_per_s == 300.0 and samples[1].nulls == {}


SCHEDULER_LABELS = {
    "model_name": "sim",
    "engine_type": "unified",
    "tp_rank": "0",
    "pp_rank": "0",
    "moe_ep_rank": "0",
}


@pytest.mark.timeout(30)
def test_serve_sim_sglang_flavour_carries_sglangs_labels_and_reads_back() -> None:
    with sim(metrics_flavor="sglang") as (_, client):
        assert client.post("/v1/chat/completions", json=body()).status_code == 200
        text = client.get("/metrics").text
    samples = {s.name: s.labels for f in text_string_to_metric_families(text) for s in f.samples}
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"):
        assert samples[name] == SCHEDULER_LABELS, name
    for name in ("sglang:prompt_tokens_total", "sglang:generation_tokens_total"):
        assert samples[name] == {"model_name": "sim", "engine_type": "unified"}, name
    reading = parse_metrics(text, SGLANG, "sim")
    assert reading.nulls == {} and reading.running == 0.0
    assert sum(reading.prompt_tokens.values()) > 0
