"""Everything a run checks before anything starts (SPEC §3): features the flags ask for, the output
directory (never overwritten), the tool root, the whole workload (every error as FILE:LINE: field:
message), and — where real workers will run untrusted code — the sandbox's isolation layers. The output
directory is created last, so a refused run leaves nothing behind."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncroll.cli_signals import deferred
from asyncroll.config import RunConfig
from asyncroll.errors import OutputExistsError, UsageError, WorkloadError, no_directory
from asyncroll.workload import EVALUATOR_TOOL, WorkloadScan, scan_workload


@dataclass(frozen=True)
class PreparedRun:
    config: RunConfig
    scan: WorkloadScan
    argv: list[str] = field(default_factory=list)
    isolation: dict[str, Any] | None = None  # the evaluator's isolation report, when code will run


def prepare(
    config: RunConfig,
    argv: list[str] | None = None,
    *,
    output_ready: bool = False,
    probe_isolation: bool = False,
    made: list[Path] | None = None,
    origins: Mapping[str, str] | None = None,
) -> PreparedRun:
    """Validate everything before anything starts; creates the output directory last.

    ``output_ready``: the caller already created the (new, empty but for its own inputs) directory.
    ``probe_isolation``: real workers will run untrusted code (``lcb_evaluate``): detect the sandbox's
    isolation layers now — in the main thread, before any thread exists, since the probe forks — and
    refuse to start when a required one is missing, unless ``--allow-weak-isolation``.
    ``made``: the output directory is appended to it once made here (a command interrupted before its
    run began removes only a directory it made itself, never one another run made meanwhile).
    ``origins``: where a setting came from when not a flag (``--config FILE: setting 'output'``), as
    :func:`~asyncroll.config.build_config`'s: a taken output or a missing tool root is named by it.
    """
    # every problem is told at once, one a line: a refused output did not hide the workload's errors
    problems = config.unavailable_features()
    where = dict(origins or {})
    try:
        exists = not output_ready and output_exists(config.output, where.get("output"))
    except UsageError as exc:  # a path that cannot name a directory: told with the rest too
        exists = False
        problems.append(str(exc))
    if exists:
        problems.append(str(OutputExistsError(config.output, where.get("output"))))
    tool_root = config.resolved_tool_root
    if not tool_root.is_dir() and config.tool_root is not None:  # a workload's own missing folder:
        named = (
            f"{where['tool_root']}: {config.tool_root}"
            if "tool_root" in where
            else f"--tool-root {tool_root}"
        )
        problems.append(f"{named}: {no_directory(tool_root)}")  # the scan names the workload
        raise UsageError("\n".join(problems))  # no line's tools can be checked without it
    scripted = config.backend == "scripted" or config.replay
    scan = scan_workload(config.workload, tool_root, scripted=scripted, limit=config.limit, flag="--workload")
    raise_together(problems, scan)
    if exists and len(problems) == 1:  # its own type, as callers may tell it apart
        raise OutputExistsError(config.output, where.get("output"))
    if problems:
        raise UsageError("\n".join(problems))
    isolation = _isolation(config) if probe_isolation and EVALUATOR_TOOL in scan.tools else None
    if output_ready:
        return PreparedRun(config, scan, list(argv or sys.argv), isolation)
    # A stop signal waits until ``made`` says whether the directory was made: one that came between the
    # two left an empty directory, no run.json, blocking the path ("nothing written", said the command)
    with deferred():
        try:
            config.output.mkdir(parents=True, exist_ok=False)
        except FileExistsError as exc:
            raise OutputExistsError(config.output, where.get("output")) from exc
        except OSError as exc:
            raise UsageError(f"--output {config.output}: cannot create: {exc.strerror or exc}") from exc
        refuse_unwritable(config.output)
        if made is not None:
            made.append(config.output)
    return PreparedRun(config, scan, list(argv or sys.argv), isolation)


def raise_together(problems: list[str], scan: WorkloadScan) -> None:
    """Raise the scan's errors, if any, after ``problems`` found before it (a taken output), one a line,
    still ending with the scan's closing count."""
    try:
        scan.raise_if_invalid()
    except WorkloadError as exc:
        if not problems:
            raise
        count = str(exc)[len("\n".join(exc.problems)) :].lstrip("\n")  # its closing count, if any
        raise WorkloadError(problems + exc.problems, count or None) from None


def output_exists(output: Path, where: str | None = None) -> bool:
    """Whether ``output`` is taken (a dangling symlink too); a path that cannot name a new directory (a
    name too long for the file system, a parent that is a file) is a usage error, naming ``where`` the
    path came from when not ``--output`` (as :class:`OutputExistsError` does)."""
    named = f"--output {output}" if where is None else f"{where} ({output})"
    try:
        os.lstat(output)
    except FileNotFoundError:
        # under a link to nothing the parents' mkdir would fail as "exists": name the link instead
        ancestor = next((p for p in output.parents if os.path.lexists(p)), None)
        if ancestor is not None and ancestor.is_symlink() and not ancestor.is_dir():
            try:
                target = os.readlink(ancestor)
            except OSError:  # replaced meanwhile: a plain "does not exist" below
                return False
            raise UsageError(
                f"{named}: cannot be used: {ancestor} is a symbolic link to {target}, which does not exist"
            ) from None
        return False
    except OSError as exc:
        raise UsageError(f"{named}: cannot be used: {exc.strerror or exc}") from exc
    return True


def taken_output(output: object, where: str | None = None) -> list[str]:
    """The refusal of an output directory that exists (or of a path that cannot name one), as a line to
    tell with a settings error, which stops a command before :func:`prepare` looks; none for a path the
    settings' own error already names (empty, a NUL in it)."""
    if not isinstance(output, str | Path) or not str(output):
        return []
    try:
        return [str(OutputExistsError(output, where))] if output_exists(Path(output), where) else []
    except UsageError as exc:  # a path that cannot name a directory
        return [str(exc)]
    except ValueError:  # a NUL in it
        return []


def refuse_unwritable(output: Path) -> None:
    """``output`` was just made, empty: one this process cannot write in (a umask of 0777 or 0277 made it
    so), or read (0444: the run finished, then its exports could not read its events.jsonl, and a sweep
    failed reading its seeded workload), is removed again and refused, before a run.json or a workload
    fails in it."""
    if os.access(output, os.R_OK | os.W_OK | os.X_OK):
        return
    mode = stat.S_IMODE(output.stat().st_mode)
    with contextlib.suppress(OSError):
        output.rmdir()
    raise UsageError(
        f"--output {output}: made with mode {mode:04o} (the umask's), in which this process cannot read or "
        "write; removed again: set a umask that leaves its owner rwx (umask 022 or 077)"
    )


def refuse_unusable_umask(output: Path) -> None:
    """A folder made in ``output`` now (as each arm's folder will be) must be usable by this process: one
    the umask leaves unreadable or unwritable to its owner (0277, 0444) is refused, for an ``output`` that
    already existed too (an empty one, a resume), where :func:`refuse_unwritable` never looked. The probe
    folder is removed again; one that cannot be made is left for the caller's own use of ``output`` to say."""
    probe = output / f".umask-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        return
    try:
        usable = os.access(probe, os.R_OK | os.W_OK | os.X_OK)
        mode = stat.S_IMODE(probe.stat().st_mode)
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()
    if not usable:
        raise UsageError(
            f"--output {output}: a folder made in it gets mode {mode:04o} (the umask's), in which this "
            "process cannot read or write: set a umask that leaves its owner rwx (umask 022 or 077)"
        )


def _isolation(config: RunConfig) -> dict[str, Any]:
    from asyncroll.evaluator.isolation import IsolationError, isolation_report, require

    try:
        require(config.allow_weak_isolation)
    except IsolationError as exc:
        raise UsageError(f"{exc}") from exc
    return isolation_report(config.allow_weak_isolation)
