"""Workload validation: every problem reported as FILE:LINE: field: message; nothing runs. Here: the
report itself, ids, and lines that cannot be read (JSON Python cannot hold, keys given twice, UTF-16)."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import jsonschema
import pytest

from asyncroll.errors import WorkloadError
from asyncroll.schemas import schemas
from asyncroll.workload import MAX_REPORTED_PROBLEMS, Problem, iter_problems, scan_workload
from tests.conftest import REPO
from tests.workload_scans import GOOD, _problems, _write


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
        (7, "script[0].type", "'dance' is not an action's type: 'tool', 'final', 'submit' or 'error'"),
        (8, "tools[1].name", "duplicate tool name 'add'"),
        (9, "script", "required by the scripted backend"),
        (10, "tools[0].inputs", "unsupported type 'tensor'"),
        (11, "line", "expected a JSON object"),
    ]
    for line, field, message in expected:
        assert any(p.startswith(f"{path}:{line}: {field}") and message in p for p in problems), (line, text)
    assert not any(p.startswith(f"{path}:1:") for p in problems)


def test_every_field_error_of_a_line_is_reported(tmp_path: Path) -> None:
    action = {"type": "final", "answer": 1, "latency_ms": "5", "output_tokens": 0}
    path = _write(tmp_path, [json.dumps({"id": True, "script": [action], "colour": "red"})])
    problems = scan_workload(path, tmp_path, scripted=True).problems
    for fld in (
        "id",
        "prompt",
        "script[0].final.latency_ms",
        "script[0].final.output_tokens",
        "colour",
    ):
        assert any(p.startswith(f"{path}:1: {fld}: ") for p in problems), (fld, problems)


def test_invalid_workload_raises_with_all_problems(tmp_path: Path) -> None:
    path = _write(tmp_path, ["{", "{"])
    scan = scan_workload(path, tmp_path, scripted=True)
    with pytest.raises(WorkloadError) as info:
        scan.raise_if_invalid()
    assert len(info.value.problems) == 2
    # what `run` and `simulate` print ends with validate's count of errors and lines
    assert str(info.value).splitlines()[-1] == f"{path}: 2 errors in 2 of 2 workload lines"
    unreadable = scan_workload(tmp_path / "missing.jsonl", tmp_path, scripted=True)
    with pytest.raises(WorkloadError) as info:
        unreadable.raise_if_invalid()  # one error, no lines read: no count
    assert str(info.value) == f"{tmp_path / 'missing.jsonl'}: cannot read: No such file or directory"


def test_empty_workload_is_an_error(tmp_path: Path) -> None:
    assert "holds no problems" in _problems(tmp_path, [""])[0]


def test_limit_and_default_ids(tmp_path: Path) -> None:
    line = json.dumps({k: v for k, v in GOOD.items() if k != "id"})
    path = _write(tmp_path, [line, "", line, line])
    assert [pid for _, pid, _ in iter_problems(path, limit=2)] == ["1", "3"]
    assert scan_workload(path, tmp_path, scripted=True, limit=2).count == 2


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


@pytest.mark.parametrize("prompt", ["", "  ", "\n\t"])
def test_a_blank_prompt_is_refused(tmp_path: Path, prompt: str) -> None:
    """SPEC §5: ``prompt`` is required; an empty one asks the model nothing (it was run as it was)."""
    (problem,) = _problems(tmp_path, [json.dumps({**GOOD, "prompt": prompt})])
    assert (
        problem == f"{tmp_path / 'w.jsonl'}:1: prompt: must not be empty or blank (the model's first message)"
    )
    validator = jsonschema.Draft202012Validator(schemas()["workload"])
    assert not validator.is_valid({**GOOD, "prompt": prompt})
    assert validator.is_valid({**GOOD, "prompt": f"{prompt}x"}) and not _problems(
        tmp_path, [json.dumps({**GOOD, "prompt": f"{prompt}x"})]
    )


def test_an_id_too_long_is_refused(tmp_path: Path) -> None:
    """A megabyte id was accepted: it is written into every event of its trajectory (20 turns: 58 MB of
    events.jsonl, a 17 MB trace.json)."""
    (problem,) = _problems(tmp_path, [json.dumps({**GOOD, "id": "x" * 1001})])
    assert problem.startswith(f"{tmp_path / 'w.jsonl'}:1: id: 1,001 characters: at most 1,000 (it names")
    assert len(problem) < 300
    validator = jsonschema.Draft202012Validator(schemas()["workload"])
    assert not validator.is_valid({**GOOD, "id": "x" * 1001})
    assert validator.is_valid({**GOOD, "id": "x" * 1000}) and not _problems(
        tmp_path, [json.dumps({**GOOD, "id": "x" * 1000})]
    )


def test_an_integer_id_too_long_is_refused(tmp_path: Path) -> None:
    """The cap was on string ids only: an integer id of 3,000 digits (JSON's integers are unbounded) was
    accepted and named its trajectory in every event, as a 3,000-character string id may not."""
    rest = json.dumps({key: value for key, value in GOOD.items() if key != "id"})
    (problem,) = _problems(tmp_path, ['{"id": ' + "9" * 3000 + ", " + rest[1:]])
    assert problem.startswith(f"{tmp_path / 'w.jsonl'}:1: id: 3,000 characters: at most 1,000"), problem
    assert not _problems(tmp_path, [json.dumps({**GOOD, "id": int("9" * 1000)})])


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


def test_errors_past_the_reported_ones_are_counted_not_listed(tmp_path: Path) -> None:
    """At most MAX_REPORTED_PROBLEMS errors are listed; the rest still count, in the summary and as the
    report's last line."""
    extra = 5
    path = _write(tmp_path, ["{not json"] * (MAX_REPORTED_PROBLEMS + extra))
    scan = scan_workload(path, tmp_path, scripted=True)
    assert len(scan.problems) == MAX_REPORTED_PROBLEMS and scan.truncated == extra
    total = MAX_REPORTED_PROBLEMS + extra
    assert scan.error_summary() == f"{total} errors in {total} of {total} workload lines"
    with pytest.raises(WorkloadError) as refused:
        scan.raise_if_invalid()
    assert refused.value.problems[-1] == f"... and {extra} more errors"
    assert refused.value.problems[-2] == f"{path}:{MAX_REPORTED_PROBLEMS}: line: not valid JSON: " + (
        "Expecting property name enclosed in double quotes (column 2)"
    )


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
        f"{path}:1: script[0].type: Field required: an action's type is 'tool', 'final', 'submit' or 'error'",
        f"{path}:1: script[1].type: 'answer' is not an action's type: 'tool', 'final', 'submit' or 'error'",
    ]


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
    assert ":2: line: cannot be read: JSON nested deeper than 500 levels" in problems[1]
    assert ":3: id: not valid Unicode: a lone UTF-16 surrogate escape" in problems[2]
    assert ":4: metadata.ok: not valid Unicode" in problems[3]


def test_a_line_of_another_json_type_is_named_in_json_words(tmp_path: Path) -> None:
    """A line that is no object was "got NoneType", "got list", "got str": Python's names, not the file's."""
    problems = _problems(tmp_path, ["null", "[1]", '"x"', "5", "true"])
    kinds = ["null", "an array", "a string", "an integer", "a boolean"]
    assert problems == [
        f"{tmp_path / 'w.jsonl'}:{i}: line: expected a JSON object, got {kind}"
        for i, kind in enumerate(kinds, 1)
    ]


@pytest.mark.parametrize(("pid", "kind"), [("1.5", "a number"), ("true", "a boolean"), ("[1]", "an array")])
def test_an_id_of_another_type_is_one_error_at_id(tmp_path: Path, pid: str, kind: str) -> None:
    """An id is a string or an integer: another type was two errors at fields no line has, one per member
    of the union ("id.str: Input should be a valid string", "id.int: Input should be a valid integer")."""
    problems = _problems(
        tmp_path, [f'{{"id": {pid}, "prompt": "p", "script": [{{"type": "final", "answer": 1}}]}}']
    )
    assert problems == [f"{tmp_path / 'w.jsonl'}:1: id: must be a string or an integer, not {kind}"]


def test_a_field_that_is_no_object_is_named_without_a_python_class(tmp_path: Path) -> None:
    """pydantic said "Input should be a valid dictionary or instance of Tool" (a class of the product's
    code) and "... or object to extract fields from" (an action)."""
    final = '[{"type": "final", "answer": 1}]'
    problems = _problems(
        tmp_path,
        [
            f'{{"prompt": "p", "tools": ["add"], "script": {final}}}',
            '{"prompt": "p", "script": ["final"]}',
            f'{{"prompt": "p", "script": {final}, "metadata": 5}}',
        ],
    )
    path = tmp_path / "w.jsonl"
    assert problems == [
        f"{path}:1: tools[0]: expected a JSON object, got a string",
        f"{path}:2: script[0]: expected a JSON object, got a string",
        f"{path}:3: metadata: expected a JSON object, got an integer",
    ]


def test_a_line_cut_short_inside_a_string_is_said_to_be_unterminated(tmp_path: Path) -> None:
    """Its newline was read as the string's next character: "Invalid control character at"."""
    problems = _problems(tmp_path, [json.dumps(GOOD), '{"id": "b", "prompt": "cut sh'])
    assert problems == [
        f"{tmp_path / 'w.jsonl'}:2: line: not valid JSON: Unterminated string starting at (column 23)"
    ]


def test_a_file_of_lines_ending_in_cr_only_is_said_to_be_one(tmp_path: Path) -> None:
    """An old Mac file (lines ending in CR alone) is one line to a JSONL reader, and JSON reads a CR as a
    space: it was "line 1: not valid JSON: Extra data (column 124)", which named no cause."""
    path = tmp_path / "w.jsonl"
    first = json.dumps(GOOD)
    path.write_bytes((first + "\r" + json.dumps({**GOOD, "id": "b"}) + "\r").encode())
    assert [p.removeprefix(str(path)) for p in scan_workload(path, tmp_path, scripted=True).problems] == [
        f":1: line: not valid JSON: Extra data (column {len(first) + 2}): a second object after a lone "
        "carriage return: lines ending in CR only? end them in LF"
    ]
    assert _problems(tmp_path, [first + " " + first]) == [  # no CR: no word of one
        f"{tmp_path / 'w.jsonl'}:1: line: not valid JSON: Extra data (column {len(first) + 2})"
    ]


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


def test_the_repeated_key_check_does_not_build_a_second_copy_of_the_line(tmp_path: Path) -> None:
    """The scan's check for a key given twice parsed the line again into a whole tree beside the problem
    already parsed: a LiveCodeBench problem of 1,000,000 tests (a 69 MB line) took 2.5 GB to validate, the
    problem itself 0.9 GB. The check keeps no object, so the scan's peak is that of the problem's parse."""
    tests = [{"input": f"1\n{i}\n", "output": f"{i}\n", "testtype": "stdin"} for i in range(20_000)]
    line = json.dumps({**GOOD, "metadata": {"tests": tests}})
    path = _write(tmp_path, [line])
    tracemalloc.start()
    try:
        Problem.model_validate_json(line.encode())
        parse_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        tracemalloc.clear_traces()
        scan = scan_workload(path, tmp_path, scripted=True)
        scan_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert scan.problems == []
    assert scan_peak < 1.5 * parse_peak, (scan_peak, parse_peak)


def test_a_workload_is_utf8_and_a_utf16_file_is_named_as_one(tmp_path: Path) -> None:
    """``json.loads`` guesses UTF-16 or UTF-32 from a line's bytes: a UTF-16-BE file passed validation and
    ran, and a UTF-16 file with its byte order mark (PowerShell's ``>``) got "'utf-16-le' codec can't
    decode byte 0x0a" on its first line and "Expecting value" on its last. A UTF-8 byte order mark (and
    CRLF line ends) stay accepted, by validation and by the run's stream alike."""
    text = (REPO / "examples" / "smoke.jsonl").read_text()
    # named once for the whole file, with its byte order (each line was once one error, plus one for
    # the NUL byte after the last newline), and converted back by the command it gives
    for encoding, named in (
        ("utf-16-be", "UTF-16BE"),
        ("utf-16", "UTF-16LE"),  # with its byte order mark, as PowerShell writes it
        ("utf-16-le", "UTF-16LE"),
        ("utf-32", "UTF-32LE"),
        ("utf-32-be", "UTF-32BE"),
    ):
        path = tmp_path / f"{encoding}.jsonl"
        path.write_bytes(text.encode(encoding))
        scan = scan_workload(path, tmp_path, scripted=True)
        assert scan.problems == [
            f"{path}: {named} text, not UTF-8: convert it first "
            f"(`iconv -f {named} -t UTF-8 FILE > workload.jsonl`)"
        ]
        assert scan.count == 0
        assert path.read_bytes().decode(named).lstrip("\ufeff") == text
    nul_later = tmp_path / "nul.jsonl"  # a NUL byte past the first bytes: that line's error
    nul_later.write_bytes(text.encode() + b'{"id": "\x00"}\n')
    nul = ": line: holds NUL bytes, which no JSON text does: a UTF-16 or UTF-32 file? save it as UTF-8"
    assert [
        p.removeprefix(str(nul_later)) for p in scan_workload(nul_later, tmp_path, scripted=True).problems
    ] == [":4" + nul]
    stray = tmp_path / "stray.jsonl"
    stray.write_bytes(b"\xff\xfe\n" + text.encode())
    assert scan_workload(stray, tmp_path, scripted=True).problems == [
        f"{stray}:1: line: not UTF-8 text (invalid start byte at byte 0 of the line)"
    ]
    marked_stray = tmp_path / "marked_stray.jsonl"  # the byte's place in the line, its byte order mark in it
    marked_stray.write_bytes(b'\xef\xbb\xbf{"id": "\xff"}\n' + text.encode())
    assert scan_workload(marked_stray, tmp_path, scripted=True).problems == [
        f"{marked_stray}:1: line: not UTF-8 text (invalid start byte at byte 11 of the line)"
    ]
    marked = tmp_path / "marked.jsonl"
    marked.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
    assert scan_workload(marked, tmp_path, scripted=True).problems == []
    assert [pid for _, pid, _ in iter_problems(marked)] == ["smoke-add", "smoke-sleep", "smoke-answer"]


def test_durations_from_zero_and_output_tokens_from_one_are_accepted(tmp_path: Path) -> None:
    tool, final = json.loads(json.dumps(GOOD["script"]))
    edge = {"latency_ms": 0, "output_tokens": 1}
    script = [{**tool, **edge, "cpu_ms": 0}, {**final, **edge}]
    assert _problems(tmp_path, [json.dumps({**GOOD, "script": script})]) == []
    below = [{**tool, "cpu_ms": -0.5, "output_tokens": 0}, final]
    problems = _problems(tmp_path, [json.dumps({**GOOD, "script": below})])
    fields = sorted(p.split(": ")[1] for p in problems)
    assert fields == ["script[0].tool.cpu_ms", "script[0].tool.output_tokens"], problems


def test_an_error_echoes_at_most_a_bounded_part_of_a_huge_value(tmp_path: Path) -> None:
    """A value the message quotes (an id, an unknown key, tool or action type) of a megabyte was printed
    whole: each such error line was as long as the value, up to 200 of them."""
    big, longest_id = "k" * 1_000_000, "k" * 1_000  # a longer id is refused (its own test)
    lines = [
        json.dumps({**GOOD, "id": longest_id}),
        json.dumps({**GOOD, "id": longest_id}),  # duplicate id
        json.dumps({**GOOD, "id": "b", big: 1}),  # unknown field
        json.dumps({**GOOD, "id": "c", "script": [{"type": big}]}),
        json.dumps({**GOOD, "id": "d", "script": [{"type": "tool", "name": big, "arguments": {}}]}),
    ]
    problems = _problems(tmp_path, lines)
    assert len(problems) == 4
    assert all(len(p) < 2_000 for p in problems), [len(p) for p in problems]
    duplicate, unknown, action_type, tool = problems
    assert duplicate.startswith(f"{tmp_path / 'w.jsonl'}:2: id: duplicate id 'kkk")
    assert duplicate.endswith("(first on line 1)") and "characters left out" in duplicate
    assert f"{tmp_path / 'w.jsonl'}:3: kkk" in unknown
    assert ":4: script[0].type: 'kkk" in action_type and ":5: script[0].name: unknown tool 'kkk" in tool
