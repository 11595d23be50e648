"""Workload validation: every problem reported as FILE:LINE: field: message; nothing runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from asyncroll import tool_files
from asyncroll.backends.action_schema import _INPUT_SCHEMAS
from asyncroll.coerce import TYPE_NAMES, CoercionError, canonical_type, coerce_arguments
from asyncroll.errors import WorkloadError
from asyncroll.schemas import schemas
from asyncroll.workload import iter_problems, scan_workload
from asyncroll.workload import scan as workload_scan
from tests.conftest import REPO

GOOD = {
    "id": "a",
    "prompt": "p",
    "tools": [{"name": "add"}],
    "script": [
        {"type": "tool", "name": "add", "arguments": {"a": 1, "b": 2}},
        {"type": "final", "answer": 3},
    ],
}


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _problems(tmp_path: Path, lines: list[str], scripted: bool = True) -> list[str]:
    path = _write(tmp_path, lines)
    return scan_workload(path, tmp_path, scripted=scripted).problems


def test_smoke_workload_is_valid() -> None:
    path = REPO / "examples" / "smoke.jsonl"
    scan = scan_workload(path, path.parent, scripted=True)
    assert scan.problems == [] and scan.count == 3
    assert [pid for _, pid, _ in iter_problems(path)] == ["smoke-add", "smoke-sleep", "smoke-answer"]


def test_every_problem_is_reported_with_file_line_and_field(tmp_path: Path) -> None:
    lines = [
        json.dumps(GOOD),
        "{not json",
        json.dumps({**GOOD, "id": "a"}),  # duplicate id
        json.dumps({**GOOD, "id": "c", "tools": [{"name": "frobnicate"}]}),
        json.dumps({**GOOD, "id": "d", "prompt": None}),
        json.dumps(
            {**GOOD, "id": "e", "script": [{"type": "tool", "name": "add", "arguments": {"a": True, "b": 2}}]}
        ),
        json.dumps({**GOOD, "id": "f", "script": [{"type": "dance"}]}),
        json.dumps({**GOOD, "id": "g", "tools": [{"name": "add"}, {"name": "add"}]}),
        json.dumps({k: v for k, v in GOOD.items() if k != "script"} | {"id": "h"}),
        json.dumps(
            {**GOOD, "id": "i", "tools": [{"name": "t", "inputs": {"x": "tensor"}, "implementation": "t.py"}]}
        ),
        "[1, 2]",
    ]
    problems = _problems(tmp_path, lines)
    path = tmp_path / "w.jsonl"
    text = "\n".join(problems)
    expected = [
        (2, "line", "not valid JSON"),
        (3, "id", "duplicate id 'a' (first on line 1)"),
        (4, "tools[0].name", "unknown tool 'frobnicate'"),
        (5, "prompt", "Input should be a valid string"),
        (6, "script[0].arguments.a", "expected number, got bool"),
        (7, "script[0].type", "'dance' is not an action's type: 'tool', 'final' or 'submit'"),
        (8, "tools[1].name", "duplicate tool name 'add'"),
        (9, "script", "required by the scripted backend"),
        (10, "tools[0].inputs", "unsupported type 'tensor'"),
        (11, "line", "expected a JSON object"),
    ]
    for line, field, message in expected:
        assert any(p.startswith(f"{path}:{line}: {field}") and message in p for p in problems), (line, text)
    assert not any(p.startswith(f"{path}:1:") for p in problems)


def test_tool_paths_are_confined_to_the_tool_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "outside.py").write_text("def f(x):\n    return x\n")
    (root / "inside.py").write_text("def f(x):\n    return x\n")
    base = {"prompt": "p", "script": [{"type": "final", "answer": 1}]}
    lines = [
        json.dumps(
            {**base, "id": 1, "tools": [{"name": "f", "inputs": {"x": "int"}, "implementation": "inside.py"}]}
        ),
        json.dumps(
            {
                **base,
                "id": 2,
                "tools": [{"name": "f", "inputs": {"x": "int"}, "implementation": "../outside.py"}],
            }
        ),
        json.dumps(
            {
                **base,
                "id": 3,
                "tools": [{"name": "f", "inputs": {"x": "int"}, "implementation": "missing.py"}],
            }
        ),
        json.dumps(
            {
                **base,
                "id": 4,
                "tools": [{"name": "f", "inputs": {"x": "int"}, "implementation": str(root / "inside.py")}],
            }
        ),
    ]
    path = _write(root, lines)
    scan = scan_workload(path, root, scripted=True)
    assert len(scan.problems) == 3
    assert "escapes the tool root" in scan.problems[0] and ":2: tools[0].implementation" in scan.problems[0]
    assert "does not exist" in scan.problems[1]
    assert "must be relative" in scan.problems[2]
    assert list(scan.tools) == ["inside.py:f"]


def test_submit_without_one_repair_protocol_is_rejected(tmp_path: Path) -> None:
    line = json.dumps({"id": 1, "prompt": "p", "script": [{"type": "submit", "code": "print(1)"}]})
    problems = _problems(tmp_path, [line])
    assert any("script[0].type" in p and "one_repair" in p for p in problems)


def test_invalid_workload_raises_with_all_problems(tmp_path: Path) -> None:
    path = _write(tmp_path, ["{", "{"])
    scan = scan_workload(path, tmp_path, scripted=True)
    with pytest.raises(WorkloadError) as info:
        scan.raise_if_invalid()
    assert len(info.value.problems) == 2


def test_empty_workload_is_an_error(tmp_path: Path) -> None:
    assert "holds no problems" in _problems(tmp_path, [""])[0]


def test_limit_and_default_ids(tmp_path: Path) -> None:
    line = json.dumps({k: v for k, v in GOOD.items() if k != "id"})
    path = _write(tmp_path, [line, "", line, line])
    assert [pid for _, pid, _ in iter_problems(path, limit=2)] == ["1", "3"]
    assert scan_workload(path, tmp_path, scripted=True, limit=2).count == 2


@pytest.mark.parametrize(
    ("value", "type_name", "expected"),
    [
        (3, "int", 3),
        (3, "float", 3.0),
        (2.5, "number", 2.5),
        ("s", "str", "s"),
        (True, "bool", True),
        ([1, 2], "list[int]", [1, 2]),
        ([1, 2.5], "List[float]", [1.0, 2.5]),
        ({"1": 2}, "dict[int, int]", {1: 2}),
        (2.0, "int", 2),  # JSON does not tell 2.0 from 2, nor does the schema's "integer"
        ([1.0, 2], "list[int]", [1, 2]),
        ({"1": -3.0}, "dict[int, int]", {1: -3}),
        ([[1, 0], [0.5, 2]], "List[List[float]]", [[1.0, 0.0], [0.5, 2.0]]),  # ToolMATH's matrices
        ([[0, 0, 1], []], "list[list[int]]", [[0, 0, 1], []]),
        ([[1.0]], "List[ list[int] ]", [[1]]),
    ],
)
def test_strict_coercion_accepts(value: object, type_name: str, expected: object) -> None:
    assert coerce_arguments({"x": value}, {"x": type_name}) == {"x": expected}


@pytest.mark.parametrize(
    ("value", "type_name"),
    [
        (True, "int"),
        (2.5, "int"),
        ("3", "int"),
        (False, "float"),
        (1, "bool"),
        (3, "str"),
        ([True], "list[int]"),
        ({"a": 1}, "dict[int, int]"),
        ({"01": 1}, "dict[int, int]"),  # one integer, one spelling: "1" and "01" would merge
        ({" 1 ": 1}, "dict[int, int]"),
        ({"+4": 1}, "dict[int, int]"),
        ({"1_000": 1}, "dict[int, int]"),
        ({"\u0663": 1}, "dict[int, int]"),  # Arabic-Indic three: int() reads it
        ({"-0": 1}, "dict[int, int]"),
        ("1,2", "list[int]"),
        (None, "number"),
        (float("inf"), "int"),
        (float("nan"), "int"),
        ([1.5], "list[int]"),
        ([1, 2], "list[list[float]]"),  # a flat list is not a matrix
        ([[1], 2], "List[List[int]]"),
        ([[True]], "list[list[float]]"),
        ([[[1.0]]], "list[list[float]]"),
    ],
)
def test_strict_coercion_rejects(value: object, type_name: str) -> None:
    with pytest.raises(CoercionError):
        coerce_arguments({"x": value}, {"x": type_name})


def test_what_the_servers_schema_accepts_coercion_accepts() -> None:
    """A reply the server's JSON Schema lets through must not then fail the strict coercion: it was
    logged as a valid model reply and then failed its trajectory as an invalid action (``2.0`` for an
    ``int``), out of the validity rate."""
    values: list[object] = [3, -0.0, 2.0, 2.5, 1e300, True, "3", None, [1, 2.0], [1.5], [True], {"1": 2}]
    values += [{"1": 2.0}, {"-4": 1}, {"a": 1}, {" 1": 2}, {"1": True}, [], {}, {"0": 1, "-0": 2}]
    values += [{"1": 5, "01": 6}, {"-12": 1, "120": 2}, {"1\n": 3}]
    values += [[[1, 2.0], []], [[1.5]], [[True]], [[1], 2], [[[1]]]]
    for type_name in TYPE_NAMES:
        validator = jsonschema.Draft202012Validator(_INPUT_SCHEMAS[canonical_type(type_name)])
        for value in values:
            if validator.is_valid(value):
                coerce_arguments({"x": value}, {"x": type_name})  # raises if stricter than the schema


def test_numbers_too_large_for_their_type_are_a_coercion_error_not_a_crash() -> None:
    """10**400 for a float input raised OverflowError; a dict[int, int] key of 4,301 digits raised
    ValueError (Python's int-string limit), and so did an error message showing such an int."""
    with pytest.raises(CoercionError, match="too large for a float"):
        coerce_arguments({"x": 10**400}, {"x": "float"})
    with pytest.raises(CoercionError, match="4,301 digits is too long an integer"):
        coerce_arguments({"x": {"9" * 4301: 1}}, {"x": "dict[int, int]"})
    with pytest.raises(CoercionError, match="expected bool, got int <an int too large to show>"):
        coerce_arguments({"x": 10**4400}, {"x": "bool"})


def test_two_keys_that_are_one_integer_are_refused_not_merged() -> None:
    """Bound arguments are Python values: ``1`` and ``"1"`` are one key of a ``dict[int, int]``; the last
    silently won."""
    with pytest.raises(CoercionError, match="the integer 1 again"):
        coerce_arguments({"x": {1: 5, "1": 6}}, {"x": "dict[int, int]"})
    assert coerce_arguments({"x": {"-12": 1, "0": 2, 7: 3}}, {"x": "dict[int, int]"}) == {
        "x": {-12: 1, 0: 2, 7: 3}
    }


def test_arguments_must_match_declared_inputs_exactly() -> None:
    with pytest.raises(CoercionError, match="missing"):
        coerce_arguments({"a": 1}, {"a": "int", "b": "int"})
    with pytest.raises(CoercionError, match="unexpected"):
        coerce_arguments({"a": 1, "c": 2}, {"a": "int"})
    assert coerce_arguments({"a": 1}, {"a": "int", "b": "int"}, {"b": 5}) == {"a": 1, "b": 5}


# --- the workload file itself: a regular file, read twice, unchanged in between --------------------------


def _smoke_copy(tmp_path: Path) -> Path:
    path = tmp_path / "w.jsonl"
    path.write_bytes((REPO / "examples" / "smoke.jsonl").read_bytes())
    return path


@pytest.mark.timeout(10)
def test_a_pipe_is_refused_without_reading_it(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # nobody writes to it: opening it must not block
    problems = scan_workload(fifo, tmp_path, scripted=True).problems
    assert len(problems) == 1 and problems[0].startswith(f"{fifo}: not a regular file (a pipe)")
    assert "save it to a file first" in problems[0]
    read, write = os.pipe()
    try:
        os.write(write, (REPO / "examples" / "smoke.jsonl").read_bytes())
        os.close(write)
        piped = Path(f"/dev/fd/{read}")
        scan = scan_workload(piped, tmp_path, scripted=True)
        assert scan.count == 0 and "not a regular file (a pipe)" in scan.problems[0]
        with pytest.raises(WorkloadError, match="not a regular file"):
            scan.raise_if_invalid()
        assert os.read(read, 10) == b'{"id": "sm'  # the scan left the pipe's content unread
    finally:
        os.close(read)
    assert scan_workload(tmp_path, tmp_path, scripted=True).problems == [
        f"{tmp_path}: is a directory, not a workload file"
    ]


def test_a_symlink_to_a_regular_file_is_accepted(tmp_path: Path) -> None:
    link = tmp_path / "link.jsonl"
    link.symlink_to(_smoke_copy(tmp_path))
    scan = scan_workload(link, REPO / "examples", scripted=True)
    assert scan.problems == [] and scan.count == 3
    assert [pid for _, pid, _ in iter_problems(link, identity=scan.identity)][-1] == "smoke-answer"


@pytest.mark.timeout(60)
def test_run_from_a_pipe_is_a_usage_error_and_creates_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "asyncroll.cli", "run", "--workload", "/dev/stdin", "--output", str(out)],
        input=(REPO / "examples" / "smoke.jsonl").read_bytes(),
        capture_output=True,
        timeout=50,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert b"/dev/stdin: not a regular file (a pipe)" in result.stderr and not out.exists()


def test_a_file_rewritten_in_place_after_validation_is_not_read(tmp_path: Path) -> None:
    path = _smoke_copy(tmp_path)
    scan = scan_workload(path, REPO / "examples", scripted=True)
    assert scan.problems == [] and scan.identity is not None
    inode = path.stat().st_ino
    with path.open("r+b") as handle:  # same inode, new (never validated) content
        handle.write(b'{"id": "evil", "prompt": "p", "script": [{"type": "final", "answer": 1}]}\n')
        handle.truncate()
    assert path.stat().st_ino == inode
    with pytest.raises(WorkloadError, match="changed since it was validated") as info:
        next(iter_problems(path, identity=scan.identity))
    assert info.value.problems[0].startswith(f"{path}: ")


def test_a_same_size_rewrite_is_caught_by_its_modification_time(tmp_path: Path) -> None:
    path = _smoke_copy(tmp_path)
    scan = scan_workload(path, REPO / "examples", scripted=True)
    assert scan.identity is not None
    path.write_bytes(path.read_bytes().replace(b"smoke-add", b"smoke-ADD"))
    os.utime(path, ns=(scan.identity.mtime_ns + 1_000, scan.identity.mtime_ns + 1_000))
    assert path.stat().st_size == scan.identity.size
    with pytest.raises(WorkloadError, match="changed since it was validated"):
        next(iter_problems(path, identity=scan.identity))


def test_a_rewrite_in_place_during_the_stream_stops_it(tmp_path: Path) -> None:
    path = _smoke_copy(tmp_path)
    scan = scan_workload(path, REPO / "examples", scripted=True)
    for identity in (scan.identity, None):  # without the scan's identity: checked against the first open
        stream = iter_problems(path, identity=identity)
        assert next(stream)[1] == "smoke-add"
        with path.open("ab") as handle:
            handle.write(b'{"id": "late", "prompt": "p", "script": [{"type": "final", "answer": 1}]}\n')
        with pytest.raises(WorkloadError, match="stopped before line 2"):
            next(stream)
        path.write_bytes((REPO / "examples" / "smoke.jsonl").read_bytes())
        scan = scan_workload(path, REPO / "examples", scripted=True)


def test_a_file_that_changes_while_it_is_scanned_is_invalid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _smoke_copy(tmp_path)
    original = workload_scan.check_problem

    def check_then_append(*args: Any) -> list[tuple[str, str]]:
        with path.open("ab") as handle:
            handle.write(b"\n")
        return original(*args)

    monkeypatch.setattr(workload_scan, "check_problem", check_then_append)
    problems = scan_workload(path, REPO / "examples", scripted=True).problems
    assert problems == [f"{path}: changed while it was being validated; validate it again when stable"]


def test_a_file_replaced_by_rename_during_the_stream_is_harmless(tmp_path: Path) -> None:
    path = _smoke_copy(tmp_path)
    scan = scan_workload(path, REPO / "examples", scripted=True)
    stream = iter_problems(path, identity=scan.identity)
    assert next(stream)[1] == "smoke-add"
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps(GOOD) + "\n")
    os.replace(other, path)  # the open handle keeps the validated file
    assert [pid for _, pid, _ in stream] == ["smoke-sleep", "smoke-answer"]
    # ... but a run that had not opened it yet refuses the replacement
    with pytest.raises(WorkloadError, match="changed since it was validated"):
        next(iter_problems(path, identity=scan.identity))


# --- trusted tool files: parsed, never run -----------------------------------------------------------------


def _tool_line(pid: int, impl: str, name: str = "f") -> str:
    return json.dumps(
        {
            "id": pid,
            "prompt": "p",
            "tools": [{"name": name, "inputs": {"x": "int"}, "implementation": impl}],
            "script": [{"type": "final", "answer": 1}],
        }
    )


def test_tool_file_with_a_syntax_error_or_without_the_tool_fails_validation(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    (tmp_path / "broken.py").write_text(f"open({str(marker)!r}, 'w').close()\n\ndef f(x):\n    return x +\n")
    (tmp_path / "other.py").write_text(f"open({str(marker)!r}, 'w').close()\n\ndef g(x):\n    return x\n")
    (tmp_path / "outside.py").write_text("def g():\n    return 1\nreturn 2\n")
    lines = [_tool_line(1, "broken.py"), _tool_line(2, "other.py"), _tool_line(3, "outside.py")]
    path = _write(tmp_path, lines)
    problems = scan_workload(path, tmp_path, scripted=True).problems
    assert problems == [
        f"{path}:1: tools[0].implementation: 'broken.py' has a syntax error at line 4: invalid syntax",
        f"{path}:2: tools[0].implementation: 'other.py' defines no top-level 'f' "
        "(no def, class, assignment or import at module level binds that name)",
        f"{path}:3: tools[0].implementation: 'outside.py' has a syntax error at line 3: "
        "'return' outside function",
    ]
    assert not marker.exists()  # validation never runs a tool file


@pytest.mark.parametrize(
    "source",
    [
        "def f(x):\n    return x\n",
        "class f:\n    def __init__(self, x):\n        self.x = x\n",
        "f = abs\n",
        "f: object = abs\n",
        "g = f = abs\n",
        "(f, g) = (abs, abs)\n",
        "from math import floor as f\n",
        "from math import *\n",
        "import math as f\n",
        "try:\n    from fastlib import f\nexcept ImportError:\n    def f(x):\n        return x\n",
        "if True:\n    f = abs\n",
        "def __getattr__(name):\n    return abs\n",
        "def _setup():\n    global f\n    f = abs\n_setup()\n",
    ],
)
def test_every_top_level_binding_of_the_tool_name_counts(tmp_path: Path, source: str) -> None:
    (tmp_path / "t.py").write_text(source)
    assert _problems(tmp_path, [_tool_line(1, "t.py")]) == []


@pytest.mark.parametrize(
    "source",
    ["def g():\n    f = 1\n", "class C:\n    def f(self):\n        pass\n", "g = lambda f: f\n", "# f\n"],
)
def test_bindings_inside_functions_and_classes_do_not_count(tmp_path: Path, source: str) -> None:
    (tmp_path / "t.py").write_text(source)
    assert "defines no top-level 'f'" in _problems(tmp_path, [_tool_line(1, "t.py")])[0]


def test_each_tool_file_is_parsed_once_per_scan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "t.py").write_text("def f(x):\n    return x\n\ndef g(x):\n    return x\n")
    parsed: list[Path] = []
    original = tool_files.ToolFile.parse

    def counting(path: Path) -> tool_files.ToolFile:
        parsed.append(path)
        return original(path)

    monkeypatch.setattr(tool_files.ToolFile, "parse", counting)
    lines = [_tool_line(i, "t.py", "f" if i % 2 else "g") for i in range(1, 21)]
    assert _problems(tmp_path, lines) == []
    assert parsed == [(tmp_path / "t.py").resolve()]


# --- values: standard JSON, strict types, bounded durations -----------------------------------------------


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_standard_json_constants_are_rejected(tmp_path: Path, constant: str) -> None:
    final = '{"type": "final", "answer": 1}'
    lines = [
        f'{{"id": "a", "prompt": "p", "script": [{{"type": "final", "answer": {constant}}}]}}',
        f'{{"id": "b", "prompt": "p", "script": [{{"type": "final", "answer": 1, '
        f'"latency_ms": {constant}}}]}}',
        f'{{"id": "c", "prompt": "p", "metadata": {{"x": [{constant}]}}, "script": [{final}]}}',
        # the words themselves, inside strings, are fine
        '{"id": "d", "prompt": "NaN or Infinity?", "script": [{"type": "final", "answer": "NaN"}]}',
    ]
    path = _write(tmp_path, lines)
    problems = scan_workload(path, tmp_path, scripted=True).problems
    message = f"line: not valid JSON: {constant} is not a JSON value"
    assert [p.split(": ", 1)[0] for p in problems] == [f"{path}:1", f"{path}:2", f"{path}:3"]
    assert all(message in p for p in problems), problems
    with pytest.raises(WorkloadError, match=f"{path}:1: line: not valid JSON"):
        next(iter_problems(path))


@pytest.mark.parametrize(
    ("action", "field", "ok"),
    [
        ({"latency_ms": 86_400_000}, "latency_ms", True),
        ({"latency_ms": 86_400_000.5}, "latency_ms", False),
        ({"latency_ms": 1e300}, "latency_ms", False),
        ({"latency_ms": -1}, "latency_ms", False),
        ({"cpu_ms": 1e300}, "cpu_ms", False),
        ({"output_tokens": 10**12}, "output_tokens", False),
        ({"output_tokens": 1_000_000}, "output_tokens", True),
    ],
)
def test_scripted_durations_are_bounded(tmp_path: Path, action: dict[str, Any], field: str, ok: bool) -> None:
    tool = {"type": "tool", "name": "sleep_ms", "arguments": {"milliseconds": 1}, **action}
    submit = {"type": "submit", "code": "print(1)", **action}
    meta = {"prompt_metadata": {"protocol": "one_repair"}, "reference_tests": [{"input": "", "output": "1"}]}
    lines = [
        json.dumps({"id": 1, "prompt": "p", "tools": [{"name": "sleep_ms"}], "script": [tool]}),
        json.dumps({"id": 2, "prompt": "p", "script": [{"type": "final", "answer": 1, **action}]}),
        json.dumps(
            {
                "id": 3,
                "prompt": "p",
                "tools": [{"name": "lcb_evaluate"}],
                "metadata": meta,
                "script": [submit],
            }
        ),
    ]
    if field == "cpu_ms":
        lines.pop(1)  # a final action has no cpu_ms
    problems = _problems(tmp_path, lines)
    if ok:
        assert problems == []
    else:
        assert len(problems) == len(lines) and all(f".{field}: Input should be" in p for p in problems), (
            problems
        )


@pytest.mark.parametrize(
    ("change", "field", "schema_rejects"),
    [
        ({"id": True}, "id", True),
        ({"script": [{"type": "final", "answer": 1, "latency_ms": "5"}]}, "latency_ms", True),
        ({"script": [{"type": "final", "answer": 1, "latency_ms": True}]}, "latency_ms", True),
        ({"script": [{"type": "final", "answer": 1, "output_tokens": "5"}]}, "output_tokens", True),
        ({"script": [{"type": "submit", "code": "print(1)", "passes": 1}]}, "passes", True),
        ({"prompt": 5}, "prompt", True),
        # JSON Schema's "integer" admits 1.0; the loader does not turn a float into an int either
        ({"id": 1.0}, "id", False),
        ({"script": [{"type": "final", "answer": 1, "output_tokens": 5.0}]}, "output_tokens", False),
    ],
)
def test_no_lax_coercion(tmp_path: Path, change: dict[str, Any], field: str, schema_rejects: bool) -> None:
    line = {"id": "a", "prompt": "p", "script": [{"type": "final", "answer": 1}]} | change
    validator = jsonschema.Draft202012Validator(schemas()["workload"])
    assert validator.is_valid(line) is not schema_rejects
    problems = _problems(tmp_path, [json.dumps(line)])
    assert problems and all(f"{field}" in p.split(": ")[1] for p in problems), problems


def test_ints_are_still_numbers_and_ids(tmp_path: Path) -> None:
    line = {
        "id": 7,
        "prompt": "p",
        "script": [{"type": "final", "answer": 1, "latency_ms": 5, "output_tokens": 3}],
    }
    validator = jsonschema.Draft202012Validator(schemas()["workload"])
    assert validator.is_valid(line)
    path = _write(tmp_path, [json.dumps(line)])
    assert scan_workload(path, tmp_path, scripted=True).problems == []
    [(_, pid, problem)] = list(iter_problems(path))
    assert pid == "7" and problem.script is not None and problem.script[0].latency_ms == 5.0


def test_every_field_error_of_a_line_is_reported(tmp_path: Path) -> None:
    action = {"type": "final", "answer": 1, "latency_ms": "5", "output_tokens": 0}
    path = _write(tmp_path, [json.dumps({"id": True, "script": [action], "colour": "red"})])
    problems = scan_workload(path, tmp_path, scripted=True).problems
    for fld in (
        "id.str",
        "id.int",
        "prompt",
        "script[0].final.latency_ms",
        "script[0].final.output_tokens",
        "colour",
    ):
        assert any(p.startswith(f"{path}:1: {fld}: ") for p in problems), (fld, problems)


@pytest.mark.parametrize(
    "type_name",
    [
        "int",
        "dict[int, int]",
        "dict[int,int]",
        " List[ float ] ",
        "list[list[float]]",
        "List[ List[int] ]",
        "List[list[float]]",
        "list[list[list[float]]]",
        "list[list[str]]",
        "number",
        "tuple",
        "list[str]",
        "s tr",
        "Dict[int, int]",
        # Python's "$" (jsonschema's) also matches before a final newline: the schema accepted these
        "int\n",
        "list[int] \n",
    ],
)
def test_the_printed_schema_accepts_exactly_the_input_types_validation_accepts(
    tmp_path: Path, type_name: str
) -> None:
    """`asyncroll schema workload` is as strict as `validate` about a tool's declared input types."""
    tool = {"name": "f", "implementation": "f.py", "inputs": {"a": type_name}}
    line = {"id": "a", "prompt": "p", "tools": [tool], "script": [{"type": "final", "answer": 1}]}
    (tmp_path / "f.py").write_text("def f(a):\n    return a\n")
    schema_ok = jsonschema.Draft202012Validator(schemas()["workload"]).is_valid(line)
    problems = _problems(tmp_path, [json.dumps(line)])
    assert schema_ok is (problems == []), problems


def test_the_evaluator_is_reached_only_by_submit(tmp_path: Path) -> None:
    """``lcb_evaluate`` needs the problem's hidden tests, which only the one-repair protocol gives it: a
    tool call of it (a TypeError at run time), its declaration outside the protocol (a model could call
    it) and a ``final`` answer to a code problem (never tested, left out of the pass rates) are refused."""
    meta = {"prompt_metadata": {"protocol": "one_repair"}, "reference_tests": [{"input": "", "output": "1"}]}
    evaluator = [{"name": "lcb_evaluate"}]
    call = {"type": "tool", "name": "lcb_evaluate", "arguments": {"code": "print(1)"}}
    lines = [
        {
            "id": "ok",
            "prompt": "p",
            "tools": evaluator,
            "metadata": meta,
            "script": [{"type": "submit", "code": "x"}],
        },
        {
            "id": "final",
            "prompt": "p",
            "tools": evaluator,
            "metadata": meta,
            "script": [{"type": "final", "answer": "1"}],
        },
        {"id": "call", "prompt": "p", "tools": evaluator, "metadata": meta, "script": [call]},
        {"id": "plain", "prompt": "p", "tools": evaluator, "script": [{"type": "final", "answer": "1"}]},
    ]
    problems = _problems(tmp_path, [json.dumps(line) for line in lines])
    assert [p.split(": ")[0].rsplit(":", 1)[1] for p in problems] == ["2", "3", "4"], problems
    assert "script[0].type" in problems[0] and "would never be tested" in problems[0]
    assert "script[0].name" in problems[1] and "cannot be called as a tool" in problems[1]
    assert "tools[0].name" in problems[2] and "cannot be called as a tool" in problems[2]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"testtype": "weird"}, "metadata.reference_tests[0].testtype: must be 'stdin' or 'functional'"),
        ({"testtype": "functional"}, "metadata.reference_tests[0]: is functional but no func_name"),
        ({"input": 3}, "metadata.reference_tests[0].input: must be a string"),
    ],
)
def test_one_repair_test_records_get_the_evaluators_own_checks(
    tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    """A test record the evaluator would refuse at run time (failing every trajectory) is reported by
    validation, with its field."""
    meta = {
        "prompt_metadata": {"protocol": "one_repair"},
        "reference_tests": [{"input": "1", "output": "1"} | change],
    }
    line = {"id": "c", "prompt": "p", "tools": [{"name": "lcb_evaluate"}], "metadata": meta}
    problems = _problems(tmp_path, [json.dumps(line)], scripted=False)
    assert len(problems) == 1 and field in problems[0], problems


def test_functional_test_records_must_be_json(tmp_path: Path) -> None:
    tests = [
        {"input": "not json", "output": "[1]", "testtype": "functional"},
        {"input": "1", "output": "1", "testtype": "stdin"},
    ]
    meta = {"prompt_metadata": {"protocol": "one_repair"}, "reference_tests": tests, "func_name": "solve"}
    line = {"id": "c", "prompt": "p", "tools": [{"name": "lcb_evaluate"}], "metadata": meta}
    problems = _problems(tmp_path, [json.dumps(line)], scripted=False)
    assert "metadata.reference_tests[0].input: line 1 is not a JSON value" in problems[0], problems
    assert "metadata.reference_tests[1]: is a stdin test but func_name 'solve' was given" in problems[1], (
        problems
    )


# --- what a tool's def says: kind and parameters, against how a worker calls it (f(**arguments)) ----------


def _tool_problems(
    tmp_path: Path, source: str, inputs: dict[str, str], bound: dict[str, Any] | None = None
) -> list[str]:
    """The errors of a one-problem workload whose tool ``f`` is defined by ``source`` (``FILE:1: `` cut)."""
    (tmp_path / "t.py").write_text(source)
    tool: dict[str, Any] = {"name": "f", "inputs": inputs, "implementation": "t.py"}
    if bound is not None:
        tool["bound_arguments"] = bound
    line = {"id": 1, "prompt": "p", "tools": [tool], "script": [{"type": "final", "answer": 1}]}
    problems = _problems(tmp_path, [json.dumps(line)])
    prefix = f"{tmp_path / 'w.jsonl'}:1: "
    assert all(p.startswith(prefix) for p in problems), problems
    return [p.removeprefix(prefix) for p in problems]


@pytest.mark.parametrize(
    ("source", "kind", "returned"),
    [
        ("import asyncio\n\nasync def f(x):\n    await asyncio.sleep(0)\n", "an async def", "a coroutine"),
        ("import os\n\ndef f(x):\n    yield x\n", "a generator function", "a generator"),
        ("\n\ndef f(x):\n    if x:\n        yield from range(x)\n", "a generator function", "a generator"),
        ("\n\nasync def f(x):\n    yield x\n", "an async generator function", "an async generator"),
    ],
)
def test_async_and_generator_tools_are_refused(tmp_path: Path, source: str, kind: str, returned: str) -> None:
    """Calling one runs none of its body: validation names the file, the def's line and why."""
    (problem,) = _tool_problems(tmp_path, source, {"x": "int"})
    assert problem.startswith(f"tools[0].implementation: 'f' (t.py:3) is {kind}"), problem
    assert f"each call would return {returned} object and run none of its body" in problem


@pytest.mark.parametrize(
    "source",
    [
        "def f(x):\n    return list(i for i in range(x))\n",  # a generator expression, not a yield
        "def f(x):\n    def g():\n        yield x\n    return list(g())\n",  # a nested generator
        "def f(x):\n    async def g():\n        return x\n    return 1\n",
        "import functools\n\n@functools.lru_cache\ndef f(x):\n    yield x\n",  # decorated: unknown
        "def g(x):\n    yield x\n\nf = g\n",  # assigned: unknown (the worker refuses what it returns)
    ],
)
def test_a_plain_function_or_one_whose_kind_is_unknown_is_not_refused(tmp_path: Path, source: str) -> None:
    assert _tool_problems(tmp_path, source, {"x": "int"}) == []


@pytest.mark.parametrize(
    ("source", "inputs", "bound", "expected"),
    [
        # every declared input is a keyword parameter; required ones are all declared
        ("def f(a, b=1, *, c, d=2):\n    pass\n", {"a": "int", "c": "int"}, None, []),
        ("def f(a, b=1, *, c, d=2):\n    pass\n", {"a": "int", "b": "int", "c": "int", "d": "int"}, None, []),
        ("def f(**kwargs):\n    pass\n", {"anything": "str"}, None, []),
        (
            "def f(a, /, b=1, **kw):\n    pass\n",
            {},
            None,
            [
                "tools[0].inputs: f(a, /, b=1, **kw) requires the positional-only parameter 'a', but a "
                "tool is called with keyword arguments only: every call would fail (t.py:1)"
            ],
        ),
        (
            "def f(x):\n    pass\n",
            {"x": "int", "y": "int"},
            None,
            ["tools[0].inputs.y: 'y' is not a parameter of f(x), which has no **kwargs (t.py:1)"],
        ),
        (
            "def f(*args):\n    pass\n",
            {"x": "int"},
            None,
            ["tools[0].inputs.x: 'x' is not a parameter of f(*args), which has no **kwargs (t.py:1)"],
        ),
        (
            "def f(x=0, /, *, y):\n    pass\n",
            {"x": "int", "y": "int"},
            None,
            [
                "tools[0].inputs.x: 'x' is a positional-only parameter (before '/') of f(x=0, /, *, y); a "
                "tool is called with keyword arguments only (t.py:1)"
            ],
        ),
        (
            "def f(a: int, b: int, *, key: str):\n    pass\n",
            {"a": "int"},
            None,
            [
                "tools[0].inputs: f(a: int, b: int, *, key: str) requires 'b', which is not in inputs: "
                "declare it (and bind it in bound_arguments if the model must not pass it) (t.py:1)",
                "tools[0].inputs: f(a: int, b: int, *, key: str) requires 'key', which is not in inputs: "
                "declare it (and bind it in bound_arguments if the model must not pass it) (t.py:1)",
            ],
        ),
        # a bound argument is declared too, so it counts as passed
        ("def f(a, key):\n    pass\n", {"a": "int", "key": "str"}, {"key": "k"}, []),
        # the name bound twice, or possibly rebound by a later star import: its signature is unknown
        ("def f(x):\n    pass\n\nif True:\n    f = print\n", {"y": "int"}, None, []),
        ("def f(x):\n    pass\n\nfrom os.path import *\n", {"y": "int"}, None, []),
        (
            "from os.path import *\n\ndef f(x):\n    pass\n",
            {"y": "int"},
            None,
            [
                "tools[0].inputs.y: 'y' is not a parameter of f(x), which has no **kwargs (t.py:3)",
                "tools[0].inputs: f(x) requires 'x', which is not in inputs: declare it (and bind it in "
                "bound_arguments if the model must not pass it) (t.py:3)",
            ],
        ),
        ("def f(x):\n    pass\n\ndef g():\n    global f\n", {"y": "int"}, None, []),
    ],
)
def test_declared_inputs_must_fit_the_functions_keyword_parameters(
    tmp_path: Path, source: str, inputs: dict[str, str], bound: dict[str, Any] | None, expected: list[str]
) -> None:
    """A worker calls ``f(**arguments)`` with exactly the declared inputs (bound ones included): a declared
    input the function cannot take by keyword, or a required parameter nobody passes, is a TypeError in
    every call; validation says so, with the field, the signature and the def's line."""
    assert _tool_problems(tmp_path, source, inputs, bound) == expected


def test_bound_arguments_are_coerced_strictly_like_the_models(tmp_path: Path) -> None:
    source = "def f(a, label, scale, ks):\n    pass\n"
    inputs = {"a": "int", "label": "str", "scale": "float", "ks": "list[int]"}
    bound = {"label": 5, "scale": True, "ks": [1, 2.0]}
    assert _tool_problems(tmp_path, source, inputs, bound) == [
        "tools[0].bound_arguments.label: expected str, got int",
        "tools[0].bound_arguments.scale: expected float, got bool True",
    ]
    # What the tool receives: a bound value is coerced like the model's (2 == 2.0, so compare types).
    received = coerce_arguments({"a": 1}, inputs, {"label": "x", "scale": 2, "ks": [1, 2.0]})
    assert {k: repr(v) for k, v in received.items()} == {
        "a": "1",
        "label": "'x'",
        "scale": "2.0",
        "ks": "[1, 2]",
    }


def test_every_bad_argument_of_a_step_is_reported(tmp_path: Path) -> None:
    tool = {
        "name": "f",
        "inputs": {"a": "int", "b": "int", "s": "float", "t": "str"},
        "implementation": "t.py",
    }
    (tmp_path / "t.py").write_text("def f(a, b, s, t):\n    pass\n")
    script = [
        {"type": "tool", "name": "f", "arguments": {"a": "5", "b": True, "s": "x", "t": 3}},
        {"type": "tool", "name": "f", "arguments": {"a": 1, "zz": 2}},
        {"type": "final", "answer": 1},
    ]
    path = _write(tmp_path, [json.dumps({"id": 1, "prompt": "p", "tools": [tool], "script": script})])
    problems = [p.removeprefix(f"{path}:1: ") for p in scan_workload(path, tmp_path, scripted=True).problems]
    assert problems == [
        "script[0].arguments.a: expected int, got str '5'",
        "script[0].arguments.b: expected int, got bool True",
        "script[0].arguments.s: expected float, got str 'x'",
        "script[0].arguments.t: expected str, got int",
        "script[1].arguments: unexpected arguments ['zz']; expected ['a', 'b', 's', 't']",
        "script[1].arguments: missing arguments ['b', 's', 't']",
    ]


@pytest.mark.parametrize("pid", ["", "  ", "\t"])
def test_a_blank_id_is_refused(tmp_path: Path, pid: str) -> None:
    (problem,) = _problems(tmp_path, [json.dumps({**GOOD, "id": pid})])
    assert problem.startswith(f"{tmp_path / 'w.jsonl'}:1: id: must not be empty or blank")
    # and by the printed schema, which accepted it
    validator = jsonschema.Draft202012Validator(schemas()["workload"])
    assert not validator.is_valid({**GOOD, "id": pid})
    assert validator.is_valid({**GOOD, "id": f"{pid}x{pid}"}) and not _problems(
        tmp_path, [json.dumps({**GOOD, "id": f"{pid}x{pid}"})]
    )


def test_the_error_count_does_not_call_an_error_a_problem(tmp_path: Path) -> None:
    missing = scan_workload(tmp_path / "missing.jsonl", tmp_path, scripted=True)
    assert missing.error_summary() == "1 error; no line was read"
    path = _write(tmp_path, [json.dumps(GOOD), json.dumps({**GOOD, "id": 2, "tools": [{"name": "x"}]})])
    assert scan_workload(path, tmp_path, scripted=True).error_summary() == "2 errors in 1 of 2 workload lines"
    (tmp_path / "w.jsonl").write_text("")
    assert (
        scan_workload(tmp_path / "w.jsonl", tmp_path, scripted=True).error_summary()
        == "1 error (0 workload lines)"
    )


def test_odd_implementation_paths_and_files_are_errors_not_crashes(tmp_path: Path) -> None:
    """A NUL in the path, a name too long, a symlink loop, a directory named .py, and a tool file nested
    deeper than the parser's stack (MemoryError) each ended ``validate`` in a traceback."""
    (tmp_path / "loop.py").symlink_to(tmp_path / "loop.py")
    (tmp_path / "dir.py").mkdir()
    (tmp_path / "deep.py").write_text("def f(x=" + "[1," * 5000 + "]" * 5000 + "):\n    return x\n")
    names = ["a\u0000.py", "b" * 300 + ".py", "loop.py", "dir.py", "deep.py", "\ud800.py"]
    lines = [
        json.dumps(
            {
                "id": f"p{i}",
                "prompt": "x",
                "tools": [{"name": "f", "inputs": {"x": "int"}, "implementation": name}],
                "script": [{"type": "final", "answer": "1"}],
            }
        )
        for i, name in enumerate(names)
    ]
    problems = _problems(tmp_path, lines)
    assert len(problems) == len(names), problems
    assert all(".implementation: " in p for p in problems), problems
    assert "cannot be resolved" in problems[0] and "cannot be resolved" in problems[1]
    assert "cannot be resolved" in problems[2]
    assert "is not a regular file" in problems[3]
    assert "nested too deeply for the parser" in problems[4]


def test_lines_python_cannot_hold_are_named_errors_not_crashes(tmp_path: Path) -> None:
    """An integer of 4,301 digits and nesting 3,000 deep ended ``validate`` in a traceback; a lone
    surrogate escape passed validation and then failed the run, output directory and all, at its first
    write. Escaped surrogate *pairs* (an emoji) stay valid."""
    base = {"prompt": "x", "script": [{"type": "final", "answer": "1"}]}
    lines = [
        '{"id":' + "9" * 4301 + ',"prompt":"x","script":[{"type":"final","answer":"1"}]}',
        json.dumps({**base, "id": "deep", "metadata": {"a": []}}).replace("[]", "[" * 3000 + "]" * 3000),
        json.dumps({**base, "id": "\ud800"}),
        json.dumps({**base, "id": "key", "metadata": {"ok": {"\udfff": 1}}}),
        json.dumps({**base, "id": "emoji \U0001f600", "prompt": "\U0001f600"}),
    ]
    problems = _problems(tmp_path, lines)
    assert len(problems) == 4, problems
    assert ":1: line: not valid JSON: Exceeds the limit (4300 digits)" in problems[0]
    assert ":2: line: cannot be read: JSON nested deeper than about 1,000 levels" in problems[1]
    assert ":3: id: not valid Unicode: a lone UTF-16 surrogate escape" in problems[2]
    assert ":4: metadata.ok: not valid Unicode" in problems[3]


def test_functional_tests_nested_too_deeply_are_named_errors_not_crashes(tmp_path: Path) -> None:
    """A functional test whose input line or output nests past Python's recursion limit ended
    ``validate`` (and ``run``) in a RecursionError traceback from the evaluator's own check."""
    deep = "[" * 5000 + "]" * 5000
    lines = [
        json.dumps(
            {
                "id": f"p{i}",
                "prompt": "x",
                "tools": [{"name": "lcb_evaluate"}],
                "script": [{"type": "submit", "code": "pass"}],
                "metadata": {
                    "func_name": "f",
                    "prompt_metadata": {"protocol": "one_repair"},
                    "reference_tests": [{**test, "testtype": "functional"}],
                },
            }
        )
        for i, test in enumerate([{"input": deep, "output": "1"}, {"input": "1", "output": deep}])
    ]
    problems = _problems(tmp_path, lines)
    assert len(problems) == 2, problems
    assert (
        ":1: metadata.reference_tests[0].input: line 1 is not a JSON value: maximum recursion" in problems[0]
    )
    assert ":2: metadata.reference_tests[0].output: is not a JSON value: maximum recursion" in problems[1]


def test_a_key_given_twice_in_one_object_is_refused(tmp_path: Path) -> None:
    """pydantic-core and ``json`` keep the last of a repeated key: a second ``reference_answer`` graded
    every answer against it, silently."""
    line = (
        '{"id":"a","prompt":"x","reference_answer":"5","reference_answer":"6",'
        '"script":[{"type":"final","answer":"6"}]}'
    )
    nested = '{"id":"b","prompt":"x","script":[{"type":"final","answer":"1","answer":"2"}]}'
    problems = _problems(tmp_path, [line, nested])
    assert len(problems) == 2, problems
    assert ":1: line: not valid JSON: key 'reference_answer' is given twice in one object" in problems[0]
    assert ":2: line: not valid JSON: key 'answer' is given twice in one object" in problems[1]


def test_a_workload_is_utf8_and_a_utf16_file_is_named_as_one(tmp_path: Path) -> None:
    """``json.loads`` guesses UTF-16 or UTF-32 from a line's bytes: a UTF-16-BE file passed validation and
    ran, and a UTF-16 file with its byte order mark (PowerShell's ``>``) got "'utf-16-le' codec can't
    decode byte 0x0a" on its first line and "Expecting value" on its last. A UTF-8 byte order mark (and
    CRLF line ends) stay accepted, by validation and by the run's stream alike."""
    text = (REPO / "examples" / "smoke.jsonl").read_text()
    for name, data in (("be.jsonl", text.encode("utf-16-be")), ("le.jsonl", text.encode("utf-16"))):
        path = tmp_path / name
        path.write_bytes(data)
        problems = scan_workload(path, tmp_path, scripted=True).problems
        nul = ": line: holds NUL bytes, which no JSON text does: a UTF-16 or UTF-32 file? save it as UTF-8"
        assert problems and all(p.endswith(nul) for p in problems), problems
    stray = tmp_path / "stray.jsonl"
    stray.write_bytes(b"\xff\xfe\n" + text.encode())
    assert scan_workload(stray, tmp_path, scripted=True).problems == [
        f"{stray}:1: line: not valid UTF-8: 'utf-8' codec can't decode byte 0xff in position 0: invalid "
        "start byte"
    ]
    marked = tmp_path / "marked.jsonl"
    marked.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
    assert scan_workload(marked, tmp_path, scripted=True).problems == []
    assert [pid for _, pid, _ in iter_problems(marked)] == ["smoke-add", "smoke-sleep", "smoke-answer"]


@pytest.mark.parametrize("number", ["1e400", "-1e400", "1" + "0" * 400 + ".5"])
def test_a_number_past_a_floats_range_is_refused_not_read_as_infinity(tmp_path: Path, number: str) -> None:
    """Python and pydantic-core read 1e400 as infinity: validation accepted it, and a final answer of
    1e400 was recorded as null in results.jsonl (a tool argument of 1e400 reached the tool as inf)."""
    final = '{"id":"a","prompt":"p","script":[{"type":"final","answer":' + number + "}]}"
    tool = (
        '{"id":"b","prompt":"p","tools":[{"name":"add"}],"script":[{"type":"tool","name":"add",'
        '"arguments":{"a":' + number + ',"b":1}},{"type":"final","answer":"x"}]}'
    )
    problems = _problems(
        tmp_path, [final, tool, json.dumps({"prompt": "p", "script": [{"type": "final", "answer": 1e308}]})]
    )
    shown = number if len(number) <= 40 else number[:37] + "..."
    message = f"line: the number {shown} is too large for a 64-bit float (it would read as infinity)"
    assert problems == [f"{tmp_path / 'w.jsonl'}:{n}: {message}" for n in (1, 2)], problems


def test_an_action_without_a_known_type_is_named_at_its_type(tmp_path: Path) -> None:
    """A hand-written action without "type", or with a wrong one, was reported at the action, in
    pydantic's words: "script[0]: Unable to extract tag using discriminator 'type'"."""
    script = [
        {"name": "add", "arguments": {}},
        {"type": "answer", "answer": "3"},
        {"type": "final", "answer": 1},
    ]
    problems = _problems(tmp_path, [json.dumps({"prompt": "p", "script": script})])
    path = tmp_path / "w.jsonl"
    assert problems == [
        f"{path}:1: script[0].type: Field required: an action's type is 'tool', 'final' or 'submit'",
        f"{path}:1: script[1].type: 'answer' is not an action's type: 'tool', 'final' or 'submit'",
    ]
