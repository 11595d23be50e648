"""``comparison.json``: the experiment's measured values, pair by pair, that ``asyncroll report`` reads.

Each arm's summary.json is read through ``SummaryModel`` (so a schema drift fails loudly) and reduced to
the metrics below; a value the run could not measure stays ``null`` ("unknown" in the report), never 0.
Failed arms appear with their error, unfinished ones (any stage's) with their status; a pair is complete only
when every arm in it completed.
``validate_comparison`` is the reader's side: ``asyncroll report`` refuses a file that is damaged,
inconsistent or of another schema version, naming what is wrong, instead of computing from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from asyncroll.experiment.config import MAX_BOOTSTRAP_RESAMPLES, MIN_BOOTSTRAP_RESAMPLES
from asyncroll.experiment.machines import experiment_settings, machine_groups
from asyncroll.json_checks import LONE_SURROGATE, lone_surrogate_at
from asyncroll.outputs.receipt import write_json_atomic
from asyncroll.setting_names import validation_message

COMPARISON_SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class Metric:
    key: str
    path: str
    label: str
    higher_is_better: bool | None


#: The compared metrics: key, dotted path in summary.json, label, direction (None: neither).
METRICS: tuple[Metric, ...] = (
    Metric(
        "completed_per_gpu_hour",
        "throughput.completed_per_gpu_hour",
        "completions per allocated GPU-hour",
        True,
    ),
    Metric(
        "completed_per_wall_hour", "throughput.completed_per_wall_hour", "completions per wall hour", True
    ),
    Metric(
        "sampled_starvation_fraction",
        "resources.sampled_starvation_fraction_of_coverage",
        "sampled model starvation (fraction of covered time)",
        False,
    ),
    Metric("sampled_starvation_s", "resources.sampled_starvation_s", "sampled model starvation, s", False),
    Metric("client_cpu_blocked_s", "resources.client_cpu_blocked_s", "client CPU-blocked, s", False),
    Metric("cpu_s_per_completion", "cpu_cost.per_completion_s", "client+worker CPU-s per completion", False),
    Metric("makespan_s", "makespan_s", "makespan, s", False),
    Metric("accuracy_exact", "accuracy.exact", "exact accuracy", True),
    Metric("pass_rate_final", "accuracy.one_repair.pass_rate_final", "one-repair final pass rate", True),
    Metric("activation_rate", "scheduler.activation_rate", "activation rate (reorders / eligible)", None),
    Metric(
        "server_coverage_fraction", "resources.server_coverage_fraction", "server telemetry coverage", None
    ),
)
#: Counts pooled across pairs (sums), for pooled rates.
COUNTS: tuple[tuple[str, str], ...] = (
    ("trajectories", "counts.trajectories"),
    ("completed", "counts.completed"),
    ("failed", "counts.failed"),
    ("max_turns", "counts.max_turns"),
    ("correct", "accuracy.correct"),
    ("graded", "accuracy.denominator"),
    ("evaluated", "accuracy.one_repair.evaluated"),
    ("passed_first", "accuracy.one_repair.passed_first"),
    ("passed_final_repairs", "accuracy.one_repair.passed_after_repair"),
    ("decisions", "scheduler.decisions"),
    ("eligible_decisions", "scheduler.eligible_decisions"),
    ("reorders", "scheduler.reorders"),
    ("worker_restarts", "workers.restarts"),
    ("loop_stalled_s", "event_loop.stalled_s"),  # the client's event loop held: all waited
    ("process_stopped_s", "event_loop.stopped_s"),  # the client's process stopped (job control)
    ("model_requests", "model.requests"),
    ("allocated_gpu_hours", "throughput.allocated_gpu_hours"),
    ("total_cpu_s", "cpu_cost.total_cpu_s"),
)
#: The counts above measured in seconds or hours, not a number of things: the rest are whole numbers.
FLOAT_COUNTS = frozenset({"loop_stalled_s", "process_stopped_s", "allocated_gpu_hours", "total_cpu_s"})

#: Summary ratios and the summary count each is over: a null ratio whose count is 0 is *undefined* (a
#: ratio over no events: a run with no completion has no CPU-s per completion), not unknown.
DENOMINATORS: dict[str, str] = {
    "accuracy.exact": "accuracy.denominator",
    "accuracy.exact_of_referenced": "accuracy.referenced",
    "cpu_cost.per_completion_s": "counts.completed",
    "rates.success_rate": "counts.trajectories",
    "rates.validity_rate": "rates.validity_denominator",
    "scheduler.activation_rate": "scheduler.eligible_decisions",
}


def dig(data: Any, path: str) -> Any:
    """``data[a][b]…`` for ``path = "a.b…"``; None when any step is missing."""
    node = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _count(value: Any) -> int | float | None:
    """A count as the summary wrote it: an integer stays one (``3``, not ``3.0``, which a strictly typed
    reader of comparison.json, Go's ``int`` or serde's ``u64``, refuses); a float (GPU-hours, CPU-s) stays
    a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def arm_values(summary: dict[str, Any] | None) -> dict[str, Any]:
    """The metrics and counts of one arm's summary (all None without a summary)."""
    metrics = {m.key: None if summary is None else _number(dig(summary, m.path)) for m in METRICS}
    counts = {k: None if summary is None else _count(dig(summary, p)) for k, p in COUNTS}
    model_failed = None if summary is None else dig(summary, "model.failed")
    # a request the stop cancelled did not fail: the run was interrupted under it
    counts["model_failures"] = (
        sum(v for k, v in model_failed.items() if k != "cancelled")
        if isinstance(model_failed, dict)
        else None
    )
    return {"metrics": metrics, "counts": counts}


def _rule(summary: dict[str, Any] | None) -> str | None:
    """The rule the arm's policy name ran (summary.json's ``scheduler.policy_rule``; None if unknown)."""
    rule = dig(summary, "scheduler.policy_rule") if summary is not None else None
    return rule if isinstance(rule, str) else None


#: comparison.json's ``server_versions`` key for the engine's version each arm's client recorded (its
#: run.json's ``backend.server_version``, asked with ``GET /version``) beside those parsed from server logs.
REPORTED_VERSION = "GET /version"


def reported_version(arm_dir: Path) -> str | None:
    """The engine's version an arm's client recorded in its run.json (None: none, or no run.json)."""
    from asyncroll.json_depth import read_json_object

    backend = (read_json_object(arm_dir / "run" / "run.json") or {}).get("backend")
    version = backend.get("server_version") if isinstance(backend, dict) else None
    return version if isinstance(version, str) else None


def build_comparison(
    experiment: dict[str, Any],
    summaries: Mapping[str, dict[str, Any] | None],
    reported: Mapping[str, str | None] | None = None,
    machines: Mapping[str, dict[str, Any] | None] | None = None,
) -> dict[str, Any]:
    """comparison.json from experiment.json's data and each comparison arm's summary (None if absent);
    ``reported``: the engine's version each arm's client recorded (:func:`reported_version`);
    ``machines``: what each arm ran on (:func:`~asyncroll.experiment.machines.arm_machine`)."""
    config = experiment["config"]
    arm_names = [a["name"] for a in config["arms"]]
    policies = {a["name"]: a["policy"] for a in config["arms"]}
    pairs: dict[int, dict[str, Any]] = {}
    failed: list[dict[str, Any]] = []
    unfinished: list[dict[str, Any]] = []  # every stage's: interrupted, pending or still running
    for plan in experiment["plan"]:
        record = experiment["arms"][plan["id"]]
        if record.get("status") == "failed":
            failed.append(
                {"id": plan["id"], "stage": plan["stage"], "arm": plan["arm"], "error": record.get("error")}
            )
        elif record.get("status") != "complete":
            unfinished.append(
                {
                    "id": plan["id"],
                    "stage": plan["stage"],
                    "arm": plan["arm"],
                    "status": record.get("status", "not_run"),
                    "error": record.get("error"),
                }
            )
        if plan["pair"] is None:
            continue
        pair = pairs.setdefault(
            plan["pair"], {"pair": plan["pair"] + 1, "seed": plan["seed"], "order": [], "arms": {}}
        )
        pair["order"].append(plan["arm"])
        pair["arms"][plan["arm"]] = {
            "id": plan["id"],
            "policy": plan["policy"],
            "policy_rule": _rule(summaries.get(plan["id"])),
            "status": record.get("status", "not_run"),
            "error": record.get("error"),
            "run_dir": record.get("run_dir"),
            **arm_values(summaries.get(plan["id"])),
        }
    versions: dict[str, list[str]] = {}
    for record in experiment["arms"].values():
        for key, values in (record.get("server_evidence") or {}).items():
            if key.endswith("_version"):
                versions.setdefault(key, [])
                versions[key] += [v for v in values if v not in versions[key]]
    for version in (reported or {}).values():
        if version is not None and version not in versions.setdefault(REPORTED_VERSION, []):
            versions[REPORTED_VERSION].append(version)
    for pair in pairs.values():
        pair["complete"] = all(
            pair["arms"][n]["status"] == "complete" for n in arm_names if n in pair["arms"]
        )
    return {
        "schema_version": COMPARISON_SCHEMA_VERSION,
        "kind": "asyncroll.comparison",
        "experiment": config["name"],
        "experiment_status": experiment["status"],
        "stop_reason": experiment.get("stop_reason"),
        "fingerprint": experiment["fingerprint"]["sha256"],
        "baseline": config.get("baseline") or arm_names[0],
        "arms": arm_names,
        "policies": policies,
        "seed": config["seed"],
        "bootstrap_resamples": config["bootstrap_resamples"],
        "stages": experiment["stages"],
        "metrics": [
            {"key": m.key, "path": m.path, "label": m.label, "higher_is_better": m.higher_is_better}
            for m in METRICS
        ],
        "pairs": [pairs[k] for k in sorted(pairs)],
        "failed_arms": failed,
        "unfinished_arms": unfinished,
        "server_versions": versions,
        "machines": machine_groups(
            machines or {}, [e["id"] for k in sorted(pairs) for e in pairs[k]["arms"].values()]
        ),
        "settings": experiment_settings(config),
    }


def write_comparison(path: Path, comparison: dict[str, Any]) -> None:
    write_json_atomic(path, comparison)


#: The bounds of a metric or count ``asyncroll report`` computes with: 0, or a magnitude from
#: ``MIN_MAGNITUDE`` to ``MAX_MAGNITUDE``. Within them a paired ratio is at most 1e100 (a % change about
#: 1e102), a difference 2e50, and a pooled rate (a sum over the pairs of at most 1e50 each, over a sum
#: that is 0 or at least about 1e-66) below 1e125; the sums, means, squared deviations and t
#: half-widths over even a million pairs stay below 1e215, far from a double's 1.8e308. So no statistic
#: overflows to ±inf, which JSON cannot hold and ``statistics.stdev`` cannot take (-1e308 once gave
#: both). A bound on the magnitude alone would not do: a ratio over 5e-324 overflows. Measured values
#: (seconds, rates, fractions, counts) lie tens of orders of magnitude inside both bounds.
MAX_MAGNITUDE = 1e50
MIN_MAGNITUDE = 1e-50


def _computable(value: float) -> float:
    if value != 0 and not MIN_MAGNITUDE <= abs(value) <= MAX_MAGNITUDE:
        raise ValueError(
            f"{value!r} is outside what the report computes with (0, or a magnitude from "
            f"{MIN_MAGNITUDE:g} to {MAX_MAGNITUDE:g})"
        )
    return value


Computable = Annotated[float, AfterValidator(_computable)]


class _Read(BaseModel):
    """The fields ``asyncroll report`` reads, strictly typed (a number is never a bool or a string, and
    never NaN); other fields are kept as they are."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


class _ArmEntry(_Read):
    id: str
    status: str
    policy_rule: str | None = None  # absent in a comparison.json written before it
    error: str | None = None
    metrics: dict[str, Computable | None]
    counts: dict[str, Computable | None]


class _PairEntry(_Read):
    pair: int = Field(ge=1)
    complete: bool
    arms: dict[str, _ArmEntry]


class _MetricEntry(_Read):
    key: str
    label: str


class _Gate(_Read):
    """A gate's verdict on one arm (``gates.evaluate_gates`` always names the arm and the observed value)."""

    metric: str
    op: str
    value: float
    arm: str
    observed: float | None
    passed: bool


class _Stage(_Read):
    status: str
    gates: list[_Gate] = Field(default_factory=list)


class _FailedArm(_Read):
    id: str
    error: str | None = None


class _UnfinishedArm(_FailedArm):
    status: str


class _Machines(_Read):
    client: dict[str, str | int | float | None] | None
    gpu: dict[str, str | int | float | None] | None
    arms: list[str]


class ComparisonFile(_Read):
    """comparison.json as ``asyncroll report`` needs it: the types and the cross-references."""

    schema_version: int
    kind: Literal["asyncroll.comparison"]
    experiment: str | None = None
    experiment_status: str | None = None
    stop_reason: str | None = None
    fingerprint: str | None = None
    arms: list[str] = Field(min_length=2)
    baseline: str
    policies: dict[str, str]
    seed: int = Field(default=0, ge=0)
    # as the config asks (a hand-edited comparison.json's 1 resample drew a zero-width "95%" interval)
    bootstrap_resamples: int = Field(default=10_000, ge=MIN_BOOTSTRAP_RESAMPLES, le=MAX_BOOTSTRAP_RESAMPLES)
    metrics: list[_MetricEntry]
    pairs: list[_PairEntry]
    failed_arms: list[_FailedArm] = Field(default_factory=list)
    unfinished_arms: list[_UnfinishedArm] = Field(default_factory=list)
    stages: dict[str, _Stage] = Field(default_factory=dict)
    server_versions: dict[str, list[str]] = Field(default_factory=dict)
    machines: list[_Machines] | None = None  # absent in a comparison.json written before it
    settings: dict[str, Any] | None = None

    @field_validator("schema_version")
    @classmethod
    def _version(cls, value: int) -> int:
        if value != COMPARISON_SCHEMA_VERSION:
            raise ValueError(
                f"{value} is not supported (this asyncroll reads schema_version {COMPARISON_SCHEMA_VERSION})"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ComparisonFile:
        problems = []
        if len(set(self.arms)) != len(self.arms):
            problems.append(f"arms: duplicate names in {self.arms}")
        if self.baseline not in self.arms:
            problems.append(f"baseline: {self.baseline!r} is not an arm ({self.arms})")
        missing = [a for a in self.arms if a not in self.policies]
        if missing:
            problems.append(f"policies: no policy for {missing}")
        keys = [m.key for m in self.metrics]
        if len(set(keys)) != len(keys):
            problems.append("metrics: duplicate keys")
        numbers = [pair.pair for pair in self.pairs]
        if twice := sorted({n for n in numbers if numbers.count(n) > 1}):
            problems.append(f"pairs: pair number(s) {twice} appear more than once")
        for i, pair in enumerate(self.pairs):
            where = f"pairs[{i}] (pair {pair.pair})"
            absent = [a for a in self.arms if a not in pair.arms]
            extra = [a for a in pair.arms if a not in self.arms]
            if absent:
                problems.append(f"{where}: no entry for arm(s) {absent}")
            if extra:
                problems.append(f"{where}: arm(s) {extra} are not in arms {self.arms}")
            for arm, entry in pair.arms.items():  # a metric not measured is null, never left out
                if lacking := [key for key in keys if key not in entry.metrics]:
                    problems.append(
                        f"{where}.arms.{arm}.metrics: no entry for {lacking} (null if not measured)"
                    )
            complete = all(entry.status == "complete" for entry in pair.arms.values())
            if pair.complete != complete and not absent:
                problems.append(
                    f"{where}: complete is {pair.complete}, but its arms' statuses say {complete}"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return self


def validate_comparison(data: Any) -> None:
    """Raise ValueError, one line naming what is wrong, unless ``data`` is a comparison.json to report."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    # REPORT.md is UTF-8: such a string could not be written; a run directory's name (and an error that
    # quotes a path) may hold a file name's undecodable bytes, written there as their escapes
    surrogate = lone_surrogate_at(data, file_names=("run_dir", "error"))
    if surrogate is not None:
        raise ValueError(f"{'a key' if surrogate == 'line' else surrogate}: {LONE_SURROGATE}")
    try:
        ComparisonFile.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        parts = []
        for err in errors[:3]:
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
            message = validation_message(err)
            parts.append(f"{where}: {message}" if where else message)
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        raise ValueError("; ".join(parts) + more) from None
