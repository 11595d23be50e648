"""Reading a workload: :func:`scan_workload` validates every line once, collecting every error as
``FILE:LINE: field: message``; :func:`iter_problems` streams the validated problems, refusing a file
that changed since its scan."""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import stat
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from pydantic import BaseModel, ValidationError

from asyncroll.errors import WorkloadError
from asyncroll.json_checks import (
    LONE_SURROGATE,
    container_kind,
    json_error_text,
    json_kind,
    line_column,
    lone_surrogate_at,
    may_hold_surrogate,
    not_utf8,
    unique_keys,
    utf8_text,
)
from asyncroll.json_depth import TOO_DEEP, json_loads
from asyncroll.paths import resolved
from asyncroll.setting_names import unknown_setting, validation_message
from asyncroll.tool_files import ToolFile
from asyncroll.workload.checks import check_problem
from asyncroll.workload.document import dataset_lines, one_document
from asyncroll.workload.models import (
    MAX_REPORTED_PROBLEMS,
    ErrorStep,
    FinalAction,
    Problem,
    SubmitAction,
    Tool,
    ToolAction,
)


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
    hint: str | None = None
    """Said after the errors, never counted nor cut among them: the converter that reads a dataset's rows."""

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
        """Raise the errors found, ending with :meth:`error_summary`'s count as ``validate`` prints it
        (where lines were read: a file that could not be read has its one error)."""
        if self.problems:
            count = f"{self.path}: {self.error_summary()}" if self.identity is not None else None
            raise WorkloadError(self.messages(), count)

    def messages(self) -> list[str]:
        """The errors as said: those reported, how many more were not, then the :attr:`hint`."""
        extra = [f"... and {self.truncated} more errors"] if self.truncated else []
        return self.problems + extra + ([self.hint] if self.hint else [])


def problem_id(problem: Problem, line_no: int) -> str:
    """The trajectory id: the problem's own id, or its 1-based line number."""
    return str(problem.id) if problem.id is not None else str(line_no)


#: A key a location shows as ``.key``; any other (empty, a space, a newline, a control or format
#: character, a dot or a bracket) is shown quoted, ``['a\nb']``: raw, an unknown key's newline split
#: the one-line error in two, and its control characters reached the terminal.
_PLAIN_KEY = re.compile(r"[\w-]+")


def _location(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(str(part)) is None:
            out += f"[{str(part)!r}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "line"


#: The most of an error's field or message shown: one quotes the line's own value (an id, an unknown key,
#: tool or action type), which a line may hold at any size (a duplicate id of a whole prompt was echoed
#: whole, each error line as long as the value).
MAX_SHOWN_CHARS = 1_000


def _clipped(text: str) -> str:
    """``text``, its middle left out past :data:`MAX_SHOWN_CHARS` (its end kept: "(first on line 3)")."""
    if len(text) <= MAX_SHOWN_CHARS:
        return text
    head, tail = text[:600], text[-300:]
    return f"{head}... [{len(text) - 900:,} characters left out] ...{tail}"


#: Constants Python's and pydantic-core's JSON parsers accept but JSON does not have.
_NON_STANDARD_CONSTANTS = (b"NaN", b"Infinity")


class _NonStandardConstant(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise _NonStandardConstant(name)


class _TooLargeNumber(ValueError):
    pass


def _finite_float(text: str) -> float:
    """``json``'s ``parse_float``: a number past a float's range (``1e400``) read as infinity, silently
    (a final answer of 1e400 was recorded as null), as pydantic-core reads it too: refused like Infinity."""
    value = float(text)
    if math.isinf(value):
        raise _TooLargeNumber(text if len(text) <= 40 else f"{text[:37]}...")
    return value


def _keys_once(pairs: list[tuple[str, Any]]) -> None:
    """The scan's ``object_pairs_hook``: refuses a key given twice and keeps no object, so the check does
    not build a second copy of a line whose problem is already parsed (a LiveCodeBench problem's million
    tests took 1.5 GB more, beside the problem's 0.9 GB)."""
    if len({key for key, _ in pairs}) != len(pairs):
        unique_keys(pairs)  # raises, naming the key


def _parse_line(raw: bytes, *, validating: bool = False) -> tuple[Problem | None, list[tuple[str, str]]]:
    """One workload line as a problem, or what is wrong with it. ``validating`` (the scan, not the run's
    stream of a file it accepted) also refuses a key given twice in one object: pydantic-core, like
    ``json``, keeps the last silently (a second ``reference_answer`` would grade every answer)."""
    # The fast path, one pass in pydantic-core, unless the line may hold NaN or Infinity, which
    # pydantic-core would accept (a string that merely mentions them takes the slow path and passes),
    # or an escaped surrogate, which it would accept lone.
    if not any(constant in raw for constant in _NON_STANDARD_CONSTANTS) and not may_hold_surrogate(raw):
        try:
            problem = Problem.model_validate_json(raw)
        except ValidationError:
            pass
        else:
            if not validating:
                return problem, []
            try:  # the keys and the numbers: about twice the fast path's time, once per line of a scan
                json_loads(raw, object_pairs_hook=_keys_once, parse_float=_finite_float)
            except (ValueError, RecursionError):
                pass  # the slow path says what
            else:
                return problem, []
    # Slow path: separate JSON errors from field errors for clear messages.
    if b"\0" in raw:  # never in JSON text; every other character of a UTF-16 or UTF-32 file
        return None, [
            ("line", "holds NUL bytes, which no JSON text does: a UTF-16 or UTF-32 file? save it as UTF-8")
        ]
    try:
        # UTF-8 (a byte order mark is let through): json.loads would guess UTF-16 or UTF-32 from the bytes
        text = utf8_text(raw)
    except UnicodeDecodeError as exc:
        return None, [("line", not_utf8(exc, of_line=True))]
    try:
        # without its line end: a line cut short inside a string was "Invalid control character at", the
        # newline read as the string's next character
        data = json_loads(
            text.rstrip("\r\n"),
            parse_constant=_reject_constant,
            object_pairs_hook=unique_keys,
            parse_float=_finite_float,
        )
    except _NonStandardConstant as exc:
        return None, [
            ("line", f"not valid JSON: {exc} is not a JSON value (write a finite number or a string)")
        ]
    except _TooLargeNumber as exc:
        return None, [
            ("line", f"the number {exc} is too large for a 64-bit float (it would read as infinity)")
        ]
    except RecursionError:
        return None, [("line", f"cannot be read: {TOO_DEEP}")]
    except json.JSONDecodeError as exc:  # its own "line 1 column 5 (char 4)" counts within the line
        why = f"not valid JSON: {exc.msg} (column {line_column(exc)})"
        if exc.msg == "Extra data" and exc.doc[: exc.pos].rstrip(" \t").endswith("\r"):
            # CR alone ends a line only in old Mac files: JSON reads it as a space between two objects
            why += ": a second object after a lone carriage return: lines ending in CR only? end them in LF"
        return None, [("line", why)]
    except ValueError as exc:  # an int past Python's digit limit
        return None, [("line", f"not valid JSON: {json_error_text(exc)}")]
    if not isinstance(data, dict):
        return None, [("line", f"expected a JSON object, got {json_kind(data)}")]
    surrogate = lone_surrogate_at(data)
    if surrogate is not None:
        return None, [(surrogate, LONE_SURROGATE)]
    try:
        return Problem.model_validate(data), []
    except ValidationError as exc:
        return None, list(dict.fromkeys(_field_error(e) for e in exc.errors(include_url=False)))


#: A script step's types, as a message lists them.
_ACTION_TYPES = "'tool', 'final', 'submit' or 'error'"


def _field_error(error: Any) -> tuple[str, str]:
    """A pydantic error as ``(field, message)``. An action's missing or unknown type (the one
    discriminated union) is named at its ``type``: pydantic said "script[0]: Unable to extract tag using
    discriminator 'type'" and "script[0]: Input tag 'answer' found using 'type' does not match ..."."""
    where = _location(error["loc"])
    if len(error["loc"]) == 2 and error["loc"][0] == "id" and error["type"] in ("string_type", "int_type"):
        # one error per member of the union: "id.str: Input should be a valid string", then "id.int: ..."
        return "id", f"must be a string or an integer, not {json_kind(error['input'])}"
    if error["type"] == "union_tag_not_found":
        return f"{where}.type", f"Field required: an action's type is {_ACTION_TYPES}"
    if error["type"] == "union_tag_invalid":
        tag = error.get("ctx", {}).get("tag")
        return f"{where}.type", f"{tag!r} is not an action's type: {_ACTION_TYPES}"
    if error["type"] == "extra_forbidden":  # pydantic: "Extra inputs are not permitted"
        loc = error["loc"]
        model = _ACTION_MODELS.get(loc[-2], Tool) if len(loc) > 1 else Problem
        return where, unknown_setting(str(loc[-1]), model.model_fields, noun="field")
    return where, validation_message(error)


#: The model of an action's fields, by the action's type (its place in an error: script[0].tool.key).
_ACTION_MODELS: dict[Any, type[BaseModel]] = {
    "tool": ToolAction,
    "final": FinalAction,
    "submit": SubmitAction,
    "error": ErrorStep,
}

_FILE_KINDS = (
    (stat.S_ISFIFO, "a pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _open_regular(path: Path) -> tuple[io.BufferedReader, FileIdentity]:
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
        identity = FileIdentity.of(st)
    except BaseException:
        os.close(fd)
        raise
    # outside the try: the file object fdopen builds owns the descriptor, and closes it if an interrupt
    # lands inside fdopen; closing it here as well would close it twice (another file's by then)
    return os.fdopen(fd, "rb"), identity


def scan_workload(
    path: Path, tool_root: Path, *, scripted: bool, limit: int | None = None, flag: str = ""
) -> WorkloadScan:
    """Validate every line (up to ``limit`` problems); collect every error instead of stopping.

    A workload that cannot be read or is not a regular file is one error of the scan, like any other,
    naming the ``flag`` that gave the path where there is one (``--workload w.jsonl: cannot read``).
    (A script that ends with a tool call is valid: under ``--max-turns`` at most its length the run ends
    it as ``max_turns``; beyond, its trajectory fails with ``script_exhausted``, counted.)"""
    scan = WorkloadScan(path=path)
    digest = hashlib.sha256()
    ids: dict[str, tuple[int, str]] = {}  # whitespace-normalised id → its first line and spelling
    tool_files: dict[Path, ToolFile] = {}
    tool_root = resolved(tool_root)  # a symlink loop: a workload in it is refused as unreadable below
    try:
        handle, identity = _open_regular(path)
    except WorkloadError as exc:
        for message in exc.problems:
            scan.add_problem(f"{flag} {message}" if flag else message)
        return scan
    with handle:
        container = container_kind(handle.peek(8)[:8], "workload.jsonl")
        if container is not None:  # its first "line" was "a UTF-16 or UTF-32 file?" or "not UTF-8"
            scan.add_problem(f"{flag} {path}: {container}" if flag else f"{path}: {container}")
            return scan
        for line_no, raw in enumerate(handle, start=1):
            digest.update(raw)
            if not raw.strip() or (limit is not None and scan.count >= limit):
                continue
            problem, issues = _parse_line(raw, validating=True)
            if problem is not None:
                issues = check_problem(problem, tool_root, scripted, tool_files)
                pid = problem_id(problem, line_no)
                # ids that differ only in whitespace ("abc", "abc ") read alike in results, events and the
                # timeline, as the LiveCodeBench converter refuses them
                if (first := ids.get(key := " ".join(pid.split()))) is not None:
                    alike = "" if first[1] == pid else f", which differs from {first[1]!r} only in whitespace"
                    issues.append(("id", f"duplicate id {pid!r}{alike} (first on line {first[0]})"))
                else:
                    ids[key] = (line_no, pid)
                for tool in problem.tools if not issues else ():
                    impl = (
                        None if tool.implementation is None else (tool_root / tool.implementation).resolve()
                    )
                    scan.tools.setdefault(tool.key, ToolSource(tool.key, tool.name, impl))
            for fld, message in issues:
                scan.add_problem(f"{path}:{line_no}: {_clipped(fld)}: {_clipped(message)}")
            scan.invalid_lines += bool(issues)
            scan.count += 1
        if scan.count and scan.invalid_lines == scan.count:  # a dataset's file or one JSON document?
            _name_the_file(scan, path)
        if FileIdentity.of(os.fstat(handle.fileno())) != identity:
            scan.add_problem(f"{path}: changed while it was being validated; validate it again when stable")
    scan.sha256 = digest.hexdigest()
    scan.identity = identity
    if scan.count == 0 and not scan.problems:
        scan.add_problem(f"{path}:1: line: the workload holds no problems")
    return scan


def _name_the_file(scan: WorkloadScan, path: Path) -> None:
    """Where no line of ``path`` was valid: one JSON document over several lines is one error, not one a
    line; a dataset's own rows get the command that converts them, after their lines' errors."""
    whole = one_document(path) if scan.count > 1 else None
    if whole is not None:
        scan.problems, scan.truncated = [whole], 0
        return
    scan.hint = dataset_lines(path)


def iter_problems(
    path: Path, limit: int | None = None, *, identity: FileIdentity | None = None
) -> Generator[tuple[int, str, Problem], None, None]:
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
