"""The workload's lines as pydantic models: problems, their tools and scripted actions, and the limits of
what a line may declare (SPEC §5). Cross-field checks pydantic cannot express are :mod:`.checks`."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator

from asyncroll.coerce import TYPE_PATTERN, check_type_name
from asyncroll.events import MAX_ERROR_CHARS

#: Built-in tools (no ``implementation``) and their declared inputs.
BUILTIN_TOOLS: dict[str, dict[str, str]] = {
    "add": {"a": "number", "b": "number"},
    "sleep_ms": {"milliseconds": "number"},
    "spin_ms": {"milliseconds": "number"},
    # The model supplies only ``code``; the runtime binds ``tests``/``func_name`` from hidden metadata.
    "lcb_evaluate": {"code": "str"},
}
#: Built-ins named by the spec whose implementation has not landed yet.
PENDING_BUILTINS: dict[str, str] = {}
MAX_REPORTED_PROBLEMS = 200
#: Upper bound of a scripted duration (``latency_ms``, ``cpu_ms``): one day. A larger one is a typo, and
#: would stall a run (or a simulation) for ever.
MAX_DURATION_MS = 86_400_000
#: Upper bound of a scripted ``output_tokens``: the simulated server decodes one token per step.
MAX_OUTPUT_TOKENS = 1_000_000
#: The built-in evaluator of the one-repair protocol, and the default text of its repair turn.
EVALUATOR_TOOL = "lcb_evaluate"
_EVALUATOR_ONLY_BY_SUBMIT = (
    f"the built-in {EVALUATOR_TOOL!r} runs a 'submit' action under the one-repair protocol "
    "(metadata.prompt_metadata.protocol == 'one_repair'), which gives it the problem's hidden tests; "
    "it cannot be called as a tool"
)
DEFAULT_REPAIR_INSTRUCTION = (
    "Your program did not pass the tests; the first failing test is shown below. Return a corrected, "
    "complete Python 3 program."
)


class _Strict(BaseModel):
    # strict: no lax coercion ("5" is not 5, true is not 1), as the published JSON Schema says; an int is
    # still a valid float.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


#: A declared duration in milliseconds: finite, from 0 to one day.
DurationMs = Annotated[float, Field(ge=0, le=MAX_DURATION_MS, allow_inf_nan=False)]
OutputTokens = Annotated[int, Field(ge=1, le=MAX_OUTPUT_TOKENS)]
#: A job's declared error (``raises``) or worker death (``worker_dies``): a simulated worker fails the job
#: with this message instead of running it, or dies holding it (what ``simulate --from-run`` writes for a
#: job that failed so in the run); a real worker ignores it.
DeclaredError = Annotated[str, Field(min_length=1, max_length=MAX_ERROR_CHARS)]


class ToolAction(_Strict):
    type: Literal["tool"]
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    latency_ms: DurationMs | None = None
    output_tokens: OutputTokens | None = None
    cpu_ms: DurationMs | None = Field(default=None, description="declared CPU time (simulation only)")
    raises: DeclaredError | None = Field(default=None, description="declared tool error (simulation only)")
    worker_dies: DeclaredError | None = Field(
        default=None, description="declared worker death holding the job, its message (simulation only)"
    )


class FinalAction(_Strict):
    type: Literal["final"]
    answer: Any
    latency_ms: DurationMs | None = None
    output_tokens: OutputTokens | None = None


class SubmitAction(_Strict):
    type: Literal["submit"]
    code: str
    latency_ms: DurationMs | None = None
    output_tokens: OutputTokens | None = None
    cpu_ms: DurationMs | None = Field(default=None, description="declared evaluation time (simulation only)")
    passes: bool | None = Field(default=None, description="declared verdict (simulation only)")
    raises: DeclaredError | None = Field(
        default=None, description="declared evaluation error (simulation only)"
    )
    worker_dies: DeclaredError | None = Field(
        default=None, description="declared worker death holding the job, its message (simulation only)"
    )


Action = Annotated[ToolAction | FinalAction | SubmitAction, Field(discriminator="type")]

#: A failure kind as ``model_failed`` events record it (``timeout``, ``http_status``, ``transport``, ...).
#: The printed schema is as strict as validation: its pattern ends in ``(?!\n)$`` (Python's ``$``, a JSON
#: Schema validator's in Python, also matches before a final newline) and it refuses ``cancelled`` too.
FailureKind = Annotated[
    str,
    Field(
        min_length=1,
        max_length=64,
        json_schema_extra={"pattern": r"^[a-z][a-z0-9_]*(?!\n)$", "not": {"const": "cancelled"}},
    ),
]


class ErrorStep(_Strict):
    """A model request that fails, as a script's last step: after ``latency_ms`` the request ends with a
    model error of ``kind`` (as model_failed events record it), ``message`` and the HTTP ``status`` it
    carried, if any, and the trajectory fails on it as on a server's error. ``simulate --from-run`` writes
    one where the run's request failed, so that the replay fails there too. Never a model's reply.
    ``scripted``: the failure is the script's own (its ``model_failed`` is marked ``scripted``); false for
    a server's failure that the step replays (``simulate --from-run`` of a request the run's server
    failed), counted as a server's, as the run counted it."""

    type: Literal["error"]
    kind: FailureKind = "scripted"
    message: Annotated[str, Field(max_length=MAX_ERROR_CHARS)] = ""
    # any three-digit status, as HTTP/1.1 carries one and a run records it (some servers answer 999)
    status: Annotated[int, Field(ge=100, le=999)] | None = None
    latency_ms: DurationMs | None = None
    scripted: bool = Field(
        default=True,
        description="the script's own failure (its model_failed says scripted); false: a server's failure "
        "replayed (simulate --from-run writes it where the run's server failed the request)",
    )

    @field_validator("kind")
    @classmethod
    def _a_kind(cls, kind: str) -> str:
        if not re.fullmatch(r"[a-z][a-z0-9_]*", kind):
            raise ValueError(
                f"{kind[:40]!r} is no failure kind: lower-case letters, digits and '_', from a letter (as "
                "model_failed records them: 'timeout', 'http_status', 'transport', ...)"
            )
        if kind == "cancelled":  # the outputs tell a stop's cancelled requests from failures by it
            raise ValueError("'cancelled' is a stopped run's request, not a failure: name another kind")
        return kind

    def error_text(self, turn: int) -> str:
        """The failure's message: its own, or one that says where it came from."""
        return self.message or f"the script's error step at turn {turn}"


#: One step of a problem's script: what the model replies (an :data:`Action`), or a failed request.
ScriptStep = Annotated[ToolAction | FinalAction | SubmitAction | ErrorStep, Field(discriminator="type")]


class Tool(_Strict):
    name: str = Field(min_length=1)
    description: str = ""
    inputs: dict[str, str] = Field(
        default_factory=dict,
        json_schema_extra={"additionalProperties": {"type": "string", "pattern": TYPE_PATTERN}},
    )
    implementation: str | None = None
    bound_arguments: dict[str, Any] = Field(default_factory=dict)

    @field_validator("inputs")
    @classmethod
    def _known_types(cls, inputs: dict[str, str]) -> dict[str, str]:
        for arg, type_name in inputs.items():
            check_type_name(arg, type_name)
        return inputs

    @property
    def key(self) -> str:
        """How workers know this tool: its name for built-ins, ``path:name`` for trusted files, the path
        normalised (``./t/a.py``, ``t//a.py`` and ``t/../t/a.py`` are all ``t/a.py``: one tool, not three
        in events, run.json and the predictor; validation refuses a ``..`` that this would misread)."""
        if self.implementation is None:
            return self.name
        return f"{posixpath.normpath(self.implementation)}:{self.name}"

    @property
    def spelled_key(self) -> str:
        """:attr:`key` with the path as the workload spells it: what runs before the normalisation
        recorded (in events.jsonl and run.json), which a replay of such a run still finds."""
        return self.name if self.implementation is None else f"{self.implementation}:{self.name}"

    @property
    def declared_inputs(self) -> dict[str, str]:
        if self.implementation is None and not self.inputs:
            return BUILTIN_TOOLS.get(self.name, {})
        return self.inputs


#: The longest string id: it names its trajectory in every event, result and trace span (a megabyte id
#: made a run of 20 turns write 58 MB of events).
MAX_ID_CHARS = 1000
#: An id as the printed JSON Schema states it: a string holding more than whitespace, or an integer.
_ID_STRING = WithJsonSchema({"type": "string", "pattern": r"\S", "maxLength": MAX_ID_CHARS})


class Problem(_Strict):
    id: Annotated[str, _ID_STRING] | int | None = None
    prompt: Annotated[str, WithJsonSchema({"type": "string", "pattern": r"\S"})]
    tools: list[Tool] = Field(default_factory=list)
    reference_answer: str | None = None
    script: list[ScriptStep] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("id")
    @classmethod
    def _not_blank(cls, value: str | int | None) -> str | int | None:
        # The id names the trajectory in events, results and reports: an invisible one names nothing.
        if isinstance(value, str) and not value.strip():
            raise ValueError("must not be empty or blank (leave 'id' out to use the line number)")
        # an integer too: JSON's are unbounded, and one of thousands of digits names it as long a string
        chars = len(value) if isinstance(value, str) else len(str(value)) if isinstance(value, int) else 0
        if chars > MAX_ID_CHARS:
            raise ValueError(
                f"{chars:,} characters: at most {MAX_ID_CHARS:,} (it names the trajectory in every "
                "event and result; keep a long key in metadata)"
            )
        return value

    @field_validator("prompt")
    @classmethod
    def _prompt_not_blank(cls, value: str) -> str:
        # a required prompt that is empty asks the model nothing: a data error, not a problem to run
        if not value.strip():
            raise ValueError("must not be empty or blank (the model's first message)")
        return value

    @property
    def protocol(self) -> str | None:
        meta = self.metadata.get("prompt_metadata")
        return meta.get("protocol") if isinstance(meta, dict) else None

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        copy = super().model_copy(update=update, deep=deep)
        # pydantic copies the instance dict, cached values included: a copy with other metadata would
        # keep this problem's protocol and tests
        copy.__dict__.pop("one_repair", None)
        return copy

    @cached_property
    def one_repair(self) -> OneRepair | None:
        """The code-evaluation protocol's settings (validated by the loader), or None; made once (its
        ``test_bytes`` walks every test), not at each evaluation."""
        if self.protocol != "one_repair":
            return None
        meta = self.metadata
        prompt_meta = meta["prompt_metadata"]
        return OneRepair(
            tests=meta["reference_tests"],
            func_name=meta.get("func_name"),
            max_generations=prompt_meta.get("max_generations", 2),
            repair_instruction=prompt_meta.get("repair_instruction", DEFAULT_REPAIR_INSTRUCTION),
        )


@dataclass(frozen=True, slots=True)
class OneRepair:
    """Submit → evaluate → on failure one repair turn with the feedback → evaluate (SPEC §2, §5).

    ``tests`` are hidden: they go to the evaluator as bound arguments, never into a prompt or a result."""

    tests: list[dict[str, Any]]
    func_name: str | None
    max_generations: int
    repair_instruction: str
    test_bytes: int = field(init=False)
    """Bytes of the tests' inputs, UTF-8 encoded (a predictor feature: bytes, not characters)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "test_bytes", sum(len(t.get("input", "").encode()) for t in self.tests))
