"""Per-turn action schemas (SPEC §7), the chat rendering of a conversation, and parsing of model output.

The schema a turn asks the server to enforce:

* code workloads (``protocol == "one_repair"``) → ``{"type": "submit", "code": str}``;
* turn 0 of a problem with tools → ``anyOf`` of one branch per tool:
  ``{"type": "tool", "name": <const>, "arguments": {<typed inputs not bound by the workload>}}``;
* otherwise → ``{"type": "final", "answer": str}``.

Every object is closed (``additionalProperties: false``) and lists every property as required. The
keywords are the subset that xgrammar and llguidance, the grammar engines of vLLM and SGLang, both compile
and enforce (``scripts/grammar_check.py`` checks them); OpenAI's hosted ``strict: true`` is narrower (no
``anyOf`` at the root, no ``patternProperties``), and outlines has no ``patternProperties``
(docs/SERVERS.md, "Grammar engines"). Parsing checks the model's text against the same schema before
it becomes an :data:`~asyncroll.workload.Action`, so a server that does not enforce the schema (``transformers
serve``) fails the request visibly with :class:`InvalidActionError`.
"""

from __future__ import annotations

import copy
import json
import math
import re
from functools import lru_cache
from typing import Any

import jsonschema
from pydantic import TypeAdapter, ValidationError

from asyncroll.coerce import INT_KEY_PATTERN, CoercionError, canonical_type, coerce_arguments
from asyncroll.errors import InvalidActionError
from asyncroll.json_checks import LONE_SURROGATE, lone_surrogate_at
from asyncroll.json_depth import JsonTooDeep, json_loads
from asyncroll.workload import Action, Problem, SubmitAction, Tool, ToolAction

SCHEMA_NAME = "agent_action"

#: Declared input type (``asyncroll.coerce.TYPE_NAMES``) → JSON Schema.
_INPUT_SCHEMAS: dict[str, dict[str, Any]] = {
    "str": {"type": "string"},
    "int": {"type": "integer"},
    "float": {"type": "number"},
    "number": {"type": "number"},
    "bool": {"type": "boolean"},
    # The keys' form as ``patternProperties``, not the equivalent ``propertyNames`` + typed
    # ``additionalProperties``: llguidance refuses ``propertyNames`` (vLLM's fallback from xgrammar
    # answers such a request with 400) and xgrammar before 0.2.7 drops the value type beside it.
    "dict[int,int]": {
        "type": "object",
        "patternProperties": {INT_KEY_PATTERN: {"type": "integer"}},
        "additionalProperties": False,
    },
    "list[int]": {"type": "array", "items": {"type": "integer"}},
    "list[float]": {"type": "array", "items": {"type": "number"}},
    "list[list[int]]": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
    "list[list[float]]": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
}
_ACTION: TypeAdapter[Any] = TypeAdapter(Action)
_FENCE = re.compile(r"^\s*```[A-Za-z0-9_+-]*[ \t\r]*\n(.*?)\n?```\s*$", re.DOTALL)
#: A fence line inside what _FENCE matched: the text starts and ends with a fence but holds more blocks.
_INNER_FENCE = re.compile(r"^[ \t]*```", re.MULTILINE)
#: Fields of a scripted action that describe the simulation, never what a model writes.
SCRIPT_ONLY_FIELDS = ("latency_ms", "output_tokens", "cpu_ms", "passes", "raises", "worker_dies")


def _closed(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def tool_schema(tool: Tool) -> dict[str, Any]:
    """One ``anyOf`` branch: a call of ``tool`` with its typed, unbound arguments."""
    inputs = {
        name: copy.deepcopy(_INPUT_SCHEMAS[canonical_type(type_name)])
        for name, type_name in tool.declared_inputs.items()
        if name not in tool.bound_arguments
    }
    return _closed({"type": {"const": "tool"}, "name": {"const": tool.name}, "arguments": _closed(inputs)})


def is_code_workload(problem: Problem) -> bool:
    return problem.protocol == "one_repair"


def turn_schema(problem: Problem, turn: int) -> dict[str, Any]:
    """The JSON Schema of the one action this turn may produce (see the module docstring)."""
    if is_code_workload(problem):
        return _closed({"type": {"const": "submit"}, "code": {"type": "string"}})
    if turn == 0 and problem.tools:
        return {"anyOf": [tool_schema(tool) for tool in problem.tools]}
    return final_schema()


def final_schema() -> dict[str, Any]:
    """The schema of a ``final`` action: any turn's with no tool call or code due, and the warm-up's."""
    return _closed({"type": {"const": "final"}, "answer": {"type": "string"}})


def response_format(schema: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI ``response_format`` field asking for ``schema`` (SPEC §7)."""
    return {"type": "json_schema", "json_schema": {"name": SCHEMA_NAME, "strict": True, "schema": schema}}


def model_view(action: Any) -> dict[str, Any]:
    """What a model would have written for ``action``: no simulation-only fields, no nulls."""
    data: dict[str, Any] = action.model_dump(exclude_none=True)
    for key in SCRIPT_ONLY_FIELDS:
        data.pop(key, None)
    return data


def system_prompt(problem: Problem, turn_schema_: dict[str, Any]) -> str:
    """Instructions that tell a model the action format (needed when the server does not enforce it)."""
    lines = [
        "You are an agent. Reply with exactly one JSON object and nothing else, matching this JSON Schema:",
        json.dumps(turn_schema_, separators=(",", ":")),
    ]
    if problem.tools:
        lines.append("Tools:")
        lines += [f"- {t.name}: {t.description or 'no description'}" for t in problem.tools]
    return "\n".join(lines)


#: The key under which a conversation's assistant entry keeps its rendered text (:func:`render_message`).
RENDERED = "rendered"


def render_messages(problem: Problem, messages: list[dict[str, Any]], turn: int) -> list[dict[str, str]]:
    """asyncroll's conversation → OpenAI chat messages.

    Assistant turns become the reply the server sent, exactly as written, where the action was read from
    it; otherwise (a replay, whose action is the script's; the scripted and simulated backends) their
    action as JSON, or a code workload's program. Tool observations become user messages prefixed
    ``Tool result:`` (no native tool calling: the action protocol is JSON text, which every
    OpenAI-compatible server supports)."""
    code = is_code_workload(problem)
    out: list[dict[str, str]] = []
    if not code:
        out.append({"role": "system", "content": system_prompt(problem, turn_schema(problem, turn))})
    out += [render_message(message, code) for message in messages]
    return out


def render_message(message: dict[str, Any], code: bool) -> dict[str, str]:
    """One entry of asyncroll's conversation as :func:`render_messages` sends it (``code``: the problem
    is a code workload's, :func:`is_code_workload`). It depends on that entry alone, so a client that
    sizes every turn's prompt can size each entry once (:mod:`asyncroll.backends.simulated`). An
    assistant entry rendered from its action keeps that text in the entry (``RENDERED``): every later
    turn sends it again, and rendering it anew each time made a trajectory of n turns cost O(n²)."""
    role = message.get("role")
    if role == "assistant":
        response = message.get("response")
        if response is not None and response.read_from_text and response.text is not None:
            return {"role": "assistant", "content": response.text}
        kept = message.get(RENDERED)
        if kept is None or kept[0] != code:
            action = message["action"]
            submitted = isinstance(action, SubmitAction) and code
            kept = message[RENDERED] = (code, action.code if submitted else json.dumps(model_view(action)))
        return {"role": "assistant", "content": kept[1]}
    if role == "tool":
        return {"role": "user", "content": f"Tool result: {message.get('content', '')}"}
    return {"role": str(role or "user"), "content": str(message.get("content", ""))}


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> jsonschema.protocols.Validator:
    schema = json_loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema)


def schema_errors(instance: Any, schema: dict[str, Any]) -> list[str]:
    """Every way ``instance`` violates ``schema`` (empty when it conforms), best match first."""
    validator = _validator(json.dumps(schema, sort_keys=True))
    errors: list[Any] = []
    for err in sorted(validator.iter_errors(instance), key=jsonschema.exceptions.relevance):
        errors += _tool_branch_errors(err)
    out = []
    for err in errors[:5]:
        if isinstance(err, str):
            out.append(err)
            continue
        path = "".join(f"[{p!r}]" for p in err.absolute_path) or "(root)"
        out.append(f"{path}: {err.message}"[:300])
    return out


def _tool_branch_errors(err: Any) -> list[Any]:
    """A tool call that fits no branch of the turn's ``anyOf`` is said to be "not valid under any of the
    given schemas", whatever is wrong with it: instead, the errors of the branch of the tool it names,
    that the name is no tool of the problem's, or that the turn wants a tool call. Any other error as it
    is."""
    call = err.instance
    if err.validator != "anyOf" or not isinstance(call, dict):
        return [err]
    if call.get("type") != "tool":  # the first turn of a problem with tools
        return [f"['type']: {call.get('type')!r} where this turn takes a tool call"[:300]]
    names = [branch.get("properties", {}).get("name", {}).get("const") for branch in err.validator_value]
    if call.get("name") in names:
        index = names.index(call.get("name"))
        return [e for e in err.context if e.relative_schema_path and e.relative_schema_path[0] == index]
    tools = ", ".join(repr(name) for name in names)
    return [f"['name']: {call.get('name')!r} is not a tool of this problem (its tools: {tools})"[:300]]


def strip_fence(text: str) -> str:
    """Remove one Markdown code fence around the whole text, if there is exactly that."""
    match = _FENCE.match(text)
    return match.group(1) if match else text


def extract_source(text: str) -> str:
    """A code reply's program: inside one fence around the whole reply; else, where two or more lines hold
    a fence (prose around a fenced program), between the last two of them, as LiveCodeBench's
    ``extract_code`` reads a reply; else the whole reply, as plain source."""
    match = _FENCE.match(text)
    if match and not _INNER_FENCE.search(match.group(1)):
        return match.group(1)
    lines = text.split("\n")
    fences = [i for i, line in enumerate(lines) if "```" in line]
    return "\n".join(lines[fences[-2] + 1 : fences[-1]]) if len(fences) >= 2 else text


def _not_json(constant: str) -> Any:
    """Python's JSON reader accepts ``NaN``, ``Infinity`` and ``-Infinity``; JSON has no such numbers."""
    raise ValueError(f"{constant} is not a JSON number")


class _TooLargeNumber(ValueError):
    pass


def _finite_float(text: str) -> float:
    """``json``'s ``parse_float``: a number past a float's range (``1e999``) reads as infinity, silently; the
    tool then ran with ``inf`` and the transcript recorded it as ``Infinity`` (not JSON) or ``null``."""
    value = float(text)
    if math.isinf(value):
        raise _TooLargeNumber(text if len(text) <= 40 else f"{text[:37]}...")
    return value


def parse_action(text: str | None, schema: dict[str, Any], *, structured: bool, code: bool) -> Action:
    """Turn a model's reply into an action, or raise :class:`InvalidActionError` saying why.

    ``structured=False`` with a code workload accepts plain source, or a fenced program with prose around
    it (:func:`extract_source`), as a ``submit``; every other case requires one JSON object that conforms to
    the turn's ``schema``."""
    if text is None:
        raise InvalidActionError("the response has no message content")
    if not isinstance(text, str):  # the HTTP backend reads text parts; a caller passing anything else
        raise InvalidActionError(f"the response's content is {type(text).__name__}, not text")
    if code and not structured:
        source = extract_source(text)
        if not source.strip():
            raise InvalidActionError("the response holds no source code")
        return SubmitAction(type="submit", code=source)
    body = text if structured else strip_fence(text)
    try:
        data = json_loads(body, parse_constant=_not_json, parse_float=_finite_float)
    except _TooLargeNumber as exc:
        raise InvalidActionError(
            f"the action holds the number {exc}, too large for a 64-bit float (it would read as infinity)"
        ) from exc
    except JsonTooDeep as exc:  # valid JSON, refused: nested deeper than any action needs
        raise InvalidActionError(f"the response is refused ({exc}): {text[:200]!r}") from exc
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, an int past the digit limit
        raise InvalidActionError(f"the response is not JSON ({exc}): {text[:200]!r}") from exc
    # "\ud800" is valid JSON text that decodes to a string no UTF-8 write accepts: taken, it failed the
    # whole run where the action's text is encoded (a submission's code, for one)
    if "\\u" in body and (where := lone_surrogate_at(data)) is not None:
        place = "action" if where == "line" else f"action's {where}"  # "line": the root or a root key
        raise InvalidActionError(f"the {place} is {LONE_SURROGATE}")
    try:
        problems = schema_errors(data, schema)
    except RecursionError as exc:
        raise InvalidActionError("the action is nested too deeply to check against the schema") from exc
    if problems:
        raise InvalidActionError("the action does not match the turn's schema: " + "; ".join(problems))
    try:
        action: Action = _ACTION.validate_python(data)
    except (ValidationError, RecursionError) as exc:
        detail = exc.errors(include_url=False) if isinstance(exc, ValidationError) else "nested too deeply"
        raise InvalidActionError(f"the action does not validate: {detail}") from exc
    if isinstance(action, SubmitAction) and _FENCE.match(action.code):
        # a program in one fence inside the JSON (a chat model's habit): no Python starts with one
        return SubmitAction(type="submit", code=extract_source(action.code))
    return action


def tool_call(problem: Problem, action: ToolAction) -> tuple[Tool, dict[str, Any]]:
    """The tool ``action`` calls and its arguments coerced to the declared inputs (bound ones added), or
    :class:`InvalidActionError`. The schema leaves a few values through that coercion refuses (an
    integer too large for a ``float``): the HTTP backend checks here too, so that such a reply is an
    invalid response of its request, counted as one, not a valid one whose trajectory then fails."""
    tool = problem.tool(action.name)
    if tool is None:
        raise InvalidActionError(f"unknown tool {action.name!r}")
    try:
        return tool, coerce_arguments(action.arguments, tool.declared_inputs, tool.bound_arguments)
    except CoercionError as exc:
        raise InvalidActionError(f"tool {action.name!r} arguments{exc.path}: {exc.message}") from exc
