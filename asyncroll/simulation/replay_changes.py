"""What a replay (``simulate --from-run``) ended otherwise than the run it replays: trajectories whose
status changed, and the run's worker replacements the replay lacks. Said on stderr and recorded in the
replay's run.json (``simulation.replayed``). Also what the replay took from the run that the run's own
client put there: the stalls of its event loop, inside the latencies it measured (:func:`stalls_taken`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from asyncroll.errors import UsageError
from asyncroll.simulation.measured import jsonl_rows


def ended_otherwise(run_dir: Path, replay_dir: Path) -> dict[str, int]:
    """How many trajectories ended otherwise in the replay than in the run, by ``"recorded → replayed"``
    status, or ``"failed → failed (other turns)"`` where the status stayed and the turns did not. The
    replay fails where the run did (a failed model request as an ``error`` step, a tool's error as its
    action's ``raises``, a worker's death as its ``worker_dies``); a trajectory it ends otherwise (its
    settings changed, or a failure it does not reproduce) takes the script's timings past where the run
    ended it, which the run never measured, and may then fail anew (its script runs out) with the same
    status after other turns."""
    recorded = _endings(run_dir / "results.jsonl")
    changes: dict[str, int] = {}
    for pid, (status, turns) in _endings(replay_dir / "results.jsonl").items():
        before = recorded.get(pid)
        if before is None or before == (status, turns):
            continue
        key = f"{before[0]} → {status}" + (" (other turns)" if before[0] == status else "")
        changes[key] = changes.get(key, 0) + 1
    return changes


def stalls_taken(run_dir: Path) -> str | None:
    """Warnings, one a line, when the recorded run's process was stopped (job control) for 0.5 s or more,
    and when its event loop stalled for 5% of its makespan and 0.5 s or more (summary.json's
    ``event_loop``, as ``run`` warns of each): its model latencies were measured by that loop, so a
    request that spanned a stop or a stall counts it as model time, and the replay takes it as such."""
    from asyncroll.json_depth import read_json_object
    from asyncroll.outputs.pauses import STALLED_WARNING_FRACTION, STALLED_WARNING_S

    loop = (read_json_object(run_dir / "summary.json") or {}).get("event_loop")
    loop = loop if isinstance(loop, dict) else {}
    said = []
    stopped = loop.get("stopped_s")
    if isinstance(stopped, int | float) and stopped >= STALLED_WARNING_S:  # as ``run`` warns of a stop
        said.append(
            f"warning: the run's process was stopped (job control) for {stopped:.3f} s (summary.json: "
            "event_loop): a model request it measured across the stop counts the stop as model latency, "
            "and so does this replay"
        )
    fraction, stalled = loop.get("fraction_of_makespan"), loop.get("stalled_s")
    if (
        isinstance(fraction, int | float)
        and isinstance(stalled, int | float)
        and fraction >= STALLED_WARNING_FRACTION
        and stalled >= STALLED_WARNING_S
    ):
        said.append(
            f"warning: the run's event loop stalled {stalled:.3f} s ({100 * fraction:.0f}% of its makespan; "
            "summary.json: event_loop): a model request it measured across a stall counts the stall as "
            "model latency, and so does this replay"
        )
    return "\n".join(said) or None


def restarts_not_replayed(run_dir: Path, replay_dir: Path) -> dict[str, Counter[str]]:
    """The run's worker replacements the replay lacks, by reason (``worker_restarting``), each counted by
    what it followed (:func:`unreplayable_restarts`, of the run less the replay's own): a tool or
    evaluation job's timeout is replayed (just past the run's timeout) and so is a death holding one (its
    ``worker_dies``); a grade job's timeout or death, a death while idle (killed from outside), a memory
    replacement and a failed start are not, so their replacement's start-up, when its slot took no job,
    is missing. A tool job's timeout the replay lacks is its own setting's (a longer ``--tool-timeout``)."""
    run, replay = (unreplayable_restarts(folder) for folder in (run_dir, replay_dir))
    lacks = {
        reason: Counter({what: n - replay.get(reason, Counter())[what] for what, n in held.items()})
        for reason, held in sorted(run.items())
    }
    return {reason: +held for reason, held in lacks.items() if +held}


#: What a replacement no replay reproduces followed: (its reason, the kind of job it held) → as said.
_UNREPLAYABLE = {
    ("timeout", "grade"): "a grade job's timeout",
    ("died", "grade"): "a death holding a grade job",
    ("died", None): "a death while idle (killed from outside)",
    ("memory", None): "a memory replacement",
    ("startup_failed", None): "a failed start",
}


def unreplayable_restarts(run_dir: Path) -> dict[str, Counter[str]]:
    """The run's worker replacements that no replay reproduces, by reason, each counted by what it followed
    (a grade job's timeout, a death while idle, ...): a grade job is implicit in the workload (no action
    carries its cost or its worker's death), and the replay's grade takes 0 s on a worker that never dies
    idle, never grows, never fails to start. Read from ``events.jsonl``: a job's ``cpu_failed`` (timeout,
    worker_died) names its kind before its worker's ``worker_restarting``."""
    held: dict[object, str] = {}  # worker -> the kind of job it lost, until replaced
    out: dict[str, Counter[str]] = {}
    for _, row in jsonl_rows(run_dir / "events.jsonl"):
        if row.get("event") == "cpu_failed" and row.get("reason") in ("timeout", "worker_died"):
            held[row.get("worker")] = str(row.get("kind"))
        elif row.get("event") == "worker_restarting":
            reason = str(row.get("reason"))
            kind = held.pop(row.get("worker"), None) if reason in ("timeout", "died") else None
            if kind in ("tool", "evaluate"):
                continue  # replayed: the job times out again, or its worker_dies
            what = _UNREPLAYABLE.get((reason, kind), f"a replacement ({reason})")
            out.setdefault(reason, Counter())[what] += 1
    return out


def grade_failures(run_dir: Path, replay_dir: Path) -> dict[str, int]:
    """The trajectories that ended otherwise in the replay whose final answer's grade job failed in the
    run, by ``cpu_failed`` reason (``error`` where it finished not ok): the replay grades that answer (in
    0 s), so it completes the run's failed trajectory. One the replay ended before that answer (a lower
    ``--max-turns``) never graded it: its grade is not why."""
    recorded = _endings(run_dir / "results.jsonl")
    changed = {
        pid
        for pid, ending in _endings(replay_dir / "results.jsonl").items()
        if recorded.get(pid, ending) != ending and ending[0] == "completed"
    }
    out: dict[str, int] = {}
    for _, row in jsonl_rows(run_dir / "events.jsonl"):
        event = row.get("event")
        failed = event == "cpu_finished" and row.get("ok") is False
        if failed or (event == "cpu_failed" and row.get("reason") in ("timeout", "worker_died")):
            if row.get("kind") != "grade" or row.get("id") not in changed:
                continue
            reason = str(row.get("reason", "error"))
            out[reason] = out.get(reason, 0) + 1
    return out


def _endings(path: Path) -> dict[str, tuple[str, int | None]]:
    """Each trajectory's status and turns (None where a line has no integer ``turns``)."""
    out: dict[str, tuple[str, int | None]] = {}
    for line_no, row in jsonl_rows(path):
        if "id" not in row or not isinstance(row.get("status"), str):
            raise UsageError(f"--from-run {path}:{line_no}: 'id' or 'status' is not valid")
        turns = row.get("turns")
        out[str(row["id"])] = (
            row["status"],
            turns if isinstance(turns, int) and not isinstance(turns, bool) else None,
        )
    return out
