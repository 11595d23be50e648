"""A ``--config`` file of run settings (JSON, or TOML named ``.toml``; a run's run.json, whose recorded
settings run it again): read and checked (:func:`load_config_file`), each setting named by where it came
from in errors (:func:`config_file_origins`), and the relative paths it holds checked from the current
directory (:func:`config_file_paths_missing`). The settings themselves are
:class:`~asyncroll.config.RunConfig`'s."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from json import JSONDecodeError
from pathlib import Path
from typing import Any

from asyncroll.config import MAX_CONFIG_BYTES, RunConfig
from asyncroll.errors import UsageError
from asyncroll.json_checks import (
    LONE_SURROGATE,
    json_error_text,
    json_kind,
    lone_surrogate_at,
    not_utf8,
    unique_keys,
    utf8_text,
)
from asyncroll.json_depth import json_loads
from asyncroll.receipt_settings import is_receipt, other_version, receipt_settings


def load_config_file(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """Read a JSON or TOML file of RunConfig fields (dashes or underscores both accepted): the settings
    by field name, and each field's name as the file spells it (for error messages). Two spellings of one
    setting (``cpu-workers`` and ``cpu_workers``) are refused: which one wins would be a guess."""
    try:
        with path.open("rb") as file:  # not read_text: /dev/zero or a mistaken model file filled memory
            raw = file.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise UsageError(
                f"--config {path}: larger than {MAX_CONFIG_BYTES >> 20} MiB: not a file of settings (a run's "
                "settings take well under a kilobyte)"
            )
        text = utf8_text(raw)  # a byte order mark (Notepad's) as a workload's
    except OSError as exc:
        raise UsageError(f"--config {path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise UsageError(f"--config {path}: {not_utf8(exc)}") from exc
    toml = path.suffix.lower() == ".toml"  # anything else is read as JSON
    try:
        # tomllib refuses a key given twice itself; json keeps the last one unless told otherwise
        data = tomllib.loads(text) if toml else json_loads(text, object_pairs_hook=unique_keys)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, TOMLDecodeError, a repeated key
        why = (
            f"{exc.msg} (line {exc.lineno}, column {exc.colno})"
            if isinstance(exc, JSONDecodeError)
            else "arrays or inline tables nested too deep (Python's recursion limit)"
            if toml and isinstance(exc, RecursionError)
            else json_error_text(exc)
        )
        at = re.search(r"\(at line (\d+), column \d+\)", str(exc)) if toml else None
        if at is not None and int(at[1]) <= len(lines := text.split("\n")):  # tomllib names no key: the line
            why = f"{exc}: {lines[int(at[1]) - 1].strip()[:120]!r}"
        # a .yaml or .cfg file is read as JSON: say so, or "not valid JSON" reads as a broken byte
        plain = toml or path.suffix.lower() == ".json"
        read_as = "" if plain else " (a --config file is JSON, or TOML named .toml)"
        raise UsageError(f"--config {path}: not valid {'TOML' if toml else 'JSON'}: {why}{read_as}") from exc
    if not isinstance(data, dict):
        raise UsageError(f"--config {path}: must hold an object of settings")
    if is_receipt(data):  # a run's run.json: that run's settings (asyncroll/receipt_settings.py)
        if (other := other_version(data)) is not None:
            raise UsageError(f"--config {path}: {other}")
        data = receipt_settings(data, path)
    elif "schema_version" in data and "command" in data:  # no settings file holds these: they are no setting
        # run.json's shape with its settings damaged: read as a settings file, it was refused for its
        # first object ("setting 'versions': a group of settings"), which says nothing of what is wrong
        held = json_kind(data["config"]) if "config" in data else "missing"
        raise UsageError(
            f"--config {path}: a run's run.json whose 'config' is {held}, not an object of settings: "
            "nothing to run again"
        )
    surrogate = lone_surrogate_at(data)  # JSON escapes one ("\udc80"); no later write could hold it
    if surrogate is not None:
        where = "a setting's name" if surrogate == "line" else f"setting {surrogate.split('.')[0]!r}"
        raise UsageError(f"--config {path}: {where}: {LONE_SURROGATE}")
    values: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if isinstance(value, dict):  # a TOML table, a JSON object: no setting is one
            raise UsageError(
                f"--config {path}: setting {key!r}: a group of settings, not a value: a run's settings are "
                "the file's top-level keys, in no section"
            )
        if name in spelled:
            raise UsageError(f"--config {path}: settings {spelled[name]!r} and {key!r} are the same setting")
        values[name], spelled[name] = value, str(key)
    return {k: v for k, v in values.items() if not _is_default(k, v)}, spelled


def _is_default(name: str, value: Any) -> bool:
    """Whether a file's value is its setting's default, of the default's own JSON type (``2.0`` or ``true``
    is no default of 2 or 1: it is refused as a flag's would be). Such a value is left out, as if not
    written: a shared file, or a run's recorded settings, that spells a default out (``endpoint`` read with
    the scripted backend, ``evaluation_timeout = null``) is no setting given against the run. A whole
    number is a float default's value too (TOML's ``request_timeout = 120``, as ``--request-timeout 120``)."""
    field = RunConfig.model_fields.get(name)
    if field is None or field.is_required():
        return False
    default = field.default
    whole = type(value) is int and type(default) is float  # not a bool: no float setting takes one
    return (type(value) is type(default) or whole) and value == default


def config_file_origins(path: Path, spelled: Mapping[str, str], keys: Iterable[str]) -> dict[str, str]:
    """Each setting read from the config file ``path`` (``keys``: field names; ``spelled``: as the file
    writes them), named as its errors should name it."""
    return {key: f"--config {path}: setting {spelled.get(key, key)!r}" for key in keys}


def config_file_paths_missing(
    config: Path, values: Mapping[str, Any], origins: Mapping[str, str]
) -> list[str]:
    """A relative ``workload`` or ``tool_root`` read from the config file ``config`` that is not found
    from the current directory, where it is taken from (as a flag's): each named with its setting, and
    with a hint where the file's folder holds it (an experiment config's paths are taken from there); and
    a path read from it that starts with ``~``, which no shell expanded there (``"output": "~/runs/a"``
    made a folder named ``~`` in the current directory). Read from the settings as given (``values``),
    before they are validated, so that these are told with the other settings' problems."""
    out: list[str] = []
    tilde: set[str] = set()
    paths = {
        key: Path(value)
        for key in ("workload", "output", "tool_root")
        if key in origins and isinstance(value := values.get(key), str | os.PathLike) and os.fspath(value)
    }
    for key, path in paths.items():
        text = os.fspath(path)
        if os.path.expanduser(text) != text:
            tilde.add(key)
            out.append(
                f"{origins[key]}: {text!r}: a config file's path is not expanded as a shell expands '~' (it "
                f"is taken as a folder named {text.split('/')[0]!r} in the current directory): write "
                f"{os.path.expanduser(text)}"
            )
    for key, path in paths.items():
        if key == "output" or key in tilde or path.is_absolute() or os.path.lexists(path):
            continue  # an output is made; a path starting with "~" is said above
        hint = ""
        if os.path.lexists(config.parent / path):
            hint = f"; relative to the config file's folder it is {config.parent / path}: write that path"
        out.append(
            f"{origins[key]}: {str(path)!r} not found from the current directory {Path.cwd()} (a relative "
            f"path in a config file is taken from there, as a flag's is){hint}"
        )
    return out
