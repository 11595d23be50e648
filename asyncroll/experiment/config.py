"""ExperimentConfig: everything a paired experiment needs, validated before any process starts.

One JSON file names the server command template (vLLM by default; ``serve-sim``, SGLang or any command),
the model, the workload and its expected SHA-256, the client's limits, the arms (policies), the pairs and
their order, the seeds, the stages with their gates, and every deadline. ``asyncroll experiment schema``
prints its JSON Schema. ``workload.path`` and ``workload.tool_root`` are relative to the file's folder;
``model.path`` and the server command are handed to the server as written, so a relative path there is
relative to the folder ``run`` starts in (where they lead from there is part of the fingerprint: a
``--resume`` from another folder that would start another program or model is refused).
"""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from asyncroll.config import MAX_PROCESS_WORKERS, MIN_TELEMETRY_INTERVAL_S, given
from asyncroll.errors import UsageError
from asyncroll.experiment.json_file import read_json_file, receipt_config
from asyncroll.experiment.origin import Origin
from asyncroll.experiment.summary_paths import metric_problem
from asyncroll.json_checks import LONE_SURROGATE, Bool, Float, Int, lone_surrogate_at
from asyncroll.locale_names import OsPath, OsStr
from asyncroll.setting_names import unknown_setting, validation_message

#: Placeholders every server command template may use; ``server.vars`` adds more.
BUILTIN_PLACEHOLDERS = ("python", "host", "port", "model_path", "served_model_name", "revision")
STAGES = ("qualification", "opportunity", "activation")
#: ``asyncroll run`` flags the plan sets for every arm (``plan.client_command``), with their negations.
#: ``extra_args`` may not repeat them: they are the protocol's (an arm's policy, seed, workload, output),
#: and the client refuses an option given twice anyway. ``--config`` is refused too: a run config file
#: could carry any setting, and its content is not part of the protocol fingerprint.
MANAGED_CLIENT_FLAGS = frozenset(
    {
        "--workload",
        "--output",
        "--backend",
        "--server-kind",
        "--model",
        "--endpoint",
        "--policy",
        "--max-active-trajectories",
        "--max-inflight-model-requests",
        "--gpu-slots",  # the deprecated alias of --max-inflight-model-requests
        "--cpu-workers",
        "--max-turns",
        "--max-tokens",
        "--warmup-requests",
        "--request-timeout",
        "--tool-timeout",
        "--telemetry-interval",
        "--seed",
        "--progress",
        "--no-progress",
        "--tool-root",
        "--limit",
        "--replay",
        "--no-replay",
        "--dedicated-gpu",
        "--no-dedicated-gpu",
        "--nvml-device",
        "--metrics-url",
        "--telemetry",
        "--no-telemetry",
        "--config",
    }
)
GateOp = Literal[">=", "<=", ">", "<", "==", "!="]
#: The most bootstrap resamples: the report draws them at once (8 bytes per resample and pair, twice),
#: so 10^10 of them asked for 149 GiB and ended `asyncroll report` with a MemoryError.
MAX_BOOTSTRAP_RESAMPLES = 1_000_000
#: The fewest: a percentile interval of fewer resamples is mostly the extreme draws themselves.
MIN_BOOTSTRAP_RESAMPLES = 100
#: The longest ``server.stop_grace_s``: the stop of an arm's server is cleanup, during which a further
#: Ctrl-C or SIGTERM is ignored (so that the server is always stopped); 1e308 was accepted, and a server
#: that ignored SIGTERM held the runner, deaf to Ctrl-C, essentially forever.
MAX_STOP_GRACE_S = 600.0

DEFAULT_VLLM_COMMAND = [
    "vllm",
    "serve",
    "{model_path}",
    "--revision",
    "{revision}",
    "--served-model-name",
    "{served_model_name}",
    "--host",
    "{host}",
    "--port",
    "{port}",
    "--seed",
    "0",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ServerSpec(_Strict):
    """How to start (and judge the readiness of) one fresh inference server per arm."""

    command: list[OsStr] = Field(default_factory=lambda: list(DEFAULT_VLLM_COMMAND), min_length=1)
    kind: Literal["vllm", "sglang", "transformers", "generic"] = "vllm"
    host: OsStr = Field(default="127.0.0.1", min_length=1)
    port: Int = Field(default=8000, ge=0, le=65535, description="0: pick a free port for each arm.")
    env: dict[OsStr, OsStr] = Field(default_factory=dict, description="Added to the server's environment.")
    vars: dict[str, OsStr] = Field(default_factory=dict, description="Extra {placeholders} of the command.")
    readiness_paths: list[str] = Field(default_factory=lambda: ["/health", "/v1/models"], min_length=1)
    startup_timeout_s: Float = Field(default=900.0, gt=0)
    stop_grace_s: Float = Field(
        default=30.0,
        ge=0,
        le=MAX_STOP_GRACE_S,
        description="Seconds between TERM and KILL of the server at an arm's end (a Ctrl-C then waits).",
    )
    metrics_path: str | None = Field(
        default="/metrics",
        description="null: no server telemetry. Unset with kind transformers: null (it serves no metrics).",
    )
    # false: whoever listens on the port is trusted (a container's daemon listens outside the command)
    check_listener: bool = Field(default=True, description="false: trust whoever listens on the port.")

    @model_validator(mode="before")
    @classmethod
    def _no_metrics_from_transformers(cls, data: Any) -> Any:
        """``transformers serve`` has no ``/metrics``: every arm's client warned it unavailable."""
        if isinstance(data, dict) and data.get("kind") == "transformers" and "metrics_path" not in data:
            return {**data, "metrics_path": None}
        return data

    @field_validator("readiness_paths")
    @classmethod
    def _paths(cls, value: list[str]) -> list[str]:
        bad = [p for p in value if not p.startswith("/")]
        if bad:
            raise ValueError(f"readiness paths must start with '/': {bad}")
        return value


class ModelSpec(_Strict):
    path: OsStr = Field(
        min_length=1,
        description="Model path or hub id handed to the server as written (a relative path: from the "
        "folder `run` starts in, not the config's).",
    )
    revision: OsStr = Field(default="main", min_length=1, description="Pin a commit for a real experiment.")
    served_name: OsStr = Field(min_length=1, description="The name requests use (--served-model-name).")


class WorkloadSpec(_Strict):
    path: OsPath
    sha256: str | None = Field(default=None, description="Expected SHA-256; a mismatch refuses to run.")
    tool_root: OsPath | None = None
    description: str = ""

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[0-9a-f]{64}", value):
            raise ValueError("sha256 must be 64 lowercase hex digits")
        return value


def _unmanaged(args: list[str]) -> list[str]:
    """Refuse extra arguments that name a flag the plan sets (``--flag`` or ``--flag=value``)."""
    clash = sorted({a.split("=", 1)[0] for a in args if a.split("=", 1)[0] in MANAGED_CLIENT_FLAGS})
    if clash:
        raise ValueError(
            f"extra_args may not repeat a flag the experiment sets: {', '.join(clash)} (the plan sets it "
            "from the config's arms, seed, client, model, workload, server and gpu)"
        )
    return args


class ClientSpec(_Strict):
    """The ``asyncroll run`` flags shared by every arm (the policy comes from the arm)."""

    backend: Literal["vllm", "openai"] = "vllm"
    replay: Bool = False
    max_active_trajectories: Int = Field(default=8, ge=1)
    max_inflight_model_requests: Int = Field(default=4, ge=1)
    cpu_workers: Int = Field(default=2, ge=1, le=MAX_PROCESS_WORKERS)  # as `run` caps it: before any server
    max_turns: Int = Field(default=8, ge=1)
    max_tokens: Int = Field(default=2048, ge=1)
    warmup_requests: Int = Field(default=2, ge=0)
    limit: Int | None = Field(default=None, ge=1)
    request_timeout: Float = Field(default=600.0, gt=0)
    tool_timeout: Float = Field(default=60.0, gt=0)
    dedicated_gpu: Bool = True
    telemetry_interval: Float = Field(default=0.2, ge=MIN_TELEMETRY_INTERVAL_S)
    extra_args: list[OsStr] = Field(
        default_factory=list, description="More `asyncroll run` flags; never one the plan sets."
    )
    deadline_s: Float = Field(default=7200.0, gt=0, description="Client wall deadline per arm.")

    _extra = field_validator("extra_args")(_unmanaged)


class GpuSpec(_Strict):
    """A declared GPU: checked before every arm (identity and idleness), via NVML or nvidia-smi."""

    index: Int = Field(default=0, ge=0)
    name_contains: str | None = None
    uuid: str | None = None
    max_memory_used_mib: Float = Field(default=1024.0, ge=0)
    max_utilization_pct: Float = Field(default=10.0, ge=0, le=100)
    idle_wait_s: Float = Field(
        default=60.0, ge=0, description="How long to wait for the previous arm's memory to be released."
    )


class ArmSpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    policy: str = Field(min_length=1)
    extra_args: list[OsStr] = Field(
        default_factory=list, description="This arm's extra `asyncroll run` flags; never one the plan sets."
    )

    _extra = field_validator("extra_args")(_unmanaged)


class Gate(_Strict):
    """One threshold: ``summary[metric] op value`` on the named arm (every arm of the stage if null)."""

    metric: str = Field(min_length=1, description="Dotted path into summary.json, e.g. counts.completed.")
    op: GateOp
    value: Float
    arm: str | None = None

    @field_validator("metric")
    @classmethod
    def _a_number_of_the_summary(cls, metric: str) -> str:
        # checked with the config (plan, run), not after the stage's arm has run on a rented GPU
        problem = metric_problem(metric)
        if problem is not None:
            raise ValueError(problem)
        return metric


class StageSpec(_Strict):
    arms: list[str] = Field(min_length=1, description="Arm names run once in this stage, in order.")
    gates: list[Gate] = Field(default_factory=list)


class Stages(_Strict):
    qualification: StageSpec | None = None
    opportunity: StageSpec | None = None
    activation: StageSpec | None = None


class ExperimentConfig(_Strict):
    """A paired policy comparison on one inference server (SPEC §10)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    server: ServerSpec = Field(default_factory=ServerSpec)
    model: ModelSpec
    workload: WorkloadSpec
    client: ClientSpec = Field(default_factory=ClientSpec)
    gpu: GpuSpec | None = Field(default=None, description="null: no GPU declared (recorded as such).")
    arms: list[ArmSpec] = Field(min_length=2)
    baseline: str | None = Field(default=None, description="Arm the others are compared to (first arm).")
    pairs: Int = Field(default=3, ge=1)
    order: Literal["alternating", "balanced", "fixed"] = "alternating"
    seed: Int = Field(
        default=0,
        ge=0,
        description="Client --seed of pair1 is seed, of pair2 seed + 1, …; the bootstrap's seed (>= 0).",
    )
    stages: Stages = Field(default_factory=Stages)
    deadline_s: Float | None = Field(
        default=None,
        gt=0,
        description="Wall deadline of each `run` or `--resume`, from its start: it stops the experiment "
        "(the arm it cuts is interrupted, not failed; --resume runs it again with a new deadline).",
    )
    bootstrap_resamples: Int = Field(default=10_000, ge=MIN_BOOTSTRAP_RESAMPLES, le=MAX_BOOTSTRAP_RESAMPLES)
    _origin: Origin = PrivateAttr(default_factory=lambda: Origin())

    def named(self, setting: str, *, lead: bool = True) -> str:
        """How a message names ``setting`` (``workload.path``): the option that gave it, else the setting,
        led by the file it is in where ``lead`` (the start of a message, as the config's other errors)."""
        if setting in self._origin.flags:
            return self._origin.flags[setting]
        source = self._origin.source
        return f"{source}: {setting}" if lead and source is not None else setting

    @model_validator(mode="after")
    def _consistent(self) -> ExperimentConfig:
        problems: list[str] = []
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            problems.append(f"arms: duplicate arm names in {names}")
        if self.baseline is not None and self.baseline not in names:
            problems.append(f"baseline: {self.baseline!r} is not an arm ({names})")
        from asyncroll.config import PolicyName
        from asyncroll.policies.registry import unknown_policy_hint

        policies = PolicyName.__args__  # type: ignore[attr-defined]
        for arm in self.arms:
            if arm.policy not in policies:
                hint = unknown_policy_hint(arm.policy)
                problems.append(f"arms[{arm.name}].policy: unknown policy {arm.policy!r}{hint}")
        for stage in STAGES:
            spec: StageSpec | None = getattr(self.stages, stage)
            if spec is None:
                continue
            for name in spec.arms:
                if name not in names:
                    problems.append(f"stages.{stage}.arms: {name!r} is not an arm ({names})")
            for i, gate in enumerate(spec.gates):
                if gate.arm is not None and gate.arm not in spec.arms:
                    problems.append(f"stages.{stage}.gates[{i}].arm: {gate.arm!r} does not run in {stage}")
        known = set(BUILTIN_PLACEHOLDERS) | set(self.server.vars)
        used: set[str] = set()
        for i, token in enumerate(self.server.command):
            try:
                parsed = [
                    (f, spec, conv) for _, f, spec, conv in string.Formatter().parse(token) if f is not None
                ]
            except ValueError as exc:
                problems.append(f"server.command[{i}] {token!r}: {exc}")
                continue
            fields = [f for f, _, _ in parsed]
            used.update(fields)
            # a spec or a conversion ("{port:d}": every value is a string) raised out of str.format, a
            # traceback of `experiment plan` and an experiment failed at its first server start
            shaped = [f for f, spec, conv in parsed if spec or conv]
            if shaped:
                problems.append(
                    f"server.command[{i}] {token!r}: a placeholder is its name in braces, with no format "
                    f"spec or conversion (write {{{shaped[0]}}})"
                )
                continue
            unknown = [f for f in fields if f not in known]
            if unknown:
                problems.append(
                    f"server.command[{i}] {token!r}: unknown placeholder(s) {unknown}; known: {sorted(known)}"
                )
        if self.server.port == 0 and "port" not in used:
            # the runner probes a port the server is never told: every arm waits startup_timeout_s, fails
            problems.append(
                "server.command: server.port is 0 (a free port is picked for each arm) but the command has "
                "no {port} placeholder, so the server would never be told that port; add it (e.g. "
                '"--port", "{port}") or set server.port to the port the command uses'
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def baseline_arm(self) -> str:
        return self.baseline or self.arms[0].name

    def arm(self, name: str) -> ArmSpec:
        return next(a for a in self.arms if a.name == name)


#: The sections of a config holding settings, each with its settings' names (for an unknown key's hint).
SECTIONS: dict[str, type[_Strict]] = {
    "server": ServerSpec,
    "model": ModelSpec,
    "workload": WorkloadSpec,
    "client": ClientSpec,
    "gpu": GpuSpec,
}


def load_experiment_config(
    path: Path, overrides: dict[str, Any] | None = None, flags: dict[str, str] | None = None
) -> ExperimentConfig:
    """Read, override (dotted keys such as ``model.path``) and validate; a relative ``workload.path`` or
    ``workload.tool_root`` → the file's folder. ``flags``: the option that gave an override, blamed for it.

    Raises UsageError with one line per problem, naming the file and the field. A string that is not
    valid Unicode (a lone surrogate escape such as ``"\\ud800"``, which JSON allows) is refused here, where
    its field can be named, not when the plan is printed or the server started.
    """
    data = read_json_file(path)
    if not isinstance(data, dict):
        raise UsageError(f"{path}: an experiment config is a JSON object")
    data = receipt_config(path, data)
    data.pop("$schema", None)
    for key, value in (overrides or {}).items():
        node = data
        *parents, leaf = key.split(".")
        for i, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):  # "model": "qwen" raised a TypeError out of the script
                where = ".".join(parents[: i + 1])
                raise UsageError(
                    f"{path}: {where}: an object is expected here (to set {key}), not {node!r:.80}"
                )
        node[leaf] = value
    surrogate = lone_surrogate_at(data)
    if surrogate is not None:
        where = "a key" if surrogate == "line" else surrogate  # "line": a top-level key
        raise UsageError(f"{path}: {where}: {LONE_SURROGATE}")
    base = path.resolve().parent
    workload = data.get("workload")
    if isinstance(workload, dict):
        for key in ("path", "tool_root"):
            if isinstance(workload.get(key), str) and workload[key] and not Path(workload[key]).is_absolute():
                workload[key] = str(base / workload[key])
    try:
        cfg = ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors(include_url=False):
            where = ".".join(str(p) for p in err["loc"]) or "config"
            msg = validation_message(err) + given(err)
            if err["type"] == "extra_forbidden":  # where it belongs, or what it may be a misspelling of
                here, _, key = where.rpartition(".")
                arm = re.fullmatch(r"arms\.\d+", here) is not None
                spec = ArmSpec if arm else SECTIONS.get(here, None if here else ExperimentConfig)  # stages
                others = {name: other.model_fields for name, other in SECTIONS.items() if name != here}
                others |= {} if arm else {"arms[]": ArmSpec.model_fields}  # an arm's policy, its flags
                msg = unknown_setting(key, spec.model_fields if spec else (), others)
            flag = (flags or {}).get(where)
            lines.append(f"{flag}: {msg}" if flag else f"{path}: {where}: {msg}")
        raise UsageError("\n".join(lines)) from None
    cfg._origin = Origin(path, dict(flags or {}))
    return cfg
