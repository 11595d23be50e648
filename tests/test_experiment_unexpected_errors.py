"""An unexpected error inside an arm fails that arm at its step; one outside any arm is recorded in
experiment.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import asyncroll.experiment.arms as arms_module
import asyncroll.experiment.runner as runner_module
from asyncroll.experiment.runner import ExperimentRunner
from tests.experiments import read
from tests.lean_experiment import lean


def test_an_unexpected_error_in_an_arm_fails_it_at_its_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(_spec: Any) -> dict[str, Any]:
        raise ValueError("a reading nobody planned for")

    monkeypatch.setattr(arms_module, "check_gpu", broken)
    out = tmp_path / "out"
    outcome = ExperimentRunner(lean(tmp_path), out, echo=lambda _: None).run()
    assert outcome.status == "complete" and outcome.exit_code == 1  # the runner moved on to the next arm
    for arm_id in ("pair1-fifo", "pair1-asyncroll"):
        arm = read(out / "arms" / arm_id / "arm.json")
        assert arm["status"] == "failed" and arm["failed_step"] == "checking_gpu"
        assert arm["error"] == "unexpected error while checking_gpu: ValueError: a reading nobody planned for"


def test_an_unexpected_error_outside_an_arm_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(runner_module, "run_arm", broken)
    out = tmp_path / "out"
    outcome = ExperimentRunner(lean(tmp_path), out, echo=lambda _: None).run()
    assert outcome.status == "failed" and outcome.exit_code == 1
    assert "unexpected error: RuntimeError: boom" in outcome.message
    exp = read(out / "experiment.json")
    assert exp["status"] == "failed" and exp["error"] == "unexpected error: RuntimeError: boom"
    assert "RuntimeError: boom" in exp["error_traceback"]
    assert exp["arms"]["pair1-fifo"]["status"] == "failed" and (out / "comparison.json").is_file()
    # the stage the crash cut is not left "running" (nor "failed", which is a failed gate): --resume runs it
    assert [s["status"] for s in exp["stages"].values()].count("interrupted") == 1
    assert "running" not in {s["status"] for s in exp["stages"].values()}
