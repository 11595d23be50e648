"""A vLLM or SGLang ``/metrics`` exposition (Prometheus text format), parsed into the quantities asyncroll
reads; :mod:`asyncroll.telemetry.server_metrics` fetches it and turns its counters into rates.

What is read (SPEC §10), per flavour:

============================  ==============================  ===========================
quantity                      vLLM                            SGLang
============================  ==============================  ===========================
requests running (Σ series)   ``vllm:num_requests_running``   ``sglang:num_running_reqs``
requests waiting (Σ series)   ``vllm:num_requests_waiting``   ``sglang:num_queue_reqs``
KV-cache usage (max series)   ``vllm:kv_cache_usage_perc``,   ``sglang:token_usage``
                              else legacy
                              ``vllm:gpu_cache_usage_perc``
prompt tokens (counter)       ``vllm:prompt_tokens_total``    ``sglang:prompt_tokens_total``
generated tokens (counter)    ``vllm:generation_tokens_total`` ``sglang:generation_tokens_total``
============================  ==============================  ===========================

SGLang's running and waiting gauges are summed over the series that count each request once
(:func:`sglang_request_series`): a ``priority="<n>"`` breakdown beside its ``priority=""`` total
(``--enable-priority-scheduling``) is left out, and of pipeline stages (``pp_rank``), which all hold the
same requests, only the lowest is read. Its token counters are labelled per request, so all are summed.

A gauge with series that differ only in their ``pid`` label is invalid: ``prometheus_client``'s
multiprocess mode (vLLM's with ``--api-server-count`` > 1) keeps one copy of a gauge per process when it
was given no ``multiprocess_mode`` (vLLM's ``vllm:kv_cache_usage_perc`` before its pull request #28792),
each holding what that process last set, so neither their sum nor their max is the server's value; a
legacy KV name without such copies is read instead. Series of separate processes that each report their
own labels (another ``engine`` or rank) are read as any others. Counters are summed over the processes
(no ``pid``).

Series whose ``model_name`` label names another model are ignored (one server may serve several);
series without the label are kept. A quantity with no series is *missing*; one with a non-finite or
negative value, a line the parser rejects, or two series with the same labels is *invalid*; both are
``None`` and reported by name, never replaced by zero (nor by the sum of the good series).

Only the lines of the wanted metrics are handed to ``prometheus_client``'s parser, at most
:data:`MAX_SERIES_LINES` of each (more make the quantity invalid): a vLLM exposition is mostly histogram
buckets, and parsing all of it on every sample would cost far more than the few lines it needs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from prometheus_client.parser import text_string_to_metric_families

from asyncroll.telemetry.counter_rate import SeriesKey

Flavor = Literal["vllm", "sglang"]
NullReason = Literal["missing", "invalid"]

#: The most sample lines of one wanted metric parsed in a reading. A server has one series per engine
#: (vLLM) or rank (SGLang) and served model: a few dozen at most. Past this the quantity is invalid and
#: its other lines are not parsed: each costs ``prometheus_client`` tens of µs, so 16 MiB of them would
#: take seconds of CPU (and of the GIL, which the event loop needs too) on every sample.
MAX_SERIES_LINES = 1024


@dataclass(frozen=True, slots=True)
class MetricNames:
    """The Prometheus sample names one server flavour uses for the quantities asyncroll reads."""

    flavor: Flavor
    running: str
    waiting: str
    kv_cache: tuple[str, ...]  # preferred first; later names are legacy fallbacks
    prompt_tokens: str
    generation_tokens: str

    @property
    def all(self) -> tuple[str, ...]:
        return (self.running, self.waiting, *self.kv_cache, self.prompt_tokens, self.generation_tokens)


VLLM = MetricNames(
    "vllm",
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    kv_cache=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    prompt_tokens="vllm:prompt_tokens_total",
    generation_tokens="vllm:generation_tokens_total",
)
SGLANG = MetricNames(
    "sglang",
    running="sglang:num_running_reqs",
    waiting="sglang:num_queue_reqs",
    kv_cache=("sglang:token_usage",),
    prompt_tokens="sglang:prompt_tokens_total",
    generation_tokens="sglang:generation_tokens_total",
)
NAMES: dict[Flavor, MetricNames] = {"vllm": VLLM, "sglang": SGLANG}


@dataclass(frozen=True, slots=True)
class ServerReading:
    """One parsed exposition. Counters stay per series so that resets are detected series by series."""

    flavor: Flavor
    running: float | None
    waiting: float | None
    kv_cache_usage: float | None
    kv_cache_metric: str | None  # which name supplied it (the legacy fallback is visible)
    prompt_tokens: dict[SeriesKey, float]
    generation_tokens: dict[SeriesKey, float]
    nulls: dict[str, NullReason] = field(default_factory=dict)
    other_models: tuple[str, ...] = ()


def sample_name(line: str) -> str:
    """The metric name a sample line starts with (up to ``{`` or whitespace)."""
    end = len(line)
    for stop in ("{", " ", "\t"):
        i = line.find(stop)
        if 0 <= i < end:
            end = i
    return line[:end]


def detect_flavor(text: str) -> Flavor | None:
    """vLLM or SGLang, from which running-requests gauge the exposition has a sample of (vLLM first)."""
    for names in (VLLM, SGLANG):
        for line in text.splitlines():
            if line.startswith(names.running) and sample_name(line) == names.running:
                return names.flavor
    return None


def _wanted_samples(text: str, names: Iterable[str]) -> Iterable[tuple[str, Any]]:
    """(name, prometheus_client Sample or the ValueError a malformed line raised), wanted lines only;
    past :data:`MAX_SERIES_LINES` lines of one name, one ValueError for it and no more of its lines."""
    wanted = tuple(names)
    exact = set(wanted)
    lines: dict[str, int] = {}
    for line in text.splitlines():
        if not line.startswith(wanted):
            continue
        name = sample_name(line)
        if name not in exact:
            continue
        seen = lines[name] = lines.get(name, 0) + 1
        if seen > MAX_SERIES_LINES:
            if seen == MAX_SERIES_LINES + 1:
                yield name, ValueError(f"more than {MAX_SERIES_LINES} lines of {name}")
            continue
        try:
            for family in text_string_to_metric_families(line + "\n"):
                for sample in family.samples:
                    yield name, sample
        except ValueError as exc:  # one malformed line spoils only its own quantity
            yield name, exc


def _label(key: SeriesKey, name: str) -> str | None:
    return next((value for label, value in key if label == name), None)


def _without(key: SeriesKey, name: str) -> SeriesKey:
    return tuple(item for item in key if item[0] != name)


def sglang_request_series(series: list[tuple[SeriesKey, float]]) -> list[tuple[SeriesKey, float]]:
    """The series of an SGLang running or waiting gauge that count each request once (the module
    docstring): a ``priority="<n>"`` breakdown beside its ``priority=""`` total is left out, and of
    pipeline stages that report the same requests only the lowest ``pp_rank``'s series is kept."""
    totals = {_without(k, "priority") for k, _ in series if _label(k, "priority") == ""}
    kept = [(k, v) for k, v in series if not _label(k, "priority") or _without(k, "priority") not in totals]

    def stage(key: SeriesKey) -> tuple[int, str]:
        rank = _label(key, "pp_rank") or "0"
        return (int(rank), rank) if rank.isdigit() else (1 << 62, rank)

    first: dict[SeriesKey, tuple[int, str]] = {}
    for key, _ in kept:
        group = _without(key, "pp_rank")
        first[group] = min(first.get(group, stage(key)), stage(key))
    return [(k, v) for k, v in kept if stage(k) == first[_without(k, "pp_rank")]]


def _finite(value: float) -> bool:
    return math.isfinite(value) and value >= 0


def parse_metrics(text: str, names: MetricNames, model: str | None = None) -> ServerReading:
    """Parse one exposition for the quantities in ``names``, keeping only ``model``'s series."""
    series: dict[str, list[tuple[SeriesKey, float]]] = {n: [] for n in names.all}
    broken: set[str] = set()
    others: set[str] = set()
    seen: set[tuple[str, SeriesKey]] = set()
    duplicated: dict[str, set[SeriesKey]] = {}  # the same labels twice: which value is right is unknown
    for name, sample in _wanted_samples(text, names.all):
        if isinstance(sample, ValueError):
            broken.add(name)
            continue
        labels: dict[str, str] = sample.labels
        served = labels.get("model_name")
        if model is not None and served is not None and served != model:
            others.add(served)
            continue
        key = tuple(sorted(labels.items()))
        if (name, key) in seen:
            duplicated.setdefault(name, set()).add(key)
        seen.add((name, key))
        series[name].append((key, float(sample.value)))
    nulls: dict[str, NullReason] = {}

    def per_process(name: str) -> bool:
        """A gauge with per-process copies of a series (the same labels but ``pid``; module docstring):
        which copy is current cannot be told. Processes that each report their own series are read."""
        keys = [_without(key, "pid") for key, _ in series[name] if _label(key, "pid") is not None]
        return len(set(keys)) < len(keys)

    def gauge(key: str, name: str, combine: Any, upper: float = math.inf) -> float | None:
        read = series[name]
        if names.flavor == "sglang" and key in ("running", "waiting"):
            read = sglang_request_series(read)
        values = [v for _, v in read]
        bad = name in broken or name in duplicated or per_process(name)
        if bad or any(not _finite(v) or v > upper for v in values):
            nulls[key] = "invalid"
            return None
        if not values:
            nulls[key] = "missing"
            return None
        return float(combine(values))

    running = gauge("running", names.running, sum)
    waiting = gauge("waiting", names.waiting, sum)
    present = [n for n in names.kv_cache if series[n] or n in broken]
    kv_metric = next((n for n in present if not per_process(n)), present[0] if present else None)
    if kv_metric is None:
        kv, nulls["kv_cache_usage"] = None, "missing"
    else:
        kv = gauge("kv_cache_usage", kv_metric, max, upper=1.0)  # a fraction: above 1 is no usage

    def counter(key: str, name: str) -> dict[SeriesKey, float]:
        """The good series (the quantity itself is null when any series is not good: see ``nulls``)."""
        twice = duplicated.get(name, set())
        good = {k: v for k, v in series[name] if _finite(v) and k not in twice}
        if name in broken or len(good) < len(series[name]):
            nulls[key] = "invalid"
        elif not good:
            nulls[key] = "missing"
        return good

    return ServerReading(
        names.flavor,
        running,
        waiting,
        kv,
        kv_metric if kv is not None else None,
        counter("prompt_tokens", names.prompt_tokens),
        counter("generation_tokens", names.generation_tokens),
        nulls,
        tuple(sorted(others)),
    )
