"""What to say when a converter is given the other converter's source, or ToolMATH records one per line.

Each converter's own checks already name every missing field; these hints, added last, name the way out.
"""

from __future__ import annotations

import json
from typing import Any

from asyncroll.json_depth import json_loads

LCB_ROWS = "these look like LiveCodeBench rows: convert them with convert-livecodebench"
TOOLMATH_RECORDS = "these rows look like ToolMATH tool records: convert them with convert-toolmath"


def lcb_row(item: Any) -> bool:
    """A LiveCodeBench row, not a ToolMATH tool record."""
    return isinstance(item, dict) and "question_id" in item and "source_problem" not in item


def toolmath_record(item: Any) -> bool:
    """A ToolMATH tool record, not a LiveCodeBench row."""
    return isinstance(item, dict) and "source_problem" in item and "question_id" not in item


def jsonl_hint(text: str, exc: json.JSONDecodeError) -> str:
    """For ToolMATH records one per line (JSONL, as a dataset library exports them), the way to the JSON
    list convert-toolmath reads ("Extra data" at line 2 alone did not say what was wrong); for
    LiveCodeBench rows, the other converter. Empty when the text is not objects one per line."""
    if exc.msg != "Extra data":
        return ""
    try:
        first = json_loads(text[: exc.pos])
    except (ValueError, RecursionError):
        return ""
    if not isinstance(first, dict):
        return ""
    if lcb_row(first):
        return f"\n{LCB_ROWS}"
    return (
        "\nthe source looks like JSONL (one record per line); convert-toolmath reads a JSON list of "
        "records, as ToolMATH.json is: make one with `jq -s . FILE > records.json`"
    )
