"""Helpers for the experiment runner's tests: the smoke experiment's config (written with changes), the
CLI in a subprocess, receipts read back, the processes an arm recorded (alive or killed), and a wait on
an arm's receipt until its client runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "experiments" / "serve_sim_smoke.json"
CLI = [sys.executable, "-m", "asyncroll.cli"]


def cli(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False
    )


def read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def recorded_processes(out: Path) -> list[dict[str, Any]]:
    found = []
    for arm_json in out.glob("arms/*/arm.json"):
        data = read(arm_json)
        for role in ("server", "client"):
            process = data.get(role, {}).get("process")
            if process:
                found.append(process)
    return found


def alive(record: dict[str, Any]) -> bool:
    try:
        proc = psutil.Process(record["pid"])
        return (
            abs(proc.create_time() - record["create_time"]) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE
        )
    except psutil.Error:
        return False


def kill_recorded(out: Path) -> None:
    for record in recorded_processes(out):
        if alive(record):
            os.killpg(record["pgid"], signal.SIGKILL)


def write_config(tmp: Path, **changes: Any) -> Path:
    data = json.loads(SMOKE.read_text())
    data["workload"]["path"] = str(ROOT / "examples" / "smoke.jsonl")
    for key, value in changes.items():
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    path = tmp / "experiment.json"
    path.write_text(json.dumps(data))
    return path


def wait_for_client(runner: subprocess.Popen[bytes], arm_json: Path, log: Path, within_s: float = 60) -> None:
    """Until the arm's receipt says its client runs and records the client's process (the status is written
    before the spawn, its process after it): synchronise on the receipt, not on a guessed delay."""
    deadline = time.monotonic() + within_s
    while True:
        assert runner.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"{arm_json.parent.name} never reached its client"
        try:
            data = read(arm_json)
            if data["status"] == "running_client" and data.get("client", {}).get("process"):
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
