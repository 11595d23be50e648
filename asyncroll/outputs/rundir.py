"""The files of one run directory, written in the order a run produces them.

``run.json`` first (``preparing``), then ``events.jsonl`` and ``results.jsonl`` (with ``--transcripts``,
``transcripts.jsonl`` too) as the run goes, ``summary.json`` at the end, then the exports
(``trace.json``, ``timeline.html``) outside the measured window (a stop signal then skips them), and
``run.json`` last with the final status. With ``out=None`` nothing is written (a sweep cell needs only
its summary), through the same calls.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import shlex
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from asyncroll.clock import Clock
from asyncroll.errors import OutputWriteError
from asyncroll.event_log import EventLog
from asyncroll.outputs.lines import LineFile
from asyncroll.outputs.receipt import Receipt, Status, exit_code, write_json_atomic
from asyncroll.process_limits import limit_note


class RunDirectory:
    def __init__(
        self,
        out: Path | None,
        receipt_body: dict[str, Any],
        wall: float,
        *,
        transcripts: bool = False,
        background: bool = False,
    ) -> None:
        """``background``: results.jsonl and transcripts.jsonl are written by threads of their own (a real
        run's: a slow file system never holds up the event loop)."""
        self.out = out
        self.moved_to: Path | None = None  # where ``out`` was moved while the run ran (found at finish)
        self.gone = False  # ``out`` was removed (or moved out of sight) while the run ran (found at finish)
        self.exports_failed: dict[str, str] = {}  # export → why it was not written (after finish)
        self._dir = None if out is None else _open_directory(out)  # which directory is this run's own
        self._results: LineFile | None = None
        self._transcripts: LineFile | None = None
        try:  # OutputWriteError: no room even for run.json (nothing is written)
            self._receipt = None if out is None else Receipt(out / "run.json", receipt_body, wall)
        except OutputWriteError:
            self._close_directory()
            raise
        if out is None:
            return
        name = "results.jsonl"
        try:
            self._results = LineFile(out / name, background=background)
            if transcripts:
                name = "transcripts.jsonl"
                self._transcripts = LineFile(out / name, background=background)
        except OSError as exc:
            name = Path(exc.filename or "").name
            raise self.abandon(f"{name}: cannot create ({exc.strerror or exc})", wall) from exc
        except RuntimeError as exc:  # its writer thread ("can't start new thread": a process limit)
            why = f"{name}: cannot start its writer thread ({exc}){limit_note(exc)}"
            raise self.abandon(why, wall) from exc

    def abandon(self, error: str, wall: float, status: Status = "failed") -> OutputWriteError:
        """A run that cannot start (a file of its own not created, a failure, or a stop, as it is set up):
        its files are closed and the receipt says so (if it can); the error to raise."""
        for lines in (self._results, self._transcripts):
            if lines is not None:
                lines.close()
        with contextlib.suppress(OutputWriteError):
            self.transition(status, wall, error=error, exit_code=exit_code(status))
        self._close_directory()
        return OutputWriteError(error)

    def here(self) -> Path:
        """The run's own directory now: ``out``, or (Linux) the path it was moved to while the run ran,
        which :attr:`moved_to` then holds. Raises FileNotFoundError when it was removed, or moved where
        it cannot be found: what is at ``out`` then (a new run's directory) is never written to."""
        assert self.out is not None
        if self._dir is None:  # not opened: the path is all there is
            return self.out
        own = os.fstat(self._dir)
        handle = Path(f"/proc/self/fd/{self._dir}")  # Linux: the directory itself, wherever it is now
        for where in (self.out, self.moved_to, handle):
            with contextlib.suppress(OSError):
                if where is None or own.st_nlink == 0 or not _same(os.stat(where), own):
                    continue
                if where == handle:  # its real path (a removed one's would not be found: " (deleted)")
                    where = Path(os.readlink(handle))
                    if not _same(os.stat(where), own):
                        continue
                self.moved_to = None if where == self.out else where
                return where
        self.gone = True  # what is at ``out`` now, if anything, is not this run's (another run's, say)
        raise FileNotFoundError(errno.ENOENT, f"{self.out} was moved or removed while the run ran")

    def _close_directory(self) -> None:
        if self._dir is not None:
            os.close(self._dir)
            self._dir = None

    @property
    def events_path(self) -> Path | None:
        return None if self.out is None else self.out / "events.jsonl"

    def update(self, *, best_effort: bool = False, **fields: Any) -> None:
        """Rewrite run.json with ``fields``. ``best_effort``: while another error is on its way out, a
        run.json that cannot be written is left as it was, so that the error reported is that one."""
        if self._receipt is not None:
            try:
                self._follow(self._receipt)
                self._receipt.update(**fields)
            except OutputWriteError:
                if not best_effort:
                    raise

    def transition(self, status: Status, wall: float, **fields: Any) -> None:
        if self._receipt is not None:
            self._follow(self._receipt)
            self._receipt.transition(status, wall, **fields)

    def _follow(self, receipt: Receipt) -> None:
        """Point the receipt at run.json where this run's directory is now; raises
        :class:`~asyncroll.outputs.lines.OutputWriteError` when it is gone, with the run.json it held
        (what it last said is named: no file says it any more)."""
        try:
            receipt.path = self.here() / "run.json"
        except OSError as exc:
            raise OutputWriteError(
                f"run.json: cannot write ({exc.strerror or exc}); it was gone with the directory, last "
                f"written {receipt.written_status!r}"
            ) from exc

    def write_result(self, line: bytes) -> None:
        """One line of results.jsonl, whole or not at all (:class:`~asyncroll.outputs.lines.LineFile`)."""
        if self._results is not None:
            self._results.write(line)

    def write_transcript(self, line: bytes) -> None:
        """One line of transcripts.jsonl (``--transcripts``), whole or not at all, as results.jsonl's."""
        if self._transcripts is not None:
            self._transcripts.write(line)

    def close_lines(self) -> OutputWriteError | None:
        """Close results.jsonl (and transcripts.jsonl) once every line queued for them is written. Why one
        stopped being written (a full disk), if one did: a failure of the last lines queued is raised by
        no write. Idempotent."""
        for lines in (self._results, self._transcripts):
            if lines is not None:
                lines.close()
        return next((f.error for f in (self._results, self._transcripts) if f is not None and f.error), None)

    def finish(
        self,
        summary: dict[str, Any] | None,
        status: Status,
        wall: float,
        error: str | None = None,
        stop: ExportStop | None = None,
        **receipt: Any,
    ) -> str | None:
        """Close results (and transcripts), write the summary (none: a summary that could not be built,
        which ``error`` names) and the exports (which a stop signal skips, with ``stop``), then the final
        receipt (with ``receipt``'s sections too). A summary.json or a final run.json the disk had no room
        for fails the run (an interrupted one stays interrupted): the error it then ended with is returned
        (else None)."""
        self.close_lines()
        if self.out is None:
            return None
        failed = None
        try:
            here = self.here()
            if summary is not None:
                write_json_atomic(here / "summary.json", summary)
        except OSError as exc:
            if status != "interrupted":  # an interrupted run stays so (exit 130, as the command says)
                status = "failed"
            error = failed = "; ".join(
                filter(None, (error, f"summary.json: cannot write ({exc.strerror or exc})"))
            )
        # The exports are written before the final receipt (whose ``exports`` records them), so they are
        # told the final status and sections: run.json still says "preparing" (and its telemetry "not
        # probed yet") if the run never started.
        final = {"status": status, **receipt, **({"error": error} if error else {})}
        try:
            exports = export(self.here(), final, stop)
        except OSError as exc:
            why = {"ok": False, "error": f"{type(exc).__name__}: {exc.strerror or exc}"}
            exports = {name: why for name in EXPORTS}
        self.exports_failed = {  # (a benchmark may skip the exports: then none is named)
            name: str(entry.get("error"))
            for name in EXPORTS
            if (entry := exports.get(name)) is not None and not entry.get("ok")
        }
        try:
            self.transition(
                status, wall, **receipt, exports=exports, error=error, exit_code=exit_code(status)
            )
        except OutputWriteError as exc:  # no room for the final receipt either: the caller says so
            said = str(exc)  # an earlier rewrite may have failed alike: its reason is the error already
            failed = error if error is not None and said in error else "; ".join(filter(None, (error, said)))
        self._close_directory()
        return failed


def open_run_files(
    out: Path | None, receipt_body: dict[str, Any], clock: Clock, *, transcripts: bool = False
) -> tuple[RunDirectory, EventLog]:
    """A run's files and its event log, before anything starts. Raises
    :class:`~asyncroll.outputs.lines.OutputWriteError` when one cannot be created (a full disk, a
    directory made read-only): run.json then says failed, or — not written at all — the directory this
    run made is removed again if empty."""
    try:
        files = RunDirectory(
            out, receipt_body, clock.wall(), transcripts=transcripts, background=not clock.virtual
        )
    except OutputWriteError as exc:
        if out is not None and not (out / "run.json").exists():
            with contextlib.suppress(OSError):  # only an empty directory: never anyone's files
                out.rmdir()
                raise OutputWriteError(f"{exc}; nothing written, {out} removed") from exc
        raise
    try:
        return files, EventLog(clock, files.events_path)
    except OSError as exc:
        raise files.abandon(f"events.jsonl: cannot create ({exc.strerror or exc})", clock.wall()) from exc
    except RuntimeError as exc:  # its writer thread ("can't start new thread": a process limit)
        why = f"events.jsonl: cannot start its writer thread ({exc}){limit_note(exc)}"
        raise files.abandon(why, clock.wall()) from exc


def _open_directory(out: Path) -> int | None:
    """A handle on the run's directory (none where it cannot be opened: its path is then all there is)."""
    try:
        return os.open(out, getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY)
    except OSError:
        return None


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


#: The files :func:`export` writes; its result has an ``{"ok": …}`` entry for each.
EXPORTS = ("trace.json", "timeline.html")
#: From this size of events.jsonl on (≈ 35k events, 1-2 s of exports; 30k trajectories: ≈ 600k events,
#: 30 s), a run says on stderr that it writes them and how to skip them: one that prints nothing for half
#: a minute after Ctrl-C gets a second Ctrl-C, then a kill -9 that loses the final run.json.
ANNOUNCE_BYTES = 10 << 20


class ExportsSkipped(BaseException):
    """Raised in :func:`export` by a stop signal (:class:`ExportStop`): the exports not written yet are
    skipped. A BaseException, as KeyboardInterrupt is: an export's ``except Exception`` would record a
    failure and go on with the next one."""


class ExportStop:
    """Lets a stop signal skip a run's exports. :meth:`signal` is called from the run's handler
    (:func:`asyncroll.runtime.signals.interruptible`) for every stop signal; while :func:`export` runs
    armed with it in the handler's thread (the main one), it raises :class:`ExportsSkipped` there, once:
    the clean-up it unwinds (a temporary file removed) is never cut short by another."""

    def __init__(self) -> None:
        self.received: str | None = None  # the first stop signal, whenever it came
        self._thread: int | None = None  # the thread writing the exports, while it does
        self._raised = False

    def signal(self, name: str) -> None:
        self.received = self.received or name
        if self._thread == threading.get_ident() and not self._raised:
            self._raised = True
            raise ExportsSkipped(name)

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        self._thread = threading.get_ident()
        try:
            yield
        finally:
            self._thread = None

    def announce(self, out: Path) -> None:
        """Say on stderr what is written now, when events.jsonl is large enough for that to take a while."""
        again = "again " if self.received else ""
        later = f"`asyncroll timeline {shlex.quote(str(out))}` writes them later"
        announce_exports(out, f" (Ctrl-C {again}to skip them; {later})")


def announce_exports(out: Path, how: str = "") -> None:
    """``writing trace.json and timeline.html … HOW`` on stderr when ``out``'s events.jsonl is at least
    :data:`ANNOUNCE_BYTES`: the exports take a while, and a command silent for half a minute looks hung."""
    try:
        size = (out / "events.jsonl").stat().st_size
    except OSError:
        return
    if size < ANNOUNCE_BYTES:
        return
    with contextlib.suppress(OSError, ValueError):  # a stderr gone or closed: the exports go on
        sys.stderr.write(
            f"writing trace.json and timeline.html from events.jsonl ({size / 2**20:.0f} MiB) …{how}\n"
        )
        sys.stderr.flush()


def export(
    out: Path,
    final: Mapping[str, Any] | None = None,
    stop: ExportStop | None = None,
    into: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """trace.json and timeline.html from one pass over events.jsonl; a failed export is recorded, never
    fatal: the run's data is safe. ``asyncroll timeline RUN_DIR`` calls this again after the fact (an
    interrupted run, or a run written by an older version). ``bench/export.py`` times it. ``final``:
    receipt fields (status, error) about to be written, which override run.json's. ``stop``: a stop signal
    during the exports skips those not written yet (recorded ``"skipped": true``); none is left half
    written. ``into``: the dict each export's result is put in as it ends (returned too), which says what
    was written when a KeyboardInterrupt cuts the exports (``asyncroll timeline``'s Ctrl-C)."""
    exports: dict[str, Any] = {} if into is None else into
    try:
        with contextlib.nullcontext() if stop is None else stop.armed():
            if stop is not None:  # armed already: a signal the moment the line is out skips them
                stop.announce(out)
            _export(out, final, exports)
    except ExportsSkipped as skip:
        mark_skipped(exports, str(skip))
    return exports


_SKIPPED = "skipped:"


def mark_skipped(exports: dict[str, Any], signal: str) -> None:
    """Each export not in ``exports`` yet recorded as skipped by the stop ``signal``."""
    for name in EXPORTS:
        why = f"{_SKIPPED} {signal} received while the exports were written"
        exports.setdefault(name, {"ok": False, "skipped": True, "error": why})


def skipped(why: str) -> bool:
    """Whether an export's ``error`` (as :attr:`RunDirectory.exports_failed` holds it) says a stop signal
    skipped it, rather than that it failed."""
    return why.startswith(_SKIPPED)


def _export(out: Path, final: Mapping[str, Any] | None, exports: dict[str, Any]) -> None:
    began = time.perf_counter()
    try:
        from asyncroll.outputs.activity import collect_activity

        activity = collect_activity(out / "events.jsonl")
    except Exception as exc:  # noqa: BLE001 - an export must never lose the run's data
        error = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        exports.update({"trace.json": error, "timeline.html": error})
        return
    parse_s = time.perf_counter() - began
    for name, module, function, extra in (
        ("trace.json", "trace", "write_trace", ()),
        ("timeline.html", "timeline", "write_timeline", (final,)),  # the page shows the run's status
    ):
        began = time.perf_counter()
        try:
            writer = getattr(importlib.import_module(f"asyncroll.outputs.{module}"), function)
            writer(out, activity, *extra)
            exports[name] = {"ok": True, "seconds": round(time.perf_counter() - began, 4)}
        except Exception as exc:  # noqa: BLE001 - an export must never lose the run's data
            exports[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    exports["events_parse_seconds"] = round(parse_s, 4)
    exports["events_skipped"] = {  # lines drawn nowhere: not valid events, or types this exporter lacks
        "invalid_lines": activity.invalid_lines,
        "unknown_types": sum(activity.unknown.values()),
    }
