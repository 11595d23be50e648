"""The protocol fingerprint, computed again before and after every arm: a tool file or workload changed
mid-experiment fails the arm and stops the experiment; what the code digest counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import asyncroll.experiment.runner as runner_module
from asyncroll.experiment.runner import ExperimentRunner
from asyncroll.experiment.server import ManagedProcess
from tests.experiments import ROOT, alive, kill_recorded, read, recorded_processes
from tests.lean_experiment import fake_arm, is_client, lean


def tool_workload(tmp: Path) -> tuple[Path, Path]:
    """A one-problem workload whose tool is a trusted file (hashed into the fingerprint)."""
    tool = tmp / "tools" / "sub.py"
    tool.parent.mkdir()
    tool.write_text("def sub(a, b):\n    return a - b\n")
    problem = {
        "id": "sub",
        "prompt": "What is 5 - 3?",
        "tools": [
            {
                "name": "sub",
                "description": "a - b",
                "inputs": {"a": "number", "b": "number"},
                "implementation": "tools/sub.py",
            }
        ],
        "reference_answer": "2",
        "script": [
            {"type": "tool", "name": "sub", "arguments": {"a": 5, "b": 3}, "latency_ms": 1},
            {"type": "final", "answer": "2", "latency_ms": 1},
        ],
    }
    workload = tmp / "workload.jsonl"
    workload.write_text(json.dumps(problem) + "\n")
    return workload, tool


@pytest.mark.timeout(120)
def test_a_tool_file_changed_during_an_arm_fails_it_and_stops_the_experiment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pair1-fifo: its tool file differs only while its client runs, so only the client's run.json shows
    it (the tools check). pair1-asyncroll: the file changes for good while its client runs, so the
    fingerprint computed when the client exits differs: the arm fails and the experiment stops there."""
    workload, tool = tool_workload(tmp_path)
    cfg = lean(tmp_path, pairs=2, workload={"path": str(workload)})
    out = tmp_path / "out"
    original = tool.read_text()
    real_start, real_wait = ManagedProcess.start, ManagedProcess.wait

    def start(self: ManagedProcess) -> None:
        if is_client(self) and "pair1-fifo" in str(self.log):
            tool.write_text(original + "# while pair1-fifo's client runs\n")
        real_start(self)

    def wait(self: ManagedProcess, timeout: float) -> int | None:
        code = real_wait(self, timeout)
        if code is None:  # the runner waits in short steps, watching the server meanwhile
            return code
        if is_client(self) and "pair1-fifo" in str(self.log):
            tool.write_text(original)
        elif is_client(self) and "pair1-asyncroll" in str(self.log):
            tool.write_text(original + "# for good\n")
        return code

    monkeypatch.setattr(ManagedProcess, "start", start)
    monkeypatch.setattr(ManagedProcess, "wait", wait)
    lines: list[str] = []
    try:
        outcome = ExperimentRunner(cfg, out, echo=lines.append).run()
    finally:
        kill_recorded(out)
    assert outcome.status == "stopped" and outcome.exit_code == 1, lines
    first = read(out / "arms" / "pair1-fifo" / "arm.json")
    assert first["status"] == "failed" and first["failed_step"] == "running_client"
    assert "the client's run does not match the plan: tool file tools/sub.py:sub: ran " in first["error"]
    second = read(out / "arms" / "pair1-asyncroll" / "arm.json")
    assert second["status"] == "failed" and second["failed_step"] == "checking_protocol"
    assert second["error"].startswith("after pair1-asyncroll ran: the protocol changed")
    assert "tools: tools/sub.py:sub " in second["error"]
    assert second["server"]["stop"]["leftover"] == []
    exp = read(out / "experiment.json")
    assert exp["status"] == "stopped" and exp["stop_reason"] == second["error"]
    assert [exp["arms"][a]["status"] for a in ("pair2-asyncroll", "pair2-fifo")] == ["pending", "pending"]
    assert not (out / "arms" / "pair2-asyncroll").exists()
    assert not any(alive(p) for p in recorded_processes(out))


def test_the_protocol_is_computed_again_before_every_arm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workload = tmp_path / "workload.jsonl"
    workload.write_text((ROOT / "examples" / "smoke.jsonl").read_text())
    cfg = lean(tmp_path, workload={"path": str(workload)})
    ran: list[str] = []
    inner = fake_arm()

    def run_arm(cfg: Any, plan: Any, arm_dir: Path, *args: Any, **kwargs: Any) -> Any:
        ran.append(plan.id)
        workload.write_text(workload.read_text() + "\n")  # a changed workload, after the first arm
        return inner(cfg, plan, arm_dir)

    monkeypatch.setattr(runner_module, "run_arm", run_arm)
    out = tmp_path / "out"
    outcome = ExperimentRunner(cfg, out, echo=lambda _: None).run()
    assert ran == ["pair1-fifo"] and outcome.status == "stopped"
    exp = read(out / "experiment.json")
    assert exp["stop_reason"].startswith("before pair1-asyncroll: the protocol changed")
    assert "workload: " in exp["stop_reason"] and exp["arms"]["pair1-asyncroll"]["status"] == "pending"


def test_the_code_digest_counts_the_packages_sources_not_editor_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening a module in an editor mid-experiment (a swap or backup file) must not stop it; an edit
    to a module or to the package data must."""
    import asyncroll
    from asyncroll.experiment.fingerprint import source_digest

    package = tmp_path / "asyncroll"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "runner.py").write_text("x = 1\n")
    monkeypatch.setattr(asyncroll, "__file__", str(package / "__init__.py"))
    before = source_digest()
    (package / "sub" / ".runner.py.swp").write_bytes(b"\0vim")
    (package / "sub" / "runner.py~").write_text("x = 0\n")
    (package / "sub" / "__pycache__").mkdir()
    (package / "sub" / "__pycache__" / "runner.cpython-311.pyc").write_bytes(b"\0")
    (package / "sub" / ".scratch.py").write_text("x = 3\n")  # hidden: not a module a client imports
    assert source_digest() == before
    (package / "sub" / "runner.py").rename(package / "sub" / "runner2.py")  # a module renamed: another one
    assert source_digest() != before
    (package / "sub" / "runner2.py").rename(package / "sub" / "runner.py")
    assert source_digest() == before
    (package / "sub" / "page.html").write_text("<p>")
    with_page = source_digest()
    assert with_page != before
    (package / "sub" / "runner.py").write_text("x = 2\n")
    assert source_digest() not in (before, with_page)
