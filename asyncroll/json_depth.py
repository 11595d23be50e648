"""How deep JSON input may nest, the same on every Python version (:func:`json_loads`).

Python's own parser stops where the interpreter's recursion does: near 1,000 levels on 3.11, 1,500 on 3.12
and 10,000 on 3.13, so the same workload line or settings file was refused on one Python and read on the
next. Light on purpose (no pydantic): the CLI's start-up path reads JSON too.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from pathlib import Path
from typing import Any

#: The deepest nesting of arrays and objects any JSON input may hold, on every Python version. Below 3.11's
#: own limit (≈ 1,000 levels less the caller's stack) wherever a file is read, and far above any real
#: workload, configuration or run record.
MAX_JSON_DEPTH = 500
TOO_DEEP = f"JSON nested deeper than {MAX_JSON_DEPTH} levels"

# A string (matched whole, so that its brackets do not count; its group empty) or a bracket (its group).
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|([\[\]{}])')
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1, "": 0}
_TOKEN_BYTES = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|([\[\]{}])')
_STEP_BYTES = {b"[": 1, b"{": 1, b"]": -1, b"}": -1, b"": 0}


class JsonTooDeep(RecursionError):
    """JSON text nested deeper than :data:`MAX_JSON_DEPTH`: a RecursionError, as Python's parser raises
    past its own limit, so a reader's handler for one is its handler for both."""


def json_depth(text: str | bytes) -> int:
    """How deep valid JSON text nests its arrays and objects (brackets inside strings do not count)."""
    # One pass, no copy of the text: each token found is an empty or one-character value, which Python
    # shares (a copy without the strings made an object per piece between them: a LiveCodeBench line of
    # a million tests, 69 MB, took 1.2 GB to measure).
    if isinstance(text, str):
        return max(accumulate(map(_STEP.__getitem__, _TOKEN.findall(text))), default=0)
    return max(accumulate(map(_STEP_BYTES.__getitem__, _TOKEN_BYTES.findall(text))), default=0)


def json_loads(text: str | bytes, **kwargs: Any) -> Any:
    """``json.loads`` that refuses nesting deeper than :data:`MAX_JSON_DEPTH` on every Python version, with
    :class:`JsonTooDeep`. Only a text holding more opening brackets than that is measured (two ``count``
    calls decide that for every other text)."""
    try:
        value = json.loads(text, **kwargs)
    except RecursionError:
        raise JsonTooDeep(TOO_DEEP) from None
    opening = (
        text.count("[") + text.count("{") if isinstance(text, str) else text.count(b"[") + text.count(b"{")
    )
    if opening > MAX_JSON_DEPTH and json_depth(text) > MAX_JSON_DEPTH:
        raise JsonTooDeep(TOO_DEEP)
    return value


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None where there is none to read: no file, unreadable, not UTF-8,
    not JSON (past Python's digit limit, or nested deeper than :data:`MAX_JSON_DEPTH`), or another value
    than an object. For the readers that go on without a file (a receipt, a summary) an error names."""
    try:
        data = json_loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None
