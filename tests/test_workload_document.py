"""A workload that is a dataset's own file, or one JSON document over several lines, rather than JSON
Lines: named once with the way to its lines (ToolMATH's JSON list was "not valid JSON" on each of its
lines, a LiveCodeBench row a dozen "unknown field" errors, neither saying which converter reads it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncroll.errors import WorkloadError
from asyncroll.workload import scan_workload
from tests.conftest import invoke
from tests.workload_scans import GOOD, _problems

TOOL_RECORD = {
    "name": "absolute_difference",
    "description": "Calculate |x - y|.",
    "inputs": {"x": "int", "y": "int"},
    "function": "absolute_difference.py",
    "source_problem": "What is |3 - 5|?",
    "source_solution": "\\boxed{2}",
    "level": "Level 1",
    "type": "Algebra",
}


def test_a_toolmath_json_list_is_one_error_naming_its_converter(tmp_path: Path) -> None:
    path = tmp_path / "ToolMATH.json"
    path.write_text(json.dumps([TOOL_RECORD, TOOL_RECORD], indent=2))
    lines = len(path.read_text().splitlines())
    scan = scan_workload(path, tmp_path, scripted=True)
    assert scan.count == lines and scan.invalid_lines == lines
    assert scan.problems == [
        f"{path}: one JSON document (an array of 2 items) over {lines} lines, not JSON Lines (one problem a "
        f"line, each a JSON object): ToolMATH tool records: convert them with `asyncroll convert-toolmath "
        f"--source {path} --functions-dir DIR --output workload.jsonl`"
    ]


def test_a_pretty_printed_problem_or_list_of_problems_says_how_to_write_it_as_lines(tmp_path: Path) -> None:
    one = tmp_path / "one.json"
    one.write_text(json.dumps(GOOD, indent=2))
    (problem,) = scan_workload(one, tmp_path, scripted=True).problems
    assert problem.startswith(f"{one}: one JSON document (an object) over ")
    assert problem.endswith(f"if it is a problem, write it on one line (`jq -c . {one} > workload.jsonl`)")
    many = tmp_path / "my list.json"  # a name the shell must have quoted
    many.write_text(json.dumps([GOOD], indent=1))
    (problem,) = scan_workload(many, tmp_path, scripted=True).problems
    assert "(an array of 1 item)" in problem
    assert problem.endswith("write one a line (`jq -c '.[]' '" + str(many) + "' > workload.jsonl`)")


def test_livecodebench_rows_keep_their_errors_and_gain_their_converter_after_them(tmp_path: Path) -> None:
    """The converter is said after the errors, also where there are more than are reported (it was one
    of them: counted, and cut with them past the first 200)."""
    row = {"question_title": "t", "question_content": "Read n.", "public_test_cases": "[]"}
    path = tmp_path / "lcb.jsonl"
    hint = (
        f"{path}: its lines are LiveCodeBench rows: convert them with `asyncroll convert-livecodebench "
        f"--source {path} --output workload.jsonl`"
    )
    for rows in (1, 150):  # 4 errors a row: 600, of which 200 are reported
        path.write_text((json.dumps(row) + "\n") * rows)
        scan = scan_workload(path, tmp_path, scripted=True)
        assert f"{path}:1: question_content: unknown field" in scan.problems
        assert scan.errors == 4 * rows and hint not in scan.problems
        assert scan.messages()[-1] == hint
        with pytest.raises(WorkloadError) as raised:
            scan.raise_if_invalid()
        lines = f"{rows} of {rows} workload line{'s' if rows > 1 else ''}"
        assert str(raised.value).endswith(f"{hint}\n{path}: {4 * rows} errors in {lines}")
    done = invoke("validate", path)
    assert done.exit_code == 2 and done.stderr.endswith(
        f"{hint}\n{path}: 600 errors in 150 of 150 workload lines\n"
    )


def test_a_livecodebench_row_cut_short_is_still_named_one(tmp_path: Path) -> None:
    """A row without its statement (as a fragment of one is) is still a LiveCodeBench row by its id and tests:
    the converter, given it, says what it lacks."""
    row = {"question_id": "3708", "platform": "leetcode", "public_test_cases": "[]", "metadata": "{}"}
    path = tmp_path / "fragment.json"
    path.write_text(json.dumps(row, indent=2))
    (problem,) = scan_workload(path, tmp_path, scripted=True).problems
    assert problem.endswith(
        f"LiveCodeBench rows: convert them with `asyncroll convert-livecodebench --source {path} "
        "--output workload.jsonl`"
    )


def test_lines_that_are_each_json_keep_their_own_errors(tmp_path: Path) -> None:
    """Every line wrong in its fields, or one good line among broken ones: each line's error, no hint."""
    bad = {**GOOD, "prompt": 5}
    assert _problems(tmp_path, [json.dumps(bad), json.dumps(bad)]) == [
        f"{tmp_path / 'w.jsonl'}:{n}: prompt: Input should be a valid string" for n in (1, 2)
    ]
    problems = _problems(tmp_path, ["[", json.dumps(GOOD), "]"])
    assert [p.split(": ", 1)[0] for p in problems] == [f"{tmp_path / 'w.jsonl'}:{n}" for n in (1, 3)]


def test_a_json_document_read_under_a_limit_is_named_by_its_own_lines(tmp_path: Path) -> None:
    """``--limit 4`` reads 4 of a 17-line document's lines, each failing: the whole file is still the one
    document, over its 17 lines (it said "over 4 lines")."""
    path = tmp_path / "ToolMATH.json"
    path.write_text(json.dumps([TOOL_RECORD, TOOL_RECORD], indent=1))
    lines = len(path.read_text().splitlines())
    scan = scan_workload(path, tmp_path, scripted=True, limit=4)
    assert scan.count == 4 and lines > 4
    (problem,) = scan.problems
    assert f"(an array of 2 items) over {lines} lines, not JSON Lines" in problem
