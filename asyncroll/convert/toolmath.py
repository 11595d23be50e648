"""``convert-toolmath``: ToolMATH tool records → one workload problem per source problem (SPEC §8.1).

ToolMATH ships a flat JSON list of *tool records* ``{name, description, inputs, function, source_problem,
source_solution, level, type}``; a benchmark problem is every record that shares a (whitespace-normalised)
``source_problem``, so each output problem carries **all** its tools. ``function`` names the tool's file,
which the release ships as ``function_ToolMATH/<function>``: it is looked up as ``DIR/<function>`` and
then ``DIR/function_ToolMATH/<function>`` for ``--functions-dir DIR``; the ``implementation`` written is
relative to ``DIR``, must stay inside it and must define the tool as a top-level function. Run the result
with ``--tool-root DIR`` (the default tool root is the workload's folder, so a workload written into
``DIR`` needs no flag).

Selection is seeded and order-independent (:mod:`asyncroll.convert.selection`). Because a problem's id,
``toolmath-<first source index>``, moves when records are reordered, the rank key is the problem's
normalised text instead: the same seed selects the same problems from a shuffled release. No reference
answer is invented by default; ``--answers-from-solution`` takes the last ``\\boxed{…}`` of the solution
and labels it as derived in ``metadata.reference_answer_source``.

A record whose ``inputs`` name a type a workload cannot declare (a tuple, say; the release's matrix
tools' ``List[List[float]]`` is declared) is an error, like any other, unless ``skip_unsupported``
(``--skip-unsupported``): then every problem with such a tool is left out, named in
:attr:`ConversionReport.left_out`, and the rest is converted.
"""

from __future__ import annotations

import ast
import json
import keyword
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncroll import grading
from asyncroll.coerce import check_type_name
from asyncroll.convert import raise_problems
from asyncroll.convert.boxed import BoxedError, last_boxed
from asyncroll.convert.hints import LCB_ROWS, jsonl_hint, lcb_row
from asyncroll.convert.output import check_destination, read_source, sha256_hex, write_jsonl_atomic
from asyncroll.convert.selection import check_limit, select
from asyncroll.errors import UsageError, no_directory
from asyncroll.json_checks import (
    LONE_SURROGATE,
    json_error_text,
    json_kind,
    lone_surrogate_at,
    may_hold_surrogate,
    not_utf8,
    unique_keys,
    utf8_text,
)
from asyncroll.json_depth import json_loads

FUNCTIONS_SUBDIR = "function_ToolMATH"
STRING_FIELDS = ("name", "description", "function", "source_problem", "source_solution", "level", "type")
DERIVED_LABEL = "derived: last \\boxed{} of source_solution (--answers-from-solution)"


@dataclass(frozen=True, slots=True)
class ToolRecord:
    """One validated source record; ``implementation`` is relative to the functions directory."""

    index: int
    name: str
    description: str
    inputs: dict[str, str]
    implementation: str
    problem: str
    solution: str
    level: str
    type: str
    unsupported: tuple[str, ...] = ()
    """The inputs whose type a workload cannot declare (``inputs.point: 'Tuple[float, float]'``)."""

    @property
    def problem_key(self) -> str:
        return normalise(self.problem)


@dataclass(slots=True)
class ConversionReport:
    """What a conversion did, for the command's one-line summary."""

    output: Path
    records: int = 0
    problems: int = 0
    written: int = 0
    skipped: int = 0
    without_answer: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    """Problems left out by ``skip_unsupported``: id and the record and input behind it."""
    disagreements: list[str] = field(default_factory=list)
    """Problems whose records disagree on ``level`` or ``type`` (kept as null): id and the values."""


def normalise(text: str) -> str:
    """Whitespace-normalised text: runs of whitespace become one space, ends stripped."""
    return " ".join(text.split())


def convert_toolmath(
    source: Path,
    functions_dir: Path,
    output: Path,
    *,
    limit: int | None = None,
    seed: int = 0,
    answers_from_solution: bool = False,
    skip_unsupported: bool = False,
) -> ConversionReport:
    """Convert ``source`` to the workload ``output``; validate everything first, write atomically."""
    check_limit(limit)
    check_destination(source, output)
    if not functions_dir.is_dir():
        raise UsageError(f"--functions-dir {functions_dir}: {no_directory(functions_dir)}")
    data = read_source(source)
    records = parse_records(data, source, functions_dir, skip_unsupported=skip_unsupported)
    problems = group_problems(records, source)
    report = ConversionReport(output, records=len(records), problems=len(problems))
    problems = _without_unsupported(problems, source, report)
    digest = sha256_hex(data)
    # The whole source is checked, whatever --limit keeps: a bad record is an error in every sample.
    _check_loadable(
        [_problem(g, seed, digest, False, ConversionReport(output)) for g in problems],
        functions_dir.resolve(),
        source,
    )
    chosen = select(problems, key=lambda group: group[0].problem_key, seed=seed, limit=limit)
    lines = [_problem(group, seed, digest, answers_from_solution, report) for group in chosen]
    report.written = write_jsonl_atomic(output, lines)
    return report


def parse_records(
    data: bytes, source: Path, functions_dir: Path, *, skip_unsupported: bool = False
) -> list[ToolRecord]:
    """Every record of the source, validated; all problems are reported together. With
    ``skip_unsupported``, an input type a workload cannot declare marks the record
    (:attr:`ToolRecord.unsupported`) instead of being an error."""
    try:
        text = utf8_text(data)  # a byte-order mark (Windows editors) is not JSON
    except UnicodeDecodeError as exc:
        raise UsageError(f"{source}: {not_utf8(exc)}") from None
    try:
        raw = json_loads(text, object_pairs_hook=unique_keys)  # a key given twice: json keeps the last
    except json.JSONDecodeError as exc:
        jsonl = jsonl_hint(text, exc)
        raise UsageError(f"{source}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}{jsonl}") from None
    except (ValueError, RecursionError) as exc:  # an int past Python's digit limit, deep nesting
        raise UsageError(f"{source}: cannot be read as JSON: {json_error_text(exc)}") from None
    surrogate = lone_surrogate_at(raw) if may_hold_surrogate(data) else None
    if surrogate is not None:
        raise UsageError(f"{source}: {surrogate}: {LONE_SURROGATE}")
    if not isinstance(raw, list):
        raise UsageError(f"{source}: expected a JSON list of tool records, got {json_kind(raw)}")
    if not raw:
        raise UsageError(f"{source}: the list holds no tool records")
    root = functions_dir.resolve()
    files = _FunctionFiles(root)
    records: list[ToolRecord] = []
    problems: list[str] = []
    unsupported = 0
    for index, item in enumerate(raw):
        record, issues = _record(index, item, files)
        if record is not None and record.unsupported and not skip_unsupported:
            unsupported += 1
            issues = [f"inputs.{arg}: {message}" for arg, message in _type_issues(record.inputs)]
            record = None
        problems.extend(f"{source}: record [{index}]{_named(item)}: {issue}" for issue in issues)
        if record is not None:
            records.append(record)
    hint = (
        f"{unsupported} record(s) are otherwise valid but take an input type a workload cannot declare: "
        "--skip-unsupported leaves their problems out and converts the rest"
        if unsupported
        else None
    )
    raise_problems(problems, hint or (LCB_ROWS if not records and any(map(lcb_row, raw)) else None))
    return records


def _type_issues(inputs: dict[str, Any]) -> list[tuple[str, str]]:
    """``(argument, why)`` for each input whose type a workload cannot declare."""
    out = []
    for arg, type_name in inputs.items():
        try:
            check_type_name(arg, type_name)
        except ValueError as exc:
            out.append((arg, str(exc)))
    return out


def _without_unsupported(
    problems: list[list[ToolRecord]], source: Path, report: ConversionReport
) -> list[list[ToolRecord]]:
    """The problems none of whose tools has an input type a workload cannot declare; the others are
    named in ``report.left_out`` (nothing is left out unless ``--skip-unsupported`` marked records)."""
    kept = []
    for group in problems:
        bad = [r for r in group if r.unsupported]
        if not bad:
            kept.append(group)
            continue
        why = "; ".join(f"record [{r.index}] ({r.name!r}): {', '.join(r.unsupported)}" for r in bad)
        report.left_out.append(f"toolmath-{group[0].index} ({why})")
    report.skipped = len(problems) - len(kept)
    if not kept:
        raise UsageError(
            f"{source}: every problem has a tool with an input type a workload cannot declare; "
            f"nothing to convert ({report.left_out[0]}{', ...' if len(report.left_out) > 1 else ''})"
        )
    return kept


def group_problems(records: list[ToolRecord], source: Path) -> list[list[ToolRecord]]:
    """Records grouped by normalised problem text, groups in order of their first record."""
    groups: dict[str, list[ToolRecord]] = {}
    for record in records:
        groups.setdefault(record.problem_key, []).append(record)
    problems: list[str] = []
    for group in groups.values():
        seen: dict[str, int] = {}
        for record in group:
            if record.name in seen:
                problems.append(
                    f"{source}: record [{record.index}]: name: tool {record.name!r} appears twice in one "
                    f"problem (also record [{seen[record.name]}]); tool names must be unique per problem"
                )
            seen.setdefault(record.name, record.index)
    raise_problems(problems)
    return list(groups.values())


def _problem(
    group: list[ToolRecord], seed: int, digest: str, answers: bool, report: ConversionReport
) -> dict[str, Any]:
    first = group[0]
    pid = f"toolmath-{first.index}"
    tools = [
        {
            "name": r.name,
            "description": r.description,
            "inputs": r.inputs,
            "implementation": r.implementation,
        }
        for r in group
    ]
    metadata: dict[str, Any] = {
        "source": "ToolMATH",
        "source_indices": [r.index for r in group],
        **_agreed(group, pid, report),
        "sample_seed": seed,
        "source_sha256": digest,
    }
    problem: dict[str, Any] = {"id": pid, "prompt": first.problem, "tools": tools}
    if answers:
        answer, reason = _derived_answer(group)
        problem["reference_answer"] = answer
        metadata["reference_answer_source"] = reason
        if answer is None:
            report.without_answer.append(pid)
    problem["metadata"] = metadata
    return problem


def _agreed(group: list[ToolRecord], pid: str, report: ConversionReport) -> dict[str, str | None]:
    """The problem's ``level`` and ``type``, each null where its records disagree (compared
    whitespace-normalised, the first record's text kept), as answers that disagree give none: the first
    record's would be a pick among contradicting values, silently. Disagreements go to ``report``."""
    out: dict[str, str | None] = {}
    said: list[str] = []
    for name in ("level", "type"):
        values: dict[str, tuple[str, int]] = {}
        for record in group:
            value = getattr(record, name)
            values.setdefault(normalise(value), (value, record.index))
        if len(values) == 1:
            out[name] = getattr(group[0], name)
            continue
        out[name] = None
        said.append(f"{name}: " + ", ".join(f"[{i}] {v!r}" for v, i in values.values()))
    if said:
        report.disagreements.append(f"{pid} ({'; '.join(said)})")
    return out


def _derived_answer(group: list[ToolRecord]) -> tuple[str | None, str]:
    """The last ``\\boxed{…}`` of the problem's solution and its label. Records of one problem whose
    solutions give different answers (or one gives none) leave it without one, named: taking the first
    record's would pick a reference answer at random among them. Answers are compared as the grader
    compares them (whitespace-normalised), and the first record's text is kept."""
    derived: dict[str | None, tuple[str | None, int]] = {}
    for record in group:
        try:
            answer = last_boxed(record.solution)
        except BoxedError as exc:
            return None, f"none: record [{record.index}]: {exc}"
        derived.setdefault(None if answer is None else grading.normalise(answer), (answer, record.index))
    if len(derived) > 1:
        (a, i), (b, j) = list(derived.values())[:2]
        return None, f"none: the problem's records disagree: [{i}] gives {a!r}, [{j}] gives {b!r}"
    [(answer, _)] = derived.values()
    return answer, DERIVED_LABEL if answer is not None else "none: source_solution has no \\boxed{}"


def _check_loadable(lines: list[dict[str, Any]], tool_root: Path, source: Path) -> None:
    """Every line must validate as a workload :class:`~asyncroll.workload.Problem` (else a bug here) and
    pass ``validate``'s checks with ``--tool-root`` the functions directory (a record's ``inputs`` that
    do not match its function's parameters are the source's error): nothing is written otherwise. Each
    error names the source file and the record behind the tool (``tools[i]`` is ``source_indices[i]``)."""
    from asyncroll.tool_files import ToolFile
    from asyncroll.workload import Problem
    from asyncroll.workload.checks import check_problem

    tool_files: dict[Path, ToolFile] = {}
    problems = []
    for line in lines:
        issues = check_problem(Problem.model_validate(line), tool_root, False, tool_files)
        for fld, message in issues:
            match = _TOOL_FIELD.fullmatch(fld)
            if match is None:
                problems.append(f"{source}: problem {line['id']}: {fld}: {message}")
                continue
            position, rest = int(match.group(1)), match.group(2) or "tool"
            index = line["metadata"]["source_indices"][position]
            name = line["tools"][position]["name"]
            rest = (
                "function" + rest.removeprefix("implementation")
                if rest.startswith("implementation")
                else rest
            )
            problems.append(f"{source}: record [{index}] ({name!r}): {rest}: {message}")
    raise_problems(problems)


_TOOL_FIELD = re.compile(r"tools\[(\d+)\](?:\.(.+))?", re.DOTALL)


def _named(item: Any) -> str:
    name = item.get("name") if isinstance(item, dict) else None
    return f" ({name!r})" if isinstance(name, str) else ""


def _record(index: int, item: Any, files: _FunctionFiles) -> tuple[ToolRecord | None, list[str]]:
    if not isinstance(item, dict):
        return None, [f"expected a tool record object, got {json_kind(item)}"]
    issues: list[str] = []
    for name in (*STRING_FIELDS, "inputs"):
        if name not in item:
            issues.append(f"{name}: missing")
    for name in STRING_FIELDS:
        if name in item and not isinstance(item[name], str):
            issues.append(f"{name}: expected a string, got {json_kind(item[name])}")
    if issues:
        return None, issues
    tool_name, problem = item["name"], item["source_problem"]
    if not tool_name.isidentifier() or keyword.iskeyword(tool_name):
        issues.append(f"name: {tool_name!r} is not a Python function name")
    if not problem.strip():
        issues.append("source_problem: empty")
    inputs = item["inputs"]
    type_issues: list[str] = []  # a well-formed type a workload cannot declare: the caller decides
    unsupported: list[str] = []
    if not isinstance(inputs, dict):
        issues.append(f"inputs: expected an object of argument → type, got {json_kind(inputs)}")
    else:
        for arg, type_name in inputs.items():
            if not isinstance(type_name, str):
                issues.append(f"inputs.{arg}: expected a type string, got {json_kind(type_name)}")
                continue
            try:
                check_type_name(arg, type_name)
            except ValueError as exc:
                type_issues.append(f"inputs.{arg}: {exc}")
                unsupported.append(f"inputs.{arg}: {type_name!r}")
    position = len(issues)
    implementation, issue = files.resolve(item["function"], tool_name)
    if issue:
        issues.append(f"function: {issue}")
    if issues or implementation is None:  # an invalid record: its type issues are errors with the rest
        return None, issues[:position] + type_issues + issues[position:]
    record = ToolRecord(
        index,
        tool_name,
        item["description"],
        dict(inputs),
        implementation,
        problem,
        item["source_solution"],
        item["level"],
        item["type"],
        tuple(unsupported),
    )
    return record, []


class _FunctionFiles:
    """Finds tool files under the functions directory and checks each defines its function (parsed once)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._defs: dict[Path, set[str] | str] = {}

    def resolve(self, function: str, name: str) -> tuple[str | None, str | None]:
        """``(implementation relative to the root, None)`` or ``(None, what is wrong)``."""
        if not function.strip():
            return None, "empty file name"
        if Path(function).is_absolute():
            return None, f"{function!r} is absolute; it must be a file under --functions-dir"
        if not function.endswith(".py"):
            return None, f"{function!r} is not a .py file"
        for candidate in (function, f"{FUNCTIONS_SUBDIR}/{function}"):
            path = (self.root / candidate).resolve()
            if not path.is_relative_to(self.root):
                return None, f"{function!r} escapes --functions-dir {self.root}"
            if path.is_file():
                problem = self._defines(path, name)
                return (None, problem) if problem else (path.relative_to(self.root).as_posix(), None)
        return None, (
            f"{function!r} not found in --functions-dir {self.root} "
            f"(looked for {function} and {FUNCTIONS_SUBDIR}/{function})"
        )

    def _defines(self, path: Path, name: str) -> str | None:
        defs = self._defs.get(path)
        if defs is None:
            defs = self._defs[path] = _top_level_functions(path)
        rel = path.relative_to(self.root).as_posix()
        if isinstance(defs, str):
            return f"{rel}: {defs}"
        if name not in defs:
            found = ", ".join(sorted(defs)) or "none"
            return f"{rel} defines no top-level function {name!r} (it defines: {found})"
        return None


def _top_level_functions(path: Path) -> set[str] | str:
    """Names of the file's top-level functions, or why the file cannot be read as Python."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except SyntaxError as exc:
        return f"not valid Python: line {exc.lineno}: {exc.msg}"
    except (OSError, ValueError, RecursionError) as exc:
        return f"cannot read: {exc}"
    except MemoryError:  # what CPython's parser raises for nesting deeper than its stack
        return "not valid Python: nested too deeply for the parser"
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
