"""How deep JSON input may nest: one limit on every Python version (`json_depth.json_loads`).

Python's own parser stops where the interpreter's recursion does (≈ 1,000 levels on 3.11, ≈ 1,500 on 3.12,
≈ 10,000 on 3.13), so a workload or a configuration refused on one Python was read on the next."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from asyncroll.config_file import load_config_file
from asyncroll.errors import UsageError
from asyncroll.experiment.config import load_experiment_config
from asyncroll.json_depth import MAX_JSON_DEPTH, TOO_DEEP, JsonTooDeep, json_depth, json_loads
from tests.workload_scans import GOOD, _problems


def nested(depth: int, inner: str = "1") -> str:
    """Arrays and objects alternating, ``depth`` deep around ``inner``."""
    text = inner
    for level in range(depth):
        text = "[" + text + "]" if level % 2 else '{"k": ' + text + "}"
    return text


def test_the_limit_is_exact_for_text_and_bytes() -> None:
    assert MAX_JSON_DEPTH == 500 and TOO_DEEP == "JSON nested deeper than 500 levels"
    for text in (nested(MAX_JSON_DEPTH), nested(MAX_JSON_DEPTH).encode()):
        assert json_depth(text) == MAX_JSON_DEPTH
        assert json_loads(text) == json.loads(text)
    for text in (nested(MAX_JSON_DEPTH + 1), nested(MAX_JSON_DEPTH + 1).encode()):
        with pytest.raises(JsonTooDeep, match=TOO_DEEP):
            json_loads(text)


def test_past_pythons_own_limit_is_the_same_error() -> None:
    """20,000 levels: past every supported Python's own parser, which raises a bare RecursionError."""
    with pytest.raises(JsonTooDeep, match=f"^{TOO_DEEP}$"):
        json_loads("[" * 20_000 + "]" * 20_000)
    assert issubclass(JsonTooDeep, RecursionError)  # a reader's handler for one is its handler for both


def test_brackets_inside_strings_do_not_count() -> None:
    quoted = json.dumps("[{" * 2000 + '\\"[' * 600 + "\\")  # escaped quotes and a backslash at the end
    text = "[" + quoted + ', {"a": ' + quoted + "}]"
    assert json_depth(text) == 2
    assert json_loads(text) == json.loads(text)
    assert json_loads(text.encode()) == json.loads(text)


def test_keywords_reach_json() -> None:
    with pytest.raises(ValueError, match="twice"):
        json_loads('{"a": 1, "a": 2}', object_pairs_hook=_unique)


def _unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
    if len({key for key, _ in pairs}) != len(pairs):
        raise ValueError("a key given twice")
    return dict(pairs)


def test_a_workload_line_past_the_limit_is_a_named_error_and_one_at_it_is_valid(tmp_path: Path) -> None:
    at = json.dumps({**GOOD, "id": "at", "metadata": {"x": []}}).replace("[]", nested(MAX_JSON_DEPTH - 2))
    past = json.dumps({**GOOD, "id": "past", "metadata": {"x": []}}).replace("[]", nested(MAX_JSON_DEPTH - 1))
    assert json_depth(at) == MAX_JSON_DEPTH and json_depth(past) == MAX_JSON_DEPTH + 1
    problems = _problems(tmp_path, [at, past])
    assert problems == [f"{tmp_path / 'w.jsonl'}:2: line: cannot be read: {TOO_DEEP}"], problems


def test_settings_files_past_the_limit_are_named_errors(tmp_path: Path) -> None:
    run_config = tmp_path / "run.json"
    run_config.write_text('{"description": ' + nested(MAX_JSON_DEPTH) + "}")
    with pytest.raises(UsageError, match=f"--config {run_config}: not valid JSON: {TOO_DEEP}"):
        load_config_file(run_config)
    experiment = tmp_path / "experiment.json"
    experiment.write_text('{"description": ' + nested(MAX_JSON_DEPTH) + "}")
    with pytest.raises(UsageError, match=f"{experiment}: invalid JSON: {TOO_DEEP}"):
        load_experiment_config(experiment)
    # a TOML settings file has no depth of its own: tomllib stops at Python's recursion limit, which
    # said only "maximum recursion depth exceeded"
    toml = tmp_path / "run.toml"
    toml.write_text("description = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(UsageError) as refused:
        load_config_file(toml)
    assert str(refused.value) == (
        f"--config {toml}: not valid TOML: arrays or inline tables nested too deep (Python's recursion limit)"
    )


def test_measuring_a_long_line_of_many_strings_copies_none_of_them() -> None:
    """A LiveCodeBench line of 1,000,000 tests (69 MB) took 1.2 GB and 3 s to measure: the text was first
    copied without its strings, one object per piece between them. Now each string or bracket is one
    reference to a shared empty or one-character value."""
    tests = [{"input": f"1\n{i}\n", "output": f"{i}\n", "testtype": "stdin"} for i in range(20_000)]
    text = json.dumps({"metadata": {"reference_tests": tests}})
    for value in (text, text.encode()):
        tracemalloc.start()
        try:
            assert json_depth(value) == 4
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 2 * len(text), (peak, len(text))
