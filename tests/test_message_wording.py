"""The wording of refusals: each names the place (file, line, field, flag) and says how to put it right,
in the same words for the same situation whichever command says it."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncroll.errors import UsageError
from asyncroll.simulation.measured import jsonl_rows
from tests.conftest import invoke


def test_a_workload_line_that_is_not_json_names_its_column_not_a_line_1_of_its_own(tmp_path: Path) -> None:
    """A bad third line said "w.jsonl:3: line: not valid JSON: Expecting value: line 1 column 1 (char 0)":
    json's own position counts within the line, so the message named line 3 and line 1 at once."""
    workload = tmp_path / "w.jsonl"
    good = '{"prompt": "p", "script": [{"type": "final", "answer": "1"}]}\n'
    workload.write_text(good * 2 + '{"prompt": "p", oops}\n')
    done = invoke("validate", workload)
    assert done.exit_code == 2, done.output
    assert f"{workload}:3: line: not valid JSON: Expecting property name" in done.stderr, done.stderr
    assert "(column 17)" in done.stderr and "line 1" not in done.stderr and "char" not in done.stderr


def test_a_replayed_runs_line_that_is_not_json_names_its_column_not_a_line_1_of_its_own(
    tmp_path: Path,
) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text('{"event": "a"}\n{"event": "b",}\n')
    with pytest.raises(UsageError) as info:
        list(jsonl_rows(events))
    said = str(info.value)
    assert f"--from-run {events}:2: not valid JSON (Expecting property name" in said, said
    assert "column 15" in said and "line 1" not in said and "char" not in said
