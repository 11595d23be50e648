"""Reading LiveCodeBench source files: a JSON array, one JSON object, or JSONL streamed in two passes.

The release's JSONL files are large (the private tests dominate), so a JSONL source is never held in
memory: the first pass parses and validates one line at a time and keeps only a reference (byte offset,
length and SHA-256 of the line); after selection the chosen lines are read again and their hashes
checked, so a source that changes between the passes is an error, not a silently mixed output. A JSON
array or a single (pretty-printed) object is parsed whole. The file's SHA-256 is computed on the way.
Because of the second pass the source must be a regular file, not a pipe.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from asyncroll.convert.output import refuse_container
from asyncroll.errors import UsageError
from asyncroll.json_checks import (
    LONE_SURROGATE,
    json_error_text,
    json_kind,
    line_column,
    lone_surrogate_at,
    may_hold_surrogate,
    not_utf8,
    unique_keys,
    utf8_text,
)
from asyncroll.json_depth import json_loads


@dataclass(frozen=True, slots=True)
class RowRef:
    """Where a row lives: a JSONL line (``offset``/``length``/``sha256``) or, for whole files, the row."""

    where: str
    offset: int = -1
    length: int = 0
    sha256: bytes = b""
    row: Any = None


class RowSource:
    """One pass over the rows of ``path`` (:meth:`scan`), then random access to chosen rows (:meth:`load`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sha256 = ""
        self.problems: list[str] = []
        """Lines that are not JSON, found by :meth:`scan` (reported with the rows' own problems)."""

    def scan(self) -> Iterator[tuple[Any, RowRef]]:
        """Every row with its reference, in file order; sets :attr:`sha256` when exhausted."""
        with self._open() as handle:
            refuse_container(self.path, handle.read(8))
            handle.seek(0)
            first = _first_non_empty_line(handle)
            handle.seek(0)
            if first is None:
                raise UsageError(f"{self.path}: empty file")
            if first.lstrip().startswith(b"[") or not _is_object(first):
                data = handle.read()
                if _broken_jsonl(first, data):
                    handle.seek(0)
                    yield from self._jsonl(handle)  # every bad line named, not only the first
                else:
                    yield from self._whole(data)
            else:
                yield from self._jsonl(handle)

    def _open(self) -> BinaryIO:
        """The source opened for reading, refused unless it is a regular file: its rows are read twice
        (a pipe, ``--source <(zcat test.jsonl.gz)``, cannot seek back; a FIFO nobody writes to would
        block the open for ever)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            raise UsageError(f"--source {self.path}: cannot read: {exc.strerror or exc}") from exc
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                raise UsageError(f"--source {self.path} is a directory, not a file")
            if not stat.S_ISREG(mode):
                raise UsageError(
                    f"--source {self.path} is not a regular file (a pipe or a device): its rows are read "
                    "twice, to check them all and then to write the chosen ones; save it to a file first "
                    "(e.g. `zcat test.jsonl.gz > test.jsonl`)"
                )
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return os.fdopen(fd, "rb")  # it owns the descriptor from here on (see workload.scan)

    def load(self, ref: RowRef) -> Any:
        """The row ``ref`` points at (read again for JSONL, after checking the line is unchanged)."""
        if ref.offset < 0:
            return ref.row
        with self.path.open("rb") as handle:
            handle.seek(ref.offset)
            raw = handle.read(ref.length)
        if hashlib.sha256(raw).digest() != ref.sha256:
            raise UsageError(f"{ref.where}: the source changed while it was being converted")
        return json_loads(raw, object_pairs_hook=unique_keys)

    def _whole(self, data: bytes) -> Iterator[tuple[Any, RowRef]]:
        self.sha256 = hashlib.sha256(data).hexdigest()
        try:
            # a leading byte-order mark is dropped; a key given twice is refused (json keeps the last)
            whole = json_loads(utf8_text(data), object_pairs_hook=unique_keys)
        except UnicodeDecodeError as exc:
            raise UsageError(f"{self.path}: {not_utf8(exc)}") from None
        except json.JSONDecodeError as exc:
            raise UsageError(f"{self.path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
        except (ValueError, RecursionError) as exc:  # an int past Python's digit limit, deep nesting
            why = json_error_text(exc) or type(exc).__name__
            raise UsageError(f"{self.path}: cannot be read as JSON: {why}") from None
        surrogate = lone_surrogate_at(whole) if may_hold_surrogate(data) else None
        if surrogate is not None:
            raise UsageError(f"{self.path}: {surrogate}: {LONE_SURROGATE}")
        if isinstance(whole, dict):
            yield whole, RowRef(str(self.path), row=whole)
        elif isinstance(whole, list):
            if not whole:
                raise UsageError(f"{self.path}: the array holds no rows")
            for i, row in enumerate(whole):
                where = f"{self.path}: row [{i}]"
                yield row, RowRef(where, row=row)
        else:
            kind = json_kind(whole)
            raise UsageError(f"{self.path}: expected rows (a JSON array, object or JSONL), got {kind}")

    def _jsonl(self, handle: Any) -> Iterator[tuple[Any, RowRef]]:
        digest = hashlib.sha256()
        offset = 0
        for line_no, raw in enumerate(handle, start=1):
            digest.update(raw)
            start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            where = f"{self.path}:{line_no}"
            try:
                row = json_loads(raw, object_pairs_hook=unique_keys)
            except UnicodeDecodeError as exc:
                self.problems.append(f"{where}: invalid line: {not_utf8(exc, of_line=True)}")
                continue
            except json.JSONDecodeError as exc:
                column = line_column(exc)
                self.problems.append(f"{where}: invalid line: not valid JSON: {exc.msg} (column {column})")
                continue
            except (ValueError, RecursionError) as exc:  # an int past Python's digit limit, deep nesting
                self.problems.append(f"{where}: invalid line: cannot be read as JSON: {json_error_text(exc)}")
                continue
            surrogate = lone_surrogate_at(row) if may_hold_surrogate(raw) else None
            if surrogate is not None:
                self.problems.append(f"{where}: invalid line: {surrogate}: {LONE_SURROGATE}")
                continue
            yield row, RowRef(where, start, len(raw), hashlib.sha256(raw).digest())
        self.sha256 = digest.hexdigest()


def _first_non_empty_line(handle: Any) -> bytes | None:
    for raw in handle:
        if raw.strip():
            return bytes(raw)
    return None


def _broken_jsonl(first: bytes, data: bytes) -> bool:
    """JSONL whose first line is broken (a cut object) or not a row (a whole JSON value that is not an
    object): the file is not one JSON document, but a later line is a whole object."""
    if not (first.lstrip().startswith(b"{") or _is_json(first)):
        return False
    try:
        json_loads(data)
    except (ValueError, RecursionError):
        return any(_is_object(line) for line in data.splitlines()[1:] if line.strip())
    return False


def _is_json(line: bytes) -> bool:
    try:
        json_loads(line)
    except (ValueError, RecursionError):
        return False
    return True


def _is_object(line: bytes) -> bool:
    try:
        return isinstance(json_loads(line), dict)
    except (ValueError, RecursionError):
        return False
