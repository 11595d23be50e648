"""Files Python's JSON reader cannot hold, or that no UTF-8 writer accepts, given to every command that
reads a file: a clear error (exit 2, naming the file) and nothing written — never a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, invoke
from tests.conversions import lcb_rows

BIG_INT = "9" * 4301  # past Python's int-string limit (4,300 digits)
DEEP = "[" * 3000 + "]" * 3000  # past the JSON reader's recursion limit


def refused(result: Any, *words: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert all(w in result.output for w in words), result.output


def damaged(recorded: Path, tmp_path: Path, name: str, content: bytes) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(recorded, copy)
    (copy / name).write_bytes(content)
    return copy


@pytest.mark.parametrize(
    ("name", "content", "word"),
    [
        ("summary.json", b'{"makespan_s": \xd9}', "summary.json"),
        ("events.jsonl", b'{"v":' + BIG_INT.encode() + b',"event":"x"}\n', "events.jsonl line 1"),
        ("events.jsonl", b"\xff\xfe\n", "events.jsonl line 1"),
    ],
)
def test_optimum_refuses_what_it_cannot_read(
    recorded: Path, tmp_path: Path, name: str, content: bytes, word: str
) -> None:
    refused(invoke("optimum", damaged(recorded, tmp_path, name, content), "--time-limit", "1"), word)


def test_a_replay_refuses_a_receipt_it_cannot_read(recorded: Path, tmp_path: Path) -> None:
    run = damaged(recorded, tmp_path, "run.json", ('{"config": ' + DEEP + "}").encode())
    out = tmp_path / "replay"
    refused(invoke("simulate", "--from-run", run, "--output", out), "cannot read run.json")
    assert not out.exists()
    assert invoke("timeline", run).exit_code in (0, 2)  # exported or refused, never a traceback


def test_converters_refuse_rows_they_cannot_hold(tmp_path: Path) -> None:
    row = {"question_id": "1873_A", "question_title": "A. Short Sort"}
    source = tmp_path / "lcb.jsonl"
    source.write_text(json.dumps({**row, "question_title": "\ud800"}) + "\n" + json.dumps(row) + "\n")
    out = tmp_path / "out.jsonl"
    refused(
        invoke("convert-livecodebench", "--source", source, "--output", out),
        ":1: invalid line: question_title",
    )
    assert not out.exists()
    tools = tmp_path / "tm.json"
    tools.write_text('[{"name": "f", "zz": ' + BIG_INT + "}]")
    functions = REPO / "examples" / "toolmath"
    result = invoke("convert-toolmath", "--source", tools, "--functions-dir", functions, "--output", out)
    refused(result, "cannot be read as JSON")
    tools.write_text(json.dumps([{"name": "f", "source_problem": "\udfff"}]))
    result = invoke("convert-toolmath", "--source", tools, "--functions-dir", functions, "--output", out)
    refused(result, "[0].source_problem: not valid Unicode")
    assert not out.exists()


@pytest.mark.parametrize(
    ("command", "name", "text"),
    [
        ("validate", "w.jsonl", '{"id": ' + BIG_INT + ', "prompt": "x"}\n'),
        ("convert-toolmath", "tm.json", '[{"name": "f", "zz": ' + BIG_INT + "}]"),
        ("convert-livecodebench", "lcb.json", '[{"question_id": ' + BIG_INT + "}]"),
        ("convert-livecodebench", "lcb.jsonl", '{"question_id": ' + BIG_INT + "}\n"),
        (
            "convert-livecodebench",
            "meta.jsonl",
            json.dumps({**lcb_rows()[0], "metadata": '{"k": ' + BIG_INT + "}"}) + "\n",
        ),
    ],
)
def test_an_integer_past_pythons_digit_limit_is_named_without_advice_for_a_programmer(
    tmp_path: Path, command: str, name: str, text: str
) -> None:
    """``validate`` and both converters passed on Python's own message, which ends "use
    sys.set_int_max_str_digits() to increase the limit": a call no flag or file of asyncroll makes.
    A ``--config`` file and an experiment config already said only what the number is."""
    source = tmp_path / name
    source.write_text(text)
    out = tmp_path / "out.jsonl"
    args: list[str | Path] = [command, source]
    if command == "convert-toolmath":
        args = [
            command,
            "--source",
            source,
            "--functions-dir",
            REPO / "examples" / "toolmath",
            "--output",
            out,
        ]
    elif command == "convert-livecodebench":
        args = [command, "--source", source, "--output", out]
    result = invoke(*args)
    refused(result, "Exceeds the limit (4300 digits) for integer string conversion: value has 4301 digits")
    assert "set_int_max_str_digits" not in result.output, result.output
    assert not out.exists()
