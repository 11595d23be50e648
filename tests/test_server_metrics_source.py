"""The server-metrics source against a real loopback ``/metrics``: counter rates, resets and invalid
readings, duplicate series, the flavour detected or declared, and parsing off the event loop."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from asyncroll.clock import SystemClock
from asyncroll.telemetry.counter_rate import CounterRate
from asyncroll.telemetry.exposition import VLLM
from asyncroll.telemetry.server_metrics import ServerMetricsSource, ServerSample
from tests.metrics_expositions import SGLANG_TEXT, VLLM_V1
from tests.metrics_loopback import MetricsServer


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


def test_a_fall_to_exactly_half_is_a_reset_and_a_reading_not_after_the_last_is_skipped() -> None:
    """A fall to at most half its last reading is a reset. A reading taken at (or before) a series' last
    reading measures nothing (no division by a zero interval) and keeps that reading for the next one."""
    rate = CounterRate()
    a = (("engine", "0"),)
    assert tuple(rate.update({a: 100.0}, at=1.0)) == (None, 0, 0)
    assert tuple(rate.update({a: 150.0}, at=1.0)) == (None, 0, 0)  # the same time: skipped
    assert tuple(rate.update({a: 50.0}, at=0.5)) == (None, 0, 0)  # earlier: skipped
    assert tuple(rate.update({a: 120.0}, at=2.0)) == (20.0, 0, 0)  # from the kept 100 at 1.0
    assert tuple(rate.update({a: 60.0}, at=3.0)) == (60.0, 1, 0)  # exactly half: a reset, 60 in 1 s
    assert rate.resets == 1


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


@pytest.mark.timeout(30)
def test_a_failed_read_is_an_error_with_no_values_and_no_counter_reset(
    metrics_server: Callable[..., MetricsServer],
) -> None:
    """The sampler copies a read's ``counter_resets`` into its sample even when the read failed: a server
    that answers 500 after the probe must not be counted as restarted, nor read as zeros."""

    def failing(n: int) -> tuple[int, str]:
        return (200, 'vllm:num_requests_running{model_name="sim"} 1\n') if n == 1 else (500, "engine dead")

    url = metrics_server(failing).url
    samples = read_samples(url, 2)
    assert [s.error for s in samples] == [f"GET {url}: HTTP 500"] * 2
    got = [(s.running, s.generation_tokens_per_s, s.counter_resets) for s in samples]
    assert got == [(None, None, 0)] * 2


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


@pytest.mark.parametrize(
    ("declared", "text", "served", "flag"),
    [
        ("vllm", SGLANG_TEXT, "SGLang's (sglang:num_running_reqs)", "--server-kind sglang"),
        ("sglang", VLLM_V1, "vLLM's (vllm:num_requests_running)", "--server-kind vllm"),
    ],
)
def test_a_declared_kind_that_is_not_the_servers_says_which_names_it_serves(
    declared: str, text: str, served: str, flag: str
) -> None:
    """``--backend vllm`` (it declares vLLM) against an SGLang server: the probe finds SGLang's names, so the
    reason says so and which --server-kind reads them, not the --disable-log-stats hint of a vLLM without
    stats (which sent the user looking for a flag the server never had)."""
    from asyncroll.telemetry.exposition import NAMES
    from asyncroll.telemetry.server_metrics import MetricsUnavailable, _probe_reading

    with pytest.raises(MetricsUnavailable) as info:
        _probe_reading("http://h/metrics", text, NAMES[declared], model=None)  # type: ignore[index]
    message = str(info.value)
    assert message.startswith(f"GET http://h/metrics: no {NAMES[declared].running} in the response")  # type: ignore[index]
    assert served in message and flag in message
    assert "--disable-log-stats" not in message
