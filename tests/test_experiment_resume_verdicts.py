"""A runner killed outright (kill -9, the OOM killer) while it stopped the processes of an arm that had
already reached its verdict: ``--resume`` ends that arm with its verdict, as an interrupt at that point
does, and never runs it again (a measured arm is not measured twice, a failed arm is never retried)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import asyncroll.experiment.runner as runner_module
from asyncroll.errors import UsageError
from asyncroll.experiment.arms import ExperimentInterrupted
from asyncroll.experiment.runner import ExperimentRunner
from tests.experiments import kill_recorded, read
from tests.lean_experiment import lean
from tests.test_experiment_setup import fake_arms


def as_left_by_a_killed_runner(arm_json: Path, *, failed: bool) -> dict[str, Any]:
    """The arm.json a runner killed while it stopped the arm's server leaves: its verdict reached (the
    client's outputs checked, or a step failed), its status ``stopping_server``, no stop recorded."""
    arm = read(arm_json)
    assert arm["status"] == "complete" and arm["transitions"][-2]["status"] == "stopping_server"
    arm["status"] = "stopping_server"
    arm["transitions"] = arm["transitions"][:-1]
    arm["server"].pop("stop")
    if failed:  # a client that failed: the step's error recorded, no summary checked
        arm.pop("summary_status")
        arm.update(error="client exited with code 1", failed_step="running_client")
    arm_json.write_text(json.dumps(arm))
    return arm


@pytest.mark.timeout(120)
def test_a_resume_ends_an_arm_whose_runner_died_while_stopping_it_with_its_verdict(tmp_path: Path) -> None:
    cfg, out = lean(tmp_path), tmp_path / "out"
    try:
        first = ExperimentRunner(cfg, out, echo=lambda _: None).run()
    finally:
        kill_recorded(out)
    assert first.status == "complete"
    arms = out / "arms"
    as_left_by_a_killed_runner(arms / "pair1-fifo" / "arm.json", failed=True)
    complete = as_left_by_a_killed_runner(arms / "pair1-asyncroll" / "arm.json", failed=False)
    exp = read(out / "experiment.json")
    exp["status"] = "running"
    exp["stages"]["comparison"]["status"] = "running"
    for record in exp["arms"].values():
        record["status"] = "running"
    (out / "experiment.json").write_text(json.dumps(exp))

    lines: list[str] = []
    try:
        outcome = ExperimentRunner(cfg, out, resume=True, echo=lines.append).run()
    finally:
        kill_recorded(out)
    assert not list(arms.glob("*.interrupted-*")), lines  # neither arm was run again
    fifo, treatment = read(arms / "pair1-fifo" / "arm.json"), read(arms / "pair1-asyncroll" / "arm.json")
    assert fifo["status"] == "failed" and fifo["error"] == "client exited with code 1"
    assert treatment["status"] == "complete" and treatment["summary_status"] == complete["summary_status"]
    for arm in (fifo, treatment):
        assert arm["interrupted_while"] == "stopping_server"
        assert set(arm["stopped_by_resume"]) == {"client", "server"}
        assert arm["transitions"][-1]["status"] == arm["status"]
    exp = read(out / "experiment.json")
    assert exp["arms"]["pair1-fifo"]["status"] == "failed"
    assert exp["arms"]["pair1-asyncroll"]["status"] == "complete"
    assert exp["resumes"][-1]["finished_arms_recorded"] == ["pair1-fifo", "pair1-asyncroll"]
    assert exp["resumes"][-1]["unfinished_arms_set_aside"] == []
    assert outcome.status == "complete" and outcome.exit_code == 1  # a failed arm: kept and reported


def _killed_leaving(arm: str) -> Any:
    """run_arm of a runner killed outright in its first arm, which leaves ``arm`` as its arm.json text."""

    def run_arm(cfg: Any, plan: Any, arm_dir: Path, *args: Any, **kwargs: Any) -> Any:
        arm_dir.mkdir(parents=True)
        (arm_dir / "arm.json").write_text(arm)
        raise ExperimentInterrupted("SIGKILL")

    return run_arm


@pytest.mark.timeout(60)
def test_a_resume_passes_over_a_non_object_where_an_arm_json_holds_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An arm.json with its verdict whose server, client and transitions are not what the runner writes
    (an older or hand-edited file): the arm is ended with its verdict, not a traceback (AttributeError)."""
    arm: dict[str, Any] = {"status": "stopping_server", "server": None, "client": [], "transitions": None}
    monkeypatch.setattr(
        runner_module, "run_arm", _killed_leaving(json.dumps({**arm, "summary_status": "ok"}))
    )
    cfg, out = lean(tmp_path), tmp_path / "out"
    assert ExperimentRunner(cfg, out, echo=lambda _: None).run().status == "interrupted"
    calls: list[str] = []
    monkeypatch.setattr(runner_module, "run_arm", fake_arms(calls))
    assert ExperimentRunner(cfg, out, resume=True, echo=lambda _: None).run().status == "complete"
    assert calls == ["pair1-asyncroll"]  # the first arm was ended with its verdict, not run again
    ended = read(out / "arms" / "pair1-fifo" / "arm.json")
    assert ended["status"] == "complete" and ended["transitions"][-1]["status"] == "complete"
    assert ended["stopped_by_resume"] == {"client": "none recorded", "server": "none recorded"}


@pytest.mark.timeout(60)
def test_a_resume_refuses_an_arm_json_it_cannot_read_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A garbled arm.json (not JSON, not an object) is refused naming it, not a ValueError traceback:
    the processes it recorded cannot be found from it."""
    for text in ("{", "[1, 2]"):
        out = tmp_path / f"out{len(text)}"
        monkeypatch.setattr(runner_module, "run_arm", _killed_leaving(text))
        cfg = lean(tmp_path)
        assert ExperimentRunner(cfg, out, echo=lambda _: None).run().status == "interrupted"
        with pytest.raises(UsageError) as refused:
            ExperimentRunner(cfg, out, resume=True, echo=lambda _: None).run()
        assert str(out / "arms" / "pair1-fifo" / "arm.json") in str(refused.value)
        assert "then --resume again" in str(refused.value)


@pytest.mark.timeout(60)
def test_a_resume_refused_for_an_unreadable_arm_json_moves_no_earlier_arm_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two unfinished arms, the second's arm.json garbled: the refusal touches nothing. The first arm's
    folder was moved aside before the second was read, while experiment.json (written only once every arm
    was seen) never said so: a folder set aside that no record listed."""
    monkeypatch.setattr(runner_module, "run_arm", _killed_leaving(json.dumps({"status": "running_client"})))
    cfg, out = lean(tmp_path), tmp_path / "out"
    assert ExperimentRunner(cfg, out, echo=lambda _: None).run().status == "interrupted"
    garbled = out / "arms" / "pair1-asyncroll" / "arm.json"
    garbled.parent.mkdir()
    garbled.write_text("{")
    before = (out / "experiment.json").read_text()
    with pytest.raises(UsageError, match="then --resume again"):
        ExperimentRunner(cfg, out, resume=True, echo=lambda _: None).run()
    assert sorted(p.name for p in (out / "arms").iterdir()) == ["pair1-asyncroll", "pair1-fifo"]
    assert read(out / "arms" / "pair1-fifo" / "arm.json") == {"status": "running_client"}
    assert (out / "experiment.json").read_text() == before
    garbled.unlink()  # as the refusal says: its processes stopped by hand, the file removed
    calls: list[str] = []
    monkeypatch.setattr(runner_module, "run_arm", fake_arms(calls))
    assert ExperimentRunner(cfg, out, resume=True, echo=lambda _: None).run().status == "complete"
    assert calls == ["pair1-fifo", "pair1-asyncroll"]
    attempts = read(out / "experiment.json")["arms"]["pair1-fifo"]["attempts_interrupted"]
    assert [Path(a["dir"]).name for a in attempts] == ["pair1-fifo.interrupted-1"]
    assert read(out / "arms" / "pair1-fifo.interrupted-1" / "arm.json") == {"status": "running_client"}
