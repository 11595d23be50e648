"""What an unknown key of a settings file most likely meant: a close spelling of a known setting, or a
setting of another section of the same file. "unknown setting" alone sent a user hunting for the typo."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from difflib import get_close_matches
from typing import Any

from asyncroll.json_checks import json_kind

#: pydantic's errors for a value that is no object where one is expected, whose messages speak Python:
#: "Input should be a valid dictionary or instance of ArmSpec" (a class name), "... or object to extract
#: fields from" (an action that is no object), "Input should be a valid dictionary".
_NOT_AN_OBJECT = frozenset({"model_type", "model_attributes_type", "dict_type", "dataclass_type"})


def validation_message(err: Mapping[str, Any]) -> str:
    """One pydantic error's message in the product's words, where pydantic's names a Python type (a
    class, ``<class 'pathlib.Path'>``) or a Python object; else pydantic's own, less "Value error, ".
    Every reader that turns a ValidationError into lines uses this, so each says it the same way."""
    kind = err.get("type")
    if kind in _NOT_AN_OBJECT:
        return f"expected a JSON object, got {json_kind(err.get('input'))}"
    if kind == "path_type":  # pydantic: "Input is not a valid path for <class 'pathlib.Path'>"
        return "Input should be a path, as a string"
    return str(err.get("msg", "invalid")).removeprefix("Value error, ")


def unknown_setting(
    key: str,
    known: Collection[str],
    sections: Mapping[str, Collection[str]] | None = None,
    aliases: Mapping[str, str] | None = None,
    noun: str = "setting",
) -> str:
    """``unknown setting``, with what ``key`` may have meant where there is a likely answer: an alias's
    setting, the closest of ``known`` (the settings where it was found), the one setting of ``known`` whose
    name starts with it (a name cut short: ``max_inflight``), or the ``sections`` (name → their settings)
    of the file that hold a setting of that name: the same section's settings first. ``noun``: what the
    keys are (a workload line's are fields)."""
    name = key.replace("-", "_")
    meant = (aliases or {}).get(name)
    close = get_close_matches(name, sorted(known), n=1, cutoff=0.8)
    if meant is None and close:
        meant = close[0]
    if meant is not None:
        return f"unknown {noun} (did you mean {meant!r}?)"
    # the same section's setting first: ``gpu.name`` is gpu.name_contains, not an arm's name
    longer = [known_name for known_name in known if known_name.startswith(name)]
    if len(longer) == 1:
        return f"unknown {noun} (did you mean {longer[0]!r}?)"
    owners = [section for section, names in (sections or {}).items() if name in names]
    if owners:
        return f"unknown {noun} (a {noun} of {owners[0]}: {owners[0]}.{name})"
    return f"unknown {noun}"
