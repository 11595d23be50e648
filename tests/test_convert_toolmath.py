"""The ToolMATH converter on real sample records: tools grouped by problem, seeded and byte-deterministic
selection, answers from the solution only when asked, and bad records or files named with nothing written.

The ToolMATH tool files are the example's own, in the release's shape (``function_ToolMATH/<function>``)."""

from __future__ import annotations

import copy
import hashlib
import json
import random
from pathlib import Path
from typing import Any

import pytest

from asyncroll.convert.toolmath import convert_toolmath
from asyncroll.errors import UsageError
from asyncroll.workload import Problem, scan_workload
from tests.cli_runs import cli
from tests.conftest import invoke
from tests.conversions import (
    _MISSING,
    LCB_EXAMPLE,
    TM_EXAMPLE,
    TM_HARD,
    TM_SAMPLE,
    lines,
    re_escape,
    real_process,
    write_json,
)


def tool_records(path: Path = TM_EXAMPLE / "ToolMATH.json") -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))
    return records


# --- ToolMATH ----------------------------------------------------------------------------------------


def test_toolmath_real_samples_group_tools_by_problem(tmp_path: Path) -> None:
    out = tmp_path / "hard.jsonl"
    report = convert_toolmath(TM_HARD, TM_EXAMPLE, out)
    assert (report.records, report.problems, report.written) == (5, 2, 2)
    problems = {p["id"]: p for p in lines(out)}
    assert set(problems) == {"toolmath-0", "toolmath-3"}
    circle, linear = problems["toolmath-0"], problems["toolmath-3"]
    assert circle["prompt"].startswith("Let $C$ be the circle with equation")
    assert [t["name"] for t in circle["tools"]] == [
        "circle_center_from_standard_coeffs_a",
        "circle_radius_from_standard_coeffs",
        "sum_three_numbers_a",
    ]
    assert [t["implementation"] for t in linear["tools"]] == [
        "function_ToolMATH/gubbb8.py",
        "function_ToolMATH/ayn1b7.py",
    ]
    assert circle["tools"][1]["inputs"] == {"D": "float", "E": "float", "F": "float"}
    digest = hashlib.sha256(TM_HARD.read_bytes()).hexdigest()
    assert circle["metadata"] == {
        "source": "ToolMATH",
        "source_indices": [0, 1, 2],
        "level": "Level 4",
        "type": "Algebra",
        "sample_seed": 0,
        "source_sha256": digest,
    }
    assert linear["metadata"]["source_indices"] == [3, 4]
    for problem in problems.values():
        assert "reference_answer" not in problem  # never invented by default
        assert "boxed" not in json.dumps(problem)  # the solution never leaks
        Problem.model_validate(problem)
    scan = scan_workload(out, TM_EXAMPLE.resolve(), scripted=False)
    assert scan.problems == [] and scan.count == 2 and len(scan.tools) == 5


def test_the_tool_root_hint_is_quoted_for_the_shell(tmp_path: Path) -> None:
    """``run with --tool-root fn 中`` for a folder with a space (or a ``;``) was pasted as two words, or two
    commands: the folder is written as a shell word."""
    import shlex
    import shutil

    functions = tmp_path / "fn dir; é"
    shutil.copytree(TM_EXAMPLE, functions)
    out = tmp_path / "out" / "sample.jsonl"
    result = invoke("convert-toolmath", "--source", TM_SAMPLE, "--functions-dir", functions, "--output", out)
    assert result.exit_code == 0, result.stderr
    hint = result.stdout.rstrip("\n").split("; run with ", 1)[1]
    assert shlex.split(hint) == ["--tool-root", str(functions)], hint


@real_process
def test_toolmath_sample_with_one_tool_per_problem_and_cli_validate(tmp_path: Path) -> None:
    out = tmp_path / "sample.jsonl"
    result = cli("convert-toolmath", "--source", TM_SAMPLE, "--functions-dir", TM_EXAMPLE, "--output", out)
    assert result.returncode == 0, result.stderr
    assert f"{out}: 3 of 3 problems (3 tool records), seed 0; run with --tool-root" in result.stdout
    assert sorted(p["id"] for p in lines(out)) == ["toolmath-0", "toolmath-1", "toolmath-2"]
    check = invoke("validate", out, "--tool-root", TM_EXAMPLE, "--backend", "openai")
    assert check.exit_code == 0, check.stderr
    answered = tmp_path / "answered.jsonl"
    converted = invoke(
        "convert-toolmath",
        "--source",
        TM_SAMPLE,
        "--functions-dir",
        TM_EXAMPLE,
        "--output",
        answered,
        "--answers-from-solution",
        "--limit",
        "2",
        "--seed",
        "3",
    )
    assert converted.exit_code == 0, converted.stderr
    assert f"{answered}: 2 of 3 problems (3 tool records), seed 3" in converted.stdout
    problems = lines(answered)
    assert [p["metadata"]["sample_seed"] for p in problems] == [3, 3]
    assert {p["id"]: p["reference_answer"] for p in problems}.items() <= {
        "toolmath-0": "1000",
        "toolmath-1": "19",
        "toolmath-2": "5",
    }.items()


def test_toolmath_is_byte_deterministic_and_seeded(tmp_path: Path) -> None:
    source = TM_EXAMPLE / "ToolMATH.json"
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    convert_toolmath(source, TM_EXAMPLE, a, seed=11)
    convert_toolmath(source, TM_EXAMPLE, b, seed=11)
    convert_toolmath(source, TM_EXAMPLE, c, seed=12)
    assert a.read_bytes() == b.read_bytes()
    assert [p["id"] for p in lines(a)] != [p["id"] for p in lines(c)]
    assert sorted(p["id"] for p in lines(a)) == sorted(p["id"] for p in lines(c))
    limited = tmp_path / "limited.jsonl"
    convert_toolmath(source, TM_EXAMPLE, limited, seed=11, limit=3)
    assert a.read_text().splitlines(keepends=True)[:3] == limited.read_text().splitlines(keepends=True)


def test_toolmath_selection_does_not_depend_on_record_order(tmp_path: Path) -> None:
    records = tool_records()
    shuffled = records[:]
    random.Random(5).shuffle(shuffled)
    assert shuffled != records
    a = tmp_path / "a.jsonl"
    b = tmp_path / "b.jsonl"
    convert_toolmath(write_json(tmp_path / "in_a.json", records), TM_EXAMPLE, a, seed=2, limit=4)
    convert_toolmath(write_json(tmp_path / "in_b.json", shuffled), TM_EXAMPLE, b, seed=2, limit=4)

    def selection(path: Path) -> list[tuple[str, list[tuple[str, str]]]]:
        # ids and tool order follow record positions, which shuffling moves; the problems must not
        return [
            (p["prompt"], sorted((t["name"], t["implementation"]) for t in p["tools"])) for p in lines(path)
        ]

    assert selection(a) == selection(b) and len(selection(a)) == 4
    for problem in lines(b):  # ids still name the first source index of the shuffled file
        first = min(problem["metadata"]["source_indices"])
        assert problem["id"] == f"toolmath-{first}"
        assert shuffled[first]["source_problem"] == problem["prompt"]


def test_toolmath_answers_from_solution_are_labelled(tmp_path: Path) -> None:
    out = tmp_path / "answers.jsonl"
    records = tool_records()
    records[0]["source_solution"] = "A solution that forgot its box."
    report = convert_toolmath(
        write_json(tmp_path / "s.json", records), TM_EXAMPLE, out, answers_from_solution=True
    )
    problems = {p["id"]: p for p in lines(out)}
    assert report.without_answer == ["toolmath-0"]
    assert problems["toolmath-0"]["reference_answer"] is None
    assert problems["toolmath-0"]["metadata"]["reference_answer_source"].startswith("none:")
    assert problems["toolmath-6"]["reference_answer"] == "-1004"
    assert problems["toolmath-3"]["reference_answer"] == "5"
    assert problems["toolmath-3"]["metadata"]["reference_answer_source"].startswith("derived:")
    cli_out = tmp_path / "cli.jsonl"
    said = invoke(
        "convert-toolmath",
        *("--source", tmp_path / "s.json", "--functions-dir", TM_EXAMPLE, "--output", cli_out),
        "--answers-from-solution",
    )
    assert said.exit_code == 0, said.output
    assert "note: 1 problem(s) have no reference_answer (no \\boxed{} answer, " in said.stderr
    assert said.stderr.endswith("metadata.reference_answer_source says which): toolmath-0\n")


def test_toolmath_records_of_one_problem_that_give_different_answers_leave_it_without_one(
    tmp_path: Path,
) -> None:
    """The answer came from the first record's solution only: records of one problem whose solutions box
    different answers got whichever record came first as the reference (the order of the release)."""
    out = tmp_path / "answers.jsonl"
    records = tool_records()
    assert [r["source_problem"] == records[3]["source_problem"] for r in records[3:5]] == [True, True]
    records[4]["source_solution"] = records[3]["source_solution"].replace("\\boxed{5}", "\\boxed{6}")
    assert records[4]["source_solution"] != records[3]["source_solution"]
    report = convert_toolmath(
        write_json(tmp_path / "s.json", records), TM_EXAMPLE, out, answers_from_solution=True
    )
    problem = {p["id"]: p for p in lines(out)}["toolmath-3"]
    assert problem["reference_answer"] is None and "toolmath-3" in report.without_answer
    assert problem["metadata"]["reference_answer_source"] == (
        "none: the problem's records disagree: [3] gives '5', [4] gives '6'"
    )
    said = invoke(
        "convert-toolmath",
        *("--source", tmp_path / "s.json", "--functions-dir", TM_EXAMPLE, "--output", tmp_path / "cli.jsonl"),
        "--answers-from-solution",
    )
    assert said.exit_code == 0, said.output
    # the note named only a missing \boxed{}, which is not why this problem has no answer
    assert "or their records box different ones" in said.stderr and "toolmath-3" in said.stderr


def test_toolmath_records_whose_answers_differ_only_in_whitespace_agree(tmp_path: Path) -> None:
    """Grading compares whitespace-normalised answers, so boxed answers that differ only in whitespace
    (a record re-wrapped, as its problem text may be) are one answer, not a disagreement that left the
    problem without a reference answer."""
    out = tmp_path / "answers.jsonl"
    records = tool_records()
    records[3]["source_solution"] = records[3]["source_solution"].replace("\\boxed{5}", "\\boxed{x +\n 5}")
    for other in records[4:6]:
        assert other["source_problem"] == records[3]["source_problem"]
        other["source_solution"] = other["source_solution"].replace("\\boxed{5}", "\\boxed{x + 5}")
    report = convert_toolmath(
        write_json(tmp_path / "s.json", records), TM_EXAMPLE, out, answers_from_solution=True
    )
    problem = {p["id"]: p for p in lines(out)}["toolmath-3"]
    assert "toolmath-3" not in report.without_answer
    assert problem["reference_answer"] == "x +\n 5"  # the first record's, as written
    assert problem["metadata"]["reference_answer_source"].startswith("derived:")


def _bad(records: list[dict[str, Any]], index: int, **changes: Any) -> list[dict[str, Any]]:
    records = copy.deepcopy(records)
    for key, value in changes.items():
        if value is _MISSING:
            del records[index][key]
        else:
            records[index][key] = value
    return records


def test_toolmath_a_record_key_given_twice_is_refused(tmp_path: Path) -> None:
    """``json`` keeps the last of a repeated key: a record naming its tool twice was converted under the
    second name, silently."""
    source = tmp_path / "ToolMATH.json"
    source.write_text(json.dumps(tool_records()).replace('"name": ', '"name": "twice", "name": ', 1))
    out = tmp_path / "w.jsonl"
    with pytest.raises(UsageError) as caught:
        convert_toolmath(source, TM_EXAMPLE, out)
    assert str(caught.value) == f"{source}: cannot be read as JSON: key 'name' is given twice in one object"
    assert not out.exists()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda r: _bad(r, 2, inputs={"number": "complex"}),
            "record [2] ('absolute_value_b'): inputs.number",
        ),
        (lambda r: _bad(r, 1, level=_MISSING), "record [1] ('absolute_value_a'): level: missing"),
        (
            lambda r: _bad(r, 0, level=5),
            "record [0] ('absolute_difference'): level: expected a string, got an integer",
        ),
        (lambda r: _bad(r, 0, inputs=["x"]), "inputs: expected an object"),
        (lambda r: _bad(r, 0, name="not a name"), "name: 'not a name' is not a Python function name"),
        (lambda r: _bad(r, 0, source_problem="  "), "source_problem: empty"),
        (
            lambda r: _bad(r, 4, function="nope.py"),
            "record [4] ('circle_radius_from_standard_coeffs'): "
            "function: 'nope.py' not found in --functions-dir",
        ),
        (lambda r: _bad(r, 0, function="../../../etc/x.py"), "escapes --functions-dir"),
        (lambda r: _bad(r, 0, function="/etc/hosts.py"), "is absolute"),
        (lambda r: _bad(r, 0, function="ToolMATH.json"), "is not a .py file"),
        (
            lambda r: _bad(r, 0, function="ayn1b7.py"),
            "function_ToolMATH/ayn1b7.py defines no top-level function 'absolute_difference' "
            "(it defines: solve_linear_equation)",
        ),
        (
            lambda r: _bad(r, 4, name="circle_center_from_standard_coeffs_a", function="ieqh52.py"),
            "record [4]: name: tool 'circle_center_from_standard_coeffs_a' appears twice in one problem "
            "(also record [3])",
        ),
        (lambda r: [*r, "a string"], "record [12]: expected a tool record object, got a string"),
        (lambda r: [], "the list holds no tool records"),
        (lambda r: {"records": r}, "expected a JSON list of tool records, got an object"),
    ],
)
def test_toolmath_bad_records_are_named_and_nothing_is_written(
    tmp_path: Path, mutate: Any, message: str
) -> None:
    source = write_json(tmp_path / "ToolMATH.json", mutate(tool_records()))
    out = tmp_path / "out" / "w.jsonl"
    with pytest.raises(UsageError) as caught:
        convert_toolmath(source, TM_EXAMPLE, out)
    assert message in str(caught.value)
    assert str(caught.value).startswith(f"{source}: ")
    assert not out.parent.exists()


def test_toolmath_file_level_errors(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('[\n  {"name": "x",\n  oops}\n]')
    out = tmp_path / "w.jsonl"
    with pytest.raises(UsageError, match=rf"{broken}:3:3: not valid JSON"):
        convert_toolmath(broken, TM_EXAMPLE, out)
    funcs = tmp_path / "funcs"
    (funcs / "function_ToolMATH").mkdir(parents=True)
    (funcs / "function_ToolMATH" / "ao5wa0.py").write_text(
        "def absolute_difference(x, y):\n    return (x -\n"
    )
    with pytest.raises(UsageError, match=r"ao5wa0.py: not valid Python: line 2"):
        convert_toolmath(TM_SAMPLE, funcs, out)
    with pytest.raises(UsageError, match=r"--functions-dir .*missing: does not exist"):
        convert_toolmath(TM_SAMPLE, tmp_path / "missing", out)
    with pytest.raises(UsageError, match=r"--functions-dir .*ao5wa0.py: not a directory"):
        convert_toolmath(TM_SAMPLE, funcs / "function_ToolMATH" / "ao5wa0.py", out)
    with pytest.raises(UsageError, match="--limit must be a positive integer, got 0"):
        convert_toolmath(TM_SAMPLE, TM_EXAMPLE, out, limit=0)
    with pytest.raises(UsageError, match="is the source file"):
        convert_toolmath(TM_SAMPLE, TM_EXAMPLE, TM_SAMPLE)
    out.write_text("keep")
    with pytest.raises(UsageError, match="already exists"):
        convert_toolmath(TM_SAMPLE, TM_EXAMPLE, out)
    assert out.read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.json", "funcs", "w.jsonl"]  # no temp left


@real_process
def test_toolmath_records_one_per_line_get_the_way_to_a_json_list(tmp_path: Path) -> None:
    """Records exported one per line (JSONL) were refused with "not valid JSON: Extra data" alone."""
    records = tool_records()
    jsonl = tmp_path / "records.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    with pytest.raises(UsageError) as refused:
        convert_toolmath(jsonl, TM_EXAMPLE, tmp_path / "w.jsonl")
    assert str(refused.value).split("\n") == [
        f"{jsonl}:2:1: not valid JSON: Extra data",
        "the source looks like JSONL (one record per line); convert-toolmath reads a JSON list of records, "
        "as ToolMATH.json is: make one with `jq -s . FILE > records.json`",
    ]
    broken = tmp_path / "broken.json"  # a list with something after it is not JSONL: no hint
    broken.write_text(json.dumps(records) + "\n]\n", encoding="utf-8")
    with pytest.raises(UsageError, match=r"Extra data$"):
        convert_toolmath(broken, TM_EXAMPLE, tmp_path / "w.jsonl")
    assert not (tmp_path / "w.jsonl").exists()


def test_livecodebench_rows_given_to_the_toolmath_converter_name_the_right_converter(tmp_path: Path) -> None:
    """LiveCodeBench rows given to convert-toolmath: a JSONL file was "Extra data" (and then called
    JSONL to put in a list), an array listed the missing record fields, neither named the converter."""
    rows = [
        json.loads(line) for line in (LCB_EXAMPLE / "test.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    hint = "these look like LiveCodeBench rows: convert them with convert-livecodebench"
    for source in (LCB_EXAMPLE / "test.jsonl", write_json(tmp_path / "rows.json", rows)):
        with pytest.raises(UsageError) as refused:
            convert_toolmath(source, TM_EXAMPLE, tmp_path / "w.jsonl")
        assert str(refused.value).split("\n")[-1] == hint
    records: list[Any] = tool_records()  # a ToolMATH file with one stray row is not taken for LiveCodeBench
    with pytest.raises(UsageError) as tm_refused:
        convert_toolmath(write_json(tmp_path / "mixed.json", [*records, rows[0]]), TM_EXAMPLE, tmp_path / "w")
    assert "LiveCodeBench" not in str(tm_refused.value)


def test_toolmath_cli_errors_exit_2_and_write_nothing(tmp_path: Path) -> None:
    out = tmp_path / "w.jsonl"
    result = invoke("convert-toolmath", "--source", TM_SAMPLE, "--functions-dir", tmp_path, "--output", out)
    assert result.exit_code == 2
    assert "error: " in result.stderr and "'ao5wa0.py' not found in --functions-dir" in result.stderr
    assert not out.exists()
    result = invoke(
        "convert-toolmath",
        "--source",
        TM_SAMPLE,
        "--functions-dir",
        TM_EXAMPLE,
        "--output",
        out,
        "--limit",
        "-1",
    )
    assert result.exit_code == 2 and "--limit must be a positive integer, got -1" in result.stderr
    assert not out.exists()


def test_toolmath_refuses_to_write_a_workload_validate_would_reject(tmp_path: Path) -> None:
    """A record whose ``inputs`` miss its function's parameter was written, and ``validate`` then
    rejected the file; the conversion now runs the same checks first and writes nothing."""
    from asyncroll.errors import UsageError

    records = json.loads((TM_EXAMPLE / "ToolMATH.json").read_text())
    records[0]["inputs"] = {}
    source = tmp_path / "tm.json"
    source.write_text(json.dumps(records))
    out = tmp_path / "w.jsonl"
    with pytest.raises(UsageError) as caught:
        convert_toolmath(source, TM_EXAMPLE, out)
    assert not out.exists()
    # the error names the source file and the record (it said "problem toolmath-0: tools[0].inputs: ...")
    assert str(caught.value).startswith(f"{source}: record [0] ({records[0]['name']!r}): inputs: ")
    assert " requires " in str(caught.value)
    for seed in range(8):  # whichever problems a limited sample keeps, the bad record is refused
        with pytest.raises(UsageError, match=re_escape(f"{source}: record [0] ")):
            convert_toolmath(source, TM_EXAMPLE, out, limit=1, seed=seed)
        assert not out.exists()
