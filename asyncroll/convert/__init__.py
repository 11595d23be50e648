"""Converters from public benchmark releases to asyncroll workloads (SPEC §8).

    toolmath        ToolMATH tool records → one problem per source problem with all its tools
    livecodebench   LiveCodeBench code_generation rows → one-repair code problems with hidden tests
    lcb_tests       the rows' test-case wire format (JSON, or base64 → zlib → pickle → JSON), decoded safely
    rows            LiveCodeBench source files: JSON array, object, or JSONL streamed in two passes
    boxed           the ``\\boxed{…}`` answer of a MATH solution (``--answers-from-solution``)
    hints           the way out when a converter is given the other's source, or ToolMATH as JSONL
    selection       the seeded, order-independent selection both converters share
    output          destination checks and the atomic, byte-deterministic JSONL writer

Every converter validates its whole input before it writes anything and raises
:class:`~asyncroll.errors.UsageError` (exit code 2) with messages that name the file, the record and the
field (:func:`raise_problems`). The same source and seed always give byte-identical output.
"""

from __future__ import annotations

from asyncroll.errors import UsageError

#: The most problems one refusal lists; the rest are counted.
MAX_REPORTED = 50


def raise_problems(problems: list[str], hint: str | None = None) -> None:
    """Refuse the input with every problem found (the first :data:`MAX_REPORTED`, the rest counted) and
    ``hint`` last; nothing when there are none."""
    if problems:
        extra = [f"... and {len(problems) - MAX_REPORTED} more"] if len(problems) > MAX_REPORTED else []
        raise UsageError("\n".join(problems[:MAX_REPORTED] + extra + ([hint] if hint else [])))
