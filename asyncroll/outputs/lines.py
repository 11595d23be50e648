"""Append-only files of whole lines (``events.jsonl``, ``results.jsonl``, ``transcripts.jsonl``) that a
full disk cannot corrupt.

A write to a nearly full file system may be *short* (part of the line on disk, then ``ENOSPC``): every
line is written whole or not at all — a partial line is cut off again, so each line on disk stays valid
JSON — and the first failure is kept (:attr:`LineFile.error`), the file closed, and
:class:`OutputWriteError` raised once. Later lines are dropped silently: the run that owns the file fails
with that first error.

A file opened with ``background=True`` (a real run's: on NFS, Lustre or GPFS a write can take
milliseconds, and seconds when the file server is busy) is written by a thread of its own:
:meth:`LineFile.write` queues the line and returns, the event loop never waiting on the file system
unless the queue already holds ``QUEUE_BYTES``. The thread writes each line as soon as it is queued,
in order; :meth:`LineFile.close` writes what is still queued before it closes the file. The first
failure is raised by the first :meth:`LineFile.write` after it, or, when it was the last line's, kept
in :attr:`LineFile.error` for the owner to read after :meth:`LineFile.close`.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import os
import shutil
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import orjson

from asyncroll.errors import OutputWriteError

#: Bytes of lines a background writer may hold before :meth:`LineFile.write` waits for it (a slow disk's
#: backlog, in memory).
QUEUE_BYTES = 16 << 20

#: Bytes a staged name may take before its ``.PID.tmp`` (a file name holds 255; a pid up to 10 digits).
_STEM_BYTES = 255 - len(".4294967295.tmp")


def staging_path(path: Path) -> Path:
    """A hidden name beside ``path`` to write it under before the rename over ``path``: this process's
    own (its pid), so two processes writing the same file at once (two ``asyncroll timeline`` of one
    run) never truncate or rename each other's half-written file."""
    return path.with_name(f"{_staged_stem(path)}.{os.getpid()}.tmp")


def open_staged(tmp: Path, mode: str) -> IO[Any]:
    """Create the staging file ``tmp`` anew for writing (``mode`` ``"w"``, UTF-8, or ``"wb"``), with the mode
    the umask gives a new file. What is at that name is removed first (a dead writer's with this pid, or
    a link another user planted in a folder both may write in), and the file is made with ``O_EXCL``,
    so a link is never followed: opened plainly, one made the write truncate the file it named."""
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
    try:
        return os.fdopen(fd, mode, encoding="utf-8") if "b" not in mode else os.fdopen(fd, mode)
    except BaseException:
        os.close(fd)
        raise


def _staged_stem(path: Path) -> str:
    """``.NAME``, the staged name less its ``.PID.tmp``. A ``path`` whose name is near the file name limit
    (a legal 250-byte output) keeps as much of it as fits, then a digest of the whole name: ``.NAME.PID.tmp``
    was too long to create ('File name too long')."""
    stem = f".{path.name}"
    encoded = os.fsencode(stem)
    if len(encoded) <= _STEM_BYTES:
        return stem
    digest = "~" + hashlib.sha256(encoded).hexdigest()[:16]
    while len(os.fsencode(stem)) > _STEM_BYTES - len(digest):  # whole characters, never half of one
        stem = stem[:-1]
    return stem + digest


def clear_staged(path: Path) -> None:
    """Remove what writers of ``path`` killed mid-write (the OOM killer) left under their staging names,
    those whose process no longer runs: with a name per process no later writer overwrites them, and a
    trace.json's can be hundreds of MB. A live process's (a neighbour writing now) is left alone. A
    staged folder (an experiment report's) goes with what it holds."""
    with contextlib.suppress(OSError):
        stem = _staged_stem(path)
        for left in path.parent.glob(glob.escape(f"{stem}.") + "*.tmp"):
            if _ended(left.name[len(stem) + 1 : -len(".tmp")]):
                remove_staged(left)


def remove_staged(left: Path) -> None:
    """Remove one staged file, or a staged folder with what it holds (never what a link points to)."""
    if left.is_dir() and not left.is_symlink():
        shutil.rmtree(left, ignore_errors=True)
    else:
        left.unlink(missing_ok=True)


def _ended(pid: str) -> bool:
    """No process has ``pid`` now (without psutil: a worker imports this module, and stays light)."""
    if not pid.isdigit() or int(pid) == 0:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):  # another user's process (alive), or too large for a pid
        return False
    return False


def json_line(data: dict[str, Any]) -> bytes:
    """One JSON line (results, transcripts): orjson, or the stdlib encoder for what orjson refuses."""
    try:
        return orjson.dumps(data, default=str, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:  # e.g. an integer answer beyond 64 bits: the stdlib encoder handles any size
        return (json.dumps(data, default=str) + "\n").encode()


def write_all(fd: int, data: bytes, offset: int | None = None) -> None:
    """Write every byte of ``data`` (at ``offset`` with ``pwrite``, else at the file's position), looping
    over short writes; a write that makes no progress is the disk being full. Also how a worker writes
    a whole frame to its pipe."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        n = os.write(fd, view[done:]) if offset is None else os.pwrite(fd, view[done:], offset + done)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        done += n


class LineFile:
    """A new file (never an existing one) that takes whole lines; see the module docstring."""

    def __init__(self, path: Path, *, background: bool = False) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self._size = 0
        self.error: OutputWriteError | None = None
        self._raised = False  # the error was raised by a write (once)
        try:  # RuntimeError: no thread can start (a process limit, ulimit -u); the file is closed again
            self._writer = None if not background else _Writer(self._write_queued, path.name)
        except BaseException:
            self._close_fd()
            raise

    def write(self, line: bytes) -> None:
        if self._writer is None:
            self._write_now(line)
        elif self.error is not None:  # the writer's line failed: raised once, by the next line
            if not self._raised:
                self._raised = True
                raise self.error
        else:
            self._writer.put(line)

    def _write_now(self, line: bytes) -> None:
        if self._fd is None:  # closed, or failed before: the owner knows
            return
        try:
            write_all(self._fd, line)
        except OSError as exc:
            with contextlib.suppress(OSError):  # the partial line a short write left
                os.ftruncate(self._fd, self._size)
            with contextlib.suppress(OSError):  # NFS tells a failed write again at close (EIO)
                self._close_fd()
            # Marked before the error is set: a writer's thread marking it after, a write on the event loop
            # that raised it in between had its mark undone, and the next line raised it again.
            self._raised = self._writer is None
            self.error = OutputWriteError(
                f"{self.path.name}: cannot write ({exc.strerror or exc}); lines written before are kept",
            )
            raise self.error from exc
        self._size += len(line)

    def _write_queued(self, line: bytes) -> None:
        """The writer thread's :meth:`_write_now`. Any other exception (a MemoryError) fails the file as a
        write error does: it ended the thread, the later lines lost unsaid, and a full queue then hung."""
        try:
            self._write_now(line)
        except OutputWriteError:
            pass  # kept in :attr:`error`; later lines dropped
        except BaseException as exc:  # noqa: BLE001 - told by the next write, or read after close
            if self._fd is None:  # failed before: the owner knows
                return
            with contextlib.suppress(OSError):  # the partial line it may have left
                os.ftruncate(self._fd, self._size)
            with contextlib.suppress(OSError):
                self._close_fd()
            self._raised = self._writer is None  # before the error is set, as in _write_now
            self.error = OutputWriteError(
                f"{self.path.name}: cannot write ({type(exc).__name__}{f': {exc}' if str(exc) else ''}); "
                "lines written before are kept",
            )

    def close(self) -> None:
        """Idempotent. A background writer writes every line still queued first; a close interrupted while
        it waits (a KeyboardInterrupt) leaves the file open to it, for the next close to wait again."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._close_fd()

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class _Writer:
    """A thread that writes queued lines in order with ``write`` (which records its own failures)."""

    def __init__(self, write: Callable[[bytes], None], name: str) -> None:
        self._write = write
        self._lines: deque[bytes] = deque()
        self._bytes = 0
        self._closing = False
        self._ready = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"asyncroll {name} writer", daemon=True)
        self._thread.start()

    def put(self, line: bytes) -> None:
        with self._ready:
            while self._lines and self._bytes + len(line) > QUEUE_BYTES:  # the disk is that far behind
                self._ready.wait()
            self._lines.append(line)
            self._bytes += len(line)
            self._ready.notify_all()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._lines and not self._closing:
                    self._ready.wait()
                if not self._lines:
                    return
                line = self._lines[0]  # left queued while written: close() waits for it too
            self._write(line)  # records its own failures (LineFile.error); later lines dropped
            with self._ready:
                self._lines.popleft()
                self._bytes -= len(line)
                self._ready.notify_all()

    def close(self) -> None:
        """Write what is queued, then end the thread."""
        with self._ready:
            self._closing = True
            self._ready.notify_all()
        self._thread.join()


class TextOutput:
    """A text file written from the start (``with TextOutput(path) as out: out.write(…)``) whose own
    failures — to create, write or flush it (a full disk) — are one :class:`OutputWriteError` naming it,
    told apart from what the body raises (reading a source, say). On an error the file is closed
    without its buffer; the owner removes or reports what it holds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:  # never through a link (one planted where another user may write): it would be truncated
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o666)
        except OSError as exc:
            raise self._error(exc) from exc
        self._file = os.fdopen(fd, "w", encoding="utf-8")

    def _error(self, exc: OSError) -> OutputWriteError:
        return OutputWriteError(f"{self.path}: cannot write ({exc.strerror or exc})")

    def write(self, text: str) -> None:
        try:
            self._file.write(text)
        except OSError as exc:
            raise self._error(exc) from exc

    def __enter__(self) -> TextOutput:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        try:
            self._file.close()  # what is still buffered: a small file's only write
        except OSError as exc:
            if exc_type is None:
                raise self._error(exc) from exc
            with contextlib.suppress(OSError):  # a failure already on its way: it stays the one told
                self._file.close()
