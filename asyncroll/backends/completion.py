"""Reading the body of a 2xx (success) chat completion: what asyncroll uses of it, and nothing else raised.

Whatever a 2xx body holds, :func:`read_completion` returns a :class:`Completion` or raises
:class:`NotACompletion` naming what is wrong (the backend records it as ``bad_response`` for that request
only). A message ``content`` given as a list of text parts is joined, as OpenAI-compatible servers mean
it; a ``usage`` that is not an object, or token counts that are not non-negative integers, give
``None`` counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson


def _int_or_none(value: Any) -> int | None:
    """A token count: a non-negative integer, else ``None`` (missing, never a made-up number)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class NotACompletion(ValueError):
    """A 2xx body that is not an OpenAI chat completion; the message says what is wrong with it."""


@dataclass(frozen=True, slots=True)
class Completion:
    """What asyncroll reads of a chat completion: the first choice's text and the token usage."""

    content: str | None
    finish_reason: Any
    prompt_tokens: int | None
    completion_tokens: int | None
    tool_calls: bool = False  # the message carries native ``tool_calls`` (which asyncroll does not read)
    refusal: str | None = None  # OpenAI's structured-output refusal (``message.refusal``)
    reasoning_only: bool = False  # no content, but reasoning (``reasoning_content`` or ``reasoning``)

    @property
    def finish_reason_text(self) -> str | None:
        """``finish_reason`` as the events record it: a string (cut to 100 characters), else None."""
        return self.finish_reason[:100] if isinstance(self.finish_reason, str) else None

    def why_invalid(self) -> str:
        """What the rest of the reply says about why its content is no action, as a note to append to
        the error (empty when nothing does)."""
        if self.finish_reason == "length":
            return " (finish_reason=length: max_tokens cut it short)"
        if self.tool_calls:
            return (
                f" (the server answered with native tool_calls, finish_reason={self._reason_shown()}: "
                "asyncroll reads actions as JSON text in the message content; serve the model without "
                "automatic tool choice)"
            )
        if self.refusal is not None:
            return f" (the model refused: {self.refusal[:300]!r})"
        if self.reasoning_only:
            return " (the message has reasoning but no content: no answer followed the reasoning)"
        if self.finish_reason not in (None, "stop"):  # content_filter, say: the server's why
            return f" (finish_reason={self._reason_shown()})"
        return ""

    def _reason_shown(self) -> str:
        """``finish_reason`` quoted for a message, cut to 100 characters: the server sets it, and one of
        megabytes would be written whole into the error that events and results keep."""
        return "None" if self.finish_reason is None else repr(str(self.finish_reason)[:100])


def _json_kind(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def _quoted(value: Any) -> str:
    """``value`` quoted for a message, at most 100 characters of it: the server writes it, and one of
    megabytes would be kept whole in the error that events and results hold."""
    return repr(value[:100]) if isinstance(value, str) else repr(value)[:100]


def message_text(content: Any) -> str | None:
    """A message's ``content`` as text: a string as is, ``null`` as None, a list of text parts
    (``[{"type": "text", "text": ...}, ...]``, as some OpenAI-compatible servers send) joined in order.
    Anything else raises :class:`NotACompletion`."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        kind = _json_kind(content)
        raise NotACompletion(
            f"choices[0].message.content is a JSON {kind}, not a string or a list of text parts"
        )
    texts: list[str] = []
    for i, part in enumerate(content):
        if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
            what = _quoted(part.get("type")) if isinstance(part, dict) else f"a JSON {_json_kind(part)}"
            raise NotACompletion(f"choices[0].message.content[{i}] is not a text part (type {what})")
        texts.append(part["text"])
    return "".join(texts)


def read_completion(payload: bytes) -> Completion:
    """The parts of a 2xx body asyncroll uses. Raises :class:`NotACompletion` (and nothing else) when
    the body is not a chat completion: not JSON, not an object, no ``choices`` list, a first choice
    without a ``message`` object, or a ``content`` that is neither text nor text parts. A ``usage``
    that is not an object, or token counts that are not integers, give ``None`` counts."""
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise NotACompletion(f"not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise NotACompletion(f"a JSON {_json_kind(data)}, not an object")
    choices = data.get("choices")
    if not isinstance(choices, list):
        raise NotACompletion(
            "no choices list" if choices is None else f"choices is a JSON {_json_kind(choices)}"
        )
    if not choices:
        raise NotACompletion("choices is empty")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise NotACompletion(f"choices[0] is a JSON {_json_kind(choice)}, not an object")
    message = choice.get("message")
    if not isinstance(message, dict):
        what = "missing" if message is None else f"a JSON {_json_kind(message)}"
        raise NotACompletion(f"choices[0].message is {what}, not an object")
    content = message_text(message.get("content"))
    usage = data.get("usage")
    if not isinstance(usage, dict):
        usage = {}
    refusal = message.get("refusal")
    reasoning = any(
        isinstance(message.get(k), str) and message[k] for k in ("reasoning_content", "reasoning")
    )
    return Completion(
        content,
        choice.get("finish_reason"),
        _int_or_none(usage.get("prompt_tokens")),
        _int_or_none(usage.get("completion_tokens")),
        bool(message.get("tool_calls")),
        refusal if isinstance(refusal, str) and refusal else None,
        reasoning and not (content or "").strip(),
    )
