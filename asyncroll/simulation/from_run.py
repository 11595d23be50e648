"""Turn a recorded run into a workload that replays its exact timings.

Every trajectory the run started is written again with each model turn's ``latency_ms`` set to the
latency the run measured for it and each tool action's ``cpu_ms`` set to the job's measured execute time
(or, for a job whose worker died, the time until that happened). A job that ran past the tool timeout
has no measured duration, only "longer than the timeout": it is replayed as one microsecond over the
run's ``tool_timeout``, so at the same timeout it times out again (with a larger ``--tool-timeout`` it
finishes just after the old one, a lower bound of its true time). Simulating that workload under
another policy answers "what would policy X have done on exactly this run?". Grade jobs run in virtual
time at zero cost (real ones take microseconds). A model request that failed in the run fails in the
replay at the same turn, after its measured latency, with its kind, message and status: the turn becomes
an ``error`` step (:class:`~asyncroll.workload.ErrorStep`) and ends the script, as it ended the
trajectory; a failure the run's server gave replays as a server's (not ``scripted``), one the run's
script gave as the script's. A job that finished with an error in the run (the tool raised, the
evaluation failed) fails in the replay with the same error (its action's ``raises``), so under
``--tool-errors fail`` its trajectory fails there too; a job whose worker died holding it dies again,
with the death's message, after the time it ran (its action's ``worker_dies``), and the replay replaces
that worker. A trajectory that
ended otherwise in the replay — its settings changed (``--max-turns``, ``--tool-errors``, ...) — goes on
on the script's timings past where the run ended it:
``simulate`` counts such trajectories after the replay
(:func:`asyncroll.simulation.replay_changes.ended_otherwise`), on stderr and in the replay's run.json
(``simulation.replayed.ended_otherwise``). A code submission
keeps its measured evaluation time and the verdict the run reached (from ``results.jsonl``: every
program before the last failed, the last one passed or not), so the replay repairs exactly where the
run did — no code runs in the replay.

A worker replaced in the run (after a timeout or a death) took a measured time to start, its
``worker_ready`` ``startup_s``, during which its slot took no job. The replay's replacements take those
times: the k-th replacement the replay starts takes the start-up of the k-th the run started after a job's
timeout or a death holding one (``worker_restarting`` order; exact when the replay replaces workers as the
run did), any beyond those their median; where the run replaced workers only otherwise (a death while
idle, memory), the median of those, and where none, that of its initial workers (all there is). A start
attempt that failed in the run is not replayed; a replacement still starting when the run ended (no
``worker_ready``) takes at least the rest of the measured window. The initial workers start before the
measured window, in the replay at once.

Only a run that completed is replayed: an interrupted, failed or killed run measured only some of its
turns and jobs (a job still running when it stopped never finished: no duration exists for it), and the
rest would silently take the workload's scripted timings. ``asyncroll optimum`` reads such a run all the
same, because leaving out what was never recorded keeps its bound valid (and its notes say so); a replay
re-runs every trajectory to its end and would have to invent those timings, so it refuses. (A run killed
after its summary.json said complete, while it wrote its exports, measured everything: it is replayed,
though its run.json still says running.) Within a
complete run every measurement must fit the workload's script, or the replay would silently keep the
script's timing where the run measured one: each tool or evaluation job ends with ``cpu_finished`` or
``cpu_failed`` (a job left without one, or cancelled, is refused), each model request is at a turn of
its trajectory's script that returned the scripted kind of action, no turn the run went past lacks its
request or its job, and a trajectory's ``trajectory_finished`` counts as many turns as were recorded;
a mismatch is refused naming the events.jsonl line.

The run's actions must be the workload's script (the scripted backend, or an HTTP backend with
``--replay``): an agent-mode run's actions came from the model, and its timings belong to those, not to
the script. Everything read from the run directory is checked; a file this version cannot read is a
:class:`UsageError` naming it (and the line, for the JSONL files), never a traceback.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncroll.errors import UsageError, no_directory, no_file
from asyncroll.json_depth import json_loads, read_json_object
from asyncroll.locale_names import unspellable
from asyncroll.outputs.lines import TextOutput
from asyncroll.outputs.receipt import RECEIPT_SCHEMA_VERSION, file_sha256
from asyncroll.paths import resolved
from asyncroll.simulation.measured import (
    Measured,
    check_against_script,
    failure_step,
    jsonl_rows,
    read_measurements,
)
from asyncroll.workload import Problem, ScriptStep, SubmitAction, ToolAction, iter_problems

#: The run's settings a replay keeps unless a flag overrides them: "the run's settings" of docs/SIMULATION.md.
RUN_SETTINGS = (
    "policy",
    "max_active_trajectories",
    "max_inflight_model_requests",
    "cpu_workers",
    "max_turns",
    "tool_timeout",
    "tool_errors",
    "starvation_threshold",
    "aging_seconds",
    "aging_weight",
)


def kept_settings(run_dir: Path, config: dict[str, Any], given: set[str]) -> dict[str, Any]:
    """The run's settings that no flag overrides. One that run.json's config lacks (a hand-edited or
    older receipt) is refused, naming it and its flag: the default in its place would replay another
    operating point than the run's, under the run's name."""
    missing = [key for key in RUN_SETTINGS if key not in config and key not in given]
    if missing:
        flags = ", ".join("--" + key.replace("_", "-") for key in missing)
        raise UsageError(
            f"--from-run {run_dir / 'run.json'}: config lacks {', '.join(missing)}: a default in its place "
            f"would not be the run's setting; give {flags} with the value the run used"
        )
    return {key: config[key] for key in RUN_SETTINGS if key in config and key not in given}


@dataclass(frozen=True)
class DerivedRun:
    workload: Path
    tool_root: Path
    source_config: dict[str, Any]
    trajectories: int
    model_turns: int
    cpu_jobs: int
    #: seconds each replacement worker takes to start, in the order they start (see the module docstring)
    replacement_startup_s: tuple[float, ...] = ()
    #: folders above the output that the replay created with it, nearest first (removed with it on refusal)
    made_parents: tuple[Path, ...] = ()
    #: the recorded run was itself a simulation (run.json ``simulated``): its timings and verdicts are
    #: that simulation's, its assumptions (a job without ``cpu_ms`` took 0 s) included, not measurements
    source_simulated: bool = False
    #: the recorded run's own workload, whose lines a refusal of the replay workload is told against
    source_workload: Path | None = None
    #: the run's ``--limit``: the lines of its workload past that many problems it never read
    source_limit: int | None = None
    #: why the replay keeps another policy name than the run's ``--policy`` (see :func:`_rule_that_ran`)
    policy_note: str | None = None
    #: the run's ``model_retrying`` and ``model_paused`` events: waits (retry back-off, an open circuit)
    #: inside the measured latencies, which the replay takes as the requests' service time
    model_waits: tuple[tuple[str, int], ...] = ()


def _load_receipt(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "run.json"
    if not run_dir.is_dir():
        why = no_directory(run_dir)
        raise UsageError(f"--from-run {run_dir}: {why} (a run directory holds run.json)")
    if not path.exists():
        raise UsageError(f"--from-run {run_dir}: no run.json (not a run directory?)")
    try:
        receipt = json_loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # not UTF-8, not JSON, past Python's limits
        raise UsageError(f"--from-run {run_dir}: cannot read run.json: {exc}") from exc
    if not isinstance(receipt, dict):
        raise UsageError(f"--from-run {path}: not a run receipt (a JSON {type(receipt).__name__})")
    version = receipt.get("schema_version")
    if version != RECEIPT_SCHEMA_VERSION:
        raise UsageError(
            f"--from-run {path}: schema_version {version!r}; this asyncroll reads run.json version "
            f"{RECEIPT_SCHEMA_VERSION} only"
        )
    status = receipt.get("status")
    if status == "running" and (read_json_object(run_dir / "summary.json") or {}).get("status") == "complete":
        status = "complete"  # killed after its summary, while it wrote its exports: every step was measured
    if status == "preparing":  # killed (or still going) before its measured window: nothing to replay
        raise UsageError(
            f"--from-run {run_dir}: the run's status is 'preparing' (killed, or still starting: it never "
            "began its measured window), so none of its model turns and jobs were measured"
        )
    if status != "complete":
        killed = " (killed, or still going: run.json was never finalised)" if status == "running" else ""
        raise UsageError(
            f"--from-run {run_dir}: the run's status is {status!r}, not 'complete'{killed}: only part of its "
            "model turns and jobs were measured, and a replay would give the rest the workload's scripted "
            "timings (`asyncroll optimum` still bounds the work it did record)"
        )
    for key in ("config", "workload"):
        if not isinstance(receipt.get(key), dict):
            raise UsageError(f"--from-run {path}: {key!r} is missing or not an object")
    config = receipt["config"]
    if config.get("backend", "scripted") != "scripted" and config.get("replay") is not True:
        raise UsageError(
            f"--from-run {run_dir}: the run's actions came from the model (--backend "
            f"{config.get('backend')} without --replay), not from the workload's script; a replay would put "
            "its measured timings on the script's actions, which are not what the run did. Replay a run of "
            "the scripted backend or an HTTP run with --replay"
        )
    workload = receipt["workload"]
    if not isinstance(workload.get("path"), str) or not isinstance(workload.get("sha256"), str):
        raise UsageError(f"--from-run {path}: 'workload' lacks its path or sha256")
    tools = receipt.get("tools", {})
    if not isinstance(tools, dict) or not all(v is None or isinstance(v, dict) for v in tools.values()):
        raise UsageError(f"--from-run {path}: 'tools' is not an object of tool files")
    return receipt


def _verdicts(run_dir: Path) -> dict[str, tuple[int, bool]]:
    """Per code trajectory: (programs evaluated, whether the last one passed), from ``results.jsonl``."""
    out: dict[str, tuple[int, bool]] = {}
    path = run_dir / "results.jsonl"
    for line_no, row in jsonl_rows(path):
        generations = row.get("generations")
        if generations:
            if not isinstance(generations, int) or "id" not in row:
                raise UsageError(f"--from-run {path}:{line_no}: 'generations' or 'id' is not valid")
            out[str(row["id"])] = (generations, bool(row.get("passed")))
    return out


def _check_results_match(run_dir: Path, measured: Measured) -> None:
    """In a complete run every trajectory that started ended (``trajectory_finished``, one ``results.jsonl``
    row), and every row's trajectory started. A trajectory whose events were removed from ``events.jsonl``
    (or a file cut at a line boundary) would otherwise vanish from the replay, or its last turns take the
    script's timings, silently: refused, naming the file and line that has what the other lacks."""
    path = run_dir / "results.jsonl"
    ended: dict[str, int] = {}
    for line_no, row in jsonl_rows(path):
        if "id" not in row:
            raise UsageError(f"--from-run {path}:{line_no}: 'id' is missing")
        if not isinstance(row.get("status"), str):  # read again after the replay, to compare statuses
            raise UsageError(f"--from-run {path}:{line_no}: 'status' is not a string")
        ended.setdefault(str(row["id"]), line_no)
    for tid, line_no in ended.items():
        if tid not in measured.started:
            raise UsageError(
                f"--from-run {path}:{line_no}: trajectory {tid!r} ended in the run, but "
                f"{measured.events} has no trajectory_started for it (events removed, or the file cut "
                "short?): the replay would leave its work out"
            )
    for tid, line_no in measured.started.items():
        if tid not in ended:
            raise UsageError(
                f"--from-run {measured.where(line_no)}: trajectory {tid!r} started, but {path} has no "
                "row for it, as every trajectory of a complete run has (the file cut short?)"
            )
        if tid not in measured.finished:  # its last measurements may be gone with it, unnoticed
            raise UsageError(
                f"--from-run {measured.where(line_no)}: trajectory {tid!r} started, but it has no "
                "trajectory_finished event, as every trajectory of a complete run has (events removed, or "
                "the file cut short?): the replay would give its unrecorded turns the script's timings"
            )


def _run_workload(run_dir: Path, recorded: dict[str, Any], given: Path | None) -> Path:
    """The run's workload file: ``given`` (its copy) or the path run.json records, with the same SHA-256."""
    path = Path(recorded["path"]) if given is None else given
    why = unspellable(path) if given is None else None
    if why is not None:  # else is_file() says False: it would "no longer exist"
        raise UsageError(
            f"--from-run {run_dir}: its workload (run.json's workload.path) {why}; or pass --workload with "
            "a copy of it"
        )
    if given is None and not path.is_file():
        raise UsageError(
            f"--from-run {run_dir}: its workload {path} no longer exists (a run recorded elsewhere: pass "
            "--workload with a copy of it)"
        )
    if not path.is_file():
        raise UsageError(f"--workload {path}: {no_file(path, 'a workload file')}")
    if file_sha256(path) != recorded["sha256"]:
        what = (
            f"its workload {path} changed since the run (SHA-256 differs from run.json's): pass --workload "
            "with a copy of the file the run read"
            if given is None
            else f"--workload {path} is not the workload the run read ({recorded['path']}; SHA-256 differs "
            "from run.json's)"
        )
        raise UsageError(f"--from-run {run_dir}: {what}")
    return path


def _tool_root(
    run_dir: Path, receipt: dict[str, Any], workload: Path, override: Path | None, limit: int | None
) -> Path:
    """The tool root the run used, absolute.

    A relative ``--tool-root`` was resolved against the directory the run started in. Where run.json
    records that directory (``cwd``) it is used; otherwise the root is recovered from the resolved tool
    file paths run.json records, and if those do not pin it down the user must pass ``--tool-root``."""
    if override is not None:
        return resolved(override)  # a symlink loop: refused as no folder by the run's checks, as run's is
    recorded = receipt["config"].get("tool_root")
    if recorded is None:
        return workload.parent.resolve()  # what the run did: the workload's folder
    if not isinstance(recorded, str):
        raise UsageError(f"--from-run {run_dir / 'run.json'}: config.tool_root is not a path")
    root = Path(recorded)
    cwd = receipt.get("cwd")
    if not root.is_absolute() and isinstance(cwd, str) and Path(cwd).is_absolute():
        root = Path(cwd) / root
    why = unspellable(root)
    if why is not None:
        raise UsageError(
            f"--from-run {run_dir}: the run's --tool-root (config.tool_root) {why}; or pass --tool-root with "
            "where its tools are"
        )
    if root.is_absolute():
        if not root.is_dir():  # not a flag the user gave: named as the run's, with the way out
            raise UsageError(
                f"--from-run {run_dir}: the run's --tool-root {root} (config.tool_root) is no longer a "
                "directory (moved, or a run recorded elsewhere): pass --tool-root with where its tools are"
            )
        return root.resolve()
    inferred = _root_from_tool_files(receipt, workload, limit)
    if inferred is None:
        raise UsageError(
            f"--from-run {run_dir}: the run's --tool-root {recorded!r} is relative to the directory it was "
            "started from, which run.json does not record; pass --tool-root with the tool root it used"
        )
    return inferred


def _root_from_tool_files(receipt: dict[str, Any], workload: Path, limit: int | None) -> Path | None:
    """The one root R with ``(R / implementation).resolve()`` equal to every tool file run.json records,
    or None when no tool file was recorded or they disagree."""
    files = {key: entry.get("path") for key, entry in receipt["tools"].items() if entry}
    candidates: set[Path] = set()
    checked: list[tuple[str, str]] = []
    for _, _, problem in iter_problems(workload, limit):
        for tool in problem.tools:
            spelled = files.pop(tool.spelled_key, None)  # as a run before keys were normalised wrote it
            path = files.pop(tool.key, spelled)
            if tool.implementation is None or not isinstance(path, str):
                continue
            parts = Path(tool.implementation).parts
            if ".." in parts or len(Path(path).parts) <= len(parts):
                return None
            candidates.add(Path(path).parents[len(parts) - 1])
            checked.append((tool.implementation, path))
        if not files:
            break
    if len(candidates) != 1:
        return None
    root = candidates.pop()
    if all(os.path.realpath(root / impl) == path for impl, path in checked):
        return root
    return None


def derive_workload(
    run_dir: Path,
    destination: Path,
    tool_root: Path | None = None,
    workload: Path | None = None,
    *,
    job_overhead_ms: float = 0.0,
) -> DerivedRun:
    """Write the replay workload of the completed run in ``run_dir`` to ``destination``.

    ``tool_root`` overrides the run's own (needed when run.json cannot say where a relative one was);
    ``workload`` is where the run's workload is now, when not at the path run.json records (a run
    recorded on another machine): the same bytes, checked by SHA-256. ``job_overhead_ms``: the replay's,
    which holds a worker before each job; a job whose worker died holding it was measured by its round
    trip, which holds the run's already, so the replay's ``cpu_ms`` is that round trip less it."""
    receipt = _load_receipt(run_dir)
    config: dict[str, Any] = receipt["config"]
    workload = _run_workload(run_dir, receipt["workload"], workload)
    if "tool_timeout" not in config:  # what a job that timed out in the run took is "past it"
        raise UsageError(f"--from-run {run_dir / 'run.json'}: config lacks tool_timeout, the run's timeout")
    timeout = config["tool_timeout"]
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or not timeout > 0:
        raise UsageError(f"--from-run {run_dir / 'run.json'}: config.tool_timeout is not a positive number")
    limit = config.get("limit")  # the lines past the run's first `limit` problems were never read
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise UsageError(f"--from-run {run_dir / 'run.json'}: config.limit is not a count of problems >= 1")
    measured = read_measurements(run_dir, float(timeout))
    for key in measured.deaths:  # the replay's overhead, then the rest of the round trip
        measured.cpu[key] = max(0.0, round(measured.cpu[key] - job_overhead_ms, 6))
    if not measured.started:
        raise UsageError(f"--from-run {run_dir}: the run started no trajectory; nothing to replay")
    verdicts = _verdicts(run_dir)
    _check_results_match(run_dir, measured)
    root = _tool_root(run_dir, receipt, workload, tool_root, limit)
    written: set[str] = set()
    with TextOutput(destination) as out:  # a full disk: an OutputWriteError naming it
        for _, pid, problem in iter_problems(workload, limit):
            if pid in measured.started:
                check_against_script(problem, pid, measured)
                out.write(_replay(problem, pid, measured, verdicts).model_dump_json() + "\n")
                written.add(pid)
    for tid, line in measured.started.items():
        if tid not in written:
            raise UsageError(
                f"--from-run {measured.where(line)}: trajectory {tid!r} is not a problem of the run's "
                f"workload {workload}: there is no script to replay it with"
            )
    count = len(written)
    config, note = _rule_that_ran(run_dir, config, measured.rules)
    waits: dict[str, int] = {}
    for _, row in jsonl_rows(run_dir / "events.jsonl"):
        if row.get("event") in ("model_retrying", "model_paused"):
            waits[row["event"]] = waits.get(row["event"], 0) + 1
    return DerivedRun(
        destination,
        root,
        config,
        count,
        len(measured.model),
        len(measured.cpu),
        measured.replacement_startup(),
        source_simulated=receipt.get("simulated") is True,
        source_workload=workload,
        source_limit=limit,
        policy_note=note,
        model_waits=tuple(sorted(waits.items())),
    )


def _rule_that_ran(
    run_dir: Path, config: dict[str, Any], rules: set[str]
) -> tuple[dict[str, Any], str | None]:
    """The run's config with ``policy`` the rule that ran, and why it changed (None: unchanged).

    ``--policy asyncroll`` names whichever pressure rule was the default when the run was recorded (the
    seed's, the unlock, the critical-path, the balanced rule); its ``cpu_selected`` events name that rule.
    A replay that kept the name would run today's default and call it the run's policy."""
    from asyncroll.policies.registry import PRESSURE_POLICIES, canonical_policy

    today = canonical_policy("asyncroll")
    if (
        config.get("policy") != "asyncroll"
        or len(rules) != 1
        or not rules <= set(PRESSURE_POLICIES) - {today}
    ):
        return config, None
    (rule,) = rules
    note = (
        f"--from-run {run_dir}: the run's --policy asyncroll was the rule {rule} then (its cpu_selected "
        f"events); the replay runs {rule}, not today's asyncroll ({today}); give --policy to choose"
    )
    return {**config, "policy": rule}, note


def _replay(problem: Problem, pid: str, measured: Measured, verdicts: dict[str, tuple[int, bool]]) -> Problem:
    script: list[ScriptStep] = []
    submitted = 0
    asked = measured.requests.get(pid, {})
    for turn, action in enumerate(problem.script or []):
        update: dict[str, Any] = {}
        if (pid, turn) in measured.model:
            update["latency_ms"] = round(measured.model[(pid, turn)] * 1000.0, 6)
        step = asked.get(turn)
        if step is not None and step.failure is not None:  # the request failed: so does the replay's, there
            script.append(failure_step(step, update.get("latency_ms"), measured))
            break
        if isinstance(action, ToolAction | SubmitAction) and (pid, turn) in measured.cpu:
            update["cpu_ms"] = measured.cpu[(pid, turn)]
            update["raises"] = measured.errors.get((pid, turn))  # the job failed so: it fails again
            update["worker_dies"] = measured.deaths.get((pid, turn))  # its worker died: it dies again
        if isinstance(action, SubmitAction) and pid in verdicts:
            submitted += 1
            generations, passed = verdicts[pid]
            update["passes"] = passed if submitted >= generations else False
        script.append(action.model_copy(update=update))
    return problem.model_copy(update={"id": pid, "script": script})
