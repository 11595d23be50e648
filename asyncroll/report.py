"""``python -m asyncroll.report --comparison … --output … [--figure]``: the same as ``asyncroll report``."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from asyncroll.cli import app

    sys.exit(app(["report", *sys.argv[1:]]))
