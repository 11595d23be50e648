"""A measurement script's result file (``--output``, ``--json``): checked before measuring, written only
as a new file.

The benchmarks and scripts measure for minutes before they write their figures, so where they will go
is checked first (:func:`refusal`), and the file is then created, never overwritten
(:func:`write_new`); one that cannot be written at the end is said, and the caller prints the result
instead of losing it to a traceback.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def refusal(path: Path, option: str) -> str | None:
    """Why ``path`` cannot take a new result file (it exists, or its folder does not), or None."""
    if os.path.lexists(path):
        return f"{option} {path} already exists; choose a new file"
    if not path.absolute().parent.is_dir():
        return f"{option} {path}: its folder does not exist"
    return None


def write_new(path: Path, text: str, option: str) -> str | None:
    """Write ``text`` to ``path`` as a new file; None, or an error line when it could not (the file
    appeared meanwhile, the disk is full). A file this call created and could not finish is removed."""
    try:
        handle = path.open("x", encoding="utf-8")
    except OSError as exc:
        return f"error: {option} {path}: cannot write ({exc.strerror or exc}); the result follows"
    try:
        with handle:
            handle.write(text)
    except OSError as exc:
        with contextlib.suppress(OSError):
            path.unlink()
        return f"error: {option} {path}: cannot write ({exc.strerror or exc}); the result follows"
    return None
