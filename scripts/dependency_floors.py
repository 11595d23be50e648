"""Print pip requirements that pin every dependency of ``pyproject.toml`` at its floor (``NAME>=V`` becomes
``NAME==V``), plus the dev extra's click (the tests' ``CliRunner`` needs its floor, 8.2), one per line.

``.ci/run`` installs the project into a second environment with them and runs the whole suite there, so a
floor stays a version the package runs on (pip keeps any version that meets a floor in a user's
environment). Run: ``python scripts/dependency_floors.py [PYPROJECT]`` (default: ./pyproject.toml).
"""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

# NAME>=FLOOR, or NAME>=FLOOR,<CAP (a next major version that is another API: httpx 1.0)
FLOOR = re.compile(r"([A-Za-z0-9_.-]+)>=([0-9][0-9.]*)(?:,<[0-9][0-9.]*)?")


def floors(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    wanted = [
        *project["dependencies"],
        *(r for r in project["optional-dependencies"]["dev"] if r.startswith("click")),
    ]
    pins = []
    for requirement in wanted:
        match = FLOOR.fullmatch(requirement.strip())
        if match is None:
            raise SystemExit(
                f"{pyproject}: {requirement!r} is not NAME>=VERSION"
                " (or NAME>=VERSION,<CAP); pin its floor by hand"
            )
        pins.append(f"{match[1]}=={match[2]}")
    return pins


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pyproject", nargs="?", type=Path, default=Path("pyproject.toml"))
    pyproject = parser.parse_args(argv).pyproject
    try:
        print("\n".join(floors(pyproject)))
    except (OSError, tomllib.TOMLDecodeError, KeyError) as exc:
        raise SystemExit(f"{pyproject}: cannot read its dependencies: {exc}") from None


if __name__ == "__main__":
    main()
