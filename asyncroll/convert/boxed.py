"""Extract the ``\\boxed{…}`` answer from a MATH solution (``convert-toolmath --answers-from-solution``).

Follows the MATH benchmark's own convention (``last_boxed_only_string``): the *last* ``\\boxed`` in the
solution is the answer, or the last ``\\fbox`` in a solution that has no ``\\boxed`` (a ``\\fbox`` after a
``\\boxed`` does not replace it). Its argument is found by matching braces, so nested groups
such as ``\\boxed{\\frac{1}{2}}`` come out whole; escaped braces (``\\{``, ``\\}``) are literal text, not
grouping. The unbraced form ``\\boxed 5`` takes the next token.
"""

from __future__ import annotations

import re

_BOXED = re.compile(r"\\boxed(?![A-Za-z])")
_FBOX = re.compile(r"\\fbox(?![A-Za-z])")


class BoxedError(ValueError):
    """The last ``\\boxed`` has no argument or unbalanced braces."""


def last_boxed(solution: str) -> str | None:
    """The argument of the last ``\\boxed`` in ``solution`` (of the last ``\\fbox`` where there is no
    ``\\boxed``), stripped; ``None`` if neither."""
    matches = list(_BOXED.finditer(solution)) or list(_FBOX.finditer(solution))
    if not matches:
        return None
    start = matches[-1].end()
    rest = solution[start:]
    stripped = rest.lstrip()
    if not stripped:
        raise BoxedError("\\boxed at the end of the solution has no argument")
    if stripped[0] != "{":
        token = re.match(r"[^\s$]+", stripped)
        if token is None:
            raise BoxedError(f"\\boxed has no argument before {stripped[:20]!r}")
        return token.group(0)
    return _braced(stripped)


def _braced(text: str) -> str:
    """The content of the brace group that opens ``text``."""
    depth = 0
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2  # an escaped character (\{ \} \\) never opens or closes a group
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                answer = text[1:i].strip()
                if not answer:
                    raise BoxedError("\\boxed{} is empty")
                return answer
        i += 1
    raise BoxedError(f"unbalanced braces after \\boxed: {text[:60]!r}")
