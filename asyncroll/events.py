"""Typed event records of ``events.jsonl`` and their parser (:func:`parse_event`).

Every event is a frozen pydantic record with an ``event`` tag. On disk each line is one JSON object with
the envelope ``v`` (schema version), ``t`` (seconds since ``measurement_started``; negative for the few
events before it), ``event`` and ``id`` (the trajectory id, or null for run-level events). Payloads that
may be large or secret (prompts, code, tests, tool arguments) are logged as sizes, never verbatim.

:class:`~asyncroll.event_log.EventLog` is the one writer: a whole line per ``write`` on an unbuffered
file, so a run killed at any instant leaves a file whose every line is valid JSON. Subscribers (the
summary, tests) see each event as it is written; nothing keeps the whole stream in memory.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, WithJsonSchema

from asyncroll.errors import MAX_ERROR_CHARS as MAX_ERROR_CHARS
from asyncroll.errors import error_text

SCHEMA_VERSION: Final = 1
#: The largest time stamp ``t`` (either sign: a run's start-up is before its window) a readable event holds,
#: seconds from measurement start beyond any run (about 31.7 years): past it a line is damaged. Both exports
#: draw whole microseconds, exact integers (in 64 bits, and in the page's JavaScript) that never overflow a
#: float when subtracted (a time of 1e308 s failed both), and ``optimum`` keeps its schedule horizon within 64
#: bits (a ``t`` of 1e20 s made CP-SAT raise a TypeError out of the command).
MAX_EVENT_TIME_S: Final = 1e9
#: An error's text as an event keeps it: its first :data:`MAX_ERROR_CHARS` characters (the schema says so).
ErrorText = Annotated[
    str,
    AfterValidator(error_text),
    WithJsonSchema(
        {
            "type": "string",
            "maxLength": MAX_ERROR_CHARS,
            "description": f"the error's first {MAX_ERROR_CHARS} characters (a longer one is cut)",
        }
    ),
]


class Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    v: Literal[1] = SCHEMA_VERSION  # a line of another version is no event of this one (skipped, counted)
    t: float = 0.0
    event: str
    id: str | None = None
    #: fields written to events.jsonl only when they are not None (absent otherwise, so that a field added
    #: later leaves the lines of the events that lack it as they were)
    absent_when_none: ClassVar[frozenset[str]] = frozenset()


# --- run lifecycle -------------------------------------------------------------------------------------


class MeasurementStarted(Event):
    event: Literal["measurement_started"] = "measurement_started"
    wall_time: float
    policy: str
    max_active_trajectories: int
    max_inflight_model_requests: int
    cpu_workers: int
    #: what every ``t`` is on: real seconds, or a simulation's virtual ones (``wall_time`` is real in both,
    #: so wall_time + t is a date only on a monotonic clock); None in a file written before the field
    clock: Literal["monotonic", "virtual"] | None = None


class MeasurementFinished(Event):
    event: Literal["measurement_finished"] = "measurement_finished"
    status: Literal["complete", "failed", "interrupted"]
    makespan_s: float
    reason: str | None = None


class LoopWatched(Event):
    """A real run watches its event loop through the measured window (once, at its start): it sleeps
    ``probe_s`` at a time, and a wake-up ``stall_s`` or more late is a ``loop_stalled``. None in a
    simulation (its clock is virtual) or in a file written before the watch existed. An event of its own,
    not a field of ``measurement_started``: an older asyncroll skips an event type it does not know, but
    took a ``measurement_started`` with a field it did not know for a damaged line."""

    event: Literal["loop_watched"] = "loop_watched"
    probe_s: float
    stall_s: float


class LoopStalled(Event):
    """The client's event loop woke ``late_s`` seconds later than it asked to, at ``t``: from ``t - late_s``
    to ``t`` the loop could not run its callbacks in time (a blocking call held it, it had more work than it
    could run, or the client got no CPU), and admission, dispatch and the reading of responses waited for
    it. Only stalls of at least ``loop_watched.stall_s``."""

    event: Literal["loop_stalled"] = "loop_stalled"
    late_s: float


class ProcessStopped(Event):
    """The client process was stopped (job control: Ctrl-Z, ``kill -STOP``) and continued (``SIGCONT``), at
    ``t``: the watch's wake-up that spans the stop came ``stopped_s`` late (from ``t - stopped_s`` to ``t``
    nothing of the client ran). Recorded instead of a ``loop_stalled``: a stop is no stall of the loop. The
    seconds are the watch's lateness, a lower bound of the stop with a grain of ``loop_watched.probe_s``.
    An event of its own, as ``loop_watched`` is: an older asyncroll skips an event type it does not know."""

    event: Literal["process_stopped"] = "process_stopped"
    stopped_s: float


class WorkerReady(Event):
    event: Literal["worker_ready"] = "worker_ready"
    worker: int
    pid: int | None
    generation: int
    startup_s: float


class WorkerRestarting(Event):
    event: Literal["worker_restarting"] = "worker_restarting"
    worker: int
    old_pid: int | None
    generation: int
    reason: Literal["timeout", "died", "startup_failed", "memory"]
    restarts: int


# --- trajectories --------------------------------------------------------------------------------------

TrajectoryStatus = Literal["completed", "failed", "max_turns", "cancelled"]


class TrajectoryStarted(Event):
    event: Literal["trajectory_started"] = "trajectory_started"
    index: int
    prompt_chars: int
    active: int


class TrajectoryFinished(Event):
    event: Literal["trajectory_finished"] = "trajectory_finished"
    status: TrajectoryStatus
    turns: int
    tool_calls: int
    duration_s: float
    correct: bool | None = None
    error: ErrorText | None = None
    generations: int | None = None  # one-repair problems: programs evaluated (2 = a repair was tried)
    observations_cut: int = 0  # tool results cut to --max-observation-chars before the model saw them
    has_reference: bool | None = None  # the problem has a reference_answer (None: a log from before)


# --- model requests ------------------------------------------------------------------------------------


class ModelEnqueued(Event):
    event: Literal["model_enqueued"] = "model_enqueued"
    request_id: int
    turn: int
    outstanding: int


class ModelStarted(Event):
    event: Literal["model_started"] = "model_started"
    request_id: int
    turn: int
    inflight: int
    queued_s: float


class ModelFinished(Event):
    event: Literal["model_finished"] = "model_finished"
    request_id: int
    turn: int
    latency_s: float
    action: Literal["tool", "final", "submit"]
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None  # the server's (HTTP backend); null when it sent none, or no server


def _true_or_absent(schema: dict[str, Any]) -> None:
    """``model_failed``'s ``scripted`` as written: true, or absent (never false, nor null: no default)."""
    schema.clear()
    schema.update(
        type="boolean",
        const=True,
        description="true: a script's error step failed the request (no request was sent; no server "
        "failed it); absent otherwise",
    )


class ModelFailed(Event):
    event: Literal["model_failed"] = "model_failed"
    request_id: int
    turn: int
    latency_s: float
    kind: str
    error: ErrorText
    status: int | None = None
    response_received: bool | None = None
    parse_s: float | None = None
    attempts: int = 1
    # a completion whose action was invalid: its usage, as model_finished records it (null when unknown)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    #: written only as true (absent otherwise: :attr:`absent_when_none`), as the schema says
    scripted: bool | None = Field(default=None, json_schema_extra=_true_or_absent)
    absent_when_none: ClassVar[frozenset[str]] = frozenset({"scripted"})


class ModelRetrying(Event):
    """An HTTP model request attempt failed with a retryable error; another follows after ``delay_s``."""

    event: Literal["model_retrying"] = "model_retrying"
    turn: int
    attempt: int
    kind: str
    status: int | None = None
    delay_s: float
    error: str


class ModelPaused(Event):
    """An HTTP model request waited ``waited_s`` for the server circuit to close before attempt
    ``attempt`` (the server was unavailable). The wait is inside the request's ``latency_s``."""

    event: Literal["model_paused"] = "model_paused"
    turn: int
    attempt: int
    waited_s: float


# --- the inference server's availability (HTTP backends) ----------------------------------------------


class ServerUnavailable(Event):
    """The HTTP backend's circuit opened after ``failures`` consecutive unavailable failures (no
    connection, a reset, 502/503/504; ``reason`` is the last one): admission is paused and requests wait
    before their next attempt until ``GET /health`` answers. ``opened`` counts openings in this run."""

    event: Literal["server_unavailable"] = "server_unavailable"
    failures: int
    reason: str
    opened: int


class ServerAvailable(Event):
    """The circuit closed again (``/health`` answered 200): admission resumes. ``paused_s`` is how long
    it was open, ``probes`` how many health probes that took."""

    event: Literal["server_available"] = "server_available"
    paused_s: float
    probes: int


# --- CPU jobs ------------------------------------------------------------------------------------------

JobKind = Literal["tool", "grade", "evaluate"]


class CpuEnqueued(Event):
    event: Literal["cpu_enqueued"] = "cpu_enqueued"
    job_id: int
    kind: JobKind
    tool: str
    turn: int
    arg_bytes: int
    queue_depth: int
    resubmission: bool = False


#: Candidates a ``cpu_selected`` event logs at most: the oldest queued jobs, oldest first (the chosen job may
#: be newer: its own prediction is the event's ``predicted_s``).
MAX_CANDIDATES: Final = 8


class Candidate(BaseModel):
    """A queued job as the policy saw it at one decision."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    job_id: int
    predicted_s: float
    source: str
    waited_s: float
    # mean remaining service after jobs like this one, where the decision had it (the batch's tail)
    remaining_s: float | None = None


class CpuSelected(Event):
    event: Literal["cpu_selected"] = "cpu_selected"
    job_id: int
    worker: int
    policy: str
    reason: str
    queue_depth: int
    model_outstanding: int
    waited_s: float
    oldest_job_id: int
    reordered: bool
    eligible: bool = False
    threshold: int | None = None
    predicted_s: float | None = None
    prediction_source: str | None = None
    observations: int = 0
    # the chosen job's remaining-work estimate, when the decision had them (the batch's tail)
    remaining_s: float | None = None
    # in the tail: the predicted seconds the running jobs still had (what the straggler guard weighs)
    running_left_s: float | None = None
    candidates: list[Candidate] = Field(
        default_factory=list,
        max_length=MAX_CANDIDATES,
        description=f"the oldest {MAX_CANDIDATES} queued jobs at most, oldest first, as the policy saw them",
    )


class CpuStarted(Event):
    event: Literal["cpu_started"] = "cpu_started"
    job_id: int
    worker: int
    pid: int | None
    generation: int


class CpuFinished(Event):
    event: Literal["cpu_finished"] = "cpu_finished"
    job_id: int
    worker: int
    kind: JobKind
    tool: str
    ok: bool
    execute_s: float
    cpu_s: float | None
    roundtrip_s: float
    serialize_s: float | None = None
    started: float | None = Field(default=None, description="child start, seconds since measurement start")
    finished: float | None = Field(default=None, description="child finish, seconds since measurement start")
    error: ErrorText | None = None


class CpuFailed(Event):
    event: Literal["cpu_failed"] = "cpu_failed"
    job_id: int
    worker: int
    kind: JobKind
    tool: str
    reason: Literal["timeout", "worker_died", "cancelled"]
    roundtrip_s: float
    error: ErrorText


# --- telemetry -----------------------------------------------------------------------------------------

TelemetrySource = Literal["server_metrics", "nvml"]


class SourceStatus(BaseModel):
    """One telemetry source as the probe found it: usable or not, and why not."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    source: TelemetrySource
    available: bool
    reason: str | None = None
    collection_s: float | None = None
    detail: dict[str, Any] = Field(default_factory=dict)


class ResourceProbe(Event):
    """Which telemetry sources answered before the measurement clock started (``t`` < 0)."""

    event: Literal["resource_probe"] = "resource_probe"
    interval_s: float
    sources: list[SourceStatus]


class ResourceSample(Event):
    """One telemetry sample. A value a source did not give is null, and ``nulls`` says why
    (``missing``, ``invalid`` or ``error``); ``collection_s`` is each source's read time."""

    event: Literal["resource_sample"] = "resource_sample"
    seq: int
    server_running: float | None = None
    server_waiting: float | None = None
    kv_cache_usage: float | None = None
    prompt_tokens_per_s: float | None = None
    generation_tokens_per_s: float | None = None
    counter_resets: int = 0
    gpu_util_pct: float | None = None
    gpu_mem_util_pct: float | None = None
    gpu_mem_used_bytes: int | None = None
    gpu_mem_total_bytes: int | None = None
    collection_s: dict[str, float] = Field(default_factory=dict)
    nulls: dict[str, str] = Field(default_factory=dict)
    errors: list[str] = Field(default_factory=list)
    late_s: float | None = 0.0  # null: the final sample, taken at the stop, has no grid point to be late for


AnyEvent = Annotated[
    MeasurementStarted
    | MeasurementFinished
    | LoopWatched
    | LoopStalled
    | ProcessStopped
    | WorkerReady
    | WorkerRestarting
    | TrajectoryStarted
    | TrajectoryFinished
    | ModelEnqueued
    | ModelStarted
    | ModelFinished
    | ModelFailed
    | ModelRetrying
    | ModelPaused
    | ServerUnavailable
    | ServerAvailable
    | CpuEnqueued
    | CpuSelected
    | CpuStarted
    | CpuFinished
    | CpuFailed
    | ResourceProbe
    | ResourceSample,
    Field(discriminator="event"),
]

EVENT_ADAPTER: TypeAdapter[Any] = TypeAdapter(AnyEvent)


def parse_event(line: str | bytes) -> Event:
    """Parse and validate one line of ``events.jsonl``."""
    event: Event = EVENT_ADAPTER.validate_json(line)
    return event
