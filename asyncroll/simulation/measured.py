"""What a recorded run's ``events.jsonl`` measured, turn by turn, checked against its workload's script.

:func:`read_measurements` reads every model request's latency and every tool or evaluation job's
duration, keyed by (trajectory, turn), with the line each came from; :func:`check_against_script` then
checks, per trajectory, that they fit the script the replay will run (see :mod:`.from_run`). Whatever does
not fit, or is missing where the run went on, is refused as a :class:`UsageError` naming the events.jsonl
line: a replay must never put the script's timing where the run measured one.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from asyncroll.errors import UsageError
from asyncroll.events import MAX_ERROR_CHARS
from asyncroll.events import SCHEMA_VERSION as EVENTS_SCHEMA_VERSION
from asyncroll.json_checks import line_column
from asyncroll.json_depth import json_loads
from asyncroll.workload import MAX_DURATION_MS, ErrorStep, Problem, SubmitAction, ToolAction

#: A timed-out job is replayed this much (ms) over the run's tool timeout, so that it times out again.
TIMEOUT_MARGIN_MS = 0.001


def jsonl_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for every line; a line that is not a JSON object names file and line."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise UsageError(f"--from-run {path.parent}: cannot read {path.name}: {exc.strerror or exc}") from exc
    with handle:
        for line_no, raw in enumerate(handle, start=1):
            try:
                row = json_loads(raw)
            except json.JSONDecodeError as exc:  # its own "line 1 column 5" counts within the line
                raise UsageError(
                    f"--from-run {path}:{line_no}: not valid JSON ({exc.msg}, column {line_column(exc)})"
                ) from None
            except (ValueError, RecursionError) as exc:  # not UTF-8, past Python's limits
                raise UsageError(f"--from-run {path}:{line_no}: not valid JSON ({exc})") from None
            if not isinstance(row, dict):
                raise UsageError(f"--from-run {path}:{line_no}: not a JSON object")
            yield line_no, row


def required(row: dict[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``row[name]``, of type ``kind`` (a bool is not a number), else refused naming ``where``."""
    value = row.get(name)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise UsageError(f"--from-run {where}: {row.get('event', 'row')!r} lacks a valid {name!r}")
    return value


def duration_s(row: dict[str, Any], name: str, where: str) -> float:
    """A recorded duration: a finite number of seconds from 0 to one day (the workload's own bound on a
    scripted duration), else refused naming the events.jsonl line (a NaN once replayed as 0 ms)."""
    value = float(required(row, name, (int, float), where))
    if not (math.isfinite(value) and 0 <= value * 1000.0 <= MAX_DURATION_MS):
        raise UsageError(
            f"--from-run {where}: {row.get('event', 'row')!r} has {name} {value!r}: not a duration in "
            "seconds from 0 to one day"
        )
    return value


@dataclass(frozen=True, slots=True)
class ModelStep:
    """A recorded model request: its events.jsonl line and what it returned."""

    line: int
    action: str | None  # the action's type; None for a failed request
    failure: str | None  # model_failed's kind
    error: str | None = None  # model_failed's error (its message)
    status: int | None = None  # model_failed's HTTP status, if it had one
    scripted: bool = False  # model_failed's scripted: a script's error step failed it, not a server


@dataclass(frozen=True, slots=True)
class Job:
    """A recorded tool or evaluation job, from its ``cpu_enqueued`` line."""

    line: int
    job_id: int
    trajectory: str
    turn: int
    kind: str
    tool: str

    def describe(self) -> str:
        return f"{self.kind} job {self.job_id} ({self.tool!r}) of {self.trajectory!r} turn {self.turn}"


@dataclass
class Measured:
    """What ``events.jsonl`` measured, keyed by (trajectory id, turn), and the line each came from."""

    events: Path
    model: dict[tuple[str, int], float] = field(default_factory=dict)
    cpu: dict[tuple[str, int], float] = field(default_factory=dict)
    #: a job that finished with an error (``cpu_finished`` ok false: the tool raised) → its error
    errors: dict[tuple[str, int], str] = field(default_factory=dict)
    #: a job whose worker died holding it (``cpu_failed`` ``worker_died``) → the death's message
    deaths: dict[tuple[str, int], str] = field(default_factory=dict)
    started: dict[str, int] = field(default_factory=dict)  # trajectory id -> trajectory_started line
    restarts: list[tuple[int, int]] = field(default_factory=list)  # (worker, generation), in start order
    #: the restarts a replay does not start: after a death while idle or for memory (and a failed start's
    #: next attempt), not after a tool or evaluation job's timeout or its worker's death while it held one
    unreplayed: set[tuple[int, int]] = field(default_factory=set)
    restarted_at: dict[tuple[int, int], float] = field(default_factory=dict)  # its worker_restarting's t
    end: float | None = None  # the measured window's end (measurement_finished's makespan_s)
    ready: dict[tuple[int, int], float] = field(default_factory=dict)  # (worker, generation) -> start-up s
    requests: dict[str, dict[int, ModelStep]] = field(default_factory=dict)  # id -> turn -> request
    jobs: dict[str, dict[int, Job]] = field(default_factory=dict)  # id -> turn -> its tool or evaluation job
    finished: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> (turns, its line)
    rules: set[str] = field(
        default_factory=set
    )  # the policies its cpu_selected events name (the rule that ran)

    def where(self, line: int) -> str:
        return f"{self.events}:{line}"

    def replacement_startup(self) -> tuple[float, ...]:
        """The start-up of each replacement the replay starts too (not :attr:`unreplayed`), in the order they
        started (a failed attempt, followed by another of its worker, has none); one still starting when the
        run ended took at least the rest of the window, which it takes in the replay. Where the run
        replaced only workers the replay does not (a death while idle, memory), their median as the one
        value every replacement takes; where none, the initial workers'."""
        replaced: list[float] = []
        others: list[float] = []
        for i, key in enumerate(self.restarts):
            if key in self.ready:
                seconds = self.ready[key]
            elif self.end is not None and not any(w == key[0] for w, _ in self.restarts[i + 1 :]):
                seconds = max(0.0, self.end - self.restarted_at[key])  # stopped while it started
            else:
                continue
            (others if key in self.unreplayed else replaced).append(seconds)
        if replaced:
            return tuple(replaced)
        if others:
            return (statistics.median(others),)
        initial = [seconds for (_, generation), seconds in self.ready.items() if generation == 0]
        return (statistics.median(initial),) if initial else ()


_READ = ("trajectory_started", "trajectory_finished", "model_finished", "model_failed", "cpu_enqueued")


def read_measurements(run_dir: Path, tool_timeout_s: float) -> Measured:
    """Every measurement of ``run_dir/events.jsonl`` (a timed-out job's as just over ``tool_timeout_s``).

    Refused naming the line: an event of a trajectory that never started, a turn asked twice, a job that
    never ended (no ``cpu_finished`` or ``cpu_failed``: its duration was never recorded) or was cancelled."""
    path = run_dir / "events.jsonl"
    measured = Measured(path)
    pending: dict[int, Job] = {}  # enqueued tool and evaluation jobs, until they end
    lost: set[int] = set()  # workers that a tool or evaluation job's timeout or death took, until replaced
    chain: dict[int, bool] = {}  # each worker's last restart: replayed or not (its next failed start's too)
    timeout_ms = round(tool_timeout_s * 1000.0 + TIMEOUT_MARGIN_MS, 6)
    number = (int, float)
    for line_no, event in jsonl_rows(path):
        where = f"{path}:{line_no}"
        if event.get("v") != EVENTS_SCHEMA_VERSION:
            raise UsageError(
                f"--from-run {where}: event schema version {event.get('v')!r}; this asyncroll reads "
                f"version {EVENTS_SCHEMA_VERSION} only"
            )
        kind, tid = event.get("event"), event.get("id")
        if kind in ("worker_restarting", "worker_ready"):
            key = (required(event, "worker", int, where), required(event, "generation", int, where))
            if kind == "worker_restarting":
                worker, reason = key[0], event.get("reason")
                chain[worker] = chain.get(worker, False) if reason == "startup_failed" else worker in lost
                lost.discard(worker)
                if not chain[worker]:
                    measured.unreplayed.add(key)
                measured.restarts.append(key)
                measured.restarted_at[key] = float(required(event, "t", number, where))
            else:
                startup = float(required(event, "startup_s", number, where))
                if not (math.isfinite(startup) and startup >= 0):
                    raise UsageError(f"--from-run {where}: 'worker_ready' lacks a valid 'startup_s'")
                measured.ready[key] = startup
            continue
        if kind == "measurement_finished":
            measured.end = float(required(event, "makespan_s", number, where))
            continue
        if kind == "cpu_selected" and isinstance(event.get("policy"), str):
            measured.rules.add(event["policy"])
            continue
        if kind not in _READ and not (
            kind in ("cpu_finished", "cpu_failed") and event.get("kind") in ("tool", "evaluate")
        ):
            continue
        if not isinstance(tid, str):
            raise UsageError(f"--from-run {where}: {kind!r} lacks a valid 'id'")
        if kind == "trajectory_started":
            measured.started.setdefault(tid, line_no)
            continue
        if tid not in measured.started:  # its events would be left out of the replay, silently
            raise UsageError(
                f"--from-run {where}: {kind!r} of {tid!r}, which no trajectory_started before it names"
            )
        if kind == "trajectory_finished":
            measured.finished[tid] = (required(event, "turns", int, where), line_no)
        elif kind in ("model_finished", "model_failed"):
            turn = required(event, "turn", int, where)
            requests = measured.requests.setdefault(tid, {})
            if turn in requests:
                raise UsageError(
                    f"--from-run {where}: a second {kind!r} of {tid!r} turn {turn} (the first is line "
                    f"{requests[turn].line}); a run asks each turn once"
                )
            measured.model[(tid, turn)] = duration_s(event, "latency_s", where)
            done = kind == "model_finished"
            if done:
                requests[turn] = ModelStep(line_no, required(event, "action", str, where), None)
            else:
                status = event.get("status")
                if status is not None and (not isinstance(status, int) or isinstance(status, bool)):
                    raise UsageError(f"--from-run {where}: 'model_failed' lacks a valid 'status'")
                scripted = event.get("scripted")
                if scripted is not None and scripted is not True:  # true, or absent: a server's failure
                    raise UsageError(f"--from-run {where}: 'model_failed' has a 'scripted' other than true")
                error = event.get("error")
                requests[turn] = ModelStep(
                    line_no,
                    None,
                    str(event.get("kind")),
                    _kept(error) if isinstance(error, str) else None,
                    status,
                    scripted is True,
                )
        elif kind == "cpu_enqueued":
            job = Job(
                line_no,
                required(event, "job_id", int, where),
                tid,
                required(event, "turn", int, where),
                required(event, "kind", str, where),
                str(event.get("tool")),
            )
            if job.kind in ("tool", "evaluate"):  # grade jobs are replayed at zero cost
                pending[job.job_id] = job
        else:
            job_id = required(event, "job_id", int, where)
            if job_id not in pending:
                raise UsageError(f"--from-run {where}: job {job_id} finished but was never enqueued")
            job = pending.pop(job_id)
            jobs = measured.jobs.setdefault(job.trajectory, {})
            if job.turn in jobs:
                raise UsageError(
                    f"--from-run {where}: a second CPU job of {job.trajectory!r} turn {job.turn} (the first "
                    f"enqueued at line {jobs[job.turn].line}); a turn runs at most one tool or evaluation job"
                )
            if kind == "cpu_finished":
                ms = round(duration_s(event, "execute_s", where) * 1000.0, 6)
                if event.get("ok") is False:  # the tool raised (or the evaluation failed): replayed so
                    measured.errors[(job.trajectory, job.turn)] = _error(event)
            elif event.get("reason") == "cancelled":
                raise UsageError(
                    f"--from-run {where}: {job.describe()} was cancelled while it ran (the run was being "
                    "stopped): it never finished, so how long it takes is unknown"
                )
            else:
                ms = round(duration_s(event, "roundtrip_s", where) * 1000.0, 6)
                if isinstance(event.get("worker"), int):  # its replacement is replayed too
                    lost.add(event["worker"])
                if event.get("reason") == "worker_died":  # replayed so: the worker dies holding it
                    measured.deaths[(job.trajectory, job.turn)] = _error(event)
                if event.get("reason") == "timeout":
                    # The round trip also holds the kill; all that is known of the job is that it ran past
                    # the timeout. Just over it: it times out again, and a longer timeout gets a lower bound.
                    if not (math.isfinite(timeout_ms) and timeout_ms <= MAX_DURATION_MS):
                        # (an infinite cost was written as null: the job took 0 s in the replay, silently)
                        raise UsageError(
                            f"--from-run {where}: {job.describe()} timed out, but run.json's "
                            f"config.tool_timeout {tool_timeout_s!r} s is longer than any job a replay can "
                            "run (one day): run.json does not fit its events"
                        )
                    ms = timeout_ms
            measured.cpu[(job.trajectory, job.turn)] = ms
            jobs[job.turn] = job
    if pending:
        job = min(pending.values(), key=lambda j: j.line)
        raise UsageError(
            f"--from-run {measured.where(job.line)}: {job.describe()} has no cpu_finished or cpu_failed "
            "event: the run never recorded how long it took, and the replay would give it the workload's "
            "scripted cost"
        )
    return measured


def _kept(text: str) -> str:
    """An error's text as an event keeps it (:data:`~asyncroll.events.ErrorText`): a longer one (a file
    edited by hand) is read as the event models read it, not refused in the replay's own workload."""
    return text[:MAX_ERROR_CHARS]


def _error(event: dict[str, Any]) -> str:
    """A failed job's error, as its ``raises`` or ``worker_dies`` replays it."""
    error = event.get("error")
    return _kept(error) if isinstance(error, str) and error else "(the run recorded no error)"


def check_against_script(problem: Problem, pid: str, measured: Measured) -> None:
    """What the run recorded for ``pid`` fits its script turn by turn, and nothing is missing where the run
    went on. A request or job recorded at a turn its script does not have (or has with another action)
    would leave that turn's measured time unused and the turn's scripted one in its place, silently: it is
    refused naming the events.jsonl line, as is a turn the run went past without a recorded request, or
    without the job its tool or submit action ran."""
    script = problem.script or []
    asked = measured.requests.get(pid, {})
    jobs = measured.jobs.get(pid, {})
    for turn, job in sorted(jobs.items()):
        action = script[turn] if turn < len(script) else None
        if job.kind == "tool":
            tool = problem.tool(action.name) if isinstance(action, ToolAction) else None
            # the spelled key: a run made before keys were normalised recorded the path as written
            fits = tool is not None and job.tool in (tool.key, tool.spelled_key)
        else:
            fits = isinstance(action, SubmitAction)
        if not fits:
            there = "no action" if action is None else f"a {action.type!r} action"
            raise UsageError(
                f"--from-run {measured.where(job.line)}: {job.describe()} does not fit the workload's "
                f"script, which has {there} at that turn: its measured time belongs to another turn, and "
                "the replay would keep the script's own cost"
            )
    for turn, step in sorted(asked.items()):
        where = measured.where(step.line)
        if turn >= len(script):
            if turn == len(script) and step.failure == "script_exhausted":
                continue  # the run asked past the end of its script, and so will the replay
            raise UsageError(
                f"--from-run {where}: {pid!r} turn {turn} is past the end of its script in the workload "
                f"({len(script)} actions): the events do not fit the workload's trajectory"
            )
        scripted = script[turn]
        if step.action is not None and step.action != scripted.type:
            raise UsageError(
                f"--from-run {where}: {pid!r} turn {turn} returned a {step.action!r} action where the "
                f"workload's script has {scripted.type!r}: its measured latency belongs to another turn, "
                "and the replay would keep the script's own"
            )
        if turn > 0 and turn - 1 not in asked:
            raise UsageError(
                f"--from-run {where}: {pid!r} turn {turn} is recorded but turn {turn - 1} has no "
                "model_finished or model_failed: the replay would give that turn the script's latency"
            )
        if isinstance(scripted, ToolAction | SubmitAction) and turn + 1 in asked and turn not in jobs:
            raise UsageError(
                f"--from-run {where}: {pid!r} turn {turn} returned a {scripted.type!r} action and the run "
                f"went on to turn {turn + 1}, but no job of turn {turn} was recorded (no cpu_enqueued): "
                "the replay would give it the script's cost"
            )
    if pid in measured.finished:
        turns, line = measured.finished[pid]
        if turns != len(asked):
            raise UsageError(
                f"--from-run {measured.where(line)}: {pid!r} finished after {turns} model turns, but "
                f"{len(asked)} have a model_finished or model_failed event: the replay would give the "
                "others the script's latency"
            )


def failure_step(step: ModelStep, latency_ms: float | None, measured: Measured) -> ErrorStep:
    """The ``error`` step that fails a replayed request as the run's failed: its kind, message and status
    after its measured latency (a failure the run recorded ends its trajectory, so the step is the last),
    ``scripted`` only where the run's was (a server's failure replays as a server's)."""
    try:
        return ErrorStep(
            type="error",
            kind=step.failure or "",
            message=step.error or "",
            status=step.status,
            latency_ms=latency_ms,
            scripted=step.scripted,
        )
    except ValidationError as exc:  # a kind or status no run records (a hand-edited file)
        field = ".".join(str(part) for part in exc.errors()[0]["loc"])
        raise UsageError(
            f"--from-run {measured.where(step.line)}: 'model_failed' has a {field!r} a replay cannot fail "
            f"with: {exc.errors()[0]['msg']}"
        ) from exc
