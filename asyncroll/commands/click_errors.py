"""click's exceptions, from the click that typer runs on.

typer 0.26 on carries its own copy of click (``typer._click``); before that it ran on the ``click``
package, and ``typer>=0.19`` allows both. An ``except`` naming the other copy's class catches nothing,
and an import of ``typer._click`` on typer 0.19-0.25 failed every command with ``ModuleNotFoundError``.
"""

from __future__ import annotations

try:
    from typer._click.exceptions import ClickException, NoSuchOption, UsageError
except ModuleNotFoundError:  # typer < 0.26 (the ignore is needed there only: hence unused-ignore)
    from click.exceptions import ClickException, NoSuchOption, UsageError  # type: ignore[assignment,no-redef,unused-ignore]

__all__ = ["ClickException", "NoSuchOption", "UsageError"]
