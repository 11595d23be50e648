"""Grading a final answer: whitespace-normalised exact match against ``reference_answer``.

Stdlib only: it runs inside tool workers as the built-in ``__grade__`` job.
"""

from __future__ import annotations


def normalise(text: str) -> str:
    return " ".join(str(text).split())


def grade(answer: str, reference: str) -> bool:
    """True when the answer equals the reference after collapsing all whitespace."""
    return normalise(answer) == normalise(reference)
