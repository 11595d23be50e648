"""RunConfig: every knob of a run, validated once, before anything starts.

The three independent limits live in :class:`Limits` and nowhere else; each is enforced by exactly one
limiter built from it (admission, the model gate, the worker pool). ``sync`` forces one active trajectory
here, so no other module special-cases it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from asyncroll.errors import UsageError
from asyncroll.evaluator.budget import (
    DEFAULT_MEMORY_LIMIT_MB,
    DEFAULT_TIME_LIMIT_S,
    MAX_MEMORY_LIMIT_MB,
    MAX_TIME_LIMIT_S,
    MIN_MEMORY_LIMIT_MB,
    tool_timeout_cap,
)
from asyncroll.floats import shown
from asyncroll.json_checks import (
    Bool,
    Float,
    Int,
)
from asyncroll.locale_names import OsPath
from asyncroll.paths import resolved
from asyncroll.setting_names import unknown_setting, validation_message
from asyncroll.url_checks import (
    api_key_problem,
    http_url_problem,
    masked_url,
    metrics_url_problem,
    not_a_root,
)

#: The longest tool result (JSON text) a model is shown by default: about 25k tokens.
DEFAULT_MAX_OBSERVATION_CHARS = 100_000
#: The largest ``--config`` file read: its settings take well under a kilobyte.
MAX_CONFIG_BYTES = 1 << 20
MIN_WORKER_RSS_MB = 64  # below a bare worker interpreter's own footprint every job would replace it
#: --telemetry-interval's floor, s: a server's /metrics read takes milliseconds; below this the sampler
#: would read back to back, taking CPU from the run it measures and a sample per read into the log.
MIN_TELEMETRY_INTERVAL_S = 0.01

PolicyName = Literal[
    "sync",
    "fifo",
    "tool_first",
    "gpu_first",
    "asyncroll",
    "asyncroll_seed",
    "asyncroll_guarded",
    "asyncroll_unlock",
    "asyncroll_critical",
    "asyncroll_balanced",
    "asyncroll_chain",
    "asyncroll_repair",
]
BackendName = Literal["scripted", "vllm", "openai"]
ServerKind = Literal["vllm", "sglang", "transformers", "generic"]

DEPRECATED_ALIASES = {"gpu_first": "tool_first"}
#: Settings by a deprecated flag's name (``--gpu-slots``): a config file that spells one is told the name.
ALIASES = {"gpu_slots": "max_inflight_model_requests"}
#: At most this many worker *processes* (``asyncroll run``; simulated ones: below): each holds
#: tens of MB, and 100,000 were once accepted until the kernel's OOM killer ended the run.
MAX_PROCESS_WORKERS = 1024
#: At most this many *simulated* workers (``asyncroll simulate``, a sweep's ``--workers``): each is an
#: object of the simulated pool with its own start-up events; 1,000,000 took 96 s and 3.8 GB for the
#: 3-problem smoke workload (100,000: 17 s, 0.5 GB), ten times the real cap is room for any what-if.
MAX_SIMULATED_WORKERS = 10 * MAX_PROCESS_WORKERS
#: Settings only an HTTP backend reads: given with ``--backend scripted`` they are refused, not ignored.
#: (``--model`` is not one: it also filters a scraped server's metrics, ``--metrics-url``.)
HTTP_ONLY = (
    "endpoint",
    "max_tokens",
    "request_timeout",
    "structured_output",
    "seed",
    "replay",
    "server_kind",
    "api_key_env",
    "max_retries",
    "retry_max_delay",
    "circuit_failures",
    "server_down_timeout",
    "warmup_requests",
)


class Limits(BaseModel):
    """The three independent bounds of a run."""

    model_config = ConfigDict(frozen=True)
    max_active_trajectories: int = Field(ge=1)
    max_inflight_model_requests: int = Field(ge=1)
    cpu_workers: int = Field(ge=1)


class RunConfig(BaseModel):
    """Everything ``asyncroll run`` needs; the same fields may come from ``--config FILE``."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # inf: never meant

    workload: OsPath
    output: OsPath
    backend: BackendName = "scripted"
    policy: PolicyName = "fifo"
    tool_root: OsPath | None = None
    model: str | None = None
    endpoint: str = "http://localhost:8000"
    limit: Int | None = Field(default=None, ge=1)
    cpu_workers: Int = Field(default=2, ge=1)
    max_active_trajectories: Int = Field(default=16, ge=1)
    max_inflight_model_requests: Int = Field(default=4, ge=1)
    max_turns: Int = Field(default=8, ge=1)
    max_tokens: Int = Field(default=512, ge=1)
    warmup_requests: Int = Field(default=2, ge=0)
    tool_timeout: Float = Field(default=60.0, gt=0)
    worker_startup_timeout: Float = Field(default=120.0, gt=0)
    # a worker left above this resident memory after a job is replaced (None: never); a MiB count
    worker_max_rss_mb: Int | None = Field(default=None, ge=MIN_WORKER_RSS_MB, le=1 << 30)
    request_timeout: Float = Field(default=120.0, gt=0)
    structured_output: Bool = True
    metrics_url: str | None = None
    telemetry: Bool = True
    nvml_device: Int | None = Field(default=None, ge=0)
    telemetry_interval: Float = Field(default=0.2, ge=MIN_TELEMETRY_INTERVAL_S)
    seed: Int = 0
    starvation_threshold: Int | None = Field(default=None, ge=1)
    aging_seconds: Float = Field(default=30.0, gt=0)
    aging_weight: Float = Field(default=0.02, ge=0)
    nvtx: Bool = False
    dedicated_gpu: Bool = False
    progress: Bool | None = None  # None: on when stderr is a terminal; False: off (--no-progress)
    metrics_port: Int | None = Field(default=None, ge=0, le=65535)  # 0: any free port (see run.json)
    metrics_host: str = Field(default="127.0.0.1", min_length=1)
    tool_errors: Literal["fail", "observe"] = "fail"
    # a tool's result longer than this (as JSON text) is cut before the model sees it (counted)
    max_observation_chars: Int = Field(default=DEFAULT_MAX_OBSERVATION_CHARS, ge=100, le=100_000_000)
    allow_weak_isolation: Bool = False
    # transcripts.jsonl: each ended trajectory's conversation (off: a run's largest output by far)
    transcripts: Bool = False
    # The code evaluator (lcb_evaluate, SPEC §9), passed to every evaluation; the evaluator's own bounds.
    # evaluation_timeout None: LiveCodeBench's (test_timeout + 1) × tests + 5 s, capped below tool_timeout.
    test_timeout: Float = Field(default=DEFAULT_TIME_LIMIT_S, gt=0, lt=MAX_TIME_LIMIT_S)
    evaluation_timeout: Float | None = Field(default=None, gt=0, lt=MAX_TIME_LIMIT_S)
    test_memory_mb: Int = Field(
        default=DEFAULT_MEMORY_LIMIT_MB, ge=MIN_MEMORY_LIMIT_MB, le=MAX_MEMORY_LIMIT_MB
    )
    # HTTP backends (SPEC §7). server_kind None: vllm for --backend vllm, probed for --backend openai.
    replay: Bool = False
    server_kind: ServerKind | None = None
    # the name of an environment variable holding the server's API key (never the key: run.json records
    # the command line and the config)
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    max_retries: Int = Field(default=0, ge=0, le=20)
    retry_max_delay: Float = Field(default=8.0, gt=0)
    circuit_failures: Int = Field(default=5, ge=0)
    server_down_timeout: Float = Field(default=120.0, gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        problems: list[str] = []
        if self.backend != "scripted" and not self.model:
            problems.append(f"--model is required with --backend {self.backend}")
        if self.backend == "scripted":
            # each flag as given: a switch turned off is its --no- form (--no-structured-output)
            given = [
                ("--no-" if getattr(self, name) is False else "--") + name.replace("_", "-")
                for name in HTTP_ONLY
                if name in self.model_fields_set
            ]
            if given:
                verb = "applies" if len(given) == 1 else "apply"
                problems.append(f"{', '.join(given)} only {verb} to HTTP backends (--backend vllm|openai)")
            if "model" in self.model_fields_set and self.metrics_url is None:  # it names no one's metrics
                problems.append("--model only applies to HTTP backends, or with --metrics-url (its filter)")
        if self.api_key_env is not None:
            key_problem = api_key_problem(os.environ.get(self.api_key_env))
            if key_problem is not None:
                problems.append(f"--api-key-env {self.api_key_env}: {key_problem}")
        if "metrics_host" in self.model_fields_set and self.metrics_port is None:
            problems.append("--metrics-host only applies with --metrics-port")
        sources = {"--metrics-url": self.metrics_url, "--nvml-device": self.nvml_device}
        asked = [flag for flag, value in sources.items() if value is not None and value != ""]
        asked += ["--telemetry-interval"] if "telemetry_interval" in self.model_fields_set else []
        if not self.telemetry and asked:
            problems.append(f"--no-telemetry conflicts with {', '.join(asked)}")
        checks = (
            ("--endpoint", self.endpoint, http_url_problem),
            ("--metrics-url", self.metrics_url, metrics_url_problem),
        )
        for flag, url, check in checks:
            problem = None if url is None else check(url)
            if url is not None and problem is not None:
                problems.append(f"{flag} {masked_url(url)!r}: {problem}")
        if not_a_root(self.endpoint):
            problems.append(
                f"--endpoint {masked_url(self.endpoint)!r}: give the server's root URL, without /v1, a "
                "query or a fragment (asyncroll requests /v1/chat/completions under it)"
            )
        problems += self._evaluator_problems()
        if problems:
            raise ValueError("\n".join(problems))  # one line a problem
        return self

    def _evaluator_problems(self) -> list[str]:
        """An evaluator time limit that was asked for must be usable. An evaluation has to return its
        verdict before ``--tool-timeout`` kills its worker, so its total budget is capped below it: a
        per-test limit or a total budget past that cap is refused, not silently cut. (The default
        per-test limit is cut by the capped budget as before, and the verdict says so.)"""
        out: list[str] = []
        cap = tool_timeout_cap(self.tool_timeout)
        given = {
            "--test-timeout": self.test_timeout if "test_timeout" in self.model_fields_set else None,
            "--evaluation-timeout": self.evaluation_timeout,
        }
        for flag, value in given.items():
            if value is not None and value > cap:
                out.append(
                    f"{flag} {shown(value)} does not fit under --tool-timeout {shown(self.tool_timeout)}: an "
                    f"evaluation must end within {cap:g}s (the tool timeout less a margin of max(1 s, 10%), "
                    "at least half of it) for its verdict to come back before the worker is killed; raise "
                    f"--tool-timeout or lower {flag}"
                )
        per_test, total = given["--test-timeout"], given["--evaluation-timeout"]
        if per_test is not None and total is not None and per_test > total:
            out.append(
                f"--test-timeout {shown(per_test)} is longer than --evaluation-timeout {shown(total)}, "
                "the budget of a whole evaluation: no test could run that long"
            )
        return out

    @property
    def declared_server_kind(self) -> ServerKind | None:
        """The server kind a run declares: ``--server-kind``, else ``vllm`` for ``--backend vllm``; None
        leaves it to be probed (``--backend openai``). The backend's requests and the telemetry's
        metric names both follow it."""
        return self.server_kind or ("vllm" if self.backend == "vllm" else None)

    @property
    def policy_name(self) -> str:
        """The canonical policy name (deprecated aliases resolved)."""
        return DEPRECATED_ALIASES.get(self.policy, self.policy)

    @property
    def limits(self) -> Limits:
        active = 1 if self.policy == "sync" else self.max_active_trajectories
        return Limits(
            max_active_trajectories=active,
            max_inflight_model_requests=self.max_inflight_model_requests,
            cpu_workers=self.cpu_workers,
        )

    @property
    def effective_starvation_threshold(self) -> int:
        return self.starvation_threshold or self.max_inflight_model_requests

    @property
    def resolved_tool_root(self) -> Path:
        return resolved(self.tool_root or self.workload.parent)  # a symlink loop: refused as no folder

    def unavailable_features(self) -> list[str]:
        """Flags that parse but whose feature has not landed yet: each refused with its reason."""
        out: list[str] = []
        if self.nvtx:
            from asyncroll.telemetry.nvtx import nvtx_missing

            missing = nvtx_missing()
            if missing is not None:
                out.append(missing)
        return out


def build_config(values: dict[str, Any], origins: Mapping[str, str] | None = None) -> RunConfig:
    """Validate settings into a RunConfig, turning every problem into one clear line. ``origins`` names
    where a setting came from when that was not a flag (``--config FILE: setting 'polcy'``)."""
    try:
        return RunConfig.model_validate(values)
    except ValidationError as exc:
        lines = [_describe(err, origins or {}, values) for err in exc.errors()]
        raise UsageError("\n".join(lines + _checks_across(values, exc, origins or {}))) from exc


#: A setting that a check across settings names in words, not as its flag ("--model only applies to HTTP
#: backends" judges the backend): such a line is left out as well when that setting was refused.
_NAMED_OTHERWISE = {"backend": "HTTP backends"}


def _checks_across(values: Mapping[str, Any], exc: ValidationError, origins: Mapping[str, str]) -> list[str]:
    """The checks across settings (``--model`` missing, conflicting flags) that a setting's own error
    kept pydantic from running: run again without the refused settings, so that every problem is told
    at once. A check that names a refused setting is left out: it would judge a default nobody gave."""
    refused = {str(err["loc"][0]) for err in exc.errors() if err.get("loc")}
    if not refused:
        return []
    try:
        kept = {k: v for k, v in values.items() if k not in refused}
        # a required path refused (or missing): a stand-in, no check across settings reads it
        stand_ins = {name: "unused" for name in ("workload", "output") if name not in kept}
        RunConfig.model_validate({**kept, **stand_ins})
    except ValidationError as again:
        flags = [re.compile(rf"--(?:no-)?{re.escape(name.replace('_', '-'))}(?![\w-])") for name in refused]
        flags += [re.compile(re.escape(words)) for name, words in _NAMED_OTHERWISE.items() if name in refused]
        found = [_describe(err, origins, values) for err in again.errors() if not err.get("loc")]
        lines = "\n".join(found).splitlines()  # one problem a line, each judged on its own
        return [line for line in lines if not any(flag.search(line) for flag in flags)]
    return []


def _past_value(msg: str, end: int, value: Any) -> int:
    """Where the setting's value written right after its flag ends (``--test-timeout 20 does not fit``),
    so that the note on where the setting came from follows the value rather than splitting the two;
    ``end`` (the flag's end) when what follows is no value of the setting's (``--model only applies``).
    A string is written as itself or quoted (``!r``), a URL maybe masked (its password as ``***``)."""
    token = re.match(r""" ('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^\s:,]+)""", msg[end:])
    if token is None or value is None or isinstance(value, bool):
        return end
    text = token.group(1)
    if isinstance(value, str):
        same = text in (value, repr(value), repr(masked_url(value)))
    else:
        try:
            same = float(text) == float(value)
        except (TypeError, ValueError, OverflowError):
            same = text.strip("'") == str(value)
    return end + token.end() if same else end


#: pydantic's range errors: its message names the bound, so the value given is added
_BOUNDS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def _describe(err: Any, origins: Mapping[str, str], values: Mapping[str, Any]) -> str:
    loc = [str(p) for p in err.get("loc", ())]
    msg = validation_message(err)
    if not loc:  # a check across settings: its message names them as flags
        for key, origin in origins.items():
            name = key.replace("_", "-")  # a switch turned off is named as its --no- form
            found = re.search(rf"--(?:no-)?{re.escape(name)}(?![\w-])", msg)
            if found is not None:  # the first mention says where the value came from
                end = _past_value(msg, found.end(), values.get(key))
                msg = f"{msg[:end]} ({origin}){msg[end:]}"
        return msg
    where = origins.get(loc[0]) or "--" + loc[0].replace("_", "-")
    if err.get("type") == "extra_forbidden":
        return f"{where}: {unknown_setting(loc[0], RunConfig.model_fields, aliases=ALIASES)}"
    if loc == ["policy"] and err.get("type") == "literal_error" and isinstance(err.get("input"), str):
        from asyncroll.policies.registry import likely_policy

        meant = likely_policy(err["input"])
        if meant is not None:  # another case, a hyphen: the list alone left the user to spot it
            return f"{where}: {msg} (did you mean {meant!r}?)"
    return f"{where}: {msg}{given(err)}"


def given(err: Any) -> str:
    """`` (got 0)`` after a pydantic range error (its message names only the bound), else ""."""
    if err.get("type") not in _BOUNDS:
        return ""
    value = err.get("input")
    return f" (got {format(value, 'g') if isinstance(value, float) else repr(value)})"
