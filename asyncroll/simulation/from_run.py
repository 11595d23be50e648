"""Turn a recorded run into a workload that replays its exact timings.

Every trajectory the run started is written again with each model turn's ``latency_ms`` set to the
latency the run measured for it and each tool action's ``cpu_ms`` set to the job's measured execute time
(or, for a job whose worker died, the time until that happened). A job that ran past the tool timeout
has no measured duration, only "longer than the timeout": it is replayed as one microsecond over the
run's ``tool_timeout``, so at the same timeout it times out again (with a larger ``--tool-timeout`` it
finishes just after the old one, a lower bound of its true time). Simulating that workload under
another policy answers "what would policy X have done on exactly this run?". Grade jobs run in virtual
time at zero cost (real ones take microseconds); a tool that raised in the run succeeds in the replay
(the scripted actions do not depend on it), and so does a job whose worker died. A code submission
keeps its measured evaluation time and the verdict the run reached (from ``results.jsonl``: every
program before the last failed, the last one passed or not), so the replay repairs exactly where the
run did — no code runs in the replay.

A worker replaced in the run (after a timeout or a death) took a measured time to start, its
``worker_ready`` ``startup_s``, during which its slot took no job. The replay's replacements take those
times: the k-th replacement the replay starts takes the start-up of the k-th one the run started (the
order of ``worker_restarting``; exact when the replay replaces workers as the run did); any replacement
beyond the run's count takes their median, and where the run replaced none, the median start-up of its
initial workers (the only measurement there is). A start attempt that failed in the run is not replayed.
The initial workers start before the measured window, in the replay at once.

Only a run that completed is replayed: an interrupted or failed run measured only some of its turns and
jobs, and the rest would silently take the workload's scripted timings. Its actions must be the
workload's script (the scripted backend, or an HTTP backend with ``--replay``): an agent-mode run's
actions came from the model, and its timings belong to those, not to the script. Everything read from the run
directory is checked; a file this version cannot read is a :class:`UsageError` naming it (and the line,
for the JSONL files), never a traceback.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncroll.errors import UsageError
from asyncroll.events import SCHEMA_VERSION as EVENTS_SCHEMA_VERSION
from asyncroll.outputs.receipt import RECEIPT_SCHEMA_VERSION, file_sha256
from asyncroll.workload import MAX_DURATION_MS, Problem, SubmitAction, ToolAction, iter_problems

#: A timed-out job is replayed this much (ms) over the run's tool timeout, so that it times out again.
TIMEOUT_MARGIN_MS = 0.001


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


def _load_receipt(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "run.json"
    try:
        receipt = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
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
    if status != "complete":
        raise UsageError(
            f"--from-run {run_dir}: the run's status is {status!r}, not 'complete': only part of its model "
            "turns and jobs were measured, and a replay would give the rest the workload's scripted timings"
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


def _jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for every line; a line that is not a JSON object names file and line."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise UsageError(f"--from-run {path.parent}: cannot read {path.name}: {exc.strerror or exc}") from exc
    with handle:
        for line_no, raw in enumerate(handle, start=1):
            try:
                row = json.loads(raw)
            except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
                raise UsageError(f"--from-run {path}:{line_no}: not valid JSON ({exc})") from None
            if not isinstance(row, dict):
                raise UsageError(f"--from-run {path}:{line_no}: not a JSON object")
            yield line_no, row


def _field(row: dict[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = row.get(name)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise UsageError(f"--from-run {where}: {row.get('event', 'row')!r} lacks a valid {name!r}")
    return value


def _seconds(row: dict[str, Any], name: str, where: str) -> float:
    """A recorded duration: a finite number of seconds from 0 to one day (the workload's own bound on a
    scripted duration), else refused naming the events.jsonl line (a NaN once replayed as 0 ms)."""
    value = float(_field(row, name, (int, float), where))
    if not (math.isfinite(value) and 0 <= value * 1000.0 <= MAX_DURATION_MS):
        raise UsageError(
            f"--from-run {where}: {row.get('event', 'row')!r} has {name} {value!r}: not a duration in "
            "seconds from 0 to one day"
        )
    return value


def _verdicts(run_dir: Path) -> dict[str, tuple[int, bool]]:
    """Per code trajectory: (programs evaluated, whether the last one passed), from ``results.jsonl``."""
    out: dict[str, tuple[int, bool]] = {}
    path = run_dir / "results.jsonl"
    for line_no, row in _jsonl(path):
        generations = row.get("generations")
        if generations:
            if not isinstance(generations, int) or "id" not in row:
                raise UsageError(f"--from-run {path}:{line_no}: 'generations' or 'id' is not valid")
            out[str(row["id"])] = (generations, bool(row.get("passed")))
    return out


@dataclass
class _Measured:
    """What ``events.jsonl`` measured, keyed by (trajectory id, turn)."""

    model: dict[tuple[str, int], float]
    cpu: dict[tuple[str, int], float]
    started: set[str]
    restarts: list[tuple[int, int]]  # (worker, generation) of each replacement, in the order it started
    ready: dict[tuple[int, int], float]  # (worker, generation) -> start-up seconds

    def replacement_startup(self) -> tuple[float, ...]:
        """The start-up of each replacement in the order they started (failed attempts have none); where
        none was replaced, the median of the initial workers' as the one value every replacement takes."""
        replaced = tuple(self.ready[key] for key in self.restarts if key in self.ready)
        if replaced:
            return replaced
        initial = [seconds for (_, generation), seconds in self.ready.items() if generation == 0]
        return (statistics.median(initial),) if initial else ()


def _measurements(run_dir: Path, tool_timeout_s: float) -> _Measured:
    measured = _Measured({}, {}, set(), [], {})
    job_turn: dict[int, int] = {}
    path = run_dir / "events.jsonl"
    timeout_ms = round(tool_timeout_s * 1000.0 + TIMEOUT_MARGIN_MS, 6)
    number = (int, float)
    for line_no, event in _jsonl(path):
        where = f"{path}:{line_no}"
        if event.get("v") != EVENTS_SCHEMA_VERSION:
            raise UsageError(
                f"--from-run {where}: event schema version {event.get('v')!r}; this asyncroll reads "
                f"version {EVENTS_SCHEMA_VERSION} only"
            )
        kind, tid = event.get("event"), event.get("id")
        if kind in ("worker_restarting", "worker_ready"):
            key = (_field(event, "worker", int, where), _field(event, "generation", int, where))
            if kind == "worker_restarting":
                measured.restarts.append(key)
            else:
                startup = float(_field(event, "startup_s", number, where))
                if not (math.isfinite(startup) and startup >= 0):
                    raise UsageError(f"--from-run {where}: 'worker_ready' lacks a valid 'startup_s'")
                measured.ready[key] = startup
            continue
        if kind not in ("trajectory_started", "model_finished", "model_failed", "cpu_enqueued") and not (
            kind in ("cpu_finished", "cpu_failed") and event.get("kind") in ("tool", "evaluate")
        ):
            continue
        if not isinstance(tid, str):
            raise UsageError(f"--from-run {where}: {kind!r} lacks a valid 'id'")
        if kind == "trajectory_started":
            measured.started.add(tid)
        elif kind in ("model_finished", "model_failed"):
            turn = _field(event, "turn", int, where)
            measured.model[(tid, turn)] = _seconds(event, "latency_s", where)
        elif kind == "cpu_enqueued":
            job_turn[_field(event, "job_id", int, where)] = _field(event, "turn", int, where)
        else:
            job = _field(event, "job_id", int, where)
            if job not in job_turn:
                raise UsageError(f"--from-run {where}: job {job} finished but was never enqueued")
            key = (tid, job_turn.pop(job))
            if kind == "cpu_finished":
                ms = round(_seconds(event, "execute_s", where) * 1000.0, 6)
            else:
                ms = round(_seconds(event, "roundtrip_s", where) * 1000.0, 6)
                if event.get("reason") == "timeout":
                    # The round trip also holds the kill; all that is known of the job is that it ran past
                    # the timeout. Just over it: it times out again, and a longer timeout gets a lower bound.
                    ms = timeout_ms
            measured.cpu[key] = ms
    return measured


def _tool_root(run_dir: Path, receipt: dict[str, Any], workload: Path, override: Path | None) -> Path:
    """The tool root the run used, absolute.

    A relative ``--tool-root`` was resolved against the directory the run started in. Where run.json
    records that directory (``cwd``) it is used; otherwise the root is recovered from the resolved tool
    file paths run.json records, and if those do not pin it down the user must pass ``--tool-root``."""
    if override is not None:
        return override.resolve()
    recorded = receipt["config"].get("tool_root")
    if recorded is None:
        return workload.parent.resolve()  # what the run did: the workload's folder
    if not isinstance(recorded, str):
        raise UsageError(f"--from-run {run_dir / 'run.json'}: config.tool_root is not a path")
    root = Path(recorded)
    if root.is_absolute():
        return root.resolve()
    cwd = receipt.get("cwd")
    if isinstance(cwd, str) and Path(cwd).is_absolute():
        return (Path(cwd) / root).resolve()
    inferred = _root_from_tool_files(receipt, workload)
    if inferred is None:
        raise UsageError(
            f"--from-run {run_dir}: the run's --tool-root {recorded!r} is relative to the directory it was "
            "started from, which run.json does not record; pass --tool-root with the tool root it used"
        )
    return inferred


def _root_from_tool_files(receipt: dict[str, Any], workload: Path) -> Path | None:
    """The one root R with ``(R / implementation).resolve()`` equal to every tool file run.json records,
    or None when no tool file was recorded or they disagree."""
    files = {key: entry.get("path") for key, entry in receipt["tools"].items() if entry}
    candidates: set[Path] = set()
    checked: list[tuple[str, str]] = []
    for _, _, problem in iter_problems(workload):
        for tool in problem.tools:
            path = files.pop(tool.key, None)
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


def derive_workload(run_dir: Path, destination: Path, tool_root: Path | None = None) -> DerivedRun:
    """Write the replay workload of the completed run in ``run_dir`` to ``destination``.

    ``tool_root`` overrides the run's own (needed when run.json cannot say where a relative one was)."""
    receipt = _load_receipt(run_dir)
    config: dict[str, Any] = receipt["config"]
    workload = Path(receipt["workload"]["path"])
    if not workload.is_file():
        raise UsageError(f"--from-run {run_dir}: its workload {workload} no longer exists")
    if file_sha256(workload) != receipt["workload"]["sha256"]:
        raise UsageError(
            f"--from-run {run_dir}: its workload {workload} changed since the run (SHA-256 differs)"
        )
    timeout = config.get("tool_timeout", 60.0)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or not timeout > 0:
        raise UsageError(f"--from-run {run_dir / 'run.json'}: config.tool_timeout is not a positive number")
    measured = _measurements(run_dir, float(timeout))
    if not measured.started:
        raise UsageError(f"--from-run {run_dir}: the run started no trajectory; nothing to replay")
    verdicts = _verdicts(run_dir)
    root = _tool_root(run_dir, receipt, workload, tool_root)
    count = 0
    with destination.open("w", encoding="utf-8") as out:
        for _, pid, problem in iter_problems(workload):
            if pid in measured.started:
                out.write(_replay(problem, pid, measured, verdicts).model_dump_json() + "\n")
                count += 1
    return DerivedRun(
        destination,
        root,
        config,
        count,
        len(measured.model),
        len(measured.cpu),
        measured.replacement_startup(),
    )


def _replay(
    problem: Problem, pid: str, measured: _Measured, verdicts: dict[str, tuple[int, bool]]
) -> Problem:
    script = []
    submitted = 0
    for turn, action in enumerate(problem.script or []):
        update: dict[str, Any] = {}
        if (pid, turn) in measured.model:
            update["latency_ms"] = round(measured.model[(pid, turn)] * 1000.0, 6)
        if isinstance(action, ToolAction | SubmitAction) and (pid, turn) in measured.cpu:
            update["cpu_ms"] = measured.cpu[(pid, turn)]
        if isinstance(action, SubmitAction) and pid in verdicts:
            submitted += 1
            generations, passed = verdicts[pid]
            update["passes"] = passed if submitted >= generations else False
        script.append(action.model_copy(update=update))
    return problem.model_copy(update={"id": pid, "script": script})
