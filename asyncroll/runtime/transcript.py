"""A trajectory's transcript (``asyncroll run --transcripts``): one line of ``transcripts.jsonl``.

The trajectory loop keeps its conversation in ``messages`` (the list each model request renders); each
entry carries what a transcript needs besides what the backends read: the turn, the model's reply
(:func:`assistant_message`), the tool's name. When a trajectory ends, :func:`transcript_line` turns that
list into the line: the trajectory's ``id``, ``index``, ``status``, ``error``, ``answer`` and
``correct`` (as in ``results.jsonl``) and the messages in order:

* ``{"role": "user", "content": PROMPT}``: the problem's prompt;
* ``{"role": "assistant", "turn": T, "text": …, "action": …, "prompt_tokens": …, "completion_tokens":
  …, "finish_reason": …}``: one per model turn. ``text`` is the server's completion text exactly as
  received (``null`` where no server wrote one: the scripted and simulated backends; or where the
  completion had no content); ``action`` the parsed action as a model writes it (no simulation-only
  field: ``latency_ms``, ``cpu_ms``, ...), or ``null`` for a reply that was no valid action (the
  trajectory's ``error`` says why);
* ``{"role": "tool", "turn": T, "name": TOOL, "content": TEXT}``: a tool's result exactly as the model
  was shown it (cut to ``--max-observation-chars`` with its note; with ``--tool-errors observe``, the
  error text);
* ``{"role": "user", "turn": T, "content": TEXT}``: the one-repair protocol's repair message exactly as
  sent (the repair instruction and the first failing case of the submission of turn ``T``).

Only what the model was shown or wrote is kept: never a problem's metadata, the evaluator's arguments
(the hidden tests) or its verdict beyond the feedback the repair message carries. Building the line
costs nothing until the trajectory ends; the run writes it then, next to its ``results.jsonl`` line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asyncroll.backends.action_schema import model_view
from asyncroll.backends.base import ModelResponse
from asyncroll.errors import ModelError

if TYPE_CHECKING:
    from asyncroll.runtime.trajectory import TrajectoryResult


def assistant_message(turn: int, response: ModelResponse) -> dict[str, Any]:
    """The conversation's entry for a model turn (``action`` is what the backends render)."""
    return {"role": "assistant", "action": response.action, "turn": turn, "response": response}


def invalid_reply(turn: int, error: ModelError) -> dict[str, Any] | None:
    """The entry for a turn whose completion arrived but was no valid action, its ``text`` null when the
    completion had no content (a reasoning model cut short by ``max_tokens``: its finish reason and token
    counts are kept). None when no completion arrived (a transport error, a timeout, an error status, a
    body that is no completion) or when the action was refused after its own entry was written."""
    if error.kind != "invalid_action" or not error.response_received:
        return None
    return {"role": "assistant", "action": None, "turn": turn, "failed": error}


def transcript_line(result: TrajectoryResult, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The line of ``transcripts.jsonl`` of an ended trajectory (see the module docstring)."""
    return {
        "id": result.id,
        "index": result.index,
        "status": result.status,
        "error": result.error,
        "answer": result.answer,
        "correct": result.correct,
        "messages": [_entry(message) for message in messages],
    }


def _entry(message: dict[str, Any]) -> dict[str, Any]:
    role = message["role"]
    turn = message.get("turn")
    if role == "assistant":
        response: ModelResponse | None = message.get("response")
        failed: ModelError | None = message.get("failed")
        source: Any = response if response is not None else failed
        action = message.get("action")
        return {
            "role": role,
            "turn": turn,
            "text": getattr(source, "text", None),
            "action": None if action is None else model_view(action),
            "prompt_tokens": getattr(source, "prompt_tokens", None),
            "completion_tokens": getattr(source, "completion_tokens", None),
            "finish_reason": getattr(source, "finish_reason", None),
        }
    if role == "tool":
        return {"role": role, "turn": turn, "name": message.get("name"), "content": message["content"]}
    entry: dict[str, Any] = {"role": role}
    if turn is not None:  # the prompt has none; a repair message the turn of the submission it judges
        entry["turn"] = turn
    entry["content"] = message["content"]
    return entry
