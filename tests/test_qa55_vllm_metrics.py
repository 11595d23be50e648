"""asyncroll's vLLM telemetry against expositions shaped as real vLLM V1 serves them, and serve-sim's vLLM
flavour against the same names.

vLLM V1's ``PrometheusStatLogger`` (``vllm/v1/metrics/loggers.py``) labels every engine metric
``model_name`` and ``engine`` (one series per engine core: per data-parallel rank); its running, waiting
and KV gauges are ``multiprocess_mode="mostrecent"``. With ``--api-server-count`` > 1 (recent vLLM's default
with ``--data-parallel-size`` > 1) it runs ``prometheus_client`` in multiprocess mode
(``setup_multiprocess_prometheus``): counters are summed over the API-server processes (no ``pid`` label,
no ``_created`` samples), "mostrecent" gauges keep the latest value any process set, and a gauge with no
``multiprocess_mode`` keeps one series per process, labelled ``pid``: so did ``vllm:kv_cache_usage_perc``
until vLLM pull request #28792 (Nov 2025), each process holding what it last set (the engine sends its
scheduler stats to one front-end per step). The fixtures below were produced by ``prometheus_client``
0.26 in multiprocess mode, two API-server processes writing as vLLM's stat logger does
(one process's values earlier and stale, the other's later).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from asyncroll.telemetry.exposition import VLLM, parse_metrics
from tests.metrics_loopback import MetricsServer, probe_and_read
from tests.sim_servers import body, sim

M = "Qwen/Qwen3-8B"


def e(n: int) -> str:
    return f'engine="{n}",model_name="{M}"'


#: ``--data-parallel-size 2``, one API server: the single-process registry (counters with ``_created``).
DP2 = f"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{{e(0)}}} 3.0
vllm:num_requests_running{{{e(1)}}} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{{e(0)}}} 1.0
vllm:num_requests_waiting{{{e(1)}}} 2.0
# HELP vllm:num_requests_waiting_by_reason Number of waiting requests by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{{{e(0)},reason="capacity"}} 1.0
vllm:num_requests_waiting_by_reason{{{e(0)},reason="deferred"}} 0.0
vllm:num_requests_waiting_by_reason{{{e(1)},reason="capacity"}} 2.0
vllm:num_requests_waiting_by_reason{{{e(1)},reason="deferred"}} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{{e(0)}}} 0.25
vllm:kv_cache_usage_perc{{{e(1)}}} 0.5
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{{e(0)}}} 300.0
vllm:prompt_tokens_total{{{e(1)}}} 120.0
# HELP vllm:prompt_tokens_created Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{{{e(0)}}} 1.7651e+09
vllm:prompt_tokens_created{{{e(1)}}} 1.7651e+09
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{{e(0)}}} 30.0
vllm:generation_tokens_total{{{e(1)}}} 12.0
# HELP vllm:generation_tokens_created Number of generation tokens processed.
# TYPE vllm:generation_tokens_created gauge
vllm:generation_tokens_created{{{e(0)}}} 1.7651e+09
vllm:generation_tokens_created{{{e(1)}}} 1.7651e+09
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{{max_lora="4",running_lora_adapters="ad1",waiting_lora_adapters=""}} 1.7651e+09
"""

#: ``--data-parallel-size 2 --api-server-count 2``, current vLLM: multiprocess mode, as
#: ``MultiProcessCollector`` renders it (no ``_created``, counters summed over the two processes).
DP2_API2 = "\n".join(line for line in DP2.splitlines() if "_created" not in line and "lora" not in line)
DP2_API2 += "\n"


def api2(engines: int) -> str:
    """``--api-server-count 2`` with vLLM before #28792: the KV gauge per process (``pid``), one process's
    values stale (0.9, 0.8), the other's fresh (0.25, 0.5); the "mostrecent" gauges and counters as now."""
    kv = {0: (0.9, 0.25), 1: (0.8, 0.5)}
    lines = [line for line in DP2_API2.splitlines() if "kv_cache" not in line]
    lines = [line for line in lines if engines == 2 or 'engine="1"' not in line]
    lines.append("# TYPE vllm:kv_cache_usage_perc gauge")
    for pid, column in (("31718", 0), ("31719", 1)):
        for n in range(engines):
            lines.append(f'vllm:kv_cache_usage_perc{{{e(n)},pid="{pid}"}} {kv[n][column]}')
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text", [DP2, DP2_API2], ids=["dp2", "dp2-api2"])
def test_data_parallel_engines_are_summed_once_each(text: str) -> None:
    reading = parse_metrics(text, VLLM, M)
    assert (reading.running, reading.waiting) == (7.0, 3.0)  # the by-reason breakdown is another name
    assert reading.kv_cache_usage == 0.5 and reading.kv_cache_metric == "vllm:kv_cache_usage_perc"
    assert sum(reading.prompt_tokens.values()) == 420.0
    assert sum(reading.generation_tokens.values()) == 42.0
    assert reading.nulls == {} and reading.other_models == ()


@pytest.mark.parametrize("engines", [1, 2])
def test_per_process_copies_of_the_kv_gauge_are_not_read_as_engines(engines: int) -> None:
    """Each API server's copy holds what that process last set: the max over them is a stale value (0.9
    while the engine is at 0.25), and which copy is current cannot be told. The quantity is invalid,
    never a stale copy; running, waiting and the counters are unaffected."""
    reading = parse_metrics(api2(engines), VLLM, M)
    assert reading.kv_cache_usage is None and reading.nulls == {"kv_cache_usage": "invalid"}
    assert reading.running == (7.0 if engines == 2 else 3.0)
    assert sum(reading.prompt_tokens.values()) == (420.0 if engines == 2 else 300.0)


def test_a_pid_label_alone_is_no_copy() -> None:
    """Processes that each report their own series (a ``pid`` beside distinct engines or ranks, or one API
    server in multiprocess mode) are read as usual: only series that differ in ``pid`` alone are copies."""
    text = DP2_API2.replace(f"{{{e(0)}}}", f'{{{e(0)},pid="7"}}').replace(
        f"{{{e(1)}}}", f'{{{e(1)},pid="8"}}'
    )
    assert 'pid="8"' in text
    reading = parse_metrics(text, VLLM, M)
    assert (reading.running, reading.waiting, reading.kv_cache_usage) == (7.0, 3.0, 0.5)
    assert reading.nulls == {}


def test_the_legacy_kv_gauge_is_read_when_the_current_one_has_per_process_copies() -> None:
    """Some vLLM releases of that time still served the deprecated ``vllm:gpu_cache_usage_perc`` (later ones
    hide it) as a "mostrecent" gauge: one series per engine, the current value."""
    text = api2(2) + f"vllm:gpu_cache_usage_perc{{{e(0)}}} 0.25\nvllm:gpu_cache_usage_perc{{{e(1)}}} 0.5\n"
    reading = parse_metrics(text, VLLM, M)
    assert reading.kv_cache_usage == 0.5 and reading.kv_cache_metric == "vllm:gpu_cache_usage_perc"
    assert reading.nulls == {}


@pytest.mark.timeout(30)
def test_the_metrics_source_reads_a_dp2_api2_vllm_over_loopback(
    metrics_server: Callable[..., MetricsServer],
) -> None:
    """Probe (flavour detected) and two samples of the real source: per-engine sums and rates."""
    later = DP2_API2.replace(
        f"vllm:prompt_tokens_total{{{e(1)}}} 120.0", f"vllm:prompt_tokens_total{{{e(1)}}} 320.0"
    )
    assert later != DP2_API2
    server = metrics_server(lambda n: (200, DP2_API2 if n <= 2 else later))
    detail, samples = probe_and_read(server.url, M, [0.0, 2.0])
    assert detail["flavor"] == "vllm" and detail["missing_at_probe"] == []
    assert [(s.running, s.waiting, s.kv_cache_usage) for s in samples] == [(7.0, 3.0, 0.5)] * 2
    assert samples[1].prompt_tokens_per_s == 100.0 and samples[1].generation_tokens_per_s == 0.0
    assert samples[1].nulls == {}


@pytest.mark.timeout(30)
def test_serve_sim_vllm_flavour_carries_vllms_labels_and_help() -> None:
    with sim() as (_, client):
        assert client.post("/v1/chat/completions", json=body()).status_code == 200
        text = client.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    expected = {
        "vllm:num_requests_running": "Number of requests in model execution batches.",
        "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
        "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
        "vllm:prompt_tokens": "Number of prefill tokens processed.",
        "vllm:generation_tokens": "Number of generation tokens processed.",
    }
    for name, doc in expected.items():
        assert families[name].documentation == doc, name
        assert [s.labels for s in families[name].samples if not s.name.endswith("_created")] == [
            {"model_name": "sim", "engine": "0"}
        ], name
    reading = parse_metrics(text, VLLM, "sim")
    assert reading.nulls == {} and sum(reading.prompt_tokens.values()) > 0
