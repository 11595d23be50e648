"""Strict types: a tool's arguments coerced to its declared inputs (never laxly, never looser than the
server's JSON Schema), and a workload's values: standard JSON, no lax coercion, bounded durations, numbers
a float can hold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from asyncroll.backends.action_schema import _INPUT_SCHEMAS
from asyncroll.coerce import TYPE_NAMES, CoercionError, canonical_type, coerce_arguments
from asyncroll.errors import WorkloadError
from asyncroll.schemas import schemas
from asyncroll.workload import iter_problems, scan_workload
from tests.workload_scans import _problems, _write


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


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("limit", 0),
        ("worker_max_rss_mb", 63),
        ("worker_max_rss_mb", 2**30 + 1),
        ("nvml_device", -1),
        ("starvation_threshold", 0),
        ("metrics_port", 65536),
        ("cpu_workers", 0),
        ("evaluation_timeout", 0.0),
    ],
)
def test_the_printed_config_schema_refuses_a_setting_out_of_range_as_the_run_does(
    setting: str, value: int | float
) -> None:
    """pydantic wrote a bounded optional integer's bounds as ``ge``/``le``, which no JSON Schema validator
    reads: `asyncroll schema config` accepted ``"limit": 0`` and ``"metrics_port": 65536``."""
    from asyncroll.config import build_config
    from asyncroll.errors import UsageError

    settings: dict[str, Any] = {"workload": "w.jsonl", "output": "out", setting: value}
    assert not jsonschema.Draft202012Validator(schemas()["config"]).is_valid(settings)
    with pytest.raises(UsageError, match=f"--{setting.replace('_', '-')}: "):
        build_config(settings)
    settings[setting] = None if setting != "cpu_workers" else 1  # the schema still takes the default
    assert jsonschema.Draft202012Validator(schemas()["config"]).is_valid(settings)


def test_the_printed_experiment_schema_bounds_the_clients_limit() -> None:
    from tests.conftest import invoke

    result = invoke("experiment", "schema")
    assert result.exit_code == 0, result.output
    limit = json.loads(result.stdout)["$defs"]["ClientSpec"]["properties"]["limit"]
    assert {"minimum": 1, "type": "integer"} in limit["anyOf"], limit
    assert '"ge"' not in result.stdout and '"le"' not in result.stdout
