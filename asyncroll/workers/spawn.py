"""Launching a worker process: command line, environment, log file and the two IPC pipes.

The worker runs ``python -m asyncroll.workers.child`` in a new session (so it leads its own process
group and a terminal's Ctrl-C reaches only the runtime, which then shuts workers down in order). Its
stdin is /dev/null and its stdout/stderr go to a log file (appended) or /dev/null; jobs and replies use
two dedicated pipes passed with ``pass_fds``, so nothing a tool prints can reach the channel. The first
frame on the job pipe lists the tools to preload.

The worker's environment carries its ``origin`` (:data:`~asyncroll.workers.orphans.ORIGIN_ENV`), which
everything it starts inherits: what it leaves behind when it dies is found by that
(:mod:`asyncroll.workers.orphans`).

``-P`` keeps the runtime's working directory off the worker's ``sys.path``: what a tool can import must
not depend on where ``asyncroll`` was started. The worker puts each tool file's own folder there instead,
as running the file as a script would (``PYTHONPATH`` is still honoured, and passed on).
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from asyncroll.workers.orphans import ORIGIN_ENV
from asyncroll.workers.protocol import ToolSpec, frame

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
LOG_TAIL_BYTES = 2000


@dataclass(frozen=True, slots=True)
class Spawned:
    """A started worker process and the runtime's ends of its pipes (unbuffered, owning their fds)."""

    process: asyncio.subprocess.Process
    replies: IO[bytes]
    jobs: IO[bytes]
    log_offset: int


async def spawn(log_path: Path | None, origin: str) -> Spawned:
    """Start a worker with ``origin`` in its environment; raises ``OSError`` (with no fd left open) if it
    cannot start. Its tools are the first frame written to its job pipe (:func:`tools_frame`)."""
    job_r, job_w = os.pipe()
    reply_r, reply_w = os.pipe()
    try:
        log, log_offset = _open_log(log_path)
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable, *child_flags(), "-m", "asyncroll.workers.child",
                "--in-fd", str(job_r), "--out-fd", str(reply_w), "--parent-pid", str(os.getpid()),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log or asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.STDOUT if log else asyncio.subprocess.DEVNULL,
                pass_fds=(job_r, reply_w), close_fds=True, start_new_session=True, env=_environment(origin),
            )  # fmt: skip
        finally:
            if log is not None:
                log.close()
    except BaseException:
        for fd in (job_r, job_w, reply_r, reply_w):
            os.close(fd)
        raise
    os.close(job_r)
    os.close(reply_w)
    return Spawned(process, _pipe_file(reply_r, "rb"), _pipe_file(job_w, "wb"), log_offset)


def tools_frame(tools: Sequence[ToolSpec]) -> bytes:
    """The worker's first input: the tools to preload, as a JSON list in one frame. Not an argument: the
    kernel refuses one longer than 128 KiB (``E2BIG``), which a workload of ~1,000 tool files reached."""
    return frame(json.dumps([tool.to_json() for tool in tools]).encode())


def log_tail(log_path: Path | None, offset: int) -> str:
    """The end of what this worker wrote to its log (not earlier generations'), as a message suffix."""
    if log_path is None:
        return ""
    try:
        with open(log_path, "rb") as log:
            log.seek(max(offset, log.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            tail = log.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""
    return f"\n--- worker log ({log_path}) ---\n{tail}" if tail else ""


def _open_log(log_path: Path | None) -> tuple[IO[bytes] | None, int]:
    if log_path is None:
        return None, 0
    # never through a link (one planted in a run folder another user may write in): O_NOFOLLOW
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0), 0o666)
    log = os.fdopen(fd, "ab")  # handed to the child, closed right after spawn
    return log, log.seek(0, os.SEEK_END)


def log_folder(path: Path) -> Path:
    """Make ``path``, the run's ``workers`` folder, or take the one an earlier worker of the run made;
    anything else there (a link another user planted in a run folder both may write in, a file) is
    refused, so that no worker's log goes where it leads."""
    try:
        path.mkdir()
    except FileExistsError:
        if path.is_symlink() or not path.is_dir():
            why = "not a folder this run made (a symbolic link or a file)"
            raise OSError(errno.EEXIST, why, str(path)) from None
    return path


def _environment(origin: str) -> dict[str, str]:
    # The worker must import this very asyncroll, whatever the installation or working directory: its
    # folder goes on PYTHONPATH after the user's own entries, the order the runtime's path has them in
    # (they come before its site-packages), so a tool imports what the runtime would (a lab's numpy
    # there, not the one beside a wheel-installed asyncroll).
    env = dict(os.environ)
    env["PYTHONPATH"] = pythonpath_with(_PACKAGE_ROOT, users_pythonpath())
    env[ORIGIN_ENV] = origin
    return env


def child_flags() -> list[str]:
    """The interpreter flags of an asyncroll child (a worker, an experiment's client or own server): ``-P``
    (the working folder off its path), and ``-s`` where this process runs without the user's own
    site-packages (``python -s``, ``-I``), so that the child does not import a package from there that
    this process never saw. (``-E``/``-I`` themselves are not passed on: the child's ``PYTHONPATH`` is
    how it finds this asyncroll.)"""
    return ["-P", "-s"] if sys.flags.no_user_site else ["-P"]


def users_pythonpath() -> str | None:
    """The user's ``PYTHONPATH`` as this process's path took it: none under ``python -E`` or ``-I``,
    which kept it off that path, so a child (which honours it) does not import a lab's numpy there
    while this process imported, and recorded, the one beside it."""
    return None if sys.flags.ignore_environment else os.environ.get("PYTHONPATH")


def pythonpath_with(root: str, given: str | None) -> str:
    """``PYTHONPATH`` for a child that must import the asyncroll held by the folder ``root``: the user's
    own entries (``given``) first, as the parent's path has them (before its site-packages), ``root``
    after them; but ``root`` first where an entry before it holds another ``asyncroll`` package (a lab's
    shared install, another checkout), which the child would import instead: the parent imported its own
    from ahead of ``PYTHONPATH`` (``python -m asyncroll`` in its checkout). An empty entry is the working
    folder, to Python as here."""
    mine = os.path.realpath(root)
    for entry in given.split(os.pathsep) if given else []:
        folder = os.path.realpath(entry or os.curdir)
        if folder == mine:
            break
        if os.path.isfile(os.path.join(folder, "asyncroll", "__init__.py")) or os.path.isfile(
            os.path.join(folder, "asyncroll.py")
        ):
            return os.pathsep.join((root, given or ""))
    return os.pathsep.join(p for p in (given, root) if p)


def _pipe_file(fd: int, mode: str) -> IO[bytes]:
    return open(fd, mode, buffering=0)
