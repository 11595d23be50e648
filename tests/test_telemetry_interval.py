"""``--telemetry-interval`` has a floor: below it the sampler reads its sources back to back (a server's
``/metrics`` read takes milliseconds), taking CPU from the run it measures and writing a sample per read
into the event log. A value below the floor is refused, naming the flag, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncroll.config import build_config
from asyncroll.errors import UsageError
from asyncroll.experiment.config import ClientSpec
from tests.conftest import REPO, invoke

SMOKE = REPO / "examples" / "smoke.jsonl"
FLOOR = "--telemetry-interval: Input should be greater than or equal to 0.01"


@pytest.mark.parametrize("value", ["0.0001", "1e-300", "0.0099"])
def test_an_interval_below_the_floor_is_refused_naming_the_flag(tmp_path: Path, value: str) -> None:
    out = tmp_path / "run"
    result = invoke("run", "--workload", SMOKE, "--output", out, "--telemetry-interval", value)
    assert result.exit_code == 2, result.output
    assert FLOOR in result.stderr
    assert not out.exists()


def test_the_floor_itself_is_accepted_and_documented() -> None:
    config = build_config({"workload": str(SMOKE), "output": "out", "telemetry_interval": 0.01})
    assert config.telemetry_interval == 0.01
    with pytest.raises(UsageError, match=r"interval: Input should be greater than or equal to 0\.01"):
        build_config({"workload": str(SMOKE), "output": "out", "telemetry_interval": 0.001})
    shown = " ".join(invoke("run", "--help").stdout.split())
    assert "Telemetry sample interval, s (0.2; at least 0.01" in shown


def test_an_experiment_refuses_it_too() -> None:
    """An experiment passes it on to each arm's run: refused when the config is read, not per arm."""
    with pytest.raises(ValueError, match=r"greater than or equal to 0\.01"):
        ClientSpec.model_validate({"telemetry_interval": 0.001})
    assert ClientSpec.model_validate({"telemetry_interval": 0.01}).telemetry_interval == 0.01
