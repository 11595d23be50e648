"""Workload validation: every problem reported as FILE:LINE: field: message; nothing runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncroll.coerce import CoercionError, coerce_arguments
from asyncroll.errors import WorkloadError
from asyncroll.workload import iter_problems, scan_workload
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
        (7, "script[0]", "does not match any of the expected tags"),
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
        ("1,2", "list[int]"),
        (None, "number"),
    ],
)
def test_strict_coercion_rejects(value: object, type_name: str) -> None:
    with pytest.raises(CoercionError):
        coerce_arguments({"x": value}, {"x": type_name})


def test_arguments_must_match_declared_inputs_exactly() -> None:
    with pytest.raises(CoercionError, match="missing"):
        coerce_arguments({"a": 1}, {"a": "int", "b": "int"})
    with pytest.raises(CoercionError, match="unexpected"):
        coerce_arguments({"a": 1, "c": 2}, {"a": "int"})
    assert coerce_arguments({"a": 1}, {"a": "int", "b": "int"}, {"b": 5}) == {"a": 1, "b": 5}
