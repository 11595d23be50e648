"""Where a check across settings places a config file's origin note: after the setting's value as the
message writes it, never between the flag and that value (:func:`asyncroll.config.build_config`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncroll.config import build_config
from asyncroll.errors import UsageError

SMOKE = Path(__file__).resolve().parent.parent / "examples" / "smoke.jsonl"


def _refusal(**settings: object) -> str:
    """The refusal of ``settings``, each read from the config file ``F``."""
    origins = {key: f"--config F: setting '{key}'" for key in settings}
    with pytest.raises(UsageError) as refused:
        build_config({"workload": SMOKE, "output": Path("unused"), **settings}, origins)
    return str(refused.value)


def test_a_url_shown_masked_or_in_double_quotes_is_followed_by_the_note() -> None:
    """A URL the message writes masked (its password as ***) or in double quotes (it holds a ') did not
    read as the setting's value: the note split the flag from it."""
    masked = _refusal(backend="vllm", model="m", endpoint="http://u:pw@localhost:8000")
    note = "(--config F: setting 'endpoint')"
    assert f"--endpoint 'http://u:***@localhost:8000' {note}: carries credentials" in masked
    quoted = _refusal(backend="vllm", model="m", endpoint="http://local'host:8000/v1")
    assert f'--endpoint "http://local\'host:8000/v1" {note}: give the server' in quoted
    metrics = _refusal(metrics_url="http://u:pw@localhost:8000/metrics")
    assert "'http://u:***@localhost:8000/metrics' (--config F: setting 'metrics_url'): carries" in metrics


def test_a_tool_timeout_is_written_exactly_and_followed_by_the_note() -> None:
    """``--tool-timeout`` was written with ``:g`` (123.4567 as 123.457): not the value given, so the note
    split the flag from it too."""
    said = _refusal(tool_timeout=123.4567, test_timeout=120)
    assert "under --tool-timeout 123.4567 (--config F: setting 'tool_timeout'): an evaluation" in said
