"""`simulate --sweep --progress`: the cells done, on stderr (redrawn in place on a terminal)."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from asyncroll.commands.common import seconds


class SweepProgress:
    """Called with ``(done, total, row)`` after each cell; :meth:`end` ends a line a stop cut short.

    On a terminal the line is redrawn with ``\\r`` within the terminal's width as it is now (as a run's
    progress line) and ended with a newline after the last cell, or by :meth:`end` when the sweep stopped
    before it (an interrupt, a failing cell), so the message that follows starts a line of its own.
    Elsewhere each cell is a line of its own."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._drawn = 0  # characters of the redrawn line now on the terminal (0: none, or it was ended)
        self._failed = False

    @classmethod
    def wanted(cls, wanted: bool | None) -> SweepProgress | None:
        """``--progress`` (``True``), ``--no-progress`` (``False``) or the default: only on a terminal."""
        stream = sys.stderr
        if stream is None:  # started with stderr closed (`2>&-`): Python has no sys.stderr, nowhere to draw
            return None
        return cls(stream) if (stream.isatty() if wanted is None else wanted) else None

    def __call__(self, done: int, total: int, row: dict[str, Any]) -> None:
        line = (
            f"[{done}/{total}] {row['policy']} {row['active']} / {row['inflight']} / {row['workers']} "
            f"seed {row['seed']}: makespan {seconds(row['makespan_s'], ' s')}"
        )
        if not self._tty:
            self._write(line + "\n")
            return
        from asyncroll.runtime.progress import in_foreground, line_width, redraw

        if not in_foreground(self._stream):  # a background job (`&`) leaves the terminal to the shell
            return
        width = line_width(self._stream)
        self._write(redraw(line, self._drawn, width) + ("\n" if done == total else ""))
        self._drawn = 0 if done == total else min(len(line), width)

    def end(self) -> None:
        """End a redrawn line the sweep left unfinished (no-op otherwise)."""
        from asyncroll.runtime.progress import in_foreground

        if self._drawn and in_foreground(self._stream):
            self._drawn = 0
            self._write("\n")

    def _write(self, text: str) -> None:
        if self._failed:  # a stream that failed once (its reader gone, a full disk) draws no more
            return
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):  # as a run's progress line: it ends the line, never the sweep
            self._failed = True
