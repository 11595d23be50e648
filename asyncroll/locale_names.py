"""Names read from a file that this process's locale cannot hand to the operating system.

A path or a program argument given on the command line always can: Python decodes it from bytes with
``surrogateescape`` and encodes it back to the same bytes. One read from a JSON or TOML file (a settings
file's ``workload``, an experiment's ``workload.path`` or ``model.served_name``, the workload path that
``run.json`` records) is text, and under a locale whose file-name encoding is not UTF-8 (``LC_ALL=C`` with
``PYTHONUTF8=0``: ASCII) a non-ASCII character in it cannot be encoded: every ``open``, ``stat`` or
``Popen`` of it raised ``UnicodeEncodeError`` (a traceback, or every experiment arm failed at its start),
and ``Path.is_file()`` said False (a recorded workload "no longer exists"). Such a name is refused where
it is read, with its field.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, TypeVar

from pydantic import AfterValidator, BeforeValidator

_Name = TypeVar("_Name", str, Path)


def unspellable(name: str | os.PathLike[str]) -> str | None:
    """Why ``name`` cannot be passed to the operating system (a path, an argument, an environment value)
    under this process's locale (or under any: a NUL character), or None when it can."""
    text = os.fspath(name)
    if (
        "\0" in text
    ):  # JSON and TOML can spell one; the system call is refused (ValueError: embedded null byte)
        return f"{text!r}: a NUL character, which no file name, argument or environment value can hold"
    try:
        os.fsencode(text)
    except UnicodeEncodeError as exc:
        return (
            f"{text!r}: {text[exc.start : exc.end]!r} cannot be written in this locale's file-name encoding "
            f"({sys.getfilesystemencoding()}); run under a UTF-8 locale (LC_ALL=C.UTF-8, or PYTHONUTF8=1)"
        )
    return None


def _spelled(value: _Name) -> _Name:
    why = unspellable(value)
    if why is not None:
        raise ValueError(why)
    return value


def _not_empty(value: object) -> object:
    if value == "":  # Path("") is the current directory: a file's "tool_root": "" meant it, silently
        raise ValueError("an empty path: give a file or folder")
    return value


#: A string or path setting that is handed to the operating system as it is (refused by validation when
#: this locale cannot encode it; a path given as an empty string is refused too).
OsStr = Annotated[str, AfterValidator(_spelled)]
OsPath = Annotated[Path, BeforeValidator(_not_empty), AfterValidator(_spelled)]
