"""What a replay (``simulate --from-run``) ended otherwise than the run it replays: trajectories whose
status changed, and the run's worker replacements the replay lacks. Said on stderr and recorded in the
replay's run.json (``simulation.replayed``)."""

from __future__ import annotations

from pathlib import Path

from asyncroll.errors import UsageError
from asyncroll.simulation.measured import jsonl_rows


def ended_otherwise(run_dir: Path, replay_dir: Path) -> dict[str, int]:
    """How many trajectories ended with another status in the replay than in the run, by ``"recorded →
    replayed"``. A trajectory that failed in the run on a model error, a tool's error under
    ``--tool-errors fail`` or its worker's death goes on in the replay (a script cannot fail that way),
    and its turns after the failure take the script's timings, which the run never measured."""
    recorded = _statuses(run_dir / "results.jsonl")
    changes: dict[str, int] = {}
    for pid, status in _statuses(replay_dir / "results.jsonl").items():
        before = recorded.get(pid)
        if before is not None and before != status:
            key = f"{before} → {status}"
            changes[key] = changes.get(key, 0) + 1
    return changes


def restarts_not_replayed(run_dir: Path, replay_dir: Path) -> dict[str, int]:
    """The run's worker replacements the replay lacks, by reason (``worker_restarting``): all but
    timeouts. A worker that died in the run (holding a job, or idle: killed from outside), or that was
    replaced for its memory, is not replayed, so its replacement's start-up, when its slot took no job,
    is missing from the replay."""
    run, replay = (_restarts(folder / "events.jsonl") for folder in (run_dir, replay_dir))
    return {
        k: n - replay.get(k, 0) for k, n in sorted(run.items()) if k != "timeout" and n > replay.get(k, 0)
    }


def _restarts(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for _, row in jsonl_rows(path):
        if row.get("event") == "worker_restarting":
            reason = str(row.get("reason"))
            out[reason] = out.get(reason, 0) + 1
    return out


def _statuses(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line_no, row in jsonl_rows(path):
        if "id" not in row or not isinstance(row.get("status"), str):
            raise UsageError(f"--from-run {path}:{line_no}: 'id' or 'status' is not valid")
        out[str(row["id"])] = row["status"]
    return out
