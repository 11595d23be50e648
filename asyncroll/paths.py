"""A path the user gave, made absolute for the run: :func:`resolved`."""

from __future__ import annotations

from pathlib import Path


def resolved(path: Path) -> Path:
    """``path`` with its symbolic links resolved, or only made absolute where it cannot be resolved: a
    symlink loop (``RuntimeError`` on Python 3.11, an ``OSError`` elsewhere). Such a path is no folder
    and no file, and the check that reads it next refuses it with the system's words."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return path.absolute()
