"""The typed fields of a chat request, checked as vLLM's OpenAI server checks them.

vLLM reads the body into a pydantic model (``ChatCompletionRequest`` in
``vllm/entrypoints/openai/protocol.py``) in pydantic's lax mode: ``"temperature": "0.5"`` is 0.5,
``"max_tokens": 16.0`` is 16, ``"stream": "true"`` is true, while ``"temperature": "hot"``, a ``model``
that is not a string or a ``seed`` past a 64-bit integer are a 400 before anything runs; then its
``SamplingParams`` refuses values out of range (a negative ``temperature``, ``top_p`` outside (0, 1])
with a 400. serve-sim reads the same fields with the same pydantic types here, so a request one of them
serves the other serves too, and writes the coerced values back into the body for the checks that follow
(:mod:`asyncroll.serve_sim.request`). Fields serve-sim never reads but vLLM types are checked as well:
a client that sends a malformed ``tools`` list or ``user`` learns it here, not first from vLLM.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from asyncroll.serve_sim.request import BadRequest

_LONG = 2**63


class _Lax(BaseModel):
    """Unknown fields are ignored, as vLLM's ``OpenAIBaseModel`` (``extra="allow"``) only logs them."""

    model_config = ConfigDict(extra="ignore")


class _StreamOptions(_Lax):
    include_usage: bool | None = True  # vLLM's default: ``stream_options: {}`` asks for the usage chunk
    continuous_usage_stats: bool | None = False


class _Function(_Lax):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class _Tool(_Lax):
    type: Literal["function"] = "function"
    function: _Function


class _NamedFunction(_Lax):
    name: str


class _NamedToolChoice(_Lax):
    function: _NamedFunction
    type: Literal["function"] = "function"


class _JsonSchemaFormat(_Lax):
    name: str
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class _ResponseFormat(_Lax):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: _JsonSchemaFormat | None = None


class _Fields(_Lax):
    """vLLM's types for the fields of ``ChatCompletionRequest`` a client commonly sends."""

    model: str | None = None
    frequency_penalty: float | None = 0.0
    presence_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int | None = 1
    response_format: _ResponseFormat | None = None
    seed: int | None = Field(default=None, ge=-_LONG, le=_LONG - 1)
    stream: bool | None = False
    stream_options: _StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[_Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | _NamedToolChoice | None = "none"
    parallel_tool_calls: bool | None = False
    user: str | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    stop_token_ids: list[int] | None = None
    prompt_logprobs: int | None = None
    echo: bool = False
    add_generation_prompt: bool = True


#: Fields whose coerced value replaces the client's in the body (the others are only checked).
_WRITTEN_BACK = (
    "logprobs", "top_logprobs", "max_tokens", "max_completion_tokens", "n", "stream", "ignore_eos",
    "min_tokens", "include_stop_str_in_output", "prompt_logprobs", "echo", "add_generation_prompt",
)  # fmt: skip

#: SamplingParams' ranges, with vLLM's words (its ``_verify_args``).
_RANGES: tuple[tuple[str, float, float, bool, str], ...] = (
    ("temperature", 0.0, float("inf"), True, "temperature must be non-negative, got {}"),
    ("top_p", 0.0, 1.0, False, "top_p must be in (0, 1], got {}"),
    ("presence_penalty", -2.0, 2.0, True, "presence_penalty must be in [-2, 2], got {}"),
    ("frequency_penalty", -2.0, 2.0, True, "frequency_penalty must be in [-2, 2], got {}"),
    ("repetition_penalty", 0.0, 2.0, False, "repetition_penalty must be in (0, 2], got {}"),
    ("min_p", 0.0, 1.0, True, "min_p must be in [0, 1], got {}"),
)


def _described(exc: ValidationError) -> str:
    """pydantic's errors as one line each, ``field.path: message``, as vLLM's 400 lists them."""
    lines = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"])
        lines.append(f"{where}: {error['msg']}")
    return f"{len(lines)} validation error(s) in the request: " + "; ".join(lines)


def checked_fields(body: dict[str, Any]) -> None:
    """Check ``body``'s typed fields as vLLM does (400 with pydantic's words, or SamplingParams' for a
    value out of range) and write back the coerced values serve-sim goes on to read; ``stream_options``
    comes back with vLLM's defaults filled in."""
    # vLLM's "before" validators, which run ahead of the field types
    if body.get("stream_options") and not body.get("stream"):
        raise BadRequest("Stream options can only be defined when `stream=True`.")
    choice = body.get("tool_choice", "auto" if body.get("tools") else None)  # vLLM's default with tools
    if choice not in (None, "none") and body.get("tools") is None:
        raise BadRequest("When using `tool_choice`, `tools` must be set.")
    try:
        fields = _Fields.model_validate(body)
    except ValidationError as exc:
        raise BadRequest(_described(exc)) from exc
    for name, low, high, closed_low, message in _RANGES:
        value = getattr(fields, name)
        if value is not None and not (low <= value <= high if closed_low else low < value <= high):
            raise BadRequest(message.format(value))
    sent = fields.model_fields_set
    for name in _WRITTEN_BACK:
        if name in sent:
            body[name] = getattr(fields, name)
    options = fields.stream_options
    body["stream_options"] = options.model_dump() if options is not None and fields.stream else None
