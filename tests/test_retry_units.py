"""The retry module on its own: which failures are retried and which say the server is not there, the
server's requested delay, the backoff and its jitter, and the circuit's count (SPEC §3, §7). Pure
functions and a counter: no server, no clock."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from asyncroll.backends.http_settings import HttpSettings
from asyncroll.backends.retry import Circuit, RetryPolicy, is_retryable, means_unavailable, retry_after_s
from asyncroll.config import build_config


@pytest.mark.parametrize("status", [408, 409, 429, 500, 501, 502, 503, 504, 599])
def test_the_openai_clients_statuses_are_retried(status: int) -> None:
    assert is_retryable("http_status", status)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 407, 410, 422, 428, 499])
def test_other_error_statuses_are_not_retried(status: int) -> None:
    assert not is_retryable("http_status", status)


def test_only_no_response_and_http_status_failures_are_retried() -> None:
    assert is_retryable("transport", None) and is_retryable("timeout", None)
    for kind, status in [("bad_response", 200), ("bad_response", None), ("invalid_action", 200)]:
        assert not is_retryable(kind, status), kind
    assert not is_retryable("schema_rejected", 400)


@pytest.mark.parametrize("status", [502, 503, 504])
def test_a_gateway_status_says_the_server_is_not_there(status: int) -> None:
    assert means_unavailable("http_status", status)


@pytest.mark.parametrize("status", [200, 400, 429, 500, 501, 505])
def test_an_answer_from_the_server_is_not_unavailable(status: int) -> None:
    assert not means_unavailable("http_status", status)


def test_no_connection_is_unavailable_and_a_slow_reply_alone_is_not() -> None:
    assert means_unavailable("transport", None)
    assert not means_unavailable("timeout", None)  # the backend decides, knowing the phase


def test_retry_after_ms_is_read_first_and_zero_means_now() -> None:
    assert retry_after_s({"retry-after-ms": "0"}) == 0.0
    assert retry_after_s({"retry-after-ms": "250", "retry-after": "7"}) == 0.25
    assert retry_after_s({"retry-after-ms": "later", "retry-after": "7"}) == 7.0  # unusable: the other
    assert retry_after_s({"retry-after-ms": "later"}) is None
    assert retry_after_s({"retry-after-ms": "-1", "retry-after": "2"}) == 2.0
    assert retry_after_s({}) is None and retry_after_s(None) is None
    for zero in ({"retry-after-ms": "-0"}, {"retry-after": "-0"}):  # no "delay_s": -0.0 in events.jsonl
        assert str(retry_after_s(zero)) == "0.0"


def test_an_http_date_retry_after_counts_from_now_and_a_past_one_is_now() -> None:
    date = "Wed, 21 Oct 2015 07:28:00 GMT"  # epoch 1445412480
    assert retry_after_s({"retry-after": date}, now_epoch=1445412477.5) == 2.5
    assert retry_after_s({"retry-after": date}, now_epoch=1445412490) == 0.0
    assert retry_after_s({"retry-after": date}) == 0.0  # long past by the real clock


@pytest.mark.parametrize("zone", ["UTC0", "JST-9", "EST5"])  # POSIX zones: no tzdata needed
@pytest.mark.parametrize(
    "date",
    [
        "Wed, 21 Oct 2015 07:28:00 GMT",  # IMF-fixdate
        "Wednesday, 21-Oct-15 07:28:00 GMT",  # RFC 850
        "Wed Oct 21 07:28:00 2015",  # asctime: no zone written, GMT all the same (RFC 9110 §5.6.7)
    ],
)
def test_every_http_date_form_is_gmt_whatever_the_local_time_zone(
    date: str, zone: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An asctime date names no zone; it was read in the machine's: 0 s (retried at once) east of
    Greenwich, hours (the cap) west of it, for a server that asked for 2.5 s."""
    import time

    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        assert retry_after_s({"retry-after": date}, now_epoch=1445412477.5) == 2.5
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize(
    "value",
    [
        "99999999999999999999 Feb 2026 00:00:00 GMT",  # a day past the C library's int
        "Mon, 01 Jan 2026 99999999999999999999:00:00 GMT",  # an hour past it
        "Mon, 01 Jan 2026 00:00:00 +99999999999999999999",  # a zone past it
    ],
)
def test_a_date_too_large_for_the_parser_asks_for_no_delay(value: str) -> None:
    """email.utils raised OverflowError for these (not ValueError): it came out of the retry itself."""
    assert retry_after_s({"retry-after": value}) is None
    policy = RetryPolicy(max_retries=1, base_delay=0.5, max_delay=8.0)
    assert 0.375 <= policy.delay(1, random.Random(0), {"retry-after": value}) <= 0.5  # the backoff


def test_a_requested_delay_is_capped_and_honoured_exactly_below_the_cap() -> None:
    policy = RetryPolicy(max_retries=3, base_delay=0.5, max_delay=2.0)
    rng = random.Random(0)
    assert policy.delay(1, rng, {"retry-after": "1.25"}) == 1.25
    assert policy.delay(5, rng, {"retry-after-ms": "0"}) == 0.0
    assert policy.delay(1, rng, {"retry-after": "60"}) == 2.0


def test_the_backoff_doubles_to_its_cap_under_a_jitter_of_three_quarters_to_one() -> None:
    policy = RetryPolicy(max_retries=9, base_delay=0.5, max_delay=3.0)
    rng = random.Random(7)
    for attempt, backoff in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 3.0), (9, 3.0)]:
        delays = [policy.delay(attempt, rng) for _ in range(200)]
        assert all(0.75 * backoff <= d <= backoff for d in delays), attempt
        assert min(delays) < 0.8 * backoff and max(delays) > 0.95 * backoff  # spread over the range


def test_a_run_and_directly_built_settings_retry_alike(tmp_path: Path) -> None:
    """Retries are off unless asked; the backoff starts at the OpenAI client's 0.5 s and is capped at
    the run's default ``--retry-max-delay``, whether the settings come from a run's config or are built
    directly (tests, benches)."""
    cfg = build_config(
        {"workload": tmp_path / "w.jsonl", "output": tmp_path / "out", "backend": "vllm", "model": "m"}
    )
    direct = HttpSettings(endpoint="http://server", model="m", inflight=1).retry
    assert HttpSettings.from_config(cfg).retry == direct
    assert direct.max_retries == 0 and direct.max_delay == cfg.retry_max_delay
    assert 0.375 <= direct.delay(1, random.Random(0)) <= 0.5


def test_the_circuit_opens_at_its_threshold_once_and_counts_each_opening() -> None:
    circuit = Circuit(3)
    assert not circuit.record_unavailable(1.0) and not circuit.record_unavailable(2.0)
    assert not circuit.is_open
    assert circuit.record_unavailable(3.0)
    snap = circuit.snapshot()
    assert (snap.open, snap.consecutive_failures, snap.opened, snap.open_since) == (True, 3, 1, 3.0)
    assert not circuit.record_unavailable(4.0)  # already open: not opened again, the time stands
    assert (circuit.snapshot().opened, circuit.snapshot().open_since) == (1, 3.0)
    circuit.close()
    snap = circuit.snapshot()
    assert (snap.open, snap.consecutive_failures, snap.opened, snap.open_since) == (False, 0, 1, None)
    assert [circuit.record_unavailable(t) for t in (5.0, 6.0, 7.0)] == [False, False, True]
    assert (circuit.snapshot().opened, circuit.snapshot().open_since) == (2, 7.0)


def test_only_an_answer_ends_a_run_of_unavailable_failures() -> None:
    circuit = Circuit(2)
    assert not circuit.record_failure(True, False, 1.0)
    assert not circuit.record_failure(False, False, 2.0)  # no answer (a slow reply): the run goes on
    assert circuit.snapshot().consecutive_failures == 1
    assert circuit.record_failure(True, False, 3.0)
    circuit.close()
    assert not circuit.record_failure(True, False, 4.0)
    assert not circuit.record_failure(False, True, 5.0)  # a 429 or a 500: the server is there
    assert circuit.snapshot().consecutive_failures == 0
    assert not circuit.record_failure(True, False, 6.0) and not circuit.is_open
    circuit.record_success()
    assert circuit.snapshot().consecutive_failures == 0


def test_a_circuit_of_threshold_zero_never_opens() -> None:
    circuit = Circuit(0)
    assert not any(circuit.record_unavailable(float(t)) for t in range(50))
    assert not circuit.is_open and circuit.snapshot().opened == 0


def test_a_threshold_of_one_opens_on_the_first_failure() -> None:
    circuit = Circuit(1)
    assert circuit.record_unavailable(0.5) and circuit.is_open
