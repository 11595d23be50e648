"""Regenerate ``examples/toolmath/workload.jsonl``: convert ``ToolMATH.json``, then attach scripted actions.

Run from anywhere: ``python examples/toolmath/make_example.py``. The conversion is exactly
``asyncroll convert-toolmath --source examples/toolmath/ToolMATH.json --functions-dir examples/toolmath
--answers-from-solution``; this script only adds, per problem, the ``script`` the scripted backend
replays (the tool calls a solver would make, then the final answer), so the example runs without a model
server. The converter itself has no option to attach scripts: a script is test data, not part of a
benchmark. ``tests/test_bundled_examples.py`` checks that the committed workload is exactly what this
produces.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # run from a checkout without installing

from asyncroll.convert.output import dump_line  # noqa: E402
from asyncroll.convert.toolmath import convert_toolmath  # noqa: E402

SEED = 0


def _tool(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "tool", "name": name, "arguments": arguments, "latency_ms": 5}


def _final(answer: str) -> dict[str, Any]:
    return {"type": "final", "answer": answer, "latency_ms": 5}


#: Per problem id: the calls a solver would make with the problem's own tools, then the answer.
SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "toolmath-0": [_tool("absolute_difference", x=530, y=-470), _final("1000")],
    "toolmath-1": [_tool("absolute_value_a", x=-11), _tool("absolute_value_a", x=19), _final("19")],
    "toolmath-2": [_tool("absolute_value_b", number=-14), _final("5")],
    "toolmath-3": [
        _tool("circle_center_from_standard_coeffs_a", D=4, E=-6),
        _tool("circle_radius_from_standard_coeffs", D=4, E=-6, F=-3),
        _tool("sum_three_numbers_a", a=-2, b=3, c=4),
        _final("5"),
    ],
    "toolmath-6": [
        _tool("shifted_square_to_linear_coeffs", shift=2008),
        _tool("solve_linear_equation", A=4016, B=4032064),
        _final("-1004"),
    ],
    "toolmath-8": [_tool("mean_of_values", values=[2, 4, 9, 13]), _final("7")],
    "toolmath-9": [
        _tool("min_and_max", values=[7, 3, 12, 5]),
        _tool("difference_of_numbers", a=12, b=3),
        _final("9"),
    ],
    "toolmath-11": [
        _tool("total_from_counts", counts={"1": 2, "2": 1, "3": 3, "5": 1, "6": 3}),
        _final("36"),
    ],
}


def build() -> str:
    """The example workload's text: the converted problems with their scripts."""
    with tempfile.TemporaryDirectory() as tmp:
        converted = Path(tmp) / "converted.jsonl"
        convert_toolmath(HERE / "ToolMATH.json", HERE, converted, seed=SEED, answers_from_solution=True)
        problems = [json.loads(line) for line in converted.read_text(encoding="utf-8").splitlines()]
    ids = {p["id"] for p in problems}
    if ids != set(SCRIPTS):
        raise SystemExit(f"scripts do not match the problems: {sorted(ids ^ set(SCRIPTS))}")
    lines = []
    for problem in problems:
        metadata = problem.pop("metadata")
        lines.append(dump_line({**problem, "script": SCRIPTS[problem["id"]], "metadata": metadata}))
    return "".join(lines)


def main() -> None:
    target = HERE / "workload.jsonl"
    fd, tmp = tempfile.mkstemp(dir=HERE, prefix=".workload.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
        handle.write(build())
    os.replace(tmp, target)
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
