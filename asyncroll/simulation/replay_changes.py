"""What a replay (``simulate --from-run``) ended otherwise than the run it replays: trajectories whose
status changed, and the run's worker replacements the replay lacks. Said on stderr and recorded in the
replay's run.json (``simulation.replayed``). Also what the replay took from the run that the run's own
client put there: the stalls of its event loop, inside the latencies it measured (:func:`stalls_taken`)."""

from __future__ import annotations

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


def restarts_not_replayed(run_dir: Path, replay_dir: Path) -> dict[str, int]:
    """The run's worker replacements the replay lacks, by reason (``worker_restarting``): all but
    timeouts. A worker that died holding a job is replayed (its job's ``worker_dies``); one that died
    idle (killed from outside), or that was replaced for its memory, is not, so its replacement's
    start-up, when its slot took no job, is missing from the replay."""
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
