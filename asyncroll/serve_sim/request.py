"""A chat completions request body as serve-sim reads it: parsed, checked, and refused with an OpenAI
error object (400, or 404 for an unknown model) where it asks for what the simulator cannot honour."""

from __future__ import annotations

import functools
import json
from typing import Any

import jsonschema
import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from asyncroll.serve_sim.sizes import text_of


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


def error_body(message: str, status: int, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


SERVED = (
    "POST /v1/chat/completions, GET /v1/models, /health, /version, /metrics, /sim/stats, "
    "POST /sim/reset-stats"
)


async def no_route(request: Request, exc: Exception) -> JSONResponse:
    """A path or method serve-sim does not serve (``/v1/completions``, ``/v1/embeddings``, a GET of the chat
    path): an OpenAI error object naming it and what is served, as vLLM answers its own with an error
    object. It was a bare ``Not Found`` in plain text, which the ``openai`` client showed as ``Error code:
    404`` and nothing more."""
    status = exc.status_code if isinstance(exc, HTTPException) else 404
    headers = exc.headers if isinstance(exc, HTTPException) else None
    if status == 405:
        allowed = (headers or {}).get("Allow")
        message = f"{request.method} {request.url.path} is not allowed here (allowed: {allowed})"
        kind = "MethodNotAllowedError"
    else:
        message = f"serve-sim does not serve {request.method} {request.url.path}; it serves {SERVED}"
        kind = "NotFoundError"
    return JSONResponse(error_body(message, status, kind), status, headers)


def validator(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    return _cached_validator(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))


@functools.lru_cache(maxsize=1024)
def _cached_validator(schema_json: bytes) -> jsonschema.protocols.Validator:
    """Agents send the same few schemas over and over: check each against its metaschema once."""
    schema = orjson.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def check_media_type(content_type: str | None) -> None:
    """vLLM refuses a body not sent as ``application/json`` (a form-encoded ``curl -d`` included) with a 400
    in these words, before reading it; answering it anyway hid the client's mistake until it met vLLM."""
    if (content_type or "").split(";", 1)[0].strip().lower() != "application/json":
        raise BadRequest("Unsupported Media Type: Only 'application/json' is allowed")


def parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


#: The content part types vLLM's chat parser knows (``MM_PARSER_MAP`` in vllm/entrypoints/chat_utils.py):
#: any other is its 400. serve-sim sizes the text of ``text``/``input_text``/``output_text``/``refusal``/
#: ``thinking`` parts and of plain-string parts; the others count nothing (serve-sim has no images or
#: audio to count).
PART_TYPES = frozenset(
    {
        "text", "input_text", "output_text", "refusal", "thinking", "image_url", "input_image", "image_pil",
        "image_embeds", "audio_embeds", "prompt_embeds", "audio_url", "input_audio", "video_url",
        "tool_reference",
    }
)  # fmt: skip
#: A part without ``type`` is taken by the media field it holds, as vLLM takes it.
_UNTYPED_KEYS = ("image_url", "image_pil", "image_embeds", "audio_embeds", "prompt_embeds", "audio_url",
                 "input_audio", "video_url", "tool_reference")  # fmt: skip


#: The roles whose message may say ``"content": null``: vLLM's message types (the OpenAI ones and its own
#: custom-role one, ``vllm/entrypoints/chat_utils.py``) allow null only in an assistant message (one with
#: ``tool_calls``) and the legacy function one; any other is its 400. A message without ``content`` is
#: another matter: the custom-role type lets it out.
NULL_CONTENT_ROLES = frozenset({"assistant", "function"})


def checked_messages(messages: Any) -> list[dict[str, Any]]:
    """The request's messages, checked before :func:`~asyncroll.serve_sim.sizes.prompt_tokens` sizes them.

    Content is a string, a list of parts (objects with a known ``type``, vLLM's 400 naming an unknown one,
    or plain strings, which vLLM reads as text parts), absent, or null where vLLM allows it."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string 'role'")
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise BadRequest(f"messages[{i}].content must be a string, a list of parts or null")
        if content is None and "content" in message and message["role"] not in NULL_CONTENT_ROLES:
            raise BadRequest(
                f"messages[{i}].content may be null only in an assistant (or function) message, as vLLM's "
                f"message types allow it; a {_shown(message['role'])} message needs a string or parts"
            )
        for j, part in enumerate(content if isinstance(content, list) else ()):
            _check_part(part, f"messages[{i}].content[{j}]")
    return messages


def _check_part(part: Any, where: str) -> None:
    if isinstance(part, str):
        return
    if not isinstance(part, dict):  # sizing would count it as nothing; vLLM refuses it too
        raise BadRequest(f"{where} must be an object (a content part) or a string")
    kind = part.get("type")
    if kind is None:
        if not any(key in part for key in _UNTYPED_KEYS):
            raise BadRequest(f"Missing 'type' field in multimodal part ({where}).")
    elif not isinstance(kind, str):
        raise BadRequest(f"Invalid 'type' field in multimodal part ({where}).")
    elif kind not in PART_TYPES:
        raise BadRequest(
            f"Unsupported chat content part type: {kind!r} ({where}). Supported types: "
            f"{', '.join(sorted(PART_TYPES))}."
        )
    elif kind in ("text", "input_text", "output_text") and not isinstance(part.get("text"), str | None):
        raise BadRequest(f"{where}.text must be a string")


#: vLLM's own structured-output fields (``extra_body``): serve-sim draws replies for ``response_format`` only
_GUIDED = (
    "guided_json", "guided_regex", "guided_choice", "guided_grammar", "structural_tag", "structured_outputs",
)  # fmt: skip


def refuse_unsupported(body: dict[str, Any]) -> None:
    """A 400 naming the field for what an OpenAI client may ask and serve-sim cannot give: more than one
    choice, a forced native tool call, vLLM's own structured-output fields, log-probabilities (the
    prompt's too: vLLM's ``prompt_logprobs`` puts them in its reply). Ignoring them answered a reply that
    silently lacked them."""
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise BadRequest(f"serve-sim answers one choice: 'n' must be 1 or absent, got {_shown(n)}")
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise BadRequest(
            "serve-sim calls no tools natively (its replies are text, never tool_calls): 'tool_choice' must "
            f'be "auto", "none" or absent, got {_shown(choice)}'
        )
    for name in _GUIDED:
        if body.get(name) is not None:
            raise BadRequest(
                f"serve-sim constrains replies only by 'response_format' (json_schema or json_object): "
                f"'{name}' (vLLM's own structured-output field) must be absent, got {_shown(body[name])}"
            )
    for name, allowed in (
        ("logprobs", (None, False)),
        ("top_logprobs", (None, 0)),
        ("prompt_logprobs", (None,)),
    ):
        value = body.get(name)
        if value not in allowed:
            raise BadRequest(
                f"serve-sim computes no log-probabilities: '{name}' must be {_shown(allowed[-1])} or "
                f"absent, got {_shown(value)}"
            )


def reply_role_and_echo(body: dict[str, Any], messages: list[dict[str, Any]]) -> tuple[str, str]:
    """The reply's role and the text vLLM's ``echo`` puts before it (``serving_chat.py``): the role is
    ``assistant``, or with ``add_generation_prompt`` false the last message's (the model continues it);
    with ``echo`` the last message's text comes first when its role is the reply's, else nothing."""
    role = "assistant" if body.get("add_generation_prompt", True) else messages[-1]["role"]
    last = messages[-1]
    echo = text_of(last.get("content")) if body.get("echo") and last["role"] == role else ""
    return role, echo


def _shown(value: Any) -> str:
    """A request's JSON value as the client wrote it, cut short: an error message quotes it."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def lengths(body: dict[str, Any], room: int) -> tuple[int, int, bool]:
    def positive(name: str, default: int | None, minimum: int) -> int | None:
        value = body.get(name, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise BadRequest(f"'{name}' must be an integer >= {minimum}, got {value!r}")
        return value

    # both are checked; OpenAI deprecated `max_tokens` for `max_completion_tokens`, and vLLM and SGLang take
    # the new one when a client sends both
    legacy, current = positive("max_tokens", None, 1), positive("max_completion_tokens", None, 1)
    requested = current if current is not None else legacy
    max_tokens = requested if requested is not None else max(1, room)
    min_tokens = positive("min_tokens", 0, 0) or 0
    if min_tokens > max_tokens:
        raise BadRequest(f"'min_tokens' ({min_tokens}) must be <= 'max_tokens' ({max_tokens})")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise BadRequest(f"'ignore_eos' must be a boolean, got {ignore_eos!r}")
    return max_tokens, min_tokens, ignore_eos


def stop_strings(value: Any) -> tuple[str, ...]:
    """The request's ``stop``: a string or a list of them (none: ``null`` or ``[]``); an empty one is a 400,
    as in vLLM."""
    stops = [value] if isinstance(value, str) else value if isinstance(value, list) else None
    if value is not None and (stops is None or not all(isinstance(s, str) for s in stops)):
        raise BadRequest(f"'stop' must be a string or a list of strings, got {_shown(value)}")
    if "" in (stops or ()):
        raise BadRequest("'stop' cannot contain an empty string")
    return tuple(stops or ())


def first_stop(content: str, stops: tuple[str, ...], honoured: Any) -> tuple[int, int] | None:
    """Where the reply meets a stop string first (its start and end characters), as vLLM stops there: the
    occurrence that ends first among those ``honoured(end)`` accepts (vLLM looks for stop strings only
    once ``min_tokens`` are out); None if it meets none."""
    best: tuple[int, int] | None = None
    for stop in stops:
        at = content.find(stop)
        while at >= 0 and not honoured(at + len(stop)):
            at = content.find(stop, at + 1)
        if at >= 0 and (best is None or at + len(stop) < best[1]):
            best = (at, at + len(stop))
    return best


def response_schema(fmt: Any) -> dict[str, Any] | None:
    """The JSON schema a ``response_format`` asks for (None for text/json_object); 400 if malformed."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise BadRequest("'response_format.type' must be text, json_object or json_schema")
    if fmt["type"] != "json_schema":
        return None
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise BadRequest("'response_format.json_schema.schema' must be a JSON object")
    schema: dict[str, Any] = spec["schema"]
    try:
        validator(schema)
    except jsonschema.SchemaError as exc:
        raise BadRequest(f"'response_format' holds an invalid JSON schema: {exc.message}") from exc
    except (RecursionError, orjson.JSONEncodeError) as exc:  # past Python's or orjson's depth limit
        raise BadRequest(f"'response_format' holds a JSON schema nested too deeply to check: {exc}") from exc
    return schema
