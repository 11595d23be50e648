"""Turn a recorded run into a workload that replays its exact timings.

Every trajectory the run started is written again with each model turn's ``latency_ms`` set to the
latency the run measured for it and each tool action's ``cpu_ms`` set to the job's measured execute time
(or, for a job that timed out or whose worker died, the time until that happened). Simulating that
workload under another policy answers "what would policy X have done on exactly this run?". Grade jobs
run in virtual time at zero cost (real ones take microseconds); a tool that raised in the run succeeds in
the replay (the scripted actions do not depend on it). A code submission keeps its measured evaluation
time and the verdict the run reached (from ``results.jsonl``: every program before the last failed, the
last one passed or not), so the replay repairs exactly where the run did — no code runs in the replay.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncroll.errors import UsageError
from asyncroll.outputs.receipt import file_sha256
from asyncroll.workload import SubmitAction, ToolAction, iter_problems


@dataclass(frozen=True)
class DerivedRun:
    workload: Path
    tool_root: Path
    source_config: dict[str, Any]
    trajectories: int
    model_turns: int
    cpu_jobs: int


def _load_receipt(run_dir: Path) -> dict[str, Any]:
    try:
        receipt: dict[str, Any] = json.loads((run_dir / "run.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"--from-run {run_dir}: cannot read run.json: {exc}") from exc
    return receipt


def _verdicts(run_dir: Path) -> dict[str, tuple[int, bool]]:
    """Per code trajectory: (programs evaluated, whether the last one passed), from ``results.jsonl``."""
    out: dict[str, tuple[int, bool]] = {}
    try:
        lines = (run_dir / "results.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UsageError(f"--from-run {run_dir}: cannot read results.jsonl: {exc}") from exc
    for line in lines:
        row = json.loads(line)
        if row.get("generations"):
            out[str(row["id"])] = (int(row["generations"]), bool(row.get("passed")))
    return out


def derive_workload(run_dir: Path, destination: Path) -> DerivedRun:
    receipt = _load_receipt(run_dir)
    config = receipt.get("config", {})
    workload = Path(receipt.get("workload", {}).get("path", ""))
    if not workload.is_file():
        raise UsageError(f"--from-run {run_dir}: its workload {workload} no longer exists")
    if file_sha256(workload) != receipt["workload"].get("sha256"):
        raise UsageError(
            f"--from-run {run_dir}: its workload {workload} changed since the run (SHA-256 differs)"
        )
    model: dict[tuple[str, int], float] = {}
    cpu: dict[tuple[str, int], float] = {}
    started: set[str] = set()
    job_turn: dict[int, int] = {}
    try:
        lines = (run_dir / "events.jsonl").open("rb")
    except OSError as exc:
        raise UsageError(f"--from-run {run_dir}: cannot read events.jsonl: {exc}") from exc
    with lines:
        for raw in lines:
            event = json.loads(raw)
            kind, tid = event.get("event"), event.get("id")
            if kind == "trajectory_started":
                started.add(tid)
            elif kind in ("model_finished", "model_failed"):
                model[(tid, event["turn"])] = event["latency_s"]
            elif kind == "cpu_enqueued":
                job_turn[event["job_id"]] = event["turn"]
            elif kind == "cpu_finished" and event["kind"] in ("tool", "evaluate"):
                cpu[(tid, job_turn.pop(event["job_id"]))] = event["execute_s"]
            elif kind == "cpu_failed" and event["kind"] in ("tool", "evaluate"):
                cpu[(tid, job_turn.pop(event["job_id"]))] = event["roundtrip_s"]
    if not started:
        raise UsageError(f"--from-run {run_dir}: the run started no trajectory; nothing to replay")
    verdicts = _verdicts(run_dir)
    tool_root = Path(config.get("tool_root") or workload.parent).resolve()
    count = 0
    with destination.open("w", encoding="utf-8") as out:
        for _, pid, problem in iter_problems(workload):
            if pid not in started:
                continue
            script = []
            submitted = 0
            for turn, action in enumerate(problem.script or []):
                update: dict[str, Any] = {}
                if (pid, turn) in model:
                    update["latency_ms"] = round(model[(pid, turn)] * 1000.0, 6)
                if isinstance(action, ToolAction | SubmitAction) and (pid, turn) in cpu:
                    update["cpu_ms"] = round(cpu[(pid, turn)] * 1000.0, 6)
                if isinstance(action, SubmitAction) and pid in verdicts:
                    submitted += 1
                    generations, passed = verdicts[pid]
                    update["passes"] = passed if submitted >= generations else False
                script.append(action.model_copy(update=update))
            replay = problem.model_copy(update={"id": pid, "script": script})
            out.write(replay.model_dump_json() + "\n")
            count += 1
    return DerivedRun(destination, tool_root, config, count, len(model), len(cpu))
