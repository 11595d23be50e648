"""Where converted workloads go: destination checks and an atomic, byte-deterministic JSONL writer.

A conversion never overwrites anything: the destination must not exist and must not be the source.
The file appears whole or not at all (written to a temporary file in the same folder, flushed to disk,
then linked into place, which fails rather than clobbers if something appeared there meanwhile);
a write that fails also removes the folders it created for the output.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from asyncroll.errors import OutputWriteError, UsageError
from asyncroll.json_checks import container_kind
from asyncroll.outputs.lines import clear_staged, staging_path
from asyncroll.paths import resolved


def output_path(text: str) -> Path:
    """``--output`` as given on the command line, refused when it names a folder: ``Path`` drops a
    trailing slash, so ``--output runs/lcb/`` wrote the workload to a file named ``runs/lcb``."""
    if not text:
        raise UsageError("--output is empty; give the workload's file name")
    if text.replace(os.sep, "/").rsplit("/", 1)[-1] in ("", ".", ".."):  # Path("a/.").name is "a"
        folder = text.rstrip("/" + os.sep) or "/"
        raise UsageError(
            f"--output {text} names a folder; give the workload's file name "
            f"(e.g. {Path(folder) / 'workload.jsonl'})"
        )
    return Path(text)


def check_destination(source: Path, output: Path) -> None:
    """Refuse an output that is the source or that already exists; both are checked before any work."""
    try:
        _check_destination(source, output)
    except OSError as exc:  # e.g. a name too long for the filesystem
        raise UsageError(f"--output {output}: cannot write there: {exc.strerror or exc}") from exc


def _check_destination(source: Path, output: Path) -> None:
    if resolved(source) == resolved(output) or (
        output.exists() and source.exists() and os.path.samefile(source, output)
    ):
        raise UsageError(f"--output {output} is the source file; choose a new file")
    # a folder on the way that does not exist yet ("new/../taken.jsonl"): the kernel cannot look the path
    # up, but once the write has made "new", the path is the one ".." reduces it to (it appeared "while
    # converting"); with every folder there, the kernel's answer stands (a symlink's ".." is not lexical)
    planned = Path(os.path.normpath(output)) if not output.parent.exists() else output
    if output.exists() or output.is_symlink() or planned.exists() or planned.is_symlink():
        raise UsageError(
            f"--output {output} already exists; conversions never overwrite a file (choose a new one)"
        )
    if output.name in ("", ".", ".."):
        raise UsageError(f"--output {output} is not a file name")


def read_source(source: Path) -> bytes:
    """The source's bytes, or a usage error naming the file."""
    try:
        data = source.read_bytes()
    except IsADirectoryError:
        raise UsageError(f"--source {source} is a directory, not a file") from None
    except OSError as exc:
        raise UsageError(f"--source {source}: cannot read: {exc.strerror or exc}") from exc
    refuse_container(source, data[:8])
    return data


def refuse_container(source: Path, head: bytes) -> None:
    """A source that starts like a compressed file or an archive is named as such (it would otherwise be
    "not UTF-8 text" or "not valid JSON"), with the way to its JSON rows."""
    kind = container_kind(head, "rows.jsonl")
    if kind is not None:
        raise UsageError(f"--source {source} is {kind}")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def dump_line(obj: Any) -> str:
    """One workload line: compact JSON, UTF-8 kept as is, keys in the order the converter built them."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n"


def write_jsonl_atomic(output: Path, objects: Iterable[Any]) -> int:
    """Write one JSON line per object to ``output`` atomically; return the number of lines.

    The parent folder is created if needed. If ``output`` appears while we write, the write fails
    with a usage error and the temporary file is removed: nothing is ever clobbered. A write that fails
    (``objects`` raising, a full disk, an interruption) also removes the folders it created.
    """
    parent = output.parent if str(output.parent) else Path(".")
    created = [d for d in (parent, *parent.parents) if not d.exists()]  # deepest first
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _remove_empty(created)
        blocking = next((d for d in (parent, *parent.parents) if d.exists() and not d.is_dir()), None)
        if blocking is not None:  # mkdir says only "File exists" (or "Not a directory")
            raise UsageError(f"--output {output}: {blocking} is a file, not a folder") from exc
        raise UsageError(f"--output {output}: cannot create its folder: {exc.strerror or exc}") from exc
    tmp = staging_path(output)  # this process's name: one a dead process with our pid left is stale
    try:
        tmp.unlink(missing_ok=True)
        # 0666 less the umask, as for any new file (mkstemp's 0600, widened to 0644, ignored a umask 077:
        # a workload's hidden tests were readable by every user)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        _remove_empty(created)
        raise UsageError(f"--output {output}: cannot write there: {exc.strerror or exc}") from exc
    count = 0
    published = False
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            for obj in objects:
                handle.write(dump_line(obj))
                count += 1
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, output)  # no-clobber publish: fails if output exists
        except FileExistsError:
            raise UsageError(f"--output {output} appeared while converting; not overwritten") from None
        except OSError:  # a filesystem without hard links: re-check, then rename
            if output.exists():
                raise UsageError(f"--output {output} appeared while converting; not overwritten") from None
            os.replace(tmp, output)
        published = True
        clear_staged(output)  # what converts killed mid-write left (a workload can be large)
    except UsageError:
        raise
    except OSError as exc:  # e.g. the disk filled up: nothing was published (not a usage error: exit 1)
        raise OutputWriteError(f"--output {output}: cannot write: {exc.strerror or exc}") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        if not published:
            _remove_empty(created)
    return count


def _remove_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first) where still empty: the ones a failed write created."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # not empty (something else wrote there meanwhile), or gone
            return
