"""A workload file that is one JSON document over several lines (a dataset's own file, a pretty-printed
list of problems) rather than JSON Lines: named once, with the way to its lines, instead of an error on
every line ("not valid JSON" for each of a ToolMATH file's lines)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from asyncroll.json_checks import json_kind, utf8_text
from asyncroll.json_depth import json_loads

#: The largest file read whole to see whether it is one JSON document (only after every line failed).
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024

_TOOLMATH_KEYS = frozenset({"function", "source_problem"})  # a ToolMATH tool record's own fields
#: a LiveCodeBench row's statement, or its id with its tests (a row cut short: the converter says what lacks)
_LIVECODEBENCH_KEYS = (frozenset({"question_content"}), frozenset({"question_id", "public_test_cases"}))


def dataset_kind(value: Any, path: Path) -> str | None:
    """ "ToolMATH tool records" or "LiveCodeBench rows" with the command that converts them, for a parsed
    document (or one line's object) whose objects carry that dataset's own fields; None otherwise."""
    source = shlex.quote(str(path))
    items = value if isinstance(value, list) else [value]
    objects = [item for item in items if isinstance(item, dict)]
    if objects and all(item.keys() >= _TOOLMATH_KEYS for item in objects):
        return (
            f"ToolMATH tool records: convert them with `asyncroll convert-toolmath --source {source} "
            "--functions-dir DIR --output workload.jsonl`"
        )
    if objects and all(any(item.keys() >= keys for keys in _LIVECODEBENCH_KEYS) for item in objects):
        return (
            f"LiveCodeBench rows: convert them with `asyncroll convert-livecodebench --source {source} "
            "--output workload.jsonl`"
        )
    return None


def one_document(path: Path) -> str | None:
    """What ``path`` is when the whole file parses as one JSON document although none of the lines read
    does alone: "one JSON document (an array of 3 items) over 39 lines, not JSON Lines …" (its own
    non-blank lines, not only those a ``--limit`` read), with the way to its lines. None where it does
    not parse whole (or is past :data:`MAX_DOCUMENT_BYTES`)."""
    if _first_value(path) is not None:  # its first line is JSON alone: lines, each wrong in its fields
        return None
    try:
        if os.stat(path).st_size > MAX_DOCUMENT_BYTES:
            return None
        text = utf8_text(path.read_bytes())
        value = json_loads(text)
    except (OSError, ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    lines = sum(1 for line in text.split("\n") if line.strip())
    source = shlex.quote(str(path))
    if isinstance(value, list):
        what = f"an array of {len(value)} item{'' if len(value) == 1 else 's'}"
        how = f"if its items are problems, write one a line (`jq -c '.[]' {source} > workload.jsonl`)"
    else:
        what = json_kind(value)
        how = f"if it is a problem, write it on one line (`jq -c . {source} > workload.jsonl`)"
    how = dataset_kind(value, path) or how
    return (
        f"{path}: one JSON document ({what}) over {lines} lines, not JSON Lines (one problem a line, "
        f"each a JSON object): {how}"
    )


def dataset_lines(path: Path) -> str | None:
    """ "FILE: its lines are LiveCodeBench rows: convert them …" where the first line of a workload whose
    every line failed is a JSON object with a dataset's own fields (a raw row is valid JSON, so each line
    was "unknown field" errors only); None otherwise."""
    first = _first_value(path)
    kind = None if first is None else dataset_kind(first, path)
    return None if kind is None else f"{path}: its lines are {kind}"


def _first_value(path: Path) -> Any:
    """The JSON value the first non-blank line of ``path`` holds alone, or None where it holds none."""
    try:
        with path.open("rb") as handle:
            for raw in handle:
                if raw.strip():
                    return json_loads(utf8_text(raw))
    except (OSError, ValueError, RecursionError):
        pass
    return None
