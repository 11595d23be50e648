"""The path from a trajectory to a misbehaving model server and back: what a user with a real
OpenAI-compatible server sees when it fails, stalls or is misconfigured (real loopback servers)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from asyncroll.backends.retry import RetryPolicy, retry_after_s
from asyncroll.config import build_config
from asyncroll.errors import UsageError
from tests.conftest import invoke, write_workload


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("sk-SECRET-1 ", "leading or trailing whitespace"),
        ("sk-SECRET-1\n", "leading or trailing whitespace"),
        ("sk-SECRET-1\r", "leading or trailing whitespace"),
        ("sk-SECRET\t1", "only visible ASCII"),
        ("sk-SECRET-é1", "only visible ASCII"),
    ],
)
def test_an_api_key_that_no_http_header_can_carry_is_refused_without_showing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, why: str
) -> None:
    """A key read with its file's newline (or a stray space, a CR from a Windows .env) made every
    request fail in h11 with ``Illegal header value b'Bearer sk-…'``: the key itself was then written to
    run.json's error, events.jsonl, results.jsonl, trace.json and timeline.html (and with the warm-up
    off, each failure counted against the server circuit as if the server were down); a non-ASCII one
    failed the run with a bare ``UnicodeEncodeError``. Both are refused before anything starts, naming
    the variable and never the key."""
    monkeypatch.setenv("ASYNCROLL_TEST_KEY", key)
    settings = {"workload": "w", "output": "o", "backend": "vllm", "model": "m"}
    with pytest.raises(UsageError, match=f"--api-key-env ASYNCROLL_TEST_KEY: .*{why}") as refused:
        build_config(settings | {"api_key_env": "ASYNCROLL_TEST_KEY"})
    assert "SECRET" not in str(refused.value)
    workload = write_workload(tmp_path / "w.jsonl", [{"id": "p", "prompt": "Say 5."}])
    result = invoke(
        "run", "--workload", workload, "--output", tmp_path / "out", "--backend", "vllm", "--model", "m",
        "--endpoint", "http://127.0.0.1:9", "--api-key-env", "ASYNCROLL_TEST_KEY", "--no-progress",
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "ASYNCROLL_TEST_KEY" in result.output and "SECRET" not in result.output
    assert not (tmp_path / "out").exists()
    monkeypatch.setenv("ASYNCROLL_TEST_KEY", "sk-fine_KEY.0/+=")  # any visible ASCII is a usable key
    assert build_config(settings | {"api_key_env": "ASYNCROLL_TEST_KEY"}).api_key_env == "ASYNCROLL_TEST_KEY"


@pytest.mark.parametrize("value", ["-5", "nan", "-inf", "NaN"])
def test_a_negative_or_nan_retry_after_is_no_delay_asked_for(value: str) -> None:
    """``retry-after: -5`` or ``nan`` (a broken proxy's) was read as 0 s: every retry went out at once,
    with no backoff at all, where the same value in ``retry-after-ms`` fell back to the backoff."""
    assert retry_after_s({"retry-after": value}) is None
    assert retry_after_s({"retry-after-ms": value}) is None
    policy = RetryPolicy(max_retries=3, base_delay=0.5, max_delay=8.0)
    assert 0.375 <= policy.delay(1, random.Random(0), {"retry-after": value}) <= 0.5  # the backoff
    assert retry_after_s({"retry-after": "0"}) == 0.0  # an explicit "now" is still honoured
    assert policy.delay(1, random.Random(0), {"retry-after": "inf"}) == 8.0  # capped
