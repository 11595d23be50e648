"""Workload lines (pydantic models) and a streaming loader whose errors say ``FILE:LINE: field: message``.

A workload is JSONL, one problem per line. :func:`scan_workload` reads the whole file once, line by line,
and collects *every* problem it finds (so ``asyncroll validate`` can report them all) while keeping only
what a run needs in memory: the ids seen, the tools to preload, the file's SHA-256 and its identity.
:func:`iter_problems` streams validated problems for admission, so a 100k-line workload never sits in
memory; given the scan's identity it refuses to read a file that changed since it was validated.

Because a workload is read twice, it must be a regular file: a pipe would be drained by the scan.
Trusted tool files are checked by parsing them (never by running them): each must compile and bind the
tool's name at top level; where the name is a plain ``def``, it must not be ``async`` or a generator, and
its parameters must take exactly the declared inputs by keyword (:mod:`asyncroll.tool_files`).
See docs/TOOLS.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, BinaryIO, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from asyncroll.coerce import TYPE_PATTERN, argument_errors, bound_errors, check_type_name
from asyncroll.errors import WorkloadError
from asyncroll.tool_files import ToolFile, ToolFunction

#: Built-in tools (no ``implementation``) and their declared inputs.
BUILTIN_TOOLS: dict[str, dict[str, str]] = {
    "add": {"a": "number", "b": "number"},
    "sleep_ms": {"milliseconds": "number"},
    "spin_ms": {"milliseconds": "number"},
    # The model supplies only ``code``; the runtime binds ``tests``/``func_name`` from hidden metadata.
    "lcb_evaluate": {"code": "str"},
}
#: Built-ins named by the spec whose implementation has not landed yet.
PENDING_BUILTINS: dict[str, str] = {}
MAX_REPORTED_PROBLEMS = 200
#: Upper bound of a scripted duration (``latency_ms``, ``cpu_ms``): one day. A larger one is a typo, and
#: would stall a run (or a simulation) for ever.
MAX_DURATION_MS = 86_400_000
#: Upper bound of a scripted ``output_tokens``: the simulated server decodes one token per step.
MAX_OUTPUT_TOKENS = 1_000_000
#: The built-in evaluator of the one-repair protocol, and the default text of its repair turn.
EVALUATOR_TOOL = "lcb_evaluate"
_EVALUATOR_ONLY_BY_SUBMIT = (
    f"the built-in {EVALUATOR_TOOL!r} runs a 'submit' action under the one-repair protocol "
    "(metadata.prompt_metadata.protocol == 'one_repair'), which gives it the problem's hidden tests; "
    "it cannot be called as a tool"
)
DEFAULT_REPAIR_INSTRUCTION = (
    "Your program did not pass the tests; the first failing test is shown below. Return a corrected, "
    "complete Python 3 program."
)


class _Strict(BaseModel):
    # strict: no lax coercion ("5" is not 5, true is not 1), as the published JSON Schema says; an int is
    # still a valid float.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


#: A declared duration in milliseconds: finite, from 0 to one day.
DurationMs = Annotated[float, Field(ge=0, le=MAX_DURATION_MS, allow_inf_nan=False)]
OutputTokens = Annotated[int, Field(ge=1, le=MAX_OUTPUT_TOKENS)]


class ToolAction(_Strict):
    type: Literal["tool"]
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    latency_ms: DurationMs | None = None
    output_tokens: OutputTokens | None = None
    cpu_ms: DurationMs | None = Field(default=None, description="declared CPU time (simulation only)")


class FinalAction(_Strict):
    type: Literal["final"]
    answer: Any
    latency_ms: DurationMs | None = None
    output_tokens: OutputTokens | None = None


class SubmitAction(_Strict):
    type: Literal["submit"]
    code: str
    latency_ms: DurationMs | None = None
    output_tokens: OutputTokens | None = None
    cpu_ms: DurationMs | None = Field(default=None, description="declared evaluation time (simulation only)")
    passes: bool | None = Field(default=None, description="declared verdict (simulation only)")


Action = Annotated[ToolAction | FinalAction | SubmitAction, Field(discriminator="type")]


class Tool(_Strict):
    name: str = Field(min_length=1)
    description: str = ""
    inputs: dict[str, str] = Field(
        default_factory=dict,
        json_schema_extra={"additionalProperties": {"type": "string", "pattern": TYPE_PATTERN}},
    )
    implementation: str | None = None
    bound_arguments: dict[str, Any] = Field(default_factory=dict)

    @field_validator("inputs")
    @classmethod
    def _known_types(cls, inputs: dict[str, str]) -> dict[str, str]:
        for arg, type_name in inputs.items():
            check_type_name(arg, type_name)
        return inputs

    @property
    def key(self) -> str:
        """How workers know this tool: its name for built-ins, ``path:name`` for trusted files."""
        return self.name if self.implementation is None else f"{self.implementation}:{self.name}"

    @property
    def declared_inputs(self) -> dict[str, str]:
        if self.implementation is None and not self.inputs:
            return BUILTIN_TOOLS.get(self.name, {})
        return self.inputs


class Problem(_Strict):
    id: str | int | None = None
    prompt: str
    tools: list[Tool] = Field(default_factory=list)
    reference_answer: str | None = None
    script: list[Action] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("id")
    @classmethod
    def _not_blank(cls, value: str | int | None) -> str | int | None:
        # The id names the trajectory in events, results and reports: an invisible one names nothing.
        if isinstance(value, str) and not value.strip():
            raise ValueError("must not be empty or blank (leave 'id' out to use the line number)")
        return value

    @property
    def protocol(self) -> str | None:
        meta = self.metadata.get("prompt_metadata")
        return meta.get("protocol") if isinstance(meta, dict) else None

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    @property
    def one_repair(self) -> OneRepair | None:
        """The code-evaluation protocol's settings (validated by the loader), or None."""
        if self.protocol != "one_repair":
            return None
        meta = self.metadata
        prompt_meta = meta["prompt_metadata"]
        return OneRepair(
            tests=meta["reference_tests"],
            func_name=meta.get("func_name"),
            max_generations=prompt_meta.get("max_generations", 2),
            repair_instruction=prompt_meta.get("repair_instruction", DEFAULT_REPAIR_INSTRUCTION),
        )


@dataclass(frozen=True, slots=True)
class OneRepair:
    """Submit → evaluate → on failure one repair turn with the feedback → evaluate (SPEC §2, §5).

    ``tests`` are hidden: they go to the evaluator as bound arguments, never into a prompt or a result."""

    tests: list[dict[str, Any]]
    func_name: str | None
    max_generations: int
    repair_instruction: str

    @property
    def test_bytes(self) -> int:
        return sum(len(t.get("input", "")) for t in self.tests)


@dataclass(frozen=True, slots=True)
class ToolSource:
    """A trusted tool file to preload in every worker."""

    key: str
    name: str
    path: Path | None


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """Which file, with which content, was read: device, inode, size and modification time.

    A rewrite in place changes the size or the modification time; a replacement changes the inode."""

    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(slots=True)
class WorkloadScan:
    """What one pass over a workload learned: enough to start a run, never the problems themselves.

    ``identity`` is the file's when it was validated (None if it could not be read); pass it to
    :func:`iter_problems` so that the run reads exactly what was validated."""

    path: Path
    count: int = 0
    sha256: str = ""
    identity: FileIdentity | None = None
    tools: dict[str, ToolSource] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    """The errors found, each ``FILE:LINE: field: message`` (at most :data:`MAX_REPORTED_PROBLEMS`)."""
    truncated: int = 0
    invalid_lines: int = 0

    def add_problem(self, message: str) -> None:
        if len(self.problems) < MAX_REPORTED_PROBLEMS:
            self.problems.append(message)
        else:
            self.truncated += 1

    @property
    def errors(self) -> int:
        """How many errors were found, reported or not."""
        return len(self.problems) + self.truncated

    def error_summary(self) -> str:
        """One line that counts the errors, and the workload lines that hold them, as nouns of their own:
        a *problem* is a workload line's task, never an error."""
        errors = f"{self.errors} error{'' if self.errors == 1 else 's'}"
        if self.identity is None:
            return f"{errors}; no line was read"
        lines = f"{self.count} workload line{'' if self.count == 1 else 's'}"
        return f"{errors} in {self.invalid_lines} of {lines}" if self.invalid_lines else f"{errors} ({lines})"

    def raise_if_invalid(self) -> None:
        if self.problems:
            extra = [f"... and {self.truncated} more errors"] if self.truncated else []
            raise WorkloadError(self.problems + extra)


def problem_id(problem: Problem, line_no: int) -> str:
    """The trajectory id: the problem's own id, or its 1-based line number."""
    return str(problem.id) if problem.id is not None else str(line_no)


def _location(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "line"


def _check_problem(
    problem: Problem,
    tool_root: Path,
    scripted: bool,
    tool_files: dict[Path, ToolFile] | None = None,
) -> list[tuple[str, str]]:
    """Cross-field checks pydantic cannot express; returns (field, message) pairs.

    ``tool_files`` caches what each trusted tool file's syntax tree says, across the problems of a scan."""
    tool_files = {} if tool_files is None else tool_files
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for i, tool in enumerate(problem.tools):
        where = f"tools[{i}]"
        if tool.name in seen:
            out.append((f"{where}.name", f"duplicate tool name {tool.name!r}"))
        seen.add(tool.name)
        if tool.implementation is None:
            if tool.name in PENDING_BUILTINS:
                out.append(
                    (
                        f"{where}.name",
                        f"built-in {tool.name!r} is not available yet: {PENDING_BUILTINS[tool.name]}",
                    )
                )
            elif tool.name not in BUILTIN_TOOLS:
                out.append(
                    (
                        f"{where}.name",
                        f"unknown tool {tool.name!r}: not a built-in "
                        f"({', '.join(sorted(BUILTIN_TOOLS))}) and no implementation given",
                    )
                )
            elif tool.inputs and tool.inputs != BUILTIN_TOOLS[tool.name]:
                out.append((f"{where}.inputs", f"built-in {tool.name!r} takes {BUILTIN_TOOLS[tool.name]}"))
            elif tool.name == EVALUATOR_TOOL and problem.protocol != "one_repair":
                out.append((f"{where}.name", _EVALUATOR_ONLY_BY_SUBMIT))
        else:
            problem_msg, function = _check_implementation(
                tool.implementation, tool.name, tool_root, tool_files
            )
            if problem_msg:
                out.append((f"{where}.implementation", problem_msg))
            if function is not None:
                out.extend(_check_function(tool.implementation, tool, function, where))
        unknown_bound = set(tool.bound_arguments) - set(tool.declared_inputs)
        if unknown_bound:
            out.append((f"{where}.bound_arguments", f"not declared in inputs: {sorted(unknown_bound)}"))
        for exc in bound_errors(tool.bound_arguments, tool.declared_inputs):
            out.append((f"{where}.bound_arguments{exc.path}", exc.message))
    if problem.protocol == "one_repair":  # scripted or not: a model server's run evaluates the same tests
        out.extend(_check_one_repair(problem))
    if problem.script is None:
        if scripted:
            hint = "a workload for a model server: --backend vllm or openai"
            out.append(("script", f"required by the scripted backend ({hint})"))
        return out
    if not problem.script:
        out.append(("script", "must hold at least one action"))
    for i, action in enumerate(problem.script):
        where = f"script[{i}]"
        if isinstance(action, ToolAction):
            declared = problem.tool(action.name)
            if declared is None:
                out.append(
                    (
                        f"{where}.name",
                        f"unknown tool {action.name!r}; this problem declares "
                        f"{[t.name for t in problem.tools]}",
                    )
                )
                continue
            if declared.name == EVALUATOR_TOOL and declared.implementation is None:
                out.append((f"{where}.name", _EVALUATOR_ONLY_BY_SUBMIT))
                continue
            for exc in argument_errors(action.arguments, declared.declared_inputs, declared.bound_arguments):
                out.append((f"{where}.arguments{exc.path}", exc.message))
        elif isinstance(action, SubmitAction) and problem.protocol != "one_repair":
            out.append((f"{where}.type", "'submit' needs metadata.prompt_metadata.protocol == 'one_repair'"))
        elif isinstance(action, FinalAction) and problem.protocol == "one_repair":
            out.append(
                (
                    f"{where}.type",
                    "a one-repair problem is answered by 'submit' (its code is run on the tests); "
                    "a 'final' answer would never be tested",
                )
            )
    return out


def _check_function(
    implementation: str, tool: Tool, function: ToolFunction, where: str
) -> list[tuple[str, str]]:
    """What the tool's ``def`` says against how a worker will call it: ``function(**arguments)``."""
    at = f"({implementation}:{function.line})"
    out: list[tuple[str, str]] = []
    refusal = function.refusal()
    if refusal is not None:
        out.append((f"{where}.implementation", f"{tool.name!r} {at} {refusal}"))
    for name, message in function.call_problems(tool.inputs):
        out.append((f"{where}.inputs" if name is None else f"{where}.inputs.{name}", f"{message} {at}"))
    return out


def _check_one_repair(problem: Problem) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    evaluator = problem.tool(EVALUATOR_TOOL)
    if evaluator is None or evaluator.implementation is not None:
        out.append(("tools", f"the one-repair protocol needs the built-in tool {EVALUATOR_TOOL!r}"))
    meta = problem.metadata
    func_name = meta.get("func_name")
    if func_name is not None and not (isinstance(func_name, str) and func_name.isidentifier()):
        out.append(("metadata.func_name", "must be a Python identifier (the Solution method to call)"))
        func_name = None
    tests = meta.get("reference_tests")
    if not isinstance(tests, list) or not tests:
        out.append(("metadata.reference_tests", "the one-repair protocol needs a non-empty list of tests"))
    else:
        from asyncroll.evaluator.cases import check_test  # the evaluator's own checks

        for i, test in enumerate(tests):
            try:
                check_test(i, test, func_name)
            except ValueError as exc:  # "tests[i].field message" → field, message
                field, _, message = str(exc).partition(" ")
                out.append((f"metadata.reference_{field}", message))
    prompt_meta = meta["prompt_metadata"]
    generations = prompt_meta.get("max_generations", 2)
    if not isinstance(generations, int) or isinstance(generations, bool) or not 1 <= generations <= 10:
        out.append(("metadata.prompt_metadata.max_generations", "must be an integer from 1 to 10"))
    instruction = prompt_meta.get("repair_instruction", DEFAULT_REPAIR_INSTRUCTION)
    if not isinstance(instruction, str):
        out.append(("metadata.prompt_metadata.repair_instruction", "must be a string"))
    return out


def _check_implementation(
    implementation: str, name: str, tool_root: Path, tool_files: dict[Path, ToolFile]
) -> tuple[str | None, ToolFunction | None]:
    """Why the file cannot serve the tool (or None), and the tool's ``def`` when its source shows it."""
    rel = Path(implementation)
    if rel.is_absolute():
        return f"must be relative to the tool root {tool_root}", None
    resolved = (tool_root / rel).resolve()
    if not resolved.is_relative_to(tool_root):
        return f"{implementation!r} escapes the tool root {tool_root}", None
    if resolved.suffix != ".py":
        return f"{implementation!r} is not a .py file", None
    if not resolved.is_file():
        return f"{implementation!r} does not exist under the tool root {tool_root}", None
    parsed = tool_files.get(resolved)
    if parsed is None:
        parsed = tool_files[resolved] = ToolFile.parse(resolved)
    if parsed.error is not None:
        return f"{implementation!r} {parsed.error}", None
    if not parsed.binds(name):
        return (
            f"{implementation!r} defines no top-level {name!r} "
            "(no def, class, assignment or import at module level binds that name)"
        ), None
    return None, parsed.function(name)


#: Constants Python's and pydantic-core's JSON parsers accept but JSON does not have.
_NON_STANDARD_CONSTANTS = (b"NaN", b"Infinity")


class _NonStandardConstant(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise _NonStandardConstant(name)


def _parse_line(raw: bytes) -> tuple[Problem | None, list[tuple[str, str]]]:
    # The fast path, one pass in pydantic-core, unless the line may hold NaN or Infinity, which
    # pydantic-core would accept (a string that merely mentions them takes the slow path and passes).
    if not any(constant in raw for constant in _NON_STANDARD_CONSTANTS):
        try:
            return Problem.model_validate_json(raw), []
        except ValidationError:
            pass
    # Slow path: separate JSON errors from field errors for clear messages.
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except _NonStandardConstant as exc:
        return None, [
            ("line", f"not valid JSON: {exc} is not a JSON value (write a finite number or a string)")
        ]
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return None, [("line", f"not valid JSON: {exc}")]
    if not isinstance(data, dict):
        return None, [("line", f"expected a JSON object, got {type(data).__name__}")]
    try:
        return Problem.model_validate(data), []
    except ValidationError as exc:
        return None, [(_location(e["loc"]), e["msg"]) for e in exc.errors(include_url=False)]


_FILE_KINDS = (
    (stat.S_ISFIFO, "a pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _open_regular(path: Path) -> tuple[BinaryIO, FileIdentity]:
    """Open a workload for reading, or raise :class:`WorkloadError` unless it is a regular file (after
    symlinks): a run reads its workload twice, and a pipe would be empty the second time."""
    try:
        # O_NONBLOCK: opening a pipe nobody writes to must not hang (it changes nothing for a file).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise WorkloadError([f"{path}: cannot read: {exc.strerror or exc}"]) from exc
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise WorkloadError([f"{path}: is a directory, not a workload file"])
        if not stat.S_ISREG(st.st_mode):
            kind = next((name for test, name in _FILE_KINDS if test(st.st_mode)), "a special file")
            raise WorkloadError(
                [
                    f"{path}: not a regular file ({kind}): a workload is read twice, to validate it and "
                    "then to run it; save it to a file first (e.g. `cat ... > workload.jsonl`)"
                ]
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), FileIdentity.of(st)
    except BaseException:
        os.close(fd)
        raise


def scan_workload(path: Path, tool_root: Path, *, scripted: bool, limit: int | None = None) -> WorkloadScan:
    """Validate every line (up to ``limit`` problems); collect every error instead of stopping.

    A workload that cannot be read or is not a regular file is one error of the scan, like any other.
    (A script that ends with a tool call is valid: under ``--max-turns`` at most its length the run ends
    it as ``max_turns``; beyond, its trajectory fails with ``script_exhausted``, counted.)"""
    scan = WorkloadScan(path=path)
    digest = hashlib.sha256()
    ids: dict[str, int] = {}
    tool_files: dict[Path, ToolFile] = {}
    tool_root = tool_root.resolve()
    try:
        handle, identity = _open_regular(path)
    except WorkloadError as exc:
        for message in exc.problems:
            scan.add_problem(message)
        return scan
    with handle:
        for line_no, raw in enumerate(handle, start=1):
            digest.update(raw)
            if not raw.strip() or (limit is not None and scan.count >= limit):
                continue
            problem, issues = _parse_line(raw)
            if problem is not None:
                issues = _check_problem(problem, tool_root, scripted, tool_files)
                pid = problem_id(problem, line_no)
                if pid in ids:
                    issues.append(("id", f"duplicate id {pid!r} (first on line {ids[pid]})"))
                else:
                    ids[pid] = line_no
                for tool in problem.tools if not issues else ():
                    impl = (
                        None if tool.implementation is None else (tool_root / tool.implementation).resolve()
                    )
                    scan.tools.setdefault(tool.key, ToolSource(tool.key, tool.name, impl))
            for fld, message in issues:
                scan.add_problem(f"{path}:{line_no}: {fld}: {message}")
            scan.invalid_lines += bool(issues)
            scan.count += 1
        if FileIdentity.of(os.fstat(handle.fileno())) != identity:
            scan.add_problem(f"{path}: changed while it was being validated; validate it again when stable")
    scan.sha256 = digest.hexdigest()
    scan.identity = identity
    if scan.count == 0 and not scan.problems:
        scan.add_problem(f"{path}:1: line: the workload holds no problems")
    return scan


def iter_problems(
    path: Path, limit: int | None = None, *, identity: FileIdentity | None = None
) -> Iterator[tuple[int, str, Problem]]:
    """Stream ``(line number, id, problem)`` from a workload that :func:`scan_workload` accepted.

    With ``identity`` (the scan's), raise :class:`WorkloadError` instead of reading a file that is not
    the one validated (replaced, or rewritten in place). Without it, a regular file is still checked
    against itself as first opened, so a rewrite in place during the stream is an error, not new lines.
    A file replaced by rename once open is harmless: the open handle keeps reading the old one."""
    handle: BinaryIO
    if identity is None:
        handle = path.open("rb")
        st = os.fstat(handle.fileno())
        expected = FileIdentity.of(st) if stat.S_ISREG(st.st_mode) else None
        why = "changed while it was being read (rewritten in place)"
    else:
        handle, _ = _open_regular(path)
        expected, why = identity, "changed since it was validated (replaced, or rewritten in place)"

    def check(line_no: int) -> None:
        # About a microsecond; done after a line is read and before it is used.
        if expected is not None and FileIdentity.of(os.fstat(handle.fileno())) != expected:
            raise WorkloadError([f"{path}: {why}; stopped before line {line_no}"])

    count = 0
    with handle:
        check(1)
        for line_no, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            if limit is not None and count >= limit:
                return
            check(line_no)
            problem, issues = _parse_line(raw)
            if problem is None:
                raise WorkloadError([f"{path}:{line_no}: {f}: {m}" for f, m in issues])
            count += 1
            yield line_no, problem_id(problem, line_no), problem
