"""How the batching server model's front ends size a chat request: characters ÷ ``chars_per_token``.

One rule for both front ends of :class:`~asyncroll.backends.server_model.BatchingServer`: ``serve-sim``
applies it to the messages an HTTP client sends, and the simulator's server backend
(:mod:`asyncroll.backends.simulated`) to the messages the HTTP client's own code renders for the same
turn (:func:`~asyncroll.backends.action_schema.render_messages`: the system prompt with the turn's schema
and tool list, then the conversation). A turn therefore costs the same prefill through either, where
the HTTP client renders the model's earlier turns from their actions (``--replay``; an agent's turns go
back as the text the model wrote, which a script does not hold). Kept free of the HTTP stack, which the
simulator does not load.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction
from functools import lru_cache
from typing import Any

#: The fewest characters per token either front end accepts: fewer would turn a prompt into more tokens
#: than a float can count (``math.ceil`` of an infinite quotient raises), so every request would fail.
MIN_CHARS_PER_TOKEN = 0.01


def content_chars(messages: Iterable[Mapping[str, Any]]) -> int:
    """Characters of every message's content, as :func:`text_of` reads it."""
    return sum(len(text_of(message.get("content"))) for message in messages)


def text_of(content: Any) -> str:
    """A message's content as text: a string, or a list of parts whose texts vLLM joins with a newline
    into the prompt (``chat_utils.py``, the "string" content format most chat templates take): a text
    part's ``text``, a ``refusal`` part's ``refusal``, a ``thinking`` part's ``thinking``, a plain-string
    part whole.

    Anything else (a missing or null content, an image part) is no text here; serve-sim refuses a
    malformed message before it sizes one."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict):
            text = part.get(_TEXT_KEYS.get(part.get("type"), "text"))
            if isinstance(text, str):
                texts.append(text)
    return "\n".join(texts)


#: Part types whose text is not under ``text``.
_TEXT_KEYS: dict[Any, str] = {"refusal": "refusal", "thinking": "thinking"}


@lru_cache(maxsize=64)
def _ratio(chars_per_token: float) -> tuple[int, int]:
    """``chars_per_token`` as the decimal it was written as (its shortest repr), numerator and
    denominator: 0.7 is 7/10, not the float just below it, by which 21 characters were 31 tokens."""
    exact = Fraction(repr(float(chars_per_token)))
    return exact.numerator, exact.denominator


def tokens(chars: int, chars_per_token: float) -> int:
    """``chars`` as tokens: rounded up, at least one (an empty prompt or reply still takes a token).
    Exact: 21 characters at 0.7 are 30 tokens (21 / 0.7 in floats is 30.000000000000004)."""
    numerator, denominator = _ratio(chars_per_token)
    return max(1, -(-chars * denominator // numerator))


def chars(tokens: int, chars_per_token: float) -> int:
    """The most characters ``tokens`` tokens hold (rounded down; exact, as :func:`tokens`)."""
    numerator, denominator = _ratio(chars_per_token)
    return tokens * numerator // denominator


def prompt_tokens(messages: Iterable[Mapping[str, Any]], chars_per_token: float) -> int:
    """The prompt tokens of a chat request: its messages' content characters as :func:`tokens`."""
    return tokens(content_chars(messages), chars_per_token)
