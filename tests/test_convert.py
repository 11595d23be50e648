"""The ToolMATH and LiveCodeBench converters on real sample rows, their errors, and the bundled examples.

Real rows (copied byte for byte from the datasets' samples) are in ``tests/fixtures/convert/``; the
ToolMATH tool files are the example's own, in the release's shape (``function_ToolMATH/<function>``).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import importlib.util
import json
import os
import pickle
import random
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

from asyncroll.coerce import coerce_arguments
from asyncroll.convert.boxed import BoxedError, last_boxed
from asyncroll.convert.lcb_tests import WireFormatError, decode_private, encode_private
from asyncroll.convert.livecodebench import convert_livecodebench
from asyncroll.convert.selection import rank_key, select
from asyncroll.convert.toolmath import convert_toolmath
from asyncroll.errors import UsageError
from asyncroll.workload import Problem, ToolAction, iter_problems, scan_workload
from tests.conftest import REPO, invoke

FIXTURES = REPO / "tests" / "fixtures" / "convert"
TM_SAMPLE = FIXTURES / "toolmath_ToolMATH_sample.json"
TM_HARD = FIXTURES / "toolmath_ToolMATHHard_sample.json"
LCB_ROW = FIXTURES / "livecodebench_code_generation_lite_1873_A.jsonl"
LCB_FRAGMENT = FIXTURES / "livecodebench_functional_fragment_3708.json"
TM_EXAMPLE = REPO / "examples" / "toolmath"
LCB_EXAMPLE = REPO / "examples" / "livecodebench"
real_process = pytest.mark.timeout(60)  # every test that starts a process has a hard deadline


def cli(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "asyncroll.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def without_source_hash(problems: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = copy.deepcopy(problems)
    for problem in out:
        problem["metadata"].pop("source_sha256")
    return out


def tool_records(path: Path = TM_EXAMPLE / "ToolMATH.json") -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))
    return records


def write_json(path: Path, value: Any) -> Path:
    path.write_text(json.dumps(value, indent=1), encoding="utf-8")
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


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# --- selection and boxed answers (pure) --------------------------------------------------------------


def test_rank_is_sha256_of_seed_and_key_and_selection_ignores_order() -> None:
    expected = hashlib.sha256(b'[3,"1873_A"]').hexdigest()
    assert rank_key(3, "1873_A") == expected
    keys = [f"k{i}" for i in range(50)]
    chosen = select(keys, key=str, seed=3, limit=10)
    shuffled = keys[:]
    random.Random(1).shuffle(shuffled)
    assert select(shuffled, key=str, seed=3, limit=10) == chosen
    assert select(keys, key=str, seed=3, limit=None)[:10] == chosen  # a limit takes a prefix
    assert select(keys, key=str, seed=4, limit=10) != chosen


@pytest.mark.parametrize(
    ("solution", "answer"),
    [
        ("so $x = \\boxed{5}$.", "5"),
        ("hence $\\boxed{\\frac{1}{2}}$", "\\frac{1}{2}"),
        ("$\\boxed{\\left(\\frac{3}{4}, \\sqrt{2}\\right)}$", "\\left(\\frac{3}{4}, \\sqrt{2}\\right)"),
        ("the set $\\boxed{\\{1, 2\\}}$", "\\{1, 2\\}"),
        ("first \\boxed{1}, then the answer \\boxed{ 2 }", "2"),
        ("\\fbox{-1004}", "-1004"),
        ("so $x = \\boxed 7$.", "7"),
        ("no box here", None),
        ("\\boxeds{3} is not a box", None),
    ],
)
def test_last_boxed_answer(solution: str, answer: str | None) -> None:
    assert last_boxed(solution) == answer


@pytest.mark.parametrize(
    ("solution", "message"),
    [("\\boxed{\\frac{1}{2}", "unbalanced"), ("\\boxed{}", "empty"), ("answer \\boxed", "no argument")],
)
def test_malformed_boxed_is_an_error(solution: str, message: str) -> None:
    with pytest.raises(BoxedError, match=message):
        last_boxed(solution)


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


def _bad(records: list[dict[str, Any]], index: int, **changes: Any) -> list[dict[str, Any]]:
    records = copy.deepcopy(records)
    for key, value in changes.items():
        if value is _MISSING:
            del records[index][key]
        else:
            records[index][key] = value
    return records


_MISSING = object()


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
            "record [0] ('absolute_difference'): level: expected a string, got int",
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
        (lambda r: [*r, "a string"], "record [12]: expected a tool record object, got str"),
        (lambda r: [], "the list holds no tool records"),
        (lambda r: {"records": r}, "expected a JSON list of tool records, got a dict"),
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
    with pytest.raises(UsageError, match=r"--functions-dir .* is not a directory"):
        convert_toolmath(TM_SAMPLE, tmp_path / "missing", out)
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


# --- ToolMATH execution: the converted example in real workers ---------------------------------------


@pytest.mark.timeout(90)
def test_toolmath_example_runs_end_to_end_with_the_scripted_backend(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = cli("run", "--workload", TM_EXAMPLE / "workload.jsonl", "--backend", "scripted", "--output", out)
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"]["completed"] == 8
    assert summary["tools"]["calls"] == 13
    assert summary["accuracy"]["exact"] == 1.0 and summary["accuracy"]["denominator"] == 8
    finished = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    tool_jobs = [e for e in finished if e["event"] == "cpu_finished" and e["kind"] == "tool"]
    assert len(tool_jobs) == 13 and all(e["ok"] for e in tool_jobs), tool_jobs
    results = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert all(r["status"] == "completed" and r["correct"] is True for r in results)


@real_process
def test_toolmath_tools_run_in_a_worker_with_math_coercion_and_json_safe_results() -> None:
    """Every scripted call of the example, as the runtime makes it: coerced from the declared inputs,
    run in a real worker that imported the converted tool files, answered with JSON-safe values."""
    import asyncio

    from asyncroll.workers import JobRequest, ProcessWorker, ToolSpec

    workload = TM_EXAMPLE / "workload.jsonl"
    scan = scan_workload(workload, TM_EXAMPLE.resolve(), scripted=True)
    assert scan.problems == []
    specs = [ToolSpec(src.name, src.path) for src in scan.tools.values()]
    calls: list[tuple[str, dict[str, Any]]] = []
    for _, _, problem in iter_problems(workload):
        for action in problem.script or []:
            if isinstance(action, ToolAction):
                tool = problem.tool(action.name)
                assert tool is not None and tool.implementation is not None
                key = ToolSpec(tool.name, (TM_EXAMPLE / tool.implementation).resolve()).key
                calls.append((key, coerce_arguments(action.arguments, tool.declared_inputs)))

    async def main() -> dict[str, Any]:
        worker = ProcessWorker(0, specs, startup_timeout=20)
        await worker.start()
        try:
            values = {}
            for job_id, (key, arguments) in enumerate(calls):
                reply = (await worker.call(JobRequest(job_id, key, arguments), 10)).reply
                assert reply.ok, reply.error
                values[key.rsplit("::", 1)[1] + json.dumps(arguments, sort_keys=True, default=str)] = (
                    reply.value
                )
            return values
        finally:
            await worker.aclose()

    async def bounded() -> dict[str, Any]:
        async with asyncio.timeout(40):
            return await main()

    values = asyncio.run(bounded())
    assert len(values) == 13
    by_name = {k.split("{", 1)[0]: v for k, v in values.items()}
    assert by_name["circle_center_from_standard_coeffs_a"] == [-2.0, 3.0]  # a tuple comes back as a list
    assert by_name["shifted_square_to_linear_coeffs"] == [4016.0, 4032064.0]
    assert by_name["circle_radius_from_standard_coeffs"] == 4.0  # uses math without importing it
    assert by_name["mean_of_values"] == 7.0  # list[float] from JSON ints
    assert by_name["min_and_max"] == [3, 12]  # List[int]
    assert by_name["total_from_counts"] == [36, 10]  # dict[int, int] from JSON string keys
    assert by_name["difference_of_numbers"] == 9  # number stays an int
    for value in values.values():
        assert json.loads(json.dumps(value)) == value


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


def test_decompression_is_capped(monkeypatch: Any) -> None:
    import asyncroll.convert.lcb_tests as lcb_tests

    field = _compressed_pickle(json.dumps([{"input": "x" * 5000, "output": "1", "testtype": "stdin"}]))
    assert len(decode_private(field)) == 1
    monkeypatch.setattr(lcb_tests, "MAX_DECOMPRESSED", 1000)
    with pytest.raises(WireFormatError, match="decompresses to more than 1000 bytes; refused"):
        decode_private(field)


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


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
        ([_row(question_id=1873)], "question_id: expected a string, got int"),
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
        (["just a string"], ": expected rows (a JSON array, object or JSONL), got a str"),
        ([_row(), "just a string"], ":2: expected a row object, got str"),
    ],
)
def test_lcb_bad_rows_are_named_and_nothing_is_written(tmp_path: Path, rows: list[Any], message: str) -> None:
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    out = tmp_path / "w.jsonl"
    with pytest.raises(UsageError) as caught:
        convert_livecodebench(source, out)
    assert message in str(caught.value) and str(source) in str(caught.value)
    assert not out.exists()


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
    for first in ("[1, 2, 3]", "42", '"header"', "null"):  # a first line that is JSON but not a row
        not_a_row = tmp_path / "not-a-row-first.jsonl"
        not_a_row.write_text(f"{first}\n{good}\n", encoding="utf-8")
        with pytest.raises(UsageError) as caught:  # was: "not-a-row-first.jsonl:2:1: ... Extra data"
            convert_livecodebench(not_a_row, out)
        assert (
            str(caught.value)
            == f"{not_a_row}:1: expected a row object, got {type(json.loads(first)).__name__}"
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


# --- the bundled examples ----------------------------------------------------------------------------


def _load_generator(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"_example_{path.parent.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("example", [TM_EXAMPLE, LCB_EXAMPLE], ids=["toolmath", "livecodebench"])
def test_committed_example_workloads_are_what_their_generators_make(example: Path) -> None:
    generator = _load_generator(example / "make_example.py")
    assert (example / "workload.jsonl").read_text(encoding="utf-8") == generator.build()


def test_lcb_example_holds_the_real_row_and_a_repair_script_per_problem() -> None:
    source_rows = [
        json.loads(x) for x in (LCB_EXAMPLE / "test.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    assert source_rows[0] == json.loads(LCB_ROW.read_text(encoding="utf-8"))  # the real row, unchanged
    problems = lines(LCB_EXAMPLE / "workload.jsonl")
    assert {p["metadata"]["test_type"] for p in problems} == {"stdin", "functional"}
    for problem in problems:
        Problem.model_validate(problem)
        script = problem["script"]
        assert [a["type"] for a in script] == ["submit", "submit"] and script[0]["code"] != script[1]["code"]


def _passes(code: str, tests: list[dict[str, str]], func_name: str | None) -> bool:
    """A plain reference check of the example's programs (the sandboxed evaluator is tested elsewhere)."""
    if func_name is None:
        for test in tests:
            run = subprocess.run(
                [sys.executable, "-I", "-c", code],
                input=test["input"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            if run.returncode != 0 or run.stdout.split() != test["output"].split():
                return False
        return True
    harness = (
        "import json, sys\nfrom typing import *\nns = {}\nexec(sys.argv[1], ns)\n"
        "tests = json.loads(sys.argv[2])\n"
        "ok = all(getattr(ns['Solution'](), sys.argv[3])(*[json.loads(x) for x in t['input'].split('\\n')])"
        " == json.loads(t['output']) for t in tests)\nprint(ok)\n"
    )
    run = subprocess.run(
        [sys.executable, "-I", "-c", harness, code, json.dumps(tests), func_name],
        capture_output=True,
        text=True,
        timeout=10,
    )
    return run.stdout.strip() == "True"


@real_process
def test_lcb_example_first_submission_fails_and_the_repair_passes() -> None:
    for problem in lines(LCB_EXAMPLE / "workload.jsonl"):
        meta = problem["metadata"]
        wrong, right = (action["code"] for action in problem["script"])
        assert not _passes(wrong, meta["reference_tests"], meta.get("func_name")), problem["id"]
        assert _passes(right, meta["reference_tests"], meta.get("func_name")), problem["id"]


# --- output and source plumbing ----------------------------------------------------------------------


def test_atomic_writer_never_clobbers_a_file_that_appears_meanwhile(tmp_path: Path) -> None:
    from asyncroll.convert.output import write_jsonl_atomic

    out = tmp_path / "w.jsonl"

    def objects() -> Any:
        yield {"id": 1}
        out.write_text("someone else's")  # appears after the checks, before the publish
        yield {"id": 2}

    with pytest.raises(UsageError, match="appeared while converting; not overwritten"):
        write_jsonl_atomic(out, objects())
    assert out.read_text() == "someone else's"
    assert [p.name for p in tmp_path.iterdir()] == ["w.jsonl"]  # the temporary file is gone
    fresh = tmp_path / "sub" / "fresh.jsonl"
    assert write_jsonl_atomic(fresh, [{"b": 1, "a": "é"}]) == 1
    assert fresh.read_bytes() == '{"b":1,"a":"é"}\n'.encode()


def test_jsonl_rows_are_read_again_by_offset_and_a_changed_source_is_refused(tmp_path: Path) -> None:
    from asyncroll.convert.rows import RowSource

    rows = lcb_rows()
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    reader = RowSource(source)
    scanned = list(reader.scan())
    assert all(ref.row is None and ref.offset >= 0 for _, ref in scanned)  # JSONL rows are not kept
    assert reader.sha256 == hashlib.sha256(source.read_bytes()).hexdigest()
    assert [reader.load(ref) for _, ref in scanned] == rows
    changed = source.read_text().replace("A. Short Sort", "A. Short Sorz")
    source.write_text(changed)
    with pytest.raises(UsageError, match=r"rows.jsonl:1: the source changed while it was being converted"):
        reader.load(scanned[0][1])


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
