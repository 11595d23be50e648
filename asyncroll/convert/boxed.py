"""Extract the ``\\boxed{…}`` answer from a MATH solution (``convert-toolmath --answers-from-solution``).

Follows the MATH benchmark's own convention (``last_boxed_only_string``): the *last* ``\\boxed`` (or
``\\fbox``) in the solution is the answer. Its argument is found by matching braces, so nested groups
such as ``\\boxed{\\frac{1}{2}}`` come out whole; escaped braces (``\\{``, ``\\}``) are literal text, not
grouping. The unbraced form ``\\boxed 5`` takes the next token.
"""

from __future__ import annotations

import re

_COMMANDS = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


class BoxedError(ValueError):
    """The last ``\\boxed`` has no argument or unbalanced braces."""


def last_boxed(solution: str) -> str | None:
    """The argument of the last ``\\boxed``/``\\fbox`` in ``solution``, stripped; ``None`` if none."""
    matches = list(_COMMANDS.finditer(solution))
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
