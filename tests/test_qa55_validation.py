"""Workload and converter validation gaps: script steps that can never run, ``if __name__`` guards of
other shapes, one tool file under several spellings, ToolMATH records that disagree on their problem's
level or type, and LiveCodeBench ids that differ only in whitespace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncroll.convert.livecodebench import convert_livecodebench
from asyncroll.convert.toolmath import convert_toolmath
from asyncroll.errors import UsageError
from asyncroll.workload import scan_workload
from tests.conftest import invoke
from tests.conversions import LCB_ROW, TM_EXAMPLE, TM_HARD, lines, write_json, write_jsonl
from tests.workload_scans import _problems

# --- script steps that can never run -------------------------------------------------------------------


def _code_problem(steps: list[dict[str, Any]], generations: int = 2) -> str:
    return json.dumps(
        {
            "id": "c",
            "prompt": "write a program",
            "tools": [{"name": "lcb_evaluate"}],
            "script": steps,
            "metadata": {
                "reference_tests": [{"input": "1", "output": "1", "testtype": "stdin"}],
                "prompt_metadata": {"protocol": "one_repair", "max_generations": generations},
            },
        }
    )


def _submit(passes: bool | None = False) -> dict[str, Any]:
    return {"type": "submit", "code": "print(input())", "passes": passes}


def test_submits_past_max_generations_are_refused(tmp_path: Path) -> None:
    """The protocol ends a trajectory at its ``max_generations``-th judged program, whatever its verdict:
    a third submit (the one that would pass) never ran, and validate said "ok"."""
    at = f"{tmp_path / 'w.jsonl'}:1"
    assert _problems(tmp_path, [_code_problem([_submit(), _submit(), _submit(True)])]) == [
        f"{at}: script[2]: never runs: the one-repair protocol ends the trajectory at its submit 2 "
        "(script[1]; max_generations 2), whatever that program's verdict: remove the 1 step(s) after it, "
        "or raise max_generations"
    ]
    one = _code_problem([_submit(), _submit()], generations=1)
    assert _problems(tmp_path, [one]) == [
        f"{at}: script[1]: never runs: the one-repair protocol ends the trajectory at its submit 1 "
        "(script[0]; max_generations 1), whatever that program's verdict: remove the 1 step(s) after it, "
        "or raise max_generations"
    ]
    # as many submits as generations, or fewer (a passing first program ends it early): valid
    assert _problems(tmp_path, [_code_problem([_submit(), _submit(True)])]) == []
    assert _problems(tmp_path, [_code_problem([_submit(True)], generations=3)]) == []


def test_steps_after_a_final_answer_are_refused(tmp_path: Path) -> None:
    """A ``final`` answer ends the trajectory: steps after it never ran, as an ``error`` step that is not
    the last is refused."""
    line = json.dumps(
        {
            "id": "a",
            "prompt": "p",
            "tools": [{"name": "add"}],
            "script": [
                {"type": "final", "answer": "3"},
                {"type": "tool", "name": "add", "arguments": {"a": 1, "b": 2}},
                {"type": "final", "answer": "4"},
            ],
        }
    )
    assert _problems(tmp_path, [line]) == [
        f"{tmp_path / 'w.jsonl'}:1: script[1]: never runs: script[0] is a 'final' answer, which ends the "
        "trajectory: remove the 2 step(s) after it"
    ]


def test_the_cli_refuses_a_script_with_a_third_submit(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    path.write_text(_code_problem([_submit(), _submit(), _submit(True)]) + "\n")
    result = invoke("validate", path)
    assert result.exit_code != 0 and "script[2]: never runs" in result.stderr


# --- if __name__ guards of other shapes ----------------------------------------------------------------


def _tool_line(impl: str = "t.py", name: str = "f") -> str:
    return json.dumps(
        {
            "id": 1,
            "prompt": "p",
            "tools": [{"name": name, "inputs": {"x": "int"}, "implementation": impl}],
            "script": [{"type": "tool", "name": name, "arguments": {"x": 1}}, {"type": "final", "answer": 1}],
        }
    )


@pytest.mark.parametrize(
    "source",
    [
        'if __name__ in ("__main__",):\n    def f(x):\n        return x\n',
        'if __name__ in {"__main__"}:\n    f = abs\n',
        'if not __name__ != "__main__":\n    f = abs\n',
        'if not __name__ == "__main__":\n    pass\nelse:\n    f = abs\n',
        'import sys\nif __name__ == "__main__" and len(sys.argv) > 1:\n    f = abs\n',
        'if x := 0:\n    pass\nelif "__main__" == __name__:\n    f = abs\n',
    ],
)
def test_other_main_guard_shapes_are_known_never_to_run(tmp_path: Path, source: str) -> None:
    """A worker imports the file as ``_asyncroll_tool_N_stem``, never ``__main__``: a tool bound only under
    ``__name__ in ("__main__",)``, ``not __name__ != "__main__"``, or ``__name__ == "__main__" and ...``
    passed validation and failed every worker's start-up ("no callable named 'f'")."""
    (tmp_path / "t.py").write_text(source)
    (problem,) = _problems(tmp_path, [_tool_line()])
    assert "binds 'f' only inside `if __name__ == \"__main__\":`" in problem, problem


@pytest.mark.parametrize(
    "source",
    [
        'if __name__ not in ("__main__",):\n    f = abs\n',
        'if not __name__ == "__main__":\n    f = abs\n',
        'if __name__ == "__main__" or True:\n    f = abs\n',
        'if __name__ in ("__main__", "tools"):\n    f = abs\n',  # unknown: left to the worker
        'import sys\nif __name__ == "__main__" or len(sys.argv) > 1:\n    f = abs\n',
    ],
)
def test_guards_that_may_run_in_a_worker_bind_the_tool(tmp_path: Path, source: str) -> None:
    (tmp_path / "t.py").write_text(source)
    assert _problems(tmp_path, [_tool_line()]) == []


# --- one tool file under several spellings -----------------------------------------------------------


def test_one_tool_file_under_several_spellings_is_one_tool(tmp_path: Path) -> None:
    """``tools/a.py``, ``./tools/a.py``, ``tools//a.py`` and ``tools/../tools/a.py`` name one file: the scan
    counted four tools, run.json recorded four, and every event's ``tool`` (the predictor's and the
    summary's key) split one tool's jobs four ways."""
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "a.py").write_text("def f(x):\n    return x\n")
    spellings = ["tools/a.py", "./tools/a.py", "tools//a.py", "tools/../tools/a.py", "tools/./a.py"]
    path = tmp_path / "w.jsonl"
    path.write_text(
        "".join(_tool_line(impl).replace('"id": 1', f'"id": {i}') + "\n" for i, impl in enumerate(spellings))
    )
    scan = scan_workload(path, tmp_path, scripted=True)
    assert scan.problems == []
    assert list(scan.tools) == ["tools/a.py:f"]


def test_a_dotdot_after_a_symlink_is_refused_not_folded_into_another_file(tmp_path: Path) -> None:
    """``link/../a.py`` opens the file next to the link's target, not ``a.py`` beside the link: the key,
    folded by text, would give two files one name, so such a spelling is refused."""
    (tmp_path / "a.py").write_text("def f(x):\n    return x\n")
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "real" / "a.py").write_text("def f(x):\n    return -x\n")
    (tmp_path / "link").symlink_to(tmp_path / "real" / "sub")
    (problem,) = _problems(tmp_path, [_tool_line("link/../a.py")])
    assert problem.endswith(
        f"tools[0].implementation: 'link/../a.py' goes up ('..') out of a symbolic link, to "
        f"{tmp_path.resolve() / 'real' / 'a.py'}, not to the file its text names, 'a.py': "
        "spell the path without '..'"
    ), problem


def test_a_run_recorded_with_the_spelled_key_still_replays(tmp_path: Path) -> None:
    """Runs made before keys were normalised recorded ``./tools/a.py:f`` in events.jsonl and run.json:
    ``simulate --from-run`` still matches their jobs to the workload's tool."""
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "a.py").write_text("def f(x):\n    return x\n")
    workload = tmp_path / "w.jsonl"
    workload.write_text(_tool_line("./tools/a.py") + "\n")
    run = tmp_path / "run"
    result = invoke("run", "--workload", workload, "--output", run, "--cpu-workers", "1")
    assert result.exit_code == 0, result.stderr
    for name in ("events.jsonl", "run.json"):  # as an older asyncroll wrote them
        text = (run / name).read_text()
        assert '"tools/a.py:f"' in text
        (run / name).write_text(text.replace('"tools/a.py:f"', '"./tools/a.py:f"'))
    replay = invoke("simulate", "--from-run", run, "--output", tmp_path / "sim")
    assert replay.exit_code == 0, replay.stderr


# --- ToolMATH: records of one problem that disagree on level or type ------------------------------------


def test_toolmath_records_that_disagree_on_level_or_type_keep_neither(tmp_path: Path) -> None:
    """The first record's ``level`` was kept silently: per-level accuracy then counted the problem at a
    level that another of its records contradicts. As with answers that disagree, it keeps none, named."""
    records = json.loads(TM_HARD.read_text(encoding="utf-8"))
    records[4]["level"] = "Level 5"
    records[1]["type"] = "Geometry"
    out = tmp_path / "out.jsonl"
    report = convert_toolmath(write_json(tmp_path / "s.json", records), TM_EXAMPLE, out)
    problems = {p["id"]: p["metadata"] for p in lines(out)}
    assert problems["toolmath-3"]["level"] is None and problems["toolmath-3"]["type"] == records[3]["type"]
    assert problems["toolmath-0"]["type"] is None and problems["toolmath-0"]["level"] == "Level 4"
    assert report.disagreements == [
        "toolmath-0 (type: [0] 'Algebra', [1] 'Geometry')",
        f"toolmath-3 (level: [3] {records[3]['level']!r}, [4] 'Level 5')",
    ]
    cli_out = tmp_path / "cli.jsonl"
    source = tmp_path / "s.json"
    result = invoke(
        "convert-toolmath", "--source", source, "--functions-dir", TM_EXAMPLE, "--output", cli_out
    )
    assert result.exit_code == 0, result.stderr
    assert (
        "note: 2 problem(s) have a null metadata level or type: their records disagree on it:"
        in result.stderr
    )
    assert "toolmath-3 (level: [3]" in result.stderr


def test_toolmath_level_differing_only_in_whitespace_agrees(tmp_path: Path) -> None:
    records = json.loads(TM_HARD.read_text(encoding="utf-8"))
    records[4]["level"] = f"  {records[3]['level']}\n"
    out = tmp_path / "out.jsonl"
    report = convert_toolmath(write_json(tmp_path / "s.json", records), TM_EXAMPLE, out)
    problems = {p["id"]: p["metadata"] for p in lines(out)}
    assert problems["toolmath-3"]["level"] == records[3]["level"] and report.disagreements == []


# --- LiveCodeBench: ids that differ only in whitespace -----------------------------------------------


@pytest.mark.parametrize("other", ["1873_A ", " 1873_A", "1873_A\n", "1873_A\u00a0"])
def test_lcb_ids_differing_only_in_whitespace_are_duplicates(tmp_path: Path, other: str) -> None:
    """``"1873_A"`` and ``"1873_A "`` became two output lines whose ids read the same in a terminal, the
    timeline and every note: the duplicate check compares ids with their whitespace normalised."""
    row = json.loads(LCB_ROW.read_text(encoding="utf-8"))
    source = write_jsonl(tmp_path / "rows.jsonl", [row, {**row, "question_id": other}])
    with pytest.raises(UsageError) as caught:
        convert_livecodebench(source, tmp_path / "out.jsonl")
    message = str(caught.value)
    assert f"duplicate id {other!r}" in message and "differs from '1873_A' only in whitespace" in message
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("other", ["abc ", " abc", "abc\n", "ab c", "abc\u00a0"])
def test_workload_ids_differing_only_in_whitespace_are_duplicates(tmp_path: Path, other: str) -> None:
    """A workload's ``"abc"`` and ``"abc "`` were two trajectories whose ids read the same in results,
    events and the timeline (the converter already refused such ids): validate says they are duplicates."""
    final = [{"type": "final", "answer": "x"}]
    path = write_jsonl(
        tmp_path / "w.jsonl", [{"id": i, "prompt": "p", "script": final} for i in ("abc", other)]
    )
    scan = scan_workload(path, tmp_path, scripted=True)
    if other == "ab c":  # another id, not another spelling of one
        assert scan.problems == [] and scan.count == 2
        return
    assert scan.problems == [
        f"{path}:2: id: duplicate id {other!r}, which differs from 'abc' only in whitespace (first on line 1)"
    ]
