"""JSON Schemas of everything asyncroll reads or writes, and models that validate the written files.

``RunReceiptModel`` and ``SummaryModel`` describe ``run.json`` and ``summary.json``; tests validate real
outputs against them, so the printed schema cannot drift from what runs write.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Approximate(BaseModel):
    """A distribution over more samples than are kept exactly: its p50 and p95 come from a quantile sketch,
    each within ``relative_accuracy`` of the exact one (count, mean, min and max stay exact)."""

    relative_accuracy: float
    exact_up_to: int  # how many samples a distribution keeps exactly


class Distribution(BaseModel):
    count: int
    mean: float | None
    min: float | None
    p50: float | None
    p95: float | None
    max: float | None
    approximate: Approximate | None = None  # absent: exact, over every sample


class RunReceiptModel(_Open):
    """``run.json``. The fields after ``error`` appear as the run gets that far: the time of each status
    it reached, the warm-up, the backend's settings (an HTTP backend), the live view's address
    (``--metrics-port``), the simulator's settings (a simulation); and, once it ended, the exports and
    the exit code; ``exports_regenerated`` once ``asyncroll timeline`` wrote them again."""

    schema_version: int
    status: Literal["preparing", "running", "complete", "failed", "interrupted"]
    created_at: str
    command: list[str]
    cwd: str
    pid: int
    #: which process ``pid`` is: the boot's id and its start in clock ticks since boot (null where /proc
    #: cannot tell; absent from a run.json written before 2026-12-06)
    pid_start: str | None = None
    config: dict[str, Any]
    #: the settings of ``config`` that were given, the others being defaults (absent before 2026-12-06)
    config_given: list[str] | None = None
    simulated: bool
    versions: dict[str, str | None]
    #: the package's version, its source digest and its checkout's git describe and commit (null: not a
    #: checkout that tracks it); absent from a run.json written before 2026-12-06
    code: dict[str, str | None] | None = None
    host: dict[str, Any]
    #: the environment variables that change what a run does, where set (absent before 2026-12-06)
    environment: dict[str, str] | None = None
    workload: dict[str, Any]
    tools: dict[str, dict[str, str] | None]
    isolation: dict[str, Any]
    telemetry: dict[str, Any]
    error: str | None
    running_at: str | None = None
    complete_at: str | None = None
    failed_at: str | None = None
    interrupted_at: str | None = None
    warmup: dict[str, Any] | None = None
    backend: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None
    simulation: dict[str, Any] | None = None
    exports: dict[str, Any] | None = None
    exit_code: int | None = None
    #: added by ``asyncroll timeline``: when, by which version, and each regenerated export's result
    exports_regenerated: dict[str, Any] | None = None


class Counts(BaseModel):
    trajectories: int
    finished: int
    completed: int
    failed: int
    max_turns: int
    unfinished: int


class OneRepair(BaseModel):
    evaluated: int
    passed_first: int
    repairs_attempted: int
    passed_after_repair: int
    pass_rate_first: float | None
    pass_rate_final: float | None
    repair_success_rate: float | None


class Accuracy(BaseModel):
    exact: float | None
    correct: int
    denominator: int
    ungraded: int
    exact_of_referenced: float | None = None
    referenced: int | None = None
    one_repair: OneRepair | None = None


class PredictionQuality(BaseModel):
    sources: dict[str, int]
    pairs: int
    pearson_log: float | None
    pearson_log_repairs: float | None
    pearson_log_first: float | None
    pairs_repairs: int | None = None  # the pairs behind pearson_log_repairs (None: a summary from before)
    pairs_first: int | None = None  # the pairs behind pearson_log_first
    pearson_null_reasons: dict[str, str] | None = None  # why each null correlation is null
    note: str


class Scheduler(BaseModel):
    policy: str
    # The rule the policy name ran (``asyncroll`` names the default rule of its version: run.json's
    # ``policy_canonical``); None in a summary written before this field.
    policy_rule: str | None = None
    decisions: int
    eligible_decisions: int
    reorders: int
    activation_rate: float | None
    reasons: dict[str, int]
    max_queue_depth: int | None
    prediction: PredictionQuality


class Bounds(BaseModel):
    lower_bound_s: float
    binding: str
    efficiency: float | None
    terms: dict[str, float]
    model_capacity: int  # requests the client can have in flight (inflight and active limits)
    server_batch_capacity: int | None  # a simulated server's max_num_seqs; None when unknown
    rounding_clamped: bool  # the bound exceeded the makespan by no more than its durations' rounding
    totals: dict[str, float]


class EventLoop(BaseModel):
    """Stalls of the client's event loop in the measured window (``loop_stalled``); null figures when the
    loop was not watched (a simulation) or the window never opened."""

    watched: bool
    stall_threshold_s: float | None
    stalls: int | None
    stalled_s: float | None
    longest_stall_s: float | None
    fraction_of_makespan: float | None
    note: str
    #: stops of the whole process (job control: ``process_stopped``), apart from the stalls; absent in a
    #: file written before they were told apart (its stops counted as stalls)
    stops: int | None = None
    stopped_s: float | None = None
    stopped_fraction_of_makespan: float | None = None


class Resources(BaseModel):
    """Coverage-aware resource metrics (MEASUREMENT.md): every estimate with its coverage, null if none."""

    interval_s: float | None
    max_gap_s: float | None
    windows: dict[str, int]
    server_coverage_s: float
    server_coverage_fraction: float | None
    gpu_coverage_s: float
    joint_coverage_s: float
    joint_coverage_fraction: float | None
    # seconds of the measured window in windows longer than max_gap_s, covered by no source (None: a
    # summary from before it was reported)
    too_long_s: float | None = None
    client_cpu_blocked_s: float | None  # None: the measured window never opened
    blocked_in_server_coverage_s: float | None
    blocked_in_joint_coverage_s: float | None
    sampled_starvation_s: float | None
    sampled_starvation_fraction_of_coverage: float | None
    sampled_starvation_coverage_s: float
    sampled_starvation_reason: str | None
    cpu_idle_candidate_s: float | None
    cpu_idle_candidate_fraction_of_coverage: float | None
    cpu_idle_candidate_coverage_s: float
    cpu_idle_candidate_reason: str | None


class SummaryModel(_Open):
    schema_version: int
    status: Literal["complete", "failed", "interrupted"]
    policy: str
    limits: dict[str, int]
    # what its durations are: seconds of real time, or a simulation's virtual seconds (None: written
    # before the field)
    clock: Literal["monotonic", "virtual"] | None = None
    makespan_s: float | None  # None: the measured window never opened
    counts: Counts
    rates: dict[str, float | int | None]
    throughput: dict[str, float | str | None]
    accuracy: Accuracy
    model: dict[str, Any]
    tools: dict[str, Any]
    latency: dict[str, Distribution]
    phases: dict[str, Any]
    scheduler: Scheduler
    workers: dict[str, Any]
    bounds: Bounds | None
    client_cpu_blocked: dict[str, float | int | str | None]
    peaks: dict[str, int]
    event_loop: EventLoop | None = None  # None: written before the section
    cpu_cost: dict[str, float | str | None]
    telemetry: dict[str, Any]
    resources: Resources


#: pydantic's names of a bound where JSON Schema has its own: pydantic writes them raw for a bounded
#: optional setting whose type has its own validator (``Int | None = Field(ge=1)``), and a validator
#: ignores a keyword it does not know (``asyncroll schema config`` accepted ``"limit": 0``).
_BOUND_KEYWORDS = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}


def standard_bounds(node: Any) -> Any:
    """``node`` (a JSON Schema) with each numeric bound under its JSON Schema keyword."""
    if isinstance(node, list):
        return [standard_bounds(item) for item in node]
    if not isinstance(node, dict):
        return node
    numeric = node.get("type") in ("integer", "number")  # not "properties": a setting may be named "ge"
    return {(_BOUND_KEYWORDS.get(k, k) if numeric else k): standard_bounds(v) for k, v in node.items()}


def schemas() -> dict[str, Any]:
    from asyncroll.config import RunConfig
    from asyncroll.events import EVENT_ADAPTER
    from asyncroll.workload import Problem

    bounded: dict[str, Any] = standard_bounds(
        {
            "workload": Problem.model_json_schema(),
            "events": EVENT_ADAPTER.json_schema(),
            "run": RunReceiptModel.model_json_schema(),
            "summary": SummaryModel.model_json_schema(),
            "config": RunConfig.model_json_schema(),
        }
    )
    return bounded
