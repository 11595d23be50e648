"""What an unknown key of a settings file most likely meant: a close spelling of a known setting, or a
setting of another section of the same file. "unknown setting" alone sent a user hunting for the typo."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from difflib import get_close_matches


def unknown_setting(
    key: str,
    known: Collection[str],
    sections: Mapping[str, Collection[str]] | None = None,
    aliases: Mapping[str, str] | None = None,
) -> str:
    """``unknown setting``, with what ``key`` may have meant where there is a likely answer: an alias's
    setting, the closest of ``known`` (the settings where it was found), or the ``sections`` (name →
    their settings) of the file that hold a setting of that name."""
    name = key.replace("-", "_")
    meant = (aliases or {}).get(name)
    close = get_close_matches(name, sorted(known), n=1, cutoff=0.8)
    if meant is None and close:
        meant = close[0]
    if meant is not None:
        return f"unknown setting (did you mean {meant!r}?)"
    owners = [section for section, names in (sections or {}).items() if name in names]
    if owners:
        return f"unknown setting (a setting of {owners[0]}: {owners[0]}.{name})"
    return "unknown setting"
