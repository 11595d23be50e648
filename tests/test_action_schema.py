"""Each turn's JSON schema (typed tool arguments, portable keywords) and the strict parsing of a model's
action against it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from asyncroll.backends.action_schema import extract_source, parse_action, turn_schema
from asyncroll.coerce import TYPE_NAMES
from asyncroll.errors import InvalidActionError
from asyncroll.workload import FinalAction, Problem, SubmitAction, ToolAction
from tests.http_backend import ADD, FINAL_SCHEMA, closed_schema


def test_typed_arguments_bound_inputs_and_code_schema() -> None:
    problem = Problem.model_validate(
        {
            "prompt": "p",
            "tools": [
                {
                    "name": "f",
                    "implementation": "tools.py",
                    "inputs": {
                        "n": "int",
                        "xs": "list[float]",
                        "m": "dict[int, int]",
                        "flag": "bool",
                        "s": "str",
                        "secret": "str",
                    },
                    "bound_arguments": {"secret": "k"},
                },
                ADD,
            ],
        }
    )
    schema = turn_schema(problem, 0)
    f_args = schema["anyOf"][0]["properties"]["arguments"]
    assert f_args["properties"] == {
        "n": {"type": "integer"},
        "xs": {"type": "array", "items": {"type": "number"}},
        "m": {
            "type": "object",
            "patternProperties": {"^(0|-?[1-9][0-9]*)$": {"type": "integer"}},
            "additionalProperties": False,
        },
        "flag": {"type": "boolean"},
        "s": {"type": "string"},
    }
    assert f_args["required"] == ["n", "xs", "m", "flag", "s"] and f_args["additionalProperties"] is False
    assert [b["properties"]["name"] for b in schema["anyOf"]] == [{"const": "f"}, {"const": "add"}]
    assert turn_schema(problem, 1) == FINAL_SCHEMA
    code = Problem.model_validate(
        {"prompt": "p", "metadata": {"prompt_metadata": {"protocol": "one_repair"}}}
    )
    assert turn_schema(code, 0) == closed_schema({"type": {"const": "submit"}, "code": {"type": "string"}})
    # A model's bad call names the argument at fault, not only "not valid under any of the given schemas"
    rest = {"xs": [], "m": {}, "flag": True, "s": ""}
    for arguments, message in (
        ({"n": "20", **rest}, r"\['arguments'\]\['n'\]: '20' is not of type"),
        (rest, r"\['arguments'\]: 'n' is a required property"),
        ({"n": 1, **rest, "secret": "x"}, r"\['arguments'\]: .*\('secret' was unexpected\)"),
    ):
        with pytest.raises(InvalidActionError, match=f"the turn's schema: {message}"):
            text = json.dumps({"type": "tool", "name": "f", "arguments": arguments})
            parse_action(text, schema, structured=True, code=False)
    with pytest.raises(
        InvalidActionError, match=r"'g' is not a tool of this problem \(its tools: 'f', 'add'\)"
    ):
        parse_action('{"type": "tool", "name": "g", "arguments": {}}', schema, structured=True, code=False)


def test_schemas_use_only_keywords_that_grammar_engines_enforce() -> None:
    """A ``dict[int, int]`` input was sent as ``propertyNames`` + a typed ``additionalProperties``:
    llguidance refuses ``propertyNames`` (vLLM's default ``auto`` backend falls back to it from xgrammar,
    so every such request got a 400) and xgrammar before 0.2.7 dropped the value type beside it. The
    schemas of every declared input type keep to keywords xgrammar and llguidance both enforce, and
    still mean what validation means: integer keys, each spelled one way, and integer values."""
    tool = {"name": "f", "implementation": "t.py", "inputs": {f"x{i}": t for i, t in enumerate(TYPE_NAMES)}}
    problem = Problem.model_validate({"prompt": "p", "tools": [tool, ADD]})
    repair = {"prompt_metadata": {"protocol": "one_repair"}}
    code = Problem.model_validate({"prompt": "p", "metadata": repair})
    schemas = [turn_schema(problem, 0), turn_schema(problem, 1), turn_schema(code, 0)]
    keywords: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                keywords.add(key)
                if key in ("properties", "patternProperties"):
                    for sub in value.values():
                        walk(sub)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    for schema in schemas:
        walk(schema)
    portable = {"anyOf", "type", "const", "properties", "required", "additionalProperties", "items"}
    assert keywords <= portable | {"patternProperties"}, keywords - portable
    schema = schemas[0]
    values = [".", 1, 1.5, True, 2, {"-3": 4, "0": 0}, [1], [1], [1.5], [2], [[1], []], [[2]], [[1.5, 2]], []]
    good = {f"x{i}": v for i, v in enumerate(values)}

    def call(**changed: Any) -> str:
        return json.dumps({"type": "tool", "name": "f", "arguments": {**good, **changed}})

    action = parse_action(call(), schema, structured=True, code=False)
    assert isinstance(action, ToolAction) and action.arguments["x5"] == {"-3": 4, "0": 0}
    for bad in ({"07": 1}, {"+7": 1}, {"-0": 1}, {"a": 1}, {"1": "2"}, {"1": 1.5}):
        with pytest.raises(InvalidActionError, match=r"\['arguments'\]\['x5'\]"):
            parse_action(call(x5=bad), schema, structured=True, code=False)


def test_parsing_is_strict_in_both_modes() -> None:
    final = FINAL_SCHEMA
    assert parse_action(
        '{"type": "final", "answer": "7"}', final, structured=True, code=False
    ) == FinalAction(type="final", answer="7")
    for bad, needle in (
        ("The answer is 7.", "not JSON"),
        ('{"type": "final", "answer": 7}', "does not match the turn's schema"),
        ('{"type": "final", "answer": "7", "why": "x"}', "does not match"),
        ('{"type": "tool", "name": "add", "arguments": {}}', "does not match"),
        (None, "no message content"),
    ):
        with pytest.raises(InvalidActionError, match=needle):
            parse_action(bad, final, structured=True, code=False)
    # --no-structured-output: JSON still required outside code workloads (one fence may surround it) ...
    fenced = '```json\n{"type": "final", "answer": "7"}\n```'
    assert parse_action(fenced, final, structured=False, code=False).type == "final"
    with pytest.raises(InvalidActionError, match="not JSON"):
        parse_action("seven", final, structured=False, code=False)
    # ... while code workloads take plain source, one surrounding fence stripped.
    source = parse_action("```python\nprint(input())\n```", {}, structured=False, code=True)
    assert source == SubmitAction(type="submit", code="print(input())")
    assert parse_action("x = 1\n", {}, structured=False, code=True) == SubmitAction(
        type="submit", code="x = 1\n"
    )
    with pytest.raises(InvalidActionError, match="no source"):
        parse_action("```\n\n```", {}, structured=False, code=True)


def test_a_code_reply_with_prose_around_its_fenced_program_submits_the_program() -> None:
    """--no-structured-output on a code workload: a chat model's usual reply, prose then a fenced program
    then prose, was submitted whole and failed as a SyntaxError (its repair spent on the prose); the
    program is read between the last two fence lines, as LiveCodeBench's ``extract_code`` reads it."""
    reply = (
        "Here is my solution:\n\n```python\nprint(int(input()) + 2)\n```\n\nIt adds two.\n"
        "Corrected:\n```python\nn = int(input())\nprint(n + 2)\n```\nDone."
    )
    assert parse_action(reply, {}, structured=False, code=True) == SubmitAction(
        type="submit", code="n = int(input())\nprint(n + 2)"
    )
    # one fence line is no fenced program: the reply is taken as it is (plain source)
    plain = "print('```')\nprint(1)\n"
    assert parse_action(plain, {}, structured=False, code=True).code == plain  # type: ignore[union-attr]
    with pytest.raises(InvalidActionError, match="no source"):
        parse_action("Sorry:\n```python\n\n```\n", {}, structured=False, code=True)
    # structured: a program wholly in one fence inside the JSON is the program (no Python starts with one)
    one_repair = {"prompt_metadata": {"protocol": "one_repair"}}
    schema = turn_schema(Problem.model_validate({"prompt": "p", "metadata": one_repair}), 0)
    fenced = json.dumps({"type": "submit", "code": "```python\nprint(1)\n```"})
    assert parse_action(fenced, schema, structured=True, code=True).code == "print(1)"  # type: ignore[union-attr]


def test_a_reply_that_starts_and_ends_with_a_fence_but_holds_two_programs_submits_the_last() -> None:
    """A reply of a fenced program, prose, then a corrected fenced program starts and ends with a fence:
    the one-fence pattern took all of it (the prose and the inner fence lines) as the program, a SyntaxError,
    where LiveCodeBench's ``extract_code`` reads the last program. A structured ``submit`` whose code is
    fenced so, or fenced with CRLF line ends, is read the same way."""
    reply = "```python\nprint(1)\n```\nWait, that is wrong. Corrected:\n```python\nprint(2)\n```"
    assert extract_source(reply) == "print(2)"
    assert parse_action(reply, {}, structured=False, code=True).code == "print(2)"  # type: ignore[union-attr]
    # one fenced program holding a fence inside a string (not at a line's start) stays whole
    program = "print('```')\nprint(1)"
    assert extract_source(f"```python\n{program}\n```\n") == program
    one_repair = {"prompt_metadata": {"protocol": "one_repair"}}
    schema = turn_schema(Problem.model_validate({"prompt": "p", "metadata": one_repair}), 0)
    for code in (reply, "```python\r\nprint(2)\r\n```"):
        submitted = parse_action(
            json.dumps({"type": "submit", "code": code}), schema, structured=True, code=True
        )
        assert submitted.code.strip() == "print(2)"  # type: ignore[union-attr]


def test_a_tool_call_that_fits_no_branch_says_what_is_wrong() -> None:
    """The first turn's ``anyOf`` said of every bad tool call only that it "is not valid under any of the
    given schemas": which argument, which name, or that a tool call was due, is what a user needs."""
    sleep = {"name": "sleep_ms", "inputs": {"milliseconds": "number"}}
    schema = turn_schema(Problem.model_validate({"prompt": "p", "tools": [ADD, sleep]}), 0)
    for reply, error in (
        (
            {"name": "mul", "arguments": {}},
            "['name']: 'mul' is not a tool of this problem (its tools: 'add', 'sleep_ms')",
        ),
        ({"name": "add", "arguments": {"a": "1", "b": 2}}, "['arguments']['a']: '1' is not of type 'number'"),
        ({"name": "add", "arguments": {"a": 1}}, "['arguments']: 'b' is a required property"),
        (
            {"name": "sleep_ms", "arguments": {"milliseconds": 1, "x": 2}},
            "['arguments']: Additional properties",
        ),
    ):
        with pytest.raises(InvalidActionError) as caught:
            parse_action(json.dumps({"type": "tool", **reply}), schema, structured=True, code=False)
        assert str(caught.value).startswith(f"the action does not match the turn's schema: {error}")
    with pytest.raises(InvalidActionError, match=r"\['type'\]: 'final' where this turn takes a tool call"):
        parse_action('{"type": "final", "answer": "5"}', schema, structured=True, code=False)


def test_a_number_past_a_floats_range_is_an_invalid_action() -> None:
    """``1e999`` in a tool call's arguments read as infinity: the call ran with ``inf`` and its transcript
    line was written with ``Infinity`` (with an integer past 64 bits beside it, where the stdlib encoder
    writes the line) or ``null`` (orjson's): invalid JSON for jq, JSON.parse and DuckDB, or a wrong record.
    The workload refuses such a number; a model's reply is an invalid action, as one with NaN is."""
    schema = turn_schema(Problem.model_validate({"prompt": "p", "tools": [ADD]}), 0)
    for big in ("1e999", "-1E400", "1" + "0" * 400 + ".5"):
        reply = '{"type": "tool", "name": "add", "arguments": {"a": ' + big + ', "b": 1}}'
        with pytest.raises(InvalidActionError, match="too large for a 64-bit float"):
            parse_action(reply, schema, structured=True, code=False)
    largest = parse_action(
        '{"type": "tool", "name": "add", "arguments": {"a": 1.7976931348623157e308, "b": -0.0}}',
        schema,
        structured=True,
        code=False,
    )
    assert isinstance(largest, ToolAction) and largest.arguments == {"a": 1.7976931348623157e308, "b": 0.0}
