"""Helpers for the converters' tests: the real sample rows (copied byte for byte from the datasets' samples,
in ``tests/fixtures/convert/``) and the bundled examples, the CLI in a subprocess, and JSON and JSONL
written and read back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncroll.convert.lcb_tests import encode_private
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures" / "convert"
TM_SAMPLE = FIXTURES / "toolmath_ToolMATH_sample.json"
TM_HARD = FIXTURES / "toolmath_ToolMATHHard_sample.json"
LCB_ROW = FIXTURES / "livecodebench_code_generation_lite_1873_A.jsonl"
LCB_FRAGMENT = FIXTURES / "livecodebench_functional_fragment_3708.json"
TM_EXAMPLE = REPO / "examples" / "toolmath"
LCB_EXAMPLE = REPO / "examples" / "livecodebench"
real_process = pytest.mark.timeout(60)  # every test that starts a process has a hard deadline


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def write_json(path: Path, value: Any) -> Path:
    path.write_text(json.dumps(value, indent=1), encoding="utf-8")
    return path


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def lcb_rows() -> list[dict[str, str]]:
    """The real row, the 3708 fragment completed with our own statement and tests, and the examples."""
    real = json.loads(LCB_ROW.read_text(encoding="utf-8"))
    return [
        real,
        functional_row(),
        *[json.loads(x) for x in (LCB_EXAMPLE / "test.jsonl").read_text(encoding="utf-8").splitlines()][1:],
    ]


def functional_row() -> dict[str, str]:
    """The real LeetCode fragment 3708 (ids, starter code, public tests, func_name) made complete with
    a statement and private tests written by us, encoded as the lite release encodes them."""
    row = json.loads(LCB_FRAGMENT.read_text(encoding="utf-8"))
    row.pop("_note")
    row["question_title"] = "Zigzag Grid Traversal With Skip"
    row["question_content"] = (
        "Traverse grid in a zigzag: the first row left to right, the next right to left, and so on. "
        "Return every other cell visited, starting with the first."
    )
    private = [
        {"input": "[[1, 2, 3], [4, 5, 6], [7, 8, 9]]", "output": "[1, 3, 5, 7, 9]", "testtype": "functional"}
    ]
    row["private_test_cases"] = encode_private(private)
    return row


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


_MISSING = object()
