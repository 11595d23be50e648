"""Helpers for the experiment runner's tests: the smoke experiment made lean, stand-ins for an arm, a
fake server that is ready at once, and one real arm run on its own."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from asyncroll.experiment.config import ExperimentConfig, load_experiment_config
from asyncroll.experiment.plan import build_plan
from asyncroll.experiment.server import ManagedProcess
from asyncroll.workers.spawn import child_flags
from tests.experiments import kill_recorded, read, write_config


def lean(tmp: Path, **changes: Any) -> ExperimentConfig:
    """The smoke experiment without stages, one pair unless ``changes`` say otherwise."""
    return load_experiment_config(write_config(tmp, **{"stages": {}, "pairs": 1, **changes}))


def is_client(process: ManagedProcess) -> bool:
    """Whether ``process`` is an arm's client: ``python -P [-s] -m asyncroll run`` (``-s`` where the runner
    runs without the user's site-packages: ``PYTHONNOUSERSITE``, ``python -s``)."""
    flags = child_flags()
    return process.command[1 : len(flags) + 4] == [*flags, "-m", "asyncroll", "run"]


def fake_arm(status: str = "failed", error: str | None = "fake arm") -> Any:
    """A stand-in for run_arm that starts nothing."""

    def run_arm(cfg: Any, plan: Any, arm_dir: Path, *args: Any, **kwargs: Any) -> Any:
        arm_dir.mkdir(parents=True)
        return SimpleNamespace(status=status, data={"error": error, "failed_step": "running_client"})

    return run_arm


def ready_server(tmp: Path) -> dict[str, Any]:
    """``server`` settings of a fake server that is ready at once and serves the model ``sim``."""
    site = tmp / "site"
    (site / "v1").mkdir(parents=True)
    (site / "health").write_text("ok")
    (site / "v1" / "models").write_text(json.dumps({"data": [{"id": "sim"}]}))
    command = ["{python}", "-m", "http.server", "--bind", "{host}", "--directory", str(site), "{port}"]
    return {"command": command, "kind": "generic", "port": 0, "startup_timeout_s": 20, "stop_grace_s": 5}


def one_arm(cfg: ExperimentConfig, out: Path, **kwargs: Any) -> dict[str, Any]:
    """run_arm for the config's first arm in ``out/arms/ID``; its arm.json. Its processes are killed if
    the test fails midway."""
    from asyncroll.experiment.arms import run_arm
    from asyncroll.experiment.client_check import Expected

    plan = build_plan(cfg)[0]
    arm_dir = out / "arms" / plan.id
    try:
        receipt = run_arm(cfg, plan, arm_dir, Expected("0" * 64, {}, {}), cfg.client.deadline_s, **kwargs)
    finally:
        kill_recorded(out)
    arm = read(arm_dir / "arm.json")
    assert arm["status"] == receipt.status
    return arm
