"""What a resume does with the arms a dead or interrupted runner left, and how a finished arm is recorded.

``--resume`` (under the output's lock: no live runner owns these arms) kills what a dead runner left
running (each recorded process group and tree, and what they detached), records an arm whose ``arm.json``
says it finished though ``experiment.json`` does not, and moves each unfinished arm's directory aside
(``<id>.interrupted-N``, kept and listed) so that it runs afresh. The runner (``runner.py``) records
each arm it runs the same way (:func:`record_arm`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from asyncroll.errors import UsageError
from asyncroll.experiment.orphans import sweep_orphan
from asyncroll.experiment.plan import ArmPlan
from asyncroll.experiment.receipts import (
    TERMINAL,
    ExperimentReceipt,
    arm_verdict,
    now_iso,
    one_line,
    read_json,
)
from asyncroll.outputs.receipt import write_json_atomic
from asyncroll.proctree import same_process


def arm_dir(output: Path, arm: ArmPlan) -> Path:
    return output / "arms" / arm.id


def finished_arm(output: Path, arm: ArmPlan) -> dict[str, Any] | None:
    """The arm's ``arm.json`` when it says the arm finished (complete or failed), else None."""
    try:
        data = read_json(arm_dir(output, arm) / "arm.json")
    except (OSError, ValueError):
        return None
    return data if data.get("status") in TERMINAL else None


def ended_with_verdict(path: Path, data: dict[str, Any], swept: dict[str, Any]) -> dict[str, Any]:
    """An arm that had its verdict when its runner died (killed while it stopped the arm's processes: the
    client's outputs had passed the checks, or a step had failed) is ended with it here, once its
    leftovers are killed (``swept``), as an interrupt at that point ends it (``arms._abort``): a measured
    arm is not measured again, a failed one is kept, never retried. Any other arm.json is left as it is."""
    where = data.get("status")
    verdict = arm_verdict(data)
    if where in (*TERMINAL, "interrupted") or verdict is None:
        return data
    data["status"] = verdict
    transitions = data.get("transitions")
    data["transitions"] = [
        *(transitions if isinstance(transitions, list) else []),
        {"status": verdict, "at": now_iso()},
    ]
    data.update(interrupted_while=where, stopped_by_resume=swept)
    write_json_atomic(path, data)
    return data


def _object(value: Any) -> dict[str, Any]:
    """``value`` where it is an object, as the runner writes it; else (an older or edited file) none."""
    return value if isinstance(value, dict) else {}


def _arm_json(path: Path) -> dict[str, Any]:
    """An unfinished arm's ``arm.json``; one that cannot be read is refused (UsageError), naming it: the
    processes it records (a server holding the GPU, say) could not be found and killed."""
    try:
        return read_json(path)
    except (OSError, ValueError, RecursionError) as exc:
        why = str(exc) if str(exc).startswith(str(path)) else f"{path}: cannot be read ({exc})"
        raise UsageError(
            f"{why}: the processes it records cannot be found from it; restore it, or stop them yourself "
            "and remove it (its arm then runs afresh), then --resume again"
        ) from None


def record_arm(
    receipt: ExperimentReceipt, output: Path, echo: Callable[[str], None], arm: ArmPlan, data: dict[str, Any]
) -> None:
    """A finished arm's outcome, from its ``arm.json``, into ``experiment.json``."""
    status, error = data["status"], data.get("error")
    receipt.set_arm(
        arm.id,
        status=status,
        error=error,
        failed_step=data.get("failed_step"),
        run_dir=str(arm_dir(output, arm) / "run"),
        finished_at=now_iso(),
        server_evidence=_object(data.get("server")).get("startup_evidence"),
    )
    echo(f"[{arm.id}] {status}" + (f": {one_line(error)}" if error else ""))


def still_running(output: Path, receipt: ExperimentReceipt) -> str:
    """The recorded processes of unfinished arms that still run (a dead runner's server, holding the GPU),
    in words, with how to stop them; "" when none does. For a resume that is refused before ``recover``
    kills them: it touches nothing, but the user it sends to a new experiment must know of them. The arms
    are those ``experiment.json`` records (the dead runner's plan: a changed plan may lack them); what
    is not as the runner writes it (a non-object where an object belongs) is passed over."""
    found, groups = [], []
    arms = receipt.data.get("arms")
    for arm_id in arms if isinstance(arms, dict) else {}:
        try:
            data = read_json(output / "arms" / str(arm_id) / "arm.json")
        except (OSError, ValueError):
            continue
        if data.get("status") in (*TERMINAL, "interrupted"):
            continue
        for role in ("server", "client"):
            entry = data.get(role)
            record = entry.get("process") if isinstance(entry, dict) else None
            if not isinstance(record, dict):
                continue
            pid = record.get("pid")
            if isinstance(pid, int) and same_process(
                pid, record.get("start_mark"), record.get("create_time")
            ):
                pgid = record.get("pgid")
                groups.append(f"-{pgid if isinstance(pgid, int) else pid}")
                found.append(f"pid {pid} ({arm_id}'s {role}, process group {groups[-1][1:]})")
    if not found:
        return ""
    return (
        f"; its dead runner left {', '.join(found)} running: stop it (kill -- {' '.join(groups)}), or undo "
        "the change and --resume, which stops it"
    )


def recover(
    receipt: ExperimentReceipt, output: Path, plan: list[ArmPlan], echo: Callable[[str], None]
) -> None:
    """Kill what a dead runner left running; set unfinished arms aside (kept) to run them afresh.

    Called under the lock: no live runner owns these arms."""
    moved, recorded = [], []
    # Every unfinished arm's arm.json is read before anything is killed or moved: one that cannot be read
    # is refused with the earlier arms' folders still in place (they were moved aside, unrecorded).
    unfinished = {
        arm.id: _arm_json(arm_dir(output, arm) / "arm.json")
        for arm in plan
        if receipt.arm(arm.id)["status"] not in TERMINAL and (arm_dir(output, arm) / "arm.json").is_file()
    }
    for arm in plan:
        record = receipt.arm(arm.id)
        own = finished_arm(output, arm) if record["status"] == "failed" else None
        if own is not None and own["status"] == "complete":  # it finished; recording it failed
            record_arm(receipt, output, echo, arm, own)
            recorded.append(arm.id)
            continue
        if record["status"] in TERMINAL or (
            record["status"] == "pending" and not arm_dir(output, arm).exists()
        ):
            continue
        where = arm_dir(output, arm)
        swept = {}
        if arm.id in unfinished:
            data = unfinished[arm.id]
            for role in ("client", "server"):
                # no process recorded: the runner was killed after the spawn, before its record of it
                entry = _object(data.get(role))
                process = _object(entry.get("process"))
                swept[role] = sweep_orphan(process or {"origin": entry.get("origin")})
            data = ended_with_verdict(where / "arm.json", data, swept)
            if data.get("status") in TERMINAL:  # it finished; the runner died before recording it
                record_arm(receipt, output, echo, arm, data)
                recorded.append(arm.id)
                continue
        n = len(record["attempts_interrupted"]) + 1
        aside = where.with_name(f"{arm.id}.interrupted-{n}")
        if where.exists():
            where.rename(aside)
        attempt = {"dir": str(aside), "status_seen": record["status"], "orphans": swept}
        for key in ("error", "interrupted_by", "cut_step"):  # the attempt's, not the next run's
            if record.get(key) is not None:
                attempt[key] = record.pop(key)
        record["attempts_interrupted"].append(attempt)
        record["status"] = "pending"
        moved.append(arm.id)
    receipt.data["resumes"].append(
        {
            "at": now_iso(),
            "status_before": receipt.data["status"],
            "stop_reason_before": receipt.data.get("stop_reason"),
            "unfinished_arms_set_aside": moved,
            "finished_arms_recorded": recorded,
        }
    )
    receipt.set_status("running", error=None, error_traceback=None, stop_reason=None)
    echo(f"resuming {output}: {len(moved)} unfinished arm(s) set aside: {moved or 'none'}")
