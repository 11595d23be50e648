"""Where a loaded experiment config's settings came from: named by a message checked after loading."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, eq=False)
class Origin:
    """Where a loaded config's settings came from, for a message checked after loading (the workload's):
    the file read, and the option (a script's ``--workload``) that gave a setting. No part of the
    config's value: two configs of the same settings are equal whichever file or option gave them."""

    source: Path | None = None
    flags: dict[str, str] = field(default_factory=dict)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Origin)

    def __hash__(self) -> int:
        return 0
