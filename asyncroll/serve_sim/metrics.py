"""``GET /metrics`` of serve-sim in vLLM's or SGLang's exact Prometheus names, via ``prometheus_client``.

Values are read at scrape time from one frozen :class:`~asyncroll.backends.server_model.ServerSnapshot`
(plus the KV estimate), never from the engine's internals, so a scrape is consistent with itself.

=========================  =================================  =============================
quantity                   vLLM                               SGLang
=========================  =================================  =============================
running sequences          ``vllm:num_requests_running``      ``sglang:num_running_reqs``
waiting sequences          ``vllm:num_requests_waiting``      ``sglang:num_queue_reqs``
KV-cache use (0..1)        ``vllm:kv_cache_usage_perc``       ``sglang:token_usage``
prompt tokens (counter)    ``vllm:prompt_tokens_total``       ``sglang:prompt_tokens_total``
generated tokens (ctr)     ``vllm:generation_tokens_total``   ``sglang:generation_tokens_total``
=========================  =================================  =============================

Every series carries a ``model_name`` label, as both servers do. vLLM's carry an ``engine`` label too
(``"0"``: one engine core), as vLLM V1 labels each of them. SGLang's carry the labels of the process that
counts them: the scheduler's gauges ``engine_type="unified"`` and the ranks of its one scheduler
(``tp_rank``, ``pp_rank``, ``moe_ep_rank``: ``"0"``; no ``dp_rank``, which SGLang adds only with
``--dp-size`` > 1), the tokenizer's counters ``engine_type="unified"`` alone, as SGLang's
``SchedulerMetricsCollector`` and ``TokenizerMetricsCollector`` label them (MEASUREMENT.md, "Sources").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from asyncroll.backends.server_model import ServerSnapshot
from asyncroll.serve_sim.config import MetricsFlavor

NAMES: dict[MetricsFlavor, dict[str, str]] = {
    "vllm": {
        "running": "vllm:num_requests_running",
        "waiting": "vllm:num_requests_waiting",
        "kv": "vllm:kv_cache_usage_perc",
        "prompt": "vllm:prompt_tokens",
        "generation": "vllm:generation_tokens",
    },
    "sglang": {
        "running": "sglang:num_running_reqs",
        "waiting": "sglang:num_queue_reqs",
        "kv": "sglang:token_usage",
        "prompt": "sglang:prompt_tokens",
        "generation": "sglang:generation_tokens",
    },
}


#: Each flavour's ``# HELP`` text; vLLM's are its ``PrometheusStatLogger``'s.
HELP: dict[MetricsFlavor, dict[str, str]] = {
    "vllm": {
        "running": "Number of requests in model execution batches.",
        "waiting": "Number of requests waiting to be processed.",
        "kv": "KV-cache usage. 1 means 100 percent usage.",
        "prompt": "Number of prefill tokens processed.",
        "generation": "Number of generation tokens processed.",
    },
    "sglang": {
        "running": "Number of requests in the running batch.",
        "waiting": "Number of requests waiting to be scheduled.",
        "kv": "KV-cache usage; 1 means 100 percent.",
        "prompt": "Number of prefill tokens processed.",
        "generation": "Number of generation tokens processed.",
    },
}
#: The labels besides ``model_name`` each flavour's gauges carry, with their values.
EXTRA_LABELS: dict[MetricsFlavor, dict[str, str]] = {
    "vllm": {"engine": "0"},
    "sglang": {"engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"},
}
#: Whether each flavour's counters have ``_created`` samples. vLLM with one API server (its default) serves
#: ``prometheus_client``'s default registry, where every counter has one (``vllm/v1/metrics/prometheus.py``,
#: ``get_prometheus_registry``; multiprocess mode, without them, only with ``--api-server-count`` > 1);
#: SGLang always runs ``prometheus_client`` in multiprocess mode, which writes none.
CREATED: dict[MetricsFlavor, bool] = {"vllm": True, "sglang": False}
#: The labels besides ``model_name`` each flavour's token counters carry (SGLang's tokenizer has no rank).
COUNTER_LABELS: dict[MetricsFlavor, dict[str, str]] = {
    "vllm": {"engine": "0"},
    "sglang": {"engine_type": "unified"},
}


class EngineCollector(Collector):
    def __init__(
        self, flavor: MetricsFlavor, model: str, read: Callable[[], tuple[ServerSnapshot, float]]
    ) -> None:
        """``read`` returns the engine snapshot and the KV-cache usage fraction, taken together."""
        self._names = NAMES[flavor]
        self._help = HELP[flavor]
        self._gauge_labels = {"model_name": model, **EXTRA_LABELS[flavor]}
        self._counter_labels = {"model_name": model, **COUNTER_LABELS[flavor]}
        self._read = read
        #: when the counters were created, as a server creates them at start-up (``_created`` samples)
        self._created = time.time() if CREATED[flavor] else None

    def collect(self) -> Iterator[Metric]:
        snap, kv = self._read()
        n, doc, gauges, counters = self._names, self._help, self._gauge_labels, self._counter_labels

        def gauge(key: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(n[key], doc[key], labels=list(gauges))
            family.add_metric(list(gauges.values()), value)
            return family

        def counter(key: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(n[key], doc[key], labels=list(counters))
            family.add_metric(list(counters.values()), value, created=self._created)
            return family

        yield gauge("running", snap.running)
        yield gauge("waiting", snap.waiting)
        yield gauge("kv", kv)
        yield counter("prompt", snap.prompt_tokens)
        yield counter("generation", snap.generated_tokens)


def registry_for(collector: EngineCollector) -> CollectorRegistry:
    """A registry holding only the engine's series (no process or GC metrics of the simulator)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """The text exposition format of one scrape."""
    return generate_latest(registry)
