"""Regenerate ``examples/livecodebench/workload.jsonl``: convert ``test.jsonl``, then attach scripts.

Run from anywhere: ``python examples/livecodebench/make_example.py``. The conversion is exactly
``asyncroll convert-livecodebench --source test.jsonl``; this script only adds, per problem, the
``script`` the scripted backend replays for the one-repair protocol: a first submission that fails a
test and a second, repaired one that passes them all. The converter has no option to attach scripts:
a script is test data, not part of a benchmark. ``tests/test_bundled_examples.py`` checks that the
committed workload is exactly what this script produces, and that each wrong program fails and each right
one passes its problem's tests.
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

from asyncroll.convert.livecodebench import convert_livecodebench  # noqa: E402
from asyncroll.convert.output import dump_line  # noqa: E402

SEED = 0

#: Per question id: (a wrong first program, the repaired program).
PROGRAMS: dict[str, tuple[str, str]] = {
    "1873_A": (
        "t = int(input())\nfor _ in range(t):\n    input()\n    print('YES')\n",
        "t = int(input())\n"
        "for _ in range(t):\n"
        "    s = input().strip()\n"
        "    print('YES' if sum(a != b for a, b in zip(s, 'abc')) <= 2 else 'NO')\n",
    ),
    "ex_sum_max": (
        "input()\nprint(sum(map(int, input().split())))\n",
        "input()\nvalues = list(map(int, input().split()))\nprint(sum(values), max(values))\n",
    ),
    "ex_running_sum": (
        "class Solution:\n    def runningSum(self, nums):\n        return nums\n",
        "from itertools import accumulate\n\n\n"
        "class Solution:\n    def runningSum(self, nums):\n        return list(accumulate(nums))\n",
    ),
    "ex_count_prefix": (
        "class Solution:\n    def prefixCount(self, words, pref):\n"
        "        return sum(pref in w for w in words)\n",
        "class Solution:\n    def prefixCount(self, words, pref):\n"
        "        return sum(w.startswith(pref) for w in words)\n",
    ),
}


def script(question_id: str) -> list[dict[str, Any]]:
    wrong, right = PROGRAMS[question_id]
    return [
        {"type": "submit", "code": wrong, "latency_ms": 5},
        {"type": "submit", "code": right, "latency_ms": 5},
    ]


def build() -> str:
    """The example workload's text: the converted problems with their scripts."""
    with tempfile.TemporaryDirectory() as tmp:
        converted = Path(tmp) / "converted.jsonl"
        convert_livecodebench(HERE / "test.jsonl", converted, seed=SEED)
        problems = [json.loads(line) for line in converted.read_text(encoding="utf-8").splitlines()]
    ids = {p["id"] for p in problems}
    if ids != set(PROGRAMS):
        raise SystemExit(f"programs do not match the problems: {sorted(ids ^ set(PROGRAMS))}")
    lines = []
    for problem in problems:
        metadata = problem.pop("metadata")
        lines.append(dump_line({**problem, "script": script(problem["id"]), "metadata": metadata}))
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
