"""A workload's trusted tool files, as validation sees them: confined to the tool root, parsed and never
run, and what a tool's def says (its kind, its parameters, its bound arguments) against how a worker calls
it (``f(**arguments)``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncroll import tool_files
from asyncroll.coerce import coerce_arguments
from asyncroll.workload import scan_workload
from asyncroll.workload.checks import SYMLINK_LOOP
from tests.workload_scans import _problems, _write


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
    assert problems[2].endswith(f"'loop.py' cannot be resolved: {SYMLINK_LOOP}")  # the same on 3.11 and 3.13
    assert "is not a regular file" in problems[3]
    assert "nested too deeply for the parser" in problems[4]


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
    ("source", "kind", "line"),
    [
        ("f = 5\n", "an int", 1),
        ("import math\n\nf: str = 'x'\n", "a str", 3),
        ("f = None\n", "None", 1),
        ("f = [1, 2]\n", "a list", 1),
        ("f = {i: i for i in range(3)}\n", "a dict", 1),
        ("g = f = f'{1}'\n", "a str", 1),
        ("f = (i for i in range(3))\n", "a generator", 1),
    ],
)
def test_a_tool_name_bound_only_to_a_literal_fails_validation(
    tmp_path: Path, source: str, kind: str, line: int
) -> None:
    """``f = 5`` binds the name, but a worker can never call it: validation says so, with the line, rather
    than letting the run fail at worker start-up."""
    (tmp_path / "t.py").write_text(source)
    assert _problems(tmp_path, [_tool_line(1, "t.py")]) == [
        f"{tmp_path / 'w.jsonl'}:1: tools[0].implementation: 't.py' binds 'f' to {kind} at line {line}, "
        "which cannot be called: a tool must be a function (a def) that a worker calls with the arguments"
    ]


@pytest.mark.parametrize(
    "source",
    [
        "f = 5\ndef f(x):\n    return x\n",  # rebound by a def
        "f = 5\nfrom math import *\n",  # a star import may rebind it
        "f = abs\n",
        "f = (abs)\n",
        "if True:\n    f = 5\nelse:\n    f = abs\n",
        # a placeholder filled at import time by a binding no statement shows
        "f = None\ndef _make():\n    return abs\nglobals()['f'] = _make()\n",
        "f = None\nglobals().update(f=abs)\n",
        "import sys\nf = None\nsetattr(sys.modules[__name__], 'f', abs)\n",
        "import sys\nf = None\nsys.modules[__name__].f = abs\n",
        "f = None\nexec('def f(x):\\n    return x')\n",
    ],
)
def test_a_literal_binding_that_may_be_rebound_is_left_to_the_worker(tmp_path: Path, source: str) -> None:
    (tmp_path / "t.py").write_text(source)
    assert _problems(tmp_path, [_tool_line(1, "t.py")]) == []


@pytest.mark.parametrize(
    "source",
    ["def g():\n    f = 1\n", "class C:\n    def f(self):\n        pass\n", "g = lambda f: f\n", "# f\n"],
)
def test_bindings_inside_functions_and_classes_do_not_count(tmp_path: Path, source: str) -> None:
    (tmp_path / "t.py").write_text(source)
    assert "defines no top-level 'f'" in _problems(tmp_path, [_tool_line(1, "t.py")])[0]


def test_a_missing_tool_name_says_which_names_the_file_binds_that_differ_only_in_case_or_underscores(
    tmp_path: Path,
) -> None:
    (tmp_path / "t.py").write_text("def getWeather(x):\n    return x\n\n\nGet_Weather = getWeather\n")
    (tmp_path / "u.py").write_text("def weather(x):\n    return x\n")
    lines = [_tool_line(1, "t.py", "get_weather"), _tool_line(2, "u.py", "get_weather")]
    at = f"{tmp_path / 'w.jsonl'}"
    assert _problems(tmp_path, lines) == [
        f"{at}:1: tools[0].implementation: 't.py' defines no top-level 'get_weather' (no def, class, "
        "assignment or import at module level binds that name; it binds 'Get_Weather', 'getWeather': "
        "names are exact)",
        f"{at}:2: tools[0].implementation: 'u.py' defines no top-level 'get_weather' (no def, class, "
        "assignment or import at module level binds that name)",
    ]


@pytest.mark.parametrize(
    "source",
    [
        'if __name__ == "__main__":\n    def f(x):\n        return x\n',
        "if '__main__' == __name__:\n    import math\n    f = math.floor\n",
        'if __name__ != "__main__":\n    pass\nelse:\n    f = abs\n',
    ],
)
def test_a_tool_bound_only_under_the_main_guard_fails_validation(tmp_path: Path, source: str) -> None:
    """A worker imports the file under a name of its own, so an ``if __name__ == "__main__":`` block never
    runs: validation said "ok" and the run failed at worker start-up ("no callable named 'f'")."""
    (tmp_path / "t.py").write_text(source)
    assert _problems(tmp_path, [_tool_line(1, "t.py")]) == [
        f"{tmp_path / 'w.jsonl'}:1: tools[0].implementation: 't.py' binds 'f' only inside "
        '`if __name__ == "__main__":`, which never runs in a worker (it imports the file as a module of '
        "another name): define it outside"
    ]


@pytest.mark.parametrize(
    "source",
    [
        'if __name__ == "__main__":\n    pass\nelse:\n    f = abs\n',
        'if __name__ != "__main__":\n    from math import *\n',
        'def f(x):\n    return x\n\nif __name__ == "__main__":\n    f = print\n',
    ],
)
def test_what_runs_outside_the_main_guard_binds_the_tool(tmp_path: Path, source: str) -> None:
    (tmp_path / "t.py").write_text(source)
    assert _problems(tmp_path, [_tool_line(1, "t.py")]) == []


def test_a_def_rebound_only_under_the_main_guard_has_its_signature_checked(tmp_path: Path) -> None:
    source = 'def f(x, y):\n    return x\n\nif __name__ == "__main__":\n    f = print\n'
    (problem,) = _tool_problems(tmp_path, source, {"x": "int"})
    assert problem.startswith("tools[0].inputs: f(x, y) requires 'y', which is not in inputs"), problem


@pytest.mark.parametrize(
    ("defined", "named"),
    [("cafe\u0301", "cafe\u0301"), ("\ufb01nd", "\ufb01nd"), ("find", "\ufb01nd")],
)
def test_a_tool_name_python_would_normalise_says_so(tmp_path: Path, defined: str, named: str) -> None:
    """Python reads a file's identifiers NFKC-normalised: ``def café`` typed with a combining accent (NFD)
    binds ``café`` in one code point, ``def ﬁnd`` (a ligature) binds ``find``. A workload that names the
    tool as typed in the file was told the file defines no such name, a name that looked exactly like
    the one in the file: the refusal says what Python binds instead, and what to name the tool."""
    import unicodedata

    (tmp_path / "t.py").write_text(f"def {defined}(x):\n    return x\n", encoding="utf-8")
    (problem,) = _problems(tmp_path, [_tool_line(1, "t.py", named)])
    binds = unicodedata.normalize("NFKC", named)
    assert f"defines no top-level {named!r}" in problem and f"name the tool {binds!r}" in problem
    assert "NFKC" in problem


def test_a_name_python_would_normalise_but_the_file_does_not_bind_either_way_is_plainly_missing(
    tmp_path: Path,
) -> None:
    # The NFKC hint is given only when the file binds the normalised name: otherwise it would name a
    # binding the file does not hold.
    (tmp_path / "t.py").write_text("def other(x):\n    return x\n", encoding="utf-8")
    (problem,) = _problems(tmp_path, [_tool_line(1, "t.py", "\ufb01nd")])
    assert problem.endswith(
        "tools[0].implementation: 't.py' defines no top-level '\ufb01nd' "
        "(no def, class, assignment or import at module level binds that name)"
    ), problem


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


def test_a_tool_file_named_like_a_built_in_takes_its_own_inputs_not_the_built_ins(tmp_path: Path) -> None:
    # A trusted ``add`` declaring no inputs takes none: the built-in add's ``a`` and ``b`` are not its own.
    (tmp_path / "t.py").write_text("def add():\n    return 3\n")
    tool = {"name": "add", "implementation": "t.py"}
    line = {
        "id": 1,
        "prompt": "p",
        "tools": [tool],
        "script": [{"type": "tool", "name": "add", "arguments": {}}, {"type": "final", "answer": 3}],
    }
    assert _problems(tmp_path, [json.dumps(line)]) == []
