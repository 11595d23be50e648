"""The experiment's deadline cuts an arm (interrupted, run again by --resume), never fails it; the
client's own deadline still does."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import asyncroll.experiment.arms as arms_module
import asyncroll.experiment.runner as runner_module
from asyncroll.experiment.report import aggregate, load_comparison
from asyncroll.experiment.report_markdown import markdown
from asyncroll.experiment.runner import ExperimentRunner
from tests.experiments import alive, read, recorded_processes
from tests.lean_experiment import lean, one_arm, ready_server


@pytest.mark.timeout(30)
@pytest.mark.parametrize("cut", ["starting_server", "running_client", "client_deadline"])
def test_the_experiments_deadline_interrupts_the_arm_the_clients_own_deadline_fails_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: str
) -> None:
    """The experiment's deadline while the server starts or the client runs: both are stopped and the
    arm ends interrupted (by the deadline), not failed. The client's own deadline still fails it."""
    server = ready_server(tmp_path)
    if cut == "starting_server":
        server["command"] = [
            "sh",
            "-c",
            "sleep 30",
            "{port}",
        ]  # never ready: the cut comes while it starts, whatever the load
    cfg = lean(tmp_path, server=server, **{"client.deadline_s": 0.3 if cut == "client_deadline" else 60})
    monkeypatch.setattr(arms_module, "client_command", lambda *_args: ["sleep", "30"])
    out = tmp_path / "out"
    if cut == "client_deadline":
        arm = one_arm(cfg, out)
    else:  # the deadline passes once the step has begun: the cut is in that step, not before or after it
        begun = out / "arms" / "pair1-fifo" / ("server.log" if cut == "starting_server" else "client.log")
        after = 0.2 if cut == "starting_server" else -1.0
        arm = one_arm(cfg, out, time_left=lambda: after if begun.exists() else float("inf"))
    if cut == "client_deadline":
        assert arm["status"] == "failed" and arm["failed_step"] == "running_client"
        assert arm["error"] == "client passed its deadline of 0.3s and was stopped"
    else:
        assert arm["status"] == "interrupted" and arm["interrupted_by"] == "deadline", arm
        assert arm["cut_step"] == cut and "failed_step" not in arm
        assert arm["error"].startswith("the experiment's deadline came while the ")
    assert [t["status"] for t in arm["transitions"]][-2:] == ["stopping_server", arm["status"]]
    assert arm["server"]["stop"]["leftover"] == []
    if cut != "starting_server":
        assert arm["client"]["stop"]["how"] == "term" and arm["client"]["stop"]["leftover"] == []
    assert recorded_processes(out) and not any(alive(p) for p in recorded_processes(out))


def cut_arm(cut: set[str], calls: list[str]) -> Any:
    """A stand-in for run_arm that starts nothing: the arms named in ``cut`` are cut by the deadline."""

    def run_arm(cfg: Any, plan: Any, arm_dir: Path, *args: Any, **kwargs: Any) -> Any:
        calls.append(plan.id)
        left = kwargs["time_left"]()  # the runner hands the arm the time left until its deadline
        assert 0 < left <= cfg.deadline_s
        arm_dir.mkdir(parents=True)
        if plan.id in cut:
            error = "the experiment's deadline came while the client ran (after 5s)"
            data = {"error": error, "interrupted_by": "deadline", "cut_step": "running_client"}
            return SimpleNamespace(status="interrupted", data=data)
        return SimpleNamespace(status="complete", data={"error": None})

    return run_arm


def test_a_deadline_stop_is_recorded_as_such_and_resume_runs_the_cut_arm_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deadline cuts pair1-asyncroll: the experiment is stopped (not complete), its stop_reason names
    the deadline, the arm is interrupted (not a failed arm, in experiment.json, comparison.json and the
    report), and --resume, with a deadline of its own, runs it again and keeps the finished arm."""
    cfg = lean(tmp_path, deadline_s=30)
    out = tmp_path / "out"
    calls: list[str] = []
    monkeypatch.setattr(runner_module, "run_arm", cut_arm({"pair1-asyncroll"}, calls))
    outcome = ExperimentRunner(cfg, out, echo=lambda _: None).run()
    assert (outcome.status, outcome.exit_code) == ("stopped", 1) and "failed arms" not in outcome.message
    exp = read(out / "experiment.json")
    assert exp["status"] == "stopped" and exp["stages"]["comparison"]["status"] == "deadline"
    assert exp["stop_reason"] == (
        "the experiment's deadline (deadline_s 30s for this run) cut pair1-asyncroll while running client "
        "(interrupted); --resume runs the unfinished arms"
    )
    assert exp["arms"]["pair1-fifo"]["status"] == "complete"
    cut = exp["arms"]["pair1-asyncroll"]
    assert cut["status"] == "interrupted" and cut["interrupted_by"] == "deadline"
    comparison = read(out / "comparison.json")
    assert comparison["failed_arms"] == [] and comparison["experiment_status"] == "stopped"
    assert comparison["pairs"][0]["arms"]["asyncroll"]["status"] == "interrupted"
    text = markdown(aggregate(load_comparison(out / "comparison.json")))
    assert text[text.index("Failed arms (kept, never re-run):") :].splitlines()[2] == "- none"
    assert "- `pair1-asyncroll`: interrupted: the experiment's deadline came while the client ran" in text
    # a day later: the deadline counts from the resume, not from the experiment's creation
    exp["created_wall"] -= 86400
    (out / "experiment.json").write_text(json.dumps(exp))
    monkeypatch.setattr(runner_module, "run_arm", cut_arm(set(), calls))
    outcome = ExperimentRunner(cfg, out, resume=True, echo=lambda _: None).run()
    assert (outcome.status, outcome.exit_code) == ("complete", 0), outcome.message
    assert calls == ["pair1-fifo", "pair1-asyncroll", "pair1-asyncroll"]  # the finished arm is not re-run
    exp = read(out / "experiment.json")
    assert exp["stop_reason"] is None and {a["status"] for a in exp["arms"].values()} == {"complete"}
    attempts = exp["arms"]["pair1-asyncroll"]["attempts_interrupted"]
    assert len(attempts) == 1 and attempts[0]["interrupted_by"] == "deadline"
    assert Path(attempts[0]["dir"]).name == "pair1-asyncroll.interrupted-1"
    assert exp["resumes"][-1]["status_before"] == "stopped"
    assert exp["resumes"][-1]["stop_reason_before"].startswith("the experiment's deadline")
    assert (out / "arms" / "pair1-fifo").is_dir()
