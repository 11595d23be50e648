"""Parsing vLLM and SGLang ``/metrics`` expositions: the model filter, engines summed, the legacy KV name,
the flavour detected, and missing, NaN, malformed or too many series null and named, never zero."""

from __future__ import annotations

from typing import Any

import pytest

from asyncroll.telemetry.exposition import SGLANG, VLLM, detect_flavor, parse_metrics
from tests.metrics_expositions import MODEL, SGLANG_TEXT, VLLM_V0, VLLM_V1


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
    # a gauge whose name only begins with the running gauge's is another metric: it decides nothing
    assert detect_flavor("sglang:num_running_reqs_offline_batch 0\n") is None
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


def test_a_kv_cache_usage_above_one_is_invalid_not_a_fraction_reported() -> None:
    """KV-cache usage is a fraction (1 = full): a server that reports 7.5 (a percentage, or a bug) gives
    no usage, named invalid, rather than a "fraction" of 7.5 in every sample and in summary.json."""
    for flavor, text in ((VLLM, "vllm:kv_cache_usage_perc 7.5\n"), (SGLANG, "sglang:token_usage 1.25\n")):
        reading = parse_metrics(text, flavor, None)
        assert reading.kv_cache_usage is None and reading.nulls["kv_cache_usage"] == "invalid"
    assert parse_metrics("vllm:kv_cache_usage_perc 1.0\n", VLLM, None).kv_cache_usage == 1.0


def test_a_malformed_line_spoils_only_its_own_quantity() -> None:
    text = VLLM_V1 + f'vllm:num_requests_waiting{{engine="3",model_name="{MODEL}"}} not-a-number\n'
    reading = parse_metrics(text, VLLM, MODEL)
    assert reading.waiting is None and reading.nulls == {"waiting": "invalid"}
    assert reading.running == 5.0


def test_past_1024_lines_of_one_quantity_it_is_invalid_and_the_rest_is_not_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server has a few dozen series of a quantity; 16 MiB of lines would cost seconds per sample.
    Counted in parser calls, not timed."""
    from asyncroll.telemetry import exposition

    def series(name: str, n: int) -> str:
        return "".join(f'{name}{{engine="{i}",model_name="sim"}} 1\n' for i in range(n))

    reading = parse_metrics(series(VLLM.running, 1025) + series(VLLM.waiting, 1024), VLLM, "sim")
    assert reading.running is None and reading.nulls["running"] == "invalid"
    assert reading.waiting == 1024.0
    parsed: list[str] = []
    parse = exposition.text_string_to_metric_families

    def counting(text: str) -> Any:
        parsed.append(text)
        return parse(text)

    monkeypatch.setattr(exposition, "text_string_to_metric_families", counting)
    parse_metrics(series(VLLM.running, 20_000), VLLM, "sim")
    assert len(parsed) == exposition.MAX_SERIES_LINES  # not 20,000 (~100 µs each)
