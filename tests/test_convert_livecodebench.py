"""The LiveCodeBench converter on the real row and fragment: private tests decoded without running a
pickle, rows converted to one-repair problems (stdin and functional), every input form alike, and bad rows
or files named with nothing written."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import pickle
import zlib
from pathlib import Path
from typing import Any

import pytest

from asyncroll.convert.lcb_tests import WireFormatError, decode_private, encode_private
from asyncroll.convert.livecodebench import convert_livecodebench
from asyncroll.convert.selection import rank_key
from asyncroll.convert.toolmath import convert_toolmath
from asyncroll.errors import UsageError
from asyncroll.workload import Problem
from tests.cli_runs import cli
from tests.conftest import REPO, invoke
from tests.conversions import (
    _MISSING,
    LCB_EXAMPLE,
    LCB_FRAGMENT,
    LCB_ROW,
    TM_EXAMPLE,
    TM_HARD,
    functional_row,
    lcb_rows,
    lines,
    re_escape,
    real_process,
    write_json,
    write_jsonl,
)

# --- LiveCodeBench: decoding -------------------------------------------------------------------------


def test_real_private_tests_decode() -> None:
    row = json.loads(LCB_ROW.read_text(encoding="utf-8"))
    tests = decode_private(row["private_test_cases"])
    assert len(tests) == 4 and all(t["testtype"] == "stdin" for t in tests)
    assert all(set(t) == {"input", "output", "testtype"} for t in tests)
    assert decode_private(encode_private(tests)) == tests


class _Hostile:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch HOSTILE_MARKER",))


def _compressed_pickle(value: Any) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(value, protocol=4))).decode()


def test_hostile_pickle_is_refused_without_running_anything(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(WireFormatError, match=r"refers to the global (posix|os)\.system; refused"):
        decode_private(_compressed_pickle(_Hostile()))
    assert not (tmp_path / "HOSTILE_MARKER").exists()
    row = dict(
        json.loads(LCB_ROW.read_text(encoding="utf-8")), private_test_cases=_compressed_pickle(_Hostile())
    )
    with pytest.raises(UsageError, match=r"\(question_id '1873_A'\): private_test_cases: the pickle refers"):
        convert_livecodebench(write_jsonl(tmp_path / "rows.jsonl", [row]), tmp_path / "w.jsonl")
    assert not (tmp_path / "HOSTILE_MARKER").exists() and not (tmp_path / "w.jsonl").exists()


def test_private_tests_in_base64_wrapped_over_lines_decode() -> None:
    """`base64` (the tool) and MIME wrap their output at 76 columns, and LiveCodeBench's decoder skips
    the line breaks; here they were "neither a JSON list nor base64: Only base64 data is allowed"."""
    row = json.loads(LCB_ROW.read_text(encoding="utf-8"))
    field = row["private_test_cases"]
    wrapped = "\r\n".join(field[i : i + 76] for i in range(0, len(field), 76)) + "\n"
    assert "\n" in wrapped.strip()
    assert decode_private(wrapped) == decode_private(field)
    with pytest.raises(WireFormatError, match="neither a JSON list nor base64"):
        decode_private(field[:40] + "*" + field[40:])


def test_toolmath_records_given_to_the_lcb_converter_name_the_right_converter(tmp_path: Path) -> None:
    """ToolMATH.json given to convert-livecodebench listed five missing fields per record, and no more."""
    with pytest.raises(UsageError) as refused:
        convert_livecodebench(TM_HARD, tmp_path / "w.jsonl")
    said = str(refused.value).split("\n")
    assert said[0] == f"{TM_HARD}: row [0]: question_id: missing"
    assert said[-1] == "these rows look like ToolMATH tool records: convert them with convert-toolmath"
    rows: list[Any] = lcb_rows()  # a LiveCodeBench file with one stray record is not taken for ToolMATH
    rows.append(json.loads(TM_HARD.read_text(encoding="utf-8"))[0])
    with pytest.raises(UsageError) as lcb_refused:
        convert_livecodebench(write_jsonl(tmp_path / "rows.jsonl", rows), tmp_path / "w.jsonl")
    assert "ToolMATH" not in str(lcb_refused.value)


@pytest.mark.parametrize(
    ("field", "message"),
    [
        (_compressed_pickle([{"input": "1", "output": "1", "testtype": "stdin"}]), "the pickle holds a list"),
        (base64.b64encode(b"not zlib").decode(), "not zlib-compressed"),
        (base64.b64encode(zlib.compress(pickle.dumps("[]"))[:-6]).decode(), "the zlib stream is truncated"),
        ("%%% not base64 %%%", "neither a JSON list nor base64"),
        (base64.b64encode(zlib.compress(b"garbage")).decode(), "not a valid pickle"),
        (_compressed_pickle('[{"input": "1", "output": 1, "testtype": "stdin"}]'), "test [0].output"),
        (_compressed_pickle('[{"input": "1", "output": "1", "testtype": "weird"}]'), "test [0].testtype"),
        ('[{"input": "x", "output": "1"}]', "test [0].testtype: expected a string, missing"),
        ('[{"input": "[1, 2", "output": "1", "testtype": "functional"}]', "test [0].input line 1"),
        ("[1,", "JSON is not valid"),
        # a lone surrogate cannot be written as UTF-8: it ended the conversion in a traceback at the write
        (
            _compressed_pickle('[{"input": "\\ud800", "output": "1", "testtype": "stdin"}]'),
            "test [0].input: not valid",
        ),
        ('[{"input": "1", "output": "\\udfff", "testtype": "stdin"}]', "test [0].output: not valid Unicode"),
    ],
)
def test_malformed_private_tests_are_clear_errors(field: str, message: str) -> None:
    with pytest.raises(WireFormatError, match=re_escape(message)):
        decode_private(field)


def test_functional_tests_hold_ints_of_up_to_livecodebench_s_50000_digits() -> None:
    """LiveCodeBench reads a functional test under its raised digit limit (50,000): a 5,001-digit argument
    or expected value is a real test there, and was refused here ("Exceeds the limit (4300 digits)") by the
    converter and by the evaluator's checks that validation runs. Past 50,000 digits both refuse it."""
    from asyncroll.evaluator import harness, lcb_json
    from asyncroll.evaluator.cases import check_test

    assert lcb_json.LCB_INT_DIGITS == harness.INT_MAX_STR_DIGITS  # the program's limit, and the readers'
    big = "1" + "0" * 5000
    test = {"input": f"{big}\n[{big}]", "output": big, "testtype": "functional"}
    assert decode_private(json.dumps([test])) == [test]
    # kept as its text, compared with a returned value's (str -> int is quadratic: see lcb_json.LongInt)
    assert check_test(0, test, "f").expected_value == lcb_json.LongInt(big)
    too_long = {"input": "1" + "0" * 50_000, "output": "1", "testtype": "functional"}
    message = "an int of more than 50,000 digits (LiveCodeBench's limit on reading ints)"
    with pytest.raises(WireFormatError, match=re_escape(f"test [0].input line 1: cannot be read: {message}")):
        decode_private(json.dumps([too_long]))
    with pytest.raises(ValueError, match=re_escape(f"tests[0].input line 1 is not a JSON value: {message}")):
        check_test(0, too_long, "f")
    with pytest.raises(ValueError, match=re_escape(f"tests[0].output is not a JSON value: {message}")):
        check_test(0, {**too_long, "input": "1", "output": too_long["input"]}, "f")


def test_decompression_is_capped(monkeypatch: Any) -> None:
    import asyncroll.convert.lcb_tests as lcb_tests

    field = _compressed_pickle(json.dumps([{"input": "x" * 5000, "output": "1", "testtype": "stdin"}]))
    assert len(decode_private(field)) == 1
    monkeypatch.setattr(lcb_tests, "MAX_DECOMPRESSED", 1000)
    with pytest.raises(WireFormatError, match="decompresses to more than 1000 bytes; refused"):
        decode_private(field)


def without_source_hash(problems: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = copy.deepcopy(problems)
    for problem in out:
        problem["metadata"].pop("source_sha256")
    return out


# --- LiveCodeBench: conversion -----------------------------------------------------------------------


@real_process
def test_lcb_real_row_converts_to_a_one_repair_problem(tmp_path: Path) -> None:
    out = tmp_path / "lcb.jsonl"
    result = cli("convert-livecodebench", "--source", LCB_ROW, "--output", out)
    assert result.returncode == 0, result.stderr
    assert f"{out}: 1 of 1 problems (1 source row(s), 0 functional), seed 0" in result.stdout
    [problem] = lines(out)
    Problem.model_validate(problem)
    row = json.loads(LCB_ROW.read_text(encoding="utf-8"))
    meta = problem["metadata"]
    assert problem["id"] == "1873_A"
    assert problem["tools"] == [
        {
            "name": "lcb_evaluate",
            "description": "Run the submitted Python 3 program against the problem's hidden tests.",
            "inputs": {"code": "str"},
        }
    ]
    assert "reference_answer" not in problem and "script" not in problem
    assert meta["prompt_metadata"]["protocol"] == "one_repair"
    assert meta["prompt_metadata"]["max_generations"] == 2
    assert "corrected, complete Python 3 program" in meta["prompt_metadata"]["repair_instruction"]
    assert meta["test_type"] == "stdin" and "func_name" not in meta
    assert (meta["public_tests"], meta["private_tests"], len(meta["reference_tests"])) == (1, 4, 5)
    assert meta["reference_tests"][0] == json.loads(row["public_test_cases"])[0]
    assert meta["reference_tests"][1:] == decode_private(row["private_test_cases"])
    assert meta["source_sha256"] == hashlib.sha256(LCB_ROW.read_bytes()).hexdigest()
    # Exactly instruction, title and statement: nothing else (no tests, no empty starter-code section).
    assert problem["prompt"] == (
        "Solve the programming problem below with a complete Python 3 program that reads the input from "
        "standard input and writes the answer to standard output. Return only the program's source code: "
        "no explanation and no Markdown fences.\n\n### Title\nA. Short Sort\n\n### Problem\n"
        + row["question_content"].strip()
        + "\n"
    )


def test_lcb_functional_rows_are_converted_not_dropped(tmp_path: Path) -> None:
    out = tmp_path / "f.jsonl"
    convert_livecodebench(write_jsonl(tmp_path / "rows.jsonl", [functional_row()]), out)
    [problem] = lines(out)
    meta = problem["metadata"]
    assert meta["test_type"] == "functional" and meta["func_name"] == "zigzagTraversal"
    assert meta["reference_tests"] == [
        {"input": "[[1, 2], [3, 4]]", "output": "[1, 4]", "testtype": "functional"},
        {"input": "[[2, 1], [2, 1], [2, 1]]", "output": "[2, 1, 2]", "testtype": "functional"},
        {"input": "[[1, 2, 3], [4, 5, 6], [7, 8, 9]]", "output": "[1, 3, 5, 7, 9]", "testtype": "functional"},
    ]
    prompt = problem["prompt"]
    assert "`Solution().zigzagTraversal(...)`" in prompt
    assert "### Starter code\n```python\nclass Solution:\n    def zigzagTraversal(self" in prompt
    assert "[1, 3, 5, 7, 9]" not in prompt


def test_lcb_stdin_only_drops_functional_rows(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "rows.jsonl", lcb_rows())
    out = tmp_path / "s.jsonl"
    report = convert_livecodebench(source, out, stdin_only=True)
    assert (report.rows, report.functional, report.skipped, report.written) == (5, 3, 3, 2)
    assert sorted(p["id"] for p in lines(out)) == ["1873_A", "ex_sum_max"]
    only_functional = write_jsonl(tmp_path / "f.jsonl", [functional_row()])
    with pytest.raises(UsageError, match="no stdin problems to convert"):
        convert_livecodebench(only_functional, tmp_path / "none.jsonl", stdin_only=True)


def test_lcb_array_object_and_jsonl_inputs_agree(tmp_path: Path) -> None:
    rows = lcb_rows()
    jsonl = write_jsonl(tmp_path / "rows.jsonl", rows)
    array = write_json(tmp_path / "rows.json", rows)
    convert_livecodebench(jsonl, tmp_path / "a.jsonl")
    convert_livecodebench(array, tmp_path / "b.jsonl")
    assert without_source_hash(lines(tmp_path / "a.jsonl")) == without_source_hash(
        lines(tmp_path / "b.jsonl")
    )
    single = write_json(tmp_path / "one.json", rows[1])
    convert_livecodebench(single, tmp_path / "c.jsonl")
    [only] = without_source_hash(lines(tmp_path / "c.jsonl"))
    assert only == next(p for p in without_source_hash(lines(tmp_path / "a.jsonl")) if p["id"] == "3708")


def test_a_byte_order_mark_is_not_part_of_the_source(tmp_path: Path) -> None:
    """A UTF-8 byte-order mark (as Windows editors save) was refused in a JSON array or object ("not
    valid JSON: Unexpected UTF-8 BOM") though the same rows converted as JSONL: every form converts alike."""
    rows = lcb_rows()
    sources = {
        "jsonl": write_jsonl(tmp_path / "rows.jsonl", rows),
        "array": write_json(tmp_path / "rows.json", rows),
    }
    expected = None
    for name, source in sources.items():
        source.write_bytes(b"\xef\xbb\xbf" + source.read_bytes())
        convert_livecodebench(source, tmp_path / f"{name}.jsonl")
        converted = without_source_hash(lines(tmp_path / f"{name}.jsonl"))
        expected = expected or converted
        assert converted == expected, name
    marked = tmp_path / "toolmath.json"
    marked.write_bytes(b"\xef\xbb\xbf" + TM_HARD.read_bytes())
    convert_toolmath(TM_HARD, TM_EXAMPLE, tmp_path / "plain.jsonl")
    convert_toolmath(marked, TM_EXAMPLE, tmp_path / "marked.jsonl")
    assert without_source_hash(lines(tmp_path / "marked.jsonl")) == without_source_hash(
        lines(tmp_path / "plain.jsonl")
    )


def test_lcb_is_deterministic_and_order_independent(tmp_path: Path) -> None:
    rows = lcb_rows()
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    for name in ("a", "b"):
        convert_livecodebench(source, tmp_path / f"{name}.jsonl", seed=9, limit=3)
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    reversed_source = write_jsonl(tmp_path / "reversed.jsonl", rows[::-1])
    convert_livecodebench(reversed_source, tmp_path / "r.jsonl", seed=9, limit=3)
    assert without_source_hash(lines(tmp_path / "r.jsonl")) == without_source_hash(
        lines(tmp_path / "a.jsonl")
    )
    expected = sorted((r["question_id"] for r in rows), key=lambda q: rank_key(9, q))[:3]
    assert [p["id"] for p in lines(tmp_path / "a.jsonl")] == expected
    convert_livecodebench(source, tmp_path / "other.jsonl", seed=10, limit=3)
    assert [p["id"] for p in lines(tmp_path / "other.jsonl")] == sorted(
        (r["question_id"] for r in rows), key=lambda q: rank_key(10, q)
    )[:3]


def _row(**changes: Any) -> dict[str, Any]:
    row: dict[str, Any] = json.loads(LCB_ROW.read_text(encoding="utf-8"))
    for key, value in changes.items():
        if value is _MISSING:
            del row[key]
        else:
            row[key] = value
    return row


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([_row(), _row()], ":2 (question_id '1873_A'): question_id: duplicate id '1873_A' (first at "),
        ([_row(question_content=_MISSING)], ":1 (question_id '1873_A'): question_content: missing"),
        ([_row(question_content="  \n")], "question_content: the problem statement is empty"),
        ([_row(private_test_cases=_MISSING)], "private_test_cases: missing"),
        ([_row(public_test_cases="[]", private_test_cases="")], "the problem has no tests"),
        ([_row(public_test_cases="[{")], "public_test_cases: JSON is not valid"),
        ([_row(question_id=1873)], "question_id: expected a string, got an integer"),
        ([_row(metadata="{nope")], "metadata: not valid JSON"),
        (
            [_row(public_test_cases='[{"input": "\\ud800", "output": "x", "testtype": "stdin"}]')],
            "public_test_cases: test [0].input: not valid Unicode: a lone UTF-16 surrogate",
        ),
        ([_row(metadata='{"func_name": "not valid"}')], "func_name 'not valid' is not a Python method name"),
        (
            [_row(metadata='{"func_name": "f"}')],
            "public_test_cases: test [0] is 'stdin' but metadata.func_name is 'f'",
        ),
        (["just a string"], ": expected rows (a JSON array, object or JSONL), got a string"),
        ([None], ": expected rows (a JSON array, object or JSONL), got null"),
        ([_row(), "just a string"], ":2: expected a row object, got a string"),
        ([_row(), [1]], ":2: expected a row object, got an array"),
        ([_row(metadata="[1]")], "metadata: expected a JSON object, got an array"),
        (
            [_row(public_test_cases='[{"input": 1, "output": "x", "testtype": "stdin"}]')],
            "public_test_cases: test [0].input: expected a string, got an integer",
        ),
        (
            [_row(public_test_cases='{"input": "1"}')],
            "public_test_cases: expected a list of tests, got an object",
        ),
    ],
)
def test_lcb_bad_rows_are_named_and_nothing_is_written(tmp_path: Path, rows: list[Any], message: str) -> None:
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    out = tmp_path / "w.jsonl"
    with pytest.raises(UsageError) as caught:
        convert_livecodebench(source, out)
    assert message in str(caught.value) and str(source) in str(caught.value)
    assert not out.exists()


@pytest.mark.parametrize("as_array", [False, True])
def test_lcb_a_row_key_given_twice_is_refused(tmp_path: Path, as_array: bool) -> None:
    """``json`` keeps the last of a repeated key: a row naming its question_id twice was converted under the
    second, silently (a workload line, a --config file and a ToolMATH source refuse one)."""
    text = json.dumps(_row())[:-1] + ', "question_id": "other"}'
    source = tmp_path / ("rows.json" if as_array else "rows.jsonl")
    source.write_text(f"[{text}]" if as_array else text + "\n", encoding="utf-8")
    out = tmp_path / "w.jsonl"
    with pytest.raises(UsageError) as caught:
        convert_livecodebench(source, out)
    assert "key 'question_id' is given twice in one object" in str(caught.value), str(caught.value)
    assert str(source) in str(caught.value) and not out.exists()


def test_lcb_file_level_errors(tmp_path: Path) -> None:
    good = json.dumps(_row())
    source = tmp_path / "rows.jsonl"
    source.write_text(good + "\n\n" + good[:40] + "\n", encoding="utf-8")
    out = tmp_path / "w.jsonl"
    with pytest.raises(UsageError, match=rf"{source}:3: invalid line: not valid JSON"):
        convert_livecodebench(source, out)
    fragment_errors = pytest.raises(
        UsageError, match=r"question_content: missing\n.*private_test_cases: missing"
    )
    with fragment_errors:
        convert_livecodebench(LCB_FRAGMENT, out)
    with pytest.raises(UsageError, match=r"--limit must be a positive integer, got 0"):
        convert_livecodebench(LCB_ROW, out, limit=0)
    with pytest.raises(UsageError, match="is the source file"):
        convert_livecodebench(LCB_ROW, LCB_ROW)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(UsageError, match="empty file"):
        convert_livecodebench(tmp_path / "empty.jsonl", out)
    with pytest.raises(UsageError, match="cannot read"):
        convert_livecodebench(tmp_path / "missing.jsonl", out)
    broken_first = tmp_path / "broken-first.jsonl"
    broken_first.write_text('{"question_id": broken\n' + good + "\ngarbage\n" + good + "\n", encoding="utf-8")
    with pytest.raises(UsageError) as caught:  # JSONL with a broken first line: every bad line named
        convert_livecodebench(broken_first, out)
    assert f"{broken_first}:1: invalid line" in str(caught.value)
    assert f"{broken_first}:3: invalid line" in str(caught.value)
    for first, kind in (
        ("[1, 2, 3]", "an array"),
        ("42", "an integer"),
        ('"header"', "a string"),
        ("null", "null"),
    ):
        not_a_row = tmp_path / "not-a-row-first.jsonl"
        not_a_row.write_text(f"{first}\n{good}\n", encoding="utf-8")
        with pytest.raises(UsageError) as caught:  # was: "not-a-row-first.jsonl:2:1: ... Extra data"
            convert_livecodebench(not_a_row, out)
        assert (
            str(caught.value)
            == f"{not_a_row}:1: expected a row object, got {kind}"  # JSON's words: it was "got NoneType"
        )
    too_long = tmp_path / ("a" * 300 + ".jsonl")
    with pytest.raises(UsageError, match="cannot write there: File name too long"):
        convert_livecodebench(LCB_ROW, too_long)
    out.write_text("keep")
    with pytest.raises(UsageError, match="already exists"):
        convert_livecodebench(LCB_ROW, out)
    assert out.read_text() == "keep"


@real_process
def test_lcb_cli_errors_exit_2_and_write_nothing(tmp_path: Path) -> None:
    out = tmp_path / "w.jsonl"
    source = write_jsonl(tmp_path / "rows.jsonl", [_row(), _row()])
    result = invoke("convert-livecodebench", "--source", source, "--output", out)
    assert result.exit_code == 2 and "duplicate id '1873_A'" in result.stderr
    result = invoke("convert-livecodebench", "--source", LCB_ROW, "--output", LCB_ROW)
    assert result.exit_code == 2 and "is the source file" in result.stderr
    assert not out.exists()


def test_a_limit_past_the_source_is_said(tmp_path: Path) -> None:
    """``--limit 219`` on a source of one row wrote 1 problem and said only "1 of 1 problems": a protocol
    that names its workload's size found out from the checksum later."""
    result = invoke(
        "convert-livecodebench", "--source", LCB_ROW, "--output", tmp_path / "a.jsonl", "--limit", "219"
    )
    assert result.exit_code == 0, result.output
    assert "note: --limit 219 asked for more problems than the source holds: 1 written" in result.stderr
    exact = invoke(
        "convert-livecodebench", "--source", LCB_ROW, "--output", tmp_path / "b.jsonl", "--limit", "1"
    )
    assert exact.exit_code == 0 and "note:" not in exact.stderr
    tools = invoke(
        "convert-toolmath",
        "--source",
        REPO / "examples" / "toolmath" / "ToolMATH.json",
        "--functions-dir",
        REPO / "examples" / "toolmath",
        "--output",
        tmp_path / "t.jsonl",
        "--limit",
        "500",
    )
    assert tools.exit_code == 0, tools.output
    assert "note: --limit 500 asked for more problems than the source holds: " in tools.stderr


def _only_pending_complaints(workload: Path, backend: str) -> None:
    """The loader may refuse only what has not landed yet (``lcb_evaluate``, the one-repair protocol)."""
    result = invoke("validate", workload, "--backend", backend)
    complaints = [
        line
        for line in result.stderr.splitlines()
        if line.startswith(f"{workload}:") and not line.endswith(" lines")
    ]
    assert all("not available yet" in c for c in complaints), complaints
    assert (result.exit_code == 0) == (not complaints), result.stderr


@real_process
def test_lcb_output_passes_the_loader_but_for_features_still_landing(tmp_path: Path) -> None:
    out = tmp_path / "lcb.jsonl"
    convert_livecodebench(write_jsonl(tmp_path / "rows.jsonl", lcb_rows()), out)
    _only_pending_complaints(out, "openai")
    _only_pending_complaints(LCB_EXAMPLE / "workload.jsonl", "scripted")


def test_a_source_that_is_not_utf8_names_the_line(tmp_path: Path) -> None:
    """The codec's own words ("'utf-8' codec can't decode byte 0xe9 in position 896: invalid continuation
    byte") named neither the line nor anything a user could find in an editor; every reader now says it
    as ``--config`` does, with the line of a whole-file source."""
    rows = [json.dumps(row) for row in lcb_rows()[:2]]
    array = tmp_path / "rows.json"
    array.write_bytes(("[\n" + rows[0] + ",\n").encode() + b'"caf\xe9"\n]\n')
    with pytest.raises(UsageError) as refused:
        convert_livecodebench(array, tmp_path / "a.jsonl")
    at = len(("[\n" + rows[0] + ",\n").encode()) + 4
    assert str(refused.value) == f"{array}: not UTF-8 text (invalid continuation byte at byte {at}, line 3)"
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_bytes((rows[0] + "\n").encode() + b'{"question_id": "caf\xe9"}\n')
    with pytest.raises(UsageError) as refused:
        convert_livecodebench(jsonl, tmp_path / "b.jsonl")
    assert (
        f"{jsonl}:2: invalid line: not UTF-8 text (invalid continuation byte at byte 20 of the line)"
        in str(refused.value)
    )
    marked = tmp_path / "marked.json"  # a byte order mark is a file's first 3 bytes: counted in the place
    marked.write_bytes(b"\xef\xbb\xbf" + array.read_bytes())
    with pytest.raises(UsageError) as refused:
        convert_livecodebench(marked, tmp_path / "c.jsonl")
    said = f"{marked}: not UTF-8 text (invalid continuation byte at byte {at + 3}, line 3)"
    assert str(refused.value) == said
    marked_line = tmp_path / "marked.jsonl"
    marked_line.write_bytes(b'\xef\xbb\xbf{"question_id": "caf\xe9"}\n' + (rows[0] + "\n").encode())
    with pytest.raises(UsageError) as refused:
        convert_livecodebench(marked_line, tmp_path / "d.jsonl")
    assert str(refused.value) == f"{marked_line}: not UTF-8 text (invalid continuation byte at byte 23)"
