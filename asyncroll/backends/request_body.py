"""What one request to an OpenAI-compatible server says: the ``/v1/chat/completions`` body of a turn or
of a warm-up request, and the scripted action's echo header in replay (``X-Asyncroll-Action``, which
``asyncroll serve-sim`` reads and every other server ignores).

In replay the server does real work of the scripted size: ``max_tokens`` = the action's
``output_tokens`` (else ``--max-tokens``), plus ``min_tokens``/``ignore_eos`` on vLLM and SGLang, or a
fixed length in ``generation_config`` on ``transformers serve`` (``min_new_tokens`` and no ``eos_token_id``;
:data:`REPLAY_FIXED_LENGTH` names how, for run.json). In agent mode with structured output the body carries
the turn's JSON schema.
"""

from __future__ import annotations

import json
from typing import Any

from asyncroll.backends.action_schema import (
    final_schema,
    model_view,
    render_messages,
    response_format,
    turn_schema,
)
from asyncroll.backends.base import ModelRequest
from asyncroll.backends.http_settings import HttpSettings
from asyncroll.config import ServerKind
from asyncroll.workload import Action

ACTION_HEADER = "x-asyncroll-action"
#: Larger scripted actions (long code) are not echoed: the reply's content is unused in replay anyway.
MAX_ACTION_HEADER = 8192

#: How a replayed turn's length is fixed on each server kind (run.json's ``replay_fixed_length``).
REPLAY_FIXED_LENGTH = {
    "vllm": "min_tokens + ignore_eos",
    "sglang": "min_tokens + ignore_eos",
    "transformers": "generation_config min_new_tokens/max_new_tokens + eos_token_id []",
    "generic": "none: max_tokens is an upper bound only",
}


def chat_body(
    s: HttpSettings, kind: ServerKind | None, request: ModelRequest, scripted: Action | None
) -> dict[str, Any]:
    """The body of one turn's request; ``scripted``: the replayed action (None in agent mode)."""
    body: dict[str, Any] = {
        "model": s.model,
        "messages": render_messages(request.problem, request.messages, request.turn),
        "temperature": 0,
        "max_tokens": s.max_tokens,
        "seed": s.seed,
    }
    if scripted is not None:
        fix_length(body, kind, scripted.output_tokens or s.max_tokens)
    elif s.structured:
        body["response_format"] = response_format(turn_schema(request.problem, request.turn))
    return body


def fix_length(body: dict[str, Any], kind: ServerKind | None, budget: int) -> None:
    """Ask ``kind`` to decode exactly ``budget`` tokens (replay), as :data:`REPLAY_FIXED_LENGTH` says."""
    body["max_tokens"] = budget
    if kind in ("vllm", "sglang"):
        body["min_tokens"] = budget
        body["ignore_eos"] = True
    elif kind == "transformers":
        # continuous batching (--continuous-batching) drops min_new_tokens but takes eos_token_id: with no
        # end-of-sequence token the decode runs to max_new_tokens on both of its paths (transformers 5.25)
        fixed = {"max_new_tokens": budget, "min_new_tokens": budget, "eos_token_id": []}
        body["generation_config"] = json.dumps(fixed)


def action_headers(scripted: Action | None) -> dict[str, str]:
    """The replayed action's echo header, when it fits (servers cap header sizes: h11 16 KiB in all)."""
    if scripted is None:
        return {}
    echo = json.dumps(model_view(scripted))
    return {ACTION_HEADER: echo} if len(echo) <= MAX_ACTION_HEADER else {}


def warmup_body(s: HttpSettings, kind: ServerKind | None = None) -> dict[str, Any]:
    """A small untimed request, shaped like the run's own: their schema when they carry one, their fixed
    decode length in replay (a server that refuses those fields, as ``transformers serve`` refuses vLLM's
    ``min_tokens``, fails the warm-up rather than every turn of a run said complete)."""
    body: dict[str, Any] = {
        "model": s.model,
        "messages": [{"role": "user", "content": 'Reply with {"type": "final", "answer": "ok"}.'}],
        "temperature": 0,
        "max_tokens": min(16, s.max_tokens),
        "seed": s.seed,
    }
    if s.replay:
        fix_length(body, kind, body["max_tokens"])
    elif s.structured:
        body["response_format"] = response_format(final_schema())
    return body
