"""One runner per experiment directory: an exclusive ``flock`` on ``OUTPUT/experiment.lock``.

The runner takes the lock before it reads or creates ``experiment.json`` and holds it until it returns,
so a second ``run`` or ``--resume`` on a directory a live runner is using is refused: without the lock,
the resume would take the live arm for an orphan, kill its server and client and move its directory away.

Why ``flock`` rather than a recorded pid and process start time: the kernel drops the lock when its
holder exits, however it exits (SIGKILL and crashes included), so a dead runner never leaves a stale
lock, and a reused pid can never pass for a live runner. The descriptor is not inherited by the arms'
servers and clients (Python opens files non-inheritable and ``subprocess`` closes other descriptors), so
a server a killed runner left behind does not hold the lock, and ``--resume`` can take over and sweep it.
The file records the holder's pid, host and start time only to name it in the refusal; it is never
deleted (unlinking a lock file lets two processes lock two different files). ``flock`` is local to one
machine: on a network filesystem two machines may not see each other's lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
from pathlib import Path

from asyncroll.errors import UsageError
from asyncroll.experiment.receipts import now_iso
from asyncroll.outputs.lines import write_all

LOCK_NAME = "experiment.lock"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class OutputLock:
    """The held lock; ``release`` (or the process's exit) frees it."""

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    @classmethod
    def acquire(cls, directory: Path) -> OutputLock:
        """Lock ``directory`` for this process, or raise UsageError naming the runner that holds it."""
        path = directory / LOCK_NAME
        try:
            # never through a link: one planted in a folder another user made would have the record
            # truncate and overwrite the file it names
            fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o644)
        except OSError as exc:
            why = "a symbolic link, which no runner makes" if exc.errno == errno.ELOOP else exc.strerror
            raise UsageError(f"{path}: cannot open the runner's lock: {why}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise _held(directory, holder) from None
        except OSError as exc:
            os.close(fd)
            raise UsageError(f"{path}: cannot lock: {exc.strerror or exc}") from None
        record = {"pid": os.getpid(), "host": socket.gethostname(), "since": now_iso()}
        try:
            os.ftruncate(fd, 0)
            write_all(fd, (json.dumps(record) + "\n").encode(), 0)  # a short write is a failure too
        except OSError as exc:  # a full disk: the lock is held all the same, but nothing is started
            os.close(fd)
            raise UsageError(f"{path}: cannot record the runner: {exc.strerror or exc}") from None
        return cls(fd, path)

    @staticmethod
    def refuse_if_held(directory: Path) -> None:
        """Raise :meth:`acquire`'s refusal now if a live runner holds ``directory``; create nothing.

        For the checks that come before the lock is taken: a second ``run`` on a live experiment's
        directory was refused by the pre-flight instead, for the fixed port the live arm's server holds,
        with the advice to stop that server."""
        try:
            fd = os.open(directory / LOCK_NAME, os.O_RDWR | _NOFOLLOW)
        except OSError:
            return  # no lock file yet (or none readable: acquire says so)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # closing the descriptor drops it again
        except BlockingIOError:
            raise _held(directory, _holder(fd)) from None
        except OSError:
            return
        finally:
            os.close(fd)

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None


def _held(directory: Path, holder: str) -> UsageError:
    return UsageError(
        f"--output {directory}: the experiment is being run by {holder}; wait for it to end, or "
        "stop it (SIGINT or SIGTERM) and then --resume"
    )


def _holder(fd: int) -> str:
    """Who holds the lock, from what it wrote (it may not have written yet)."""
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
        return f"pid {int(data['pid'])} on {data['host']} (since {data['since']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"
