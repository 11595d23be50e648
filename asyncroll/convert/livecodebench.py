"""``convert-livecodebench``: LiveCodeBench ``code_generation`` rows → one-repair code problems (SPEC §8.2).

The source is a JSON array of rows, one JSON object, or JSONL; every field of a row is a string. Each
selected row becomes a problem whose prompt holds an instruction (return a complete Python 3 program as
source only), the title, the statement and the starter code, and never a test or a solution. The model's
only tool is the built-in ``lcb_evaluate``, which takes just ``code``: the tests (public then private,
decoded by :mod:`asyncroll.convert.lcb_tests`) go to ``metadata.reference_tests`` and, for a functional
(LeetCode) problem, the method to call to ``metadata.func_name``; ``metadata.prompt_metadata`` selects
the one-repair protocol. Hidden metadata never reaches prompts or results.

Functional problems are converted (``--stdin-only`` drops them). Selection ranks rows by the SHA-256 of
``[seed, question_id]`` (:mod:`asyncroll.convert.selection`), so it does not depend on input order.
"""

from __future__ import annotations

import json
import keyword
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncroll.convert import raise_problems
from asyncroll.convert.hints import TOOLMATH_RECORDS, toolmath_record
from asyncroll.convert.lcb_tests import WireFormatError, decode_private, decode_public
from asyncroll.convert.output import check_destination, write_jsonl_atomic
from asyncroll.convert.rows import RowRef, RowSource
from asyncroll.convert.selection import check_limit, select
from asyncroll.errors import UsageError
from asyncroll.json_checks import json_error_text, json_kind
from asyncroll.json_depth import json_loads

REQUIRED = ("question_id", "question_content", "public_test_cases", "private_test_cases")
OPTIONAL = (
    "question_title",
    "platform",
    "contest_id",
    "contest_date",
    "starter_code",
    "difficulty",
    "metadata",
)
EVALUATE_TOOL = {
    "name": "lcb_evaluate",
    "description": "Run the submitted Python 3 program against the problem's hidden tests.",
    "inputs": {"code": "str"},
}
SOURCE_ONLY = "Return only the program's source code: no explanation and no Markdown fences."
STDIN_INSTRUCTION = (
    "Solve the programming problem below with a complete Python 3 program that reads the input from "
    "standard input and writes the answer to standard output."
)
FUNCTIONAL_INSTRUCTION = (
    "Solve the programming problem below with a complete Python 3 program that completes the starter "
    "code: it must define `class Solution` with the method `{func}`, which is called as "
    "`Solution().{func}(...)` with the problem's arguments; its return value is checked."
)
REPAIR_INSTRUCTION = (
    "Your program did not pass the tests; the first failing test is shown below. Return a corrected, "
    "complete Python 3 program. " + SOURCE_ONLY
)
PROMPT_METADATA = {"protocol": "one_repair", "max_generations": 2, "repair_instruction": REPAIR_INSTRUCTION}


@dataclass(frozen=True, slots=True)
class CodeProblem:
    """One validated row: what the prompt shows and what stays hidden."""

    where: str
    question_id: str
    row: dict[str, str]
    func_name: str | None
    public: list[dict[str, str]]
    private: list[dict[str, str]]

    @property
    def functional(self) -> bool:
        return self.func_name is not None


@dataclass(slots=True)
class LcbReport:
    """What a conversion did, for the command's one-line summary."""

    output: Path
    rows: int = 0
    functional: int = 0
    skipped: int = 0
    written: int = 0


def convert_livecodebench(
    source: Path, output: Path, *, limit: int | None = None, seed: int = 0, stdin_only: bool = False
) -> LcbReport:
    """Convert ``source`` rows to the workload ``output``; validate everything first, write atomically.

    For a JSONL source, memory holds one row at a time plus a small reference per row
    (:mod:`asyncroll.convert.rows`), whatever the file's size.
    """
    check_limit(limit)
    check_destination(source, output)
    rows = RowSource(source)
    entries = scan_rows(rows)
    functional = sum(e.functional for e in entries)
    report = LcbReport(output, rows=len(entries), functional=functional)
    eligible = [e for e in entries if not (stdin_only and e.functional)]
    report.skipped = len(entries) - len(eligible)
    if not eligible:
        raise UsageError(f"{source}: no stdin problems to convert (--stdin-only dropped all {len(entries)})")
    chosen = select(eligible, key=lambda e: e.question_id, seed=seed, limit=limit)
    from asyncroll.workload import Problem

    def lines() -> Iterator[dict[str, Any]]:
        # One problem in memory at a time; an error here removes the temporary file (nothing written).
        for entry in chosen:
            problem, issues = parse_row(entry.ref.where, rows.load(entry.ref))
            if problem is None:  # only if the row changed under us; load() checks its hash first
                raise UsageError("\n".join(issues))
            line = to_problem(problem, seed, rows.sha256)
            Problem.model_validate(line)  # a converter bug if not
            yield line

    report.written = write_jsonl_atomic(output, lines())
    return report


@dataclass(frozen=True, slots=True)
class _Entry:
    """A validated row, kept small: its id, its kind and where to read it again."""

    question_id: str
    functional: bool
    ref: RowRef


def scan_rows(rows: RowSource) -> list[_Entry]:
    """Validate every row; duplicate ids, invalid lines and malformed rows are reported together."""
    problems: list[str] = []
    entries: list[_Entry] = []
    first_seen: dict[str, tuple[str, str]] = {}  # whitespace-normalised id → (where, id)
    toolmath = 0  # rows that are ToolMATH tool records (the other converter's source)
    for row, ref in rows.scan():
        toolmath += toolmath_record(row)
        problem, issues = parse_row(ref.where, row)
        problems.extend(issues)
        if problem is None:
            continue
        # ids that differ only in whitespace ("abc", "abc ") read alike in a terminal, a note or the
        # timeline: two output lines under them could not be told apart
        key = " ".join(problem.question_id.split())
        if key in first_seen:
            where, first = first_seen[key]
            alike = (
                "" if first == problem.question_id else f", which differs from {first!r} only in whitespace"
            )
            problems.append(
                f"{problem.where}: question_id: duplicate id {problem.question_id!r}{alike} "
                f"(first at {where})"
            )
            continue
        first_seen[key] = (ref.where, problem.question_id)
        entries.append(_Entry(problem.question_id, problem.functional, ref))
    hint = TOOLMATH_RECORDS if toolmath and not entries else None  # no usable row: the other converter's
    raise_problems(sorted(rows.problems + problems, key=_line_order), hint)
    return entries


def _line_order(message: str) -> int:
    """A message's line number when it has one, so invalid lines and row problems interleave in order."""
    head = message.split(": ", 1)[0]
    number = head.rsplit(":", 1)[-1].split(" ", 1)[0]
    return int(number) if number.isdigit() else 0


def parse_row(where: str, row: Any) -> tuple[CodeProblem | None, list[str]]:
    """One row → a :class:`CodeProblem`, or the list of what is wrong with it."""
    if not isinstance(row, dict):
        return None, [f"{where}: expected a row object, got {json_kind(row)}"]
    qid = row.get("question_id")
    if isinstance(qid, str) and qid.strip():
        where = f"{where} (question_id {qid!r})"
    issues = [f"{where}: {name}: missing" for name in REQUIRED if name not in row]
    issues += [
        f"{where}: {name}: expected a string, got {json_kind(row[name])}"
        for name in (*REQUIRED, *OPTIONAL)
        if name in row and not isinstance(row[name], str)
    ]
    if issues:
        return None, issues
    if not row["question_id"].strip():
        issues.append(f"{where}: question_id: empty")
    if not row["question_content"].strip():
        issues.append(f"{where}: question_content: the problem statement is empty")
    func_name, issue = _func_name(row.get("metadata", ""))
    if issue:
        issues.append(f"{where}: metadata: {issue}")
    tests: dict[str, list[dict[str, str]]] = {}
    for name, decode in (("public_test_cases", decode_public), ("private_test_cases", decode_private)):
        try:
            tests[name] = decode(row[name])
        except WireFormatError as exc:
            issues.append(f"{where}: {name}: {exc}")
    if issues:
        return None, issues
    expected = "functional" if func_name else "stdin"
    for name, cases in tests.items():
        for i, case in enumerate(cases):
            if case["testtype"] != expected:
                reason = f"metadata.func_name is {func_name!r}" if func_name else "metadata has no func_name"
                issues.append(f"{where}: {name}: test [{i}] is {case['testtype']!r} but {reason}")
                break
    if not tests["public_test_cases"] and not tests["private_test_cases"]:
        issues.append(f"{where}: public_test_cases, private_test_cases: the problem has no tests")
    if issues:
        return None, issues
    problem = CodeProblem(
        where, row["question_id"], row, func_name, tests["public_test_cases"], tests["private_test_cases"]
    )
    return problem, []


def _func_name(field: str) -> tuple[str | None, str | None]:
    if not field.strip():
        return None, None
    try:
        meta = json_loads(field)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON: {exc.msg}"
    except (ValueError, RecursionError) as exc:  # an int past Python's digit limit, deep nesting
        return None, f"cannot be read as JSON: {json_error_text(exc)}"
    if not isinstance(meta, dict):
        return None, f"expected a JSON object, got {json_kind(meta)}"
    name = meta.get("func_name")
    if name is None:
        return None, None
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        return None, f"func_name {name!r} is not a Python method name"
    return name, None


def build_prompt(problem: CodeProblem) -> str:
    """Instruction, title, statement and starter code; tests and solutions never appear."""
    row = problem.row
    instruction = (
        FUNCTIONAL_INSTRUCTION.format(func=problem.func_name) if problem.functional else STDIN_INSTRUCTION
    )
    parts = [f"{instruction} {SOURCE_ONLY}"]
    title = row.get("question_title", "").strip()
    if title:
        parts.append(f"### Title\n{title}")
    parts.append(f"### Problem\n{row['question_content'].strip()}")
    starter = row.get("starter_code", "")
    if starter.strip():
        parts.append(f"### Starter code\n```python\n{starter.rstrip()}\n```")
    return "\n\n".join(parts) + "\n"


def to_problem(problem: CodeProblem, seed: int, source_sha256: str) -> dict[str, Any]:
    """The workload line: prompt, the ``lcb_evaluate`` tool and the hidden metadata."""
    row = problem.row
    metadata: dict[str, Any] = {
        "source": "LiveCodeBench",
        "question_id": problem.question_id,
        "question_title": row.get("question_title", ""),
        "platform": row.get("platform", ""),
        "contest_id": row.get("contest_id", ""),
        "contest_date": row.get("contest_date", ""),
        "difficulty": row.get("difficulty", ""),
        "test_type": "functional" if problem.functional else "stdin",
        "public_tests": len(problem.public),
        "private_tests": len(problem.private),
        "sample_seed": seed,
        "source_sha256": source_sha256,
    }
    if problem.func_name is not None:
        metadata["func_name"] = problem.func_name
    metadata["prompt_metadata"] = dict(PROMPT_METADATA)
    metadata["reference_tests"] = problem.public + problem.private
    return {
        "id": problem.question_id,
        "prompt": build_prompt(problem),
        "tools": [dict(EVALUATE_TOOL)],
        "metadata": metadata,
    }
