"""The converters on what the real releases hold beyond the bundled samples (QA findings).

The ToolMATH release declares matrix and point-list inputs as ``List[List[float]]`` (``ToolMATH.json``:
``matrix_multiply_2x2_a``) and ``list[list[float]]`` (``ToolMATHHard.json``: ``min_quadratic_form_3d``,
``area_of_planar_quadrilateral``). Neither file converted at all while a workload could not declare that
type; it can now (the last test converts and runs such a tool). A record whose input type a workload
still cannot declare (a tuple, say) is an error unless ``--skip-unsupported``, which leaves its problem
out. The records below are of those shapes, with our own statements and tool files.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from asyncroll.convert.livecodebench import convert_livecodebench
from asyncroll.convert.toolmath import convert_toolmath
from asyncroll.errors import UsageError
from tests.conftest import REPO, invoke

TM_EXAMPLE = REPO / "examples" / "toolmath"
LCB_ROW = REPO / "tests" / "fixtures" / "convert" / "livecodebench_code_generation_lite_1873_A.jsonl"


def _records() -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = json.loads((TM_EXAMPLE / "ToolMATH.json").read_text(encoding="utf-8"))
    return records


def _matrix_problem() -> list[dict[str, Any]]:
    """One problem, two tools: one takes a point as a tuple (a type a workload cannot declare), one plain
    floats."""
    problem = (
        "The points $(0,0,0)$, $(2,0,0)$, $(2,3,0)$ and $(0,3,0)$ bound a rectangle. Find twice its area."
    )
    common = {
        "source_problem": problem,
        "source_solution": "The area is 6, so $\\boxed{12}$.",
        "level": "Level 2",
    }
    return [
        {
            "name": "quad_area",
            "description": "Area of a planar quadrilateral given its four vertices in order.",
            "inputs": {"points": "Tuple[float, float]"},
            "function": "qa0001.py",
            **common,
            "type": "Precalculus",
        },
        {
            "name": "scale_value",
            "description": "Return k times x.",
            "inputs": {"x": "float", "k": "float"},
            "function": "qa0002.py",
            **common,
            "type": "Precalculus",
        },
    ]


def _functions(tmp_path: Path) -> Path:
    """The example's tool files plus ours for the matrix problem, in the release's layout."""
    root = tmp_path / "functions"
    shutil.copytree(TM_EXAMPLE / "function_ToolMATH", root / "function_ToolMATH")
    (root / "function_ToolMATH" / "qa0001.py").write_text(
        "def quad_area(points):\n"
        "    (ax, ay, _), (bx, by, _), (cx, cy, _), (dx, dy, _) = points\n"
        "    twice = (ax * by - bx * ay) + (bx * cy - cx * by) + (cx * dy - dx * cy) + (dx * ay - ax * dy)\n"
        "    return abs(twice) / 2\n",
        encoding="utf-8",
    )
    (root / "function_ToolMATH" / "qa0002.py").write_text(
        "def scale_value(x: float, k: float) -> float:\n    return k * x\n", encoding="utf-8"
    )
    return root


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps(records, indent=1), encoding="utf-8")
    return path


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().split(b"\n") if line]


def test_toolmath_an_unsupported_input_type_names_the_record_and_the_way_out(tmp_path: Path) -> None:
    """Without --skip-unsupported a ToolMATHHard-style record is an error as before, but the error now
    says how to convert the rest of the release (there was no way: every sample of it failed)."""
    functions = _functions(tmp_path)
    source = _write(tmp_path / "ToolMATHHard.json", [*_records(), *_matrix_problem()])
    out = tmp_path / "out" / "w.jsonl"
    with pytest.raises(UsageError) as caught:
        convert_toolmath(source, functions, out)
    message = str(caught.value)
    assert message.startswith(f"{source}: record [12] ('quad_area'): inputs.points: ")
    assert "unsupported type 'Tuple[float, float]'" in message
    assert message.splitlines()[-1] == (
        "1 record(s) are otherwise valid but take an input type a workload cannot declare: "
        "--skip-unsupported leaves their problems out and converts the rest"
    )
    assert not out.parent.exists()


def test_toolmath_skip_unsupported_leaves_out_whole_problems_and_keeps_the_rest(tmp_path: Path) -> None:
    functions = _functions(tmp_path)
    plain = _write(tmp_path / "plain.json", _records())
    source = _write(tmp_path / "hard.json", [*_records(), *_matrix_problem()])
    expected, got = tmp_path / "expected.jsonl", tmp_path / "got.jsonl"
    convert_toolmath(plain, functions, expected, seed=4)
    report = convert_toolmath(source, functions, got, seed=4, skip_unsupported=True)
    # the problem is left out whole (its float-only tool too), named with the record and the input
    assert report.left_out == [
        "toolmath-12 (record [12] ('quad_area'): inputs.points: 'Tuple[float, float]')"
    ]
    assert (report.records, report.problems, report.skipped, report.written) == (14, 9, 1, 8)

    def same(problems: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = copy.deepcopy(problems)
        for problem in out:
            problem["metadata"].pop("source_sha256")
        return out

    # what is kept is exactly the conversion of the release without that problem, in the same order
    assert same(_lines(got)) == same(_lines(expected))
    limited = tmp_path / "limited.jsonl"
    convert_toolmath(source, functions, limited, seed=4, limit=3, skip_unsupported=True)
    assert _lines(limited) == _lines(got)[:3]
    scan = invoke("validate", got, "--tool-root", functions, "--backend", "openai")
    assert scan.exit_code == 0, scan.stderr


def test_toolmath_skip_unsupported_still_refuses_invalid_records_and_an_empty_result(tmp_path: Path) -> None:
    functions = _functions(tmp_path)
    broken = _matrix_problem()
    broken[0]["function"] = "missing.py"  # an invalid record stays an error, its type issue named too
    source = _write(tmp_path / "broken.json", [*_records(), *broken])
    out = tmp_path / "w.jsonl"
    with pytest.raises(UsageError) as caught:
        convert_toolmath(source, functions, out, skip_unsupported=True)
    message = str(caught.value)
    assert "record [12] ('quad_area'): inputs.points: input 'points' has unsupported type" in message
    assert "record [12] ('quad_area'): function: 'missing.py' not found" in message
    only = _write(tmp_path / "only.json", _matrix_problem())
    with pytest.raises(UsageError, match="every problem has a tool with an input type a workload cannot"):
        convert_toolmath(only, functions, out, skip_unsupported=True)
    assert not out.exists()


def test_toolmath_cli_skip_unsupported_lists_what_it_left_out(tmp_path: Path) -> None:
    functions = _functions(tmp_path)
    source = _write(tmp_path / "hard.json", [*_records(), *_matrix_problem()])
    out = tmp_path / "w.jsonl"
    args = ("convert-toolmath", "--source", source, "--functions-dir", functions, "--output", out)
    refused = invoke(*args)
    assert refused.exit_code == 2 and "--skip-unsupported leaves their problems out" in refused.stderr
    assert not out.exists()
    result = invoke(*args, "--skip-unsupported")
    assert result.exit_code == 0, result.stderr
    summary = f"{out}: 8 of 8 problems (14 tool records, 1 left out by --skip-unsupported), seed 0"
    assert summary in result.stdout
    assert (
        "note: 1 problem(s) left out: a tool takes an input type a workload cannot declare: "
        "toolmath-12 (record [12] ('quad_area'): inputs.points: 'Tuple[float, float]')"
    ) in result.stderr


def test_toolmath_skip_unsupported_help_does_not_call_the_declared_matrices_unsupported() -> None:
    """The flag's help named the release's List[List[float]] matrices as the type it skips, but they are
    declared types (they convert without the flag): the help must not send a user to a flag they do not
    need."""
    result = invoke("convert-toolmath", "--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    assert "List[List[float]] matrices); they are listed" not in text
    assert "List[List[float]] matrices are declared" in text


# --- LiveCodeBench: a source that is not a regular file ----------------------------------------------


@pytest.mark.timeout(30)
def test_lcb_a_pipe_source_is_a_named_error_not_a_traceback_or_a_hang(tmp_path: Path) -> None:
    """``--source <(zcat test.jsonl.gz)`` raised io.UnsupportedOperation out of the command (exit 1 and
    a traceback), and a FIFO nobody wrote to blocked the command for ever."""
    row = (
        REPO / "tests" / "fixtures" / "convert" / "livecodebench_code_generation_lite_1873_A.jsonl"
    ).read_bytes()
    out = tmp_path / "w.jsonl"
    read, write = os.pipe()
    try:
        os.write(write, row)  # well under a pipe's buffer
        os.close(write)
        with pytest.raises(
            UsageError, match=r"is not a regular file \(a pipe or a device\).*save it to a file"
        ):
            convert_livecodebench(Path(f"/dev/fd/{read}"), out)
    finally:
        os.close(read)
    fifo = tmp_path / "rows.fifo"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="is not a regular file"):
        convert_livecodebench(fifo, out)
    result = invoke("convert-livecodebench", "--source", fifo, "--output", out)
    assert result.exit_code == 2 and "is not a regular file" in result.stderr
    assert not out.exists()
    with pytest.raises(UsageError, match="is a directory, not a file"):
        convert_livecodebench(tmp_path, out)


# --- a failed write leaves no folder behind ----------------------------------------------------------


def test_a_conversion_that_fails_while_writing_removes_the_folders_it_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The output's folders were created before the rows were written and stayed, empty, when the write
    failed (the source changed between the passes, the disk filled up, Ctrl-C)."""
    import asyncroll.convert.livecodebench as lcb
    from asyncroll.convert.output import write_jsonl_atomic

    source = tmp_path / "rows.jsonl"
    row = json.loads(LCB_ROW.read_text(encoding="utf-8"))
    source.write_text(json.dumps(row) + "\n", encoding="utf-8")
    real_select = lcb.select

    def select_then_edit(*args: Any, **kwargs: Any) -> Any:
        chosen = real_select(*args, **kwargs)
        source.write_text(json.dumps({**row, "question_title": "changed"}) + "\n", encoding="utf-8")
        return chosen

    monkeypatch.setattr(lcb, "select", select_then_edit)
    out = tmp_path / "new" / "deeper" / "w.jsonl"
    with pytest.raises(UsageError, match="the source changed while it was being converted"):
        convert_livecodebench(source, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl"]

    def interrupted() -> Any:
        yield {"id": 1}
        raise KeyboardInterrupt

    kept = tmp_path / "kept"
    kept.mkdir()
    with pytest.raises(KeyboardInterrupt):
        write_jsonl_atomic(kept / "a" / "w.jsonl", interrupted())
    assert list(kept.iterdir()) == []  # "kept" existed before: it stays; "a" is removed


def test_toolmath_matrix_tools_convert_validate_and_run(tmp_path: Path) -> None:
    """``List[List[float]]`` (ToolMATH.json's spelling; ToolMATHHard's is ``list[list[float]]``) is a
    declared input type: the record converts without any flag, validates, is offered to the model as an
    array of number arrays, and a real worker calls the tool with the matrix (JSON ints as floats)."""
    import asyncio

    from asyncroll.backends.action_schema import tool_schema
    from asyncroll.coerce import coerce_arguments
    from asyncroll.workers.process import ProcessWorker
    from asyncroll.workers.protocol import JobRequest, ToolSpec
    from asyncroll.workload import iter_problems

    functions = _functions(tmp_path)
    (functions / "function_ToolMATH" / "qa0003.py").write_text(
        "def matrix_trace(m):\n    assert all(type(x) is float for row in m for x in row)\n"
        "    return sum(m[i][i] for i in range(len(m)))\n",
        encoding="utf-8",
    )
    matrix = {
        "name": "matrix_trace",
        "description": "Trace of a square matrix given as a list of rows.",
        "inputs": {"m": "List[List[float]]"},
        "function": "qa0003.py",
        "source_problem": "Find the trace of the $2 \\times 2$ identity matrix.",
        "source_solution": "It is $1 + 1 = \\boxed{2}$.",
        "level": "Level 1",
        "type": "Precalculus",
    }
    source = _write(tmp_path / "ToolMATH.json", [*_records(), matrix])
    out = tmp_path / "w.jsonl"
    report = convert_toolmath(source, functions, out)
    assert report.left_out == [] and report.written == 9
    scan = invoke("validate", out, "--tool-root", functions, "--backend", "openai")
    assert scan.exit_code == 0, scan.stderr
    problem = next(p for _, pid, p in iter_problems(out) if pid == "toolmath-12")
    tool = problem.tools[0]
    assert tool_schema(tool)["properties"]["arguments"]["properties"]["m"] == {
        "type": "array",
        "items": {"type": "array", "items": {"type": "number"}},
    }
    arguments = coerce_arguments({"m": [[1, 0], [0, 1]]}, tool.declared_inputs)
    assert tool.implementation is not None
    spec = ToolSpec(tool.name, (functions / tool.implementation).resolve())

    async def call() -> Any:
        worker = ProcessWorker(0, [spec], startup_timeout=20)
        await worker.start()
        try:
            return (await worker.call(JobRequest(1, spec.key, arguments), 10)).reply
        finally:
            await worker.aclose()

    async def bounded() -> Any:
        async with asyncio.timeout(40):
            return await call()

    reply = asyncio.run(bounded())
    assert reply.ok, reply.error
    assert reply.value == 2.0


# --- a download that is not JSON text yet --------------------------------------------------------------


def test_a_compressed_or_parquet_source_is_named_as_such_with_the_way_to_its_rows(tmp_path: Path) -> None:
    """A ``.jsonl.gz`` or a Parquet shard (how dataset hubs serve LiveCodeBench) was "not UTF-8 text" or
    "not valid JSON", which sends a user looking for a broken byte instead of a decompressor."""
    import gzip

    rows = tmp_path / "test.jsonl.gz"
    rows.write_bytes(gzip.compress(LCB_ROW.read_bytes()))
    records = tmp_path / "ToolMATH.json.gz"
    records.write_bytes(gzip.compress((TM_EXAMPLE / "ToolMATH.json").read_bytes()))
    parquet = tmp_path / "test-00000-of-00001.parquet"
    parquet.write_bytes(b"PAR1" + bytes(64) + b"PAR1")
    wide = tmp_path / "test-utf16.jsonl"  # saved by a Windows editor
    wide.write_bytes(LCB_ROW.read_text().encode("utf-16"))
    out = tmp_path / "w.jsonl"
    for args, what in (
        (("convert-livecodebench", "--source", wide), "is UTF-16LE text, not UTF-8: convert it first"),
        (("convert-livecodebench", "--source", rows), "is gzip-compressed, not JSON text: decompress it"),
        (("convert-livecodebench", "--source", parquet), "is a Parquet file, not JSON text: export its rows"),
        (
            ("convert-toolmath", "--source", records, "--functions-dir", TM_EXAMPLE),
            "is gzip-compressed, not JSON text: decompress it",
        ),
    ):
        result = invoke(*args, "--output", out)
        assert result.exit_code == 2 and what in result.stderr, result.stderr
        assert not out.exists()
