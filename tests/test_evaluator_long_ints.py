"""Long ints in a functional result cost the worker time linear in their size: a done record the program
writes itself, all of it 50,000-digit ints, once took the worker about 5 s to read and 12 s more to show as
feedback (str <-> int is quadratic in CPython), outside every time limit of the test."""

from __future__ import annotations

import json
from typing import Any

import pytest

from asyncroll.evaluator.compare import compare_value, parse_expected
from asyncroll.evaluator.execution import Execution
from asyncroll.evaluator.lcb_json import LONG_INT_DIGITS, LongInt, lcb_dumps_head
from tests.evaluations import SLACK_S, evaluate, real_process, verdict
from tests.hostile_programs import STATUS_FD

BIG = "7" * 50_000


def _forges(fields: str) -> str:
    """A functional program that writes its own done record, ``fields`` then 330 ints of 50,000 digits
    (16 MiB, under the record cap), and ends."""
    line = '\'{"kind": "done", ' + fields + " [' + ','.join(['7' * 50000] * 330) + ']}\\n'"
    return (
        "def f(x):\n"
        + "".join(f"    {code}\n" for code in STATUS_FD.strip().splitlines())
        + f"    data = ({line}).encode()\n"
        "    while data:\n"
        "        data = data[os.write(fd, data):]\n"
        "    os._exit(0)\n"
    )


def _read(record: str) -> Any:
    execution = Execution()
    execution.read_records(record.encode(), b"")
    assert execution.done is not None
    return execution.done["result"]


def test_a_long_int_is_read_as_its_text_and_compared_exactly() -> None:
    long_text = "-" + "12" * 600
    got = _read(json.dumps({"kind": "done", "ok": True, "result": [1, 2.5, json.loads(long_text), {"a": 3}]}))
    assert isinstance(got, list) and isinstance(got[2], LongInt) and got[2].text == long_text
    assert compare_value(got, parse_expected(f'[1, 2.5, {long_text}, {{"a": 3}}]')) is None
    assert compare_value(got, parse_expected(f'[1, 2.5, {long_text[:-1]}3, {{"a": 3}}]')) is not None
    assert compare_value(got, parse_expected(f'[1, 2.5, "{long_text}", {{"a": 3}}]')) is not None
    short = "9" * LONG_INT_DIGITS  # as long as a JSON int read as an int gets; 1e3 still equals 1000
    assert _read(f'{{"kind": "done", "ok": true, "result": [{short}, 1000]}}') == [int(short), 1000]
    assert compare_value(_read('{"kind": "done", "ok": true, "result": 1000}'), parse_expected("1e3")) is None


@pytest.mark.parametrize(
    ("result", "kind"), [("{}", "int"), ('[1, {{"k": {}}}]', "list"), ('{{"k": {}}}', "dict")]
)
def test_a_result_with_an_int_past_livecodebench_s_limit_can_never_match(result: str, kind: str) -> None:
    """CPython 3.12 and later check the digit limit of a long int's str() only roughly: on a sandbox
    interpreter of 3.12.1 or 3.13.0 the harness wrote ``10 ** 50000`` (50,001 digits) into its record, which
    the worker, reading under the limit exactly, could not read: a runtime_error ('the program's report could
    not be read back'), where LiveCodeBench's ``==`` is false (a wrong answer, as 3.11's harness says)."""
    execution = Execution()
    record = '{"kind": "done", "ok": true, "result": ' + result.format("1" * 50_001) + "}"
    execution.read_records(record.encode(), b"")
    assert execution.done is not None and not execution.status_garbled
    assert str(execution.done["unrepresentable"]).startswith(f"<{kind} that cannot be shown: an int of more")
    for other in ('{"kind": "exit", "result": ', '{"kind": "done", "ok": false, "error": '):  # only a result
        execution = Execution()
        execution.read_records((other + "1" * 50_001 + "}").encode(), b"")
        assert execution.done is None and execution.status_garbled


def test_the_feedback_shows_the_head_of_the_value_as_json_writes_it() -> None:
    value = [1, "a\u00e9", {"k": [None, True, 2.5]}, list(range(500))]
    for limit in (0, 5, 40, 1000, 10_000):
        assert lcb_dumps_head(value, limit) == json.dumps(value)[: limit + 1]
    record = '{"kind": "done", "ok": true, "result": {"x": [' + ", ".join([BIG] * 3) + "]}}"
    assert lcb_dumps_head(_read(record), 1000) == ('{"x": [' + BIG)[:1001]


@real_process
@pytest.mark.parametrize(
    ("fields", "expected", "field", "shown"),
    [
        ('"ok": true, "result":', "wrong_answer", "got", "[7777777777"),
        ('"ok": false, "error":', "runtime_error", "error", "7777777777"),
    ],
    ids=["result", "error"],
)
def test_a_forged_record_of_long_ints_costs_the_worker_no_more_than_its_size(
    fields: str, expected: str, field: str, shown: str
) -> None:
    """Reading such a record and showing it as feedback (a result's JSON, an error's text) took the worker
    about 17 s on a 1 s test."""
    program = _forges(fields)
    result, elapsed = evaluate(program, [{"input": "1", "output": "2"}], func_name="f", time_limit_s=1.0)
    assert verdict(result) == expected, result
    assert shown in result["feedback"][field], result
    assert elapsed < 1.0 + SLACK_S, elapsed


def test_a_record_without_long_ints_is_read_at_the_c_parser_s_speed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``parse_int`` (a Python call per int) only for a record that holds a run of more than
    ``LONG_INT_DIGITS`` digits: for every record, a result of millions of small ints took three times as
    long to read."""
    hooked: list[bool] = []
    loads = json.loads

    def spy(text: str | bytes, **kwargs: object) -> object:
        if text:  # not the empty exit record
            hooked.append("parse_int" in kwargs)
        return loads(text, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(json, "loads", spy)
    digits = "5" * LONG_INT_DIGITS
    assert _read(f'{{"kind": "done", "ok": true, "result": [1, {digits}, "{digits}"]}}')[1] == int(digits)
    assert hooked == [False]
    got = _read(f'{{"kind": "done", "ok": true, "result": [1, {digits}9]}}')
    assert got == [1, LongInt(digits + "9")] and hooked == [False, True]
    # a long run inside a string sends a record the slow way, with the same values
    assert _read(f'{{"kind": "done", "ok": true, "result": [1, "{digits}9"]}}') == [1, digits + "9"]


@real_process
def test_a_stdin_program_s_done_record_is_capped_at_what_an_error_can_take() -> None:
    """A stdin program's done record holds no result: a line past :data:`STDIN_RECORD_CAP` is not read
    (the cap was twice the stdout cap, 16 MiB to 256 MiB of JSON the worker parsed and held)."""
    forged = STATUS_FD + (
        'data = (\'{"kind": "done", "ok": true, "pad": [\' + \'0,\' * 200000 + \'0]}\\n\').encode()\n'
        "while data:\n"
        "    data = data[os.write(fd, data):]\n"
        "print(3)\n"
    )
    result, _ = evaluate(forged, [{"input": "", "output": "3"}], time_limit_s=6.0)
    assert verdict(result) == "runtime_error", result
    assert "could not be read back" in result["feedback"]["error"], result
    long_error = "raise ValueError('\\U0001f600' * 10000)\n"  # every character 12 bytes as JSON
    result, _ = evaluate(long_error, [{"input": "", "output": "3"}], time_limit_s=6.0)
    error = result["feedback"]["error"]  # the traceback's end: the message; read back whole
    assert verdict(result) == "runtime_error" and error.endswith("\U0001f600" * 10), result
    assert "could not be read back" not in error, result
