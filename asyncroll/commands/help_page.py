"""``--help`` printed through :func:`~asyncroll.commands.common.say`, as every other line on stdout is.

click prints a help page itself, with its own ``echo``: ``asyncroll --help > /dev/full`` (or a stdout on
a full disk) ended in an ``OSError`` traceback. Every command and group of the app takes its help option
from :class:`HelpThroughSay`: a stdout that fails silences it and the command exits 1 (``cli.main``).
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperGroup

from asyncroll.commands.common import say


def _show_help(ctx: Any, param: Any, value: bool) -> None:  # typer's own click: its types are private
    if value and not ctx.resilient_parsing:  # shell completion parses partial lines: no page then
        say(ctx.get_help())
        ctx.exit()


class HelpThroughSay:
    """A click command (or group) mixin whose ``--help`` prints its page with ``say``."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            option.callback = _show_help
        return option


class HelpGroup(HelpThroughSay, TyperGroup):
    """The app's groups (``asyncroll``, ``asyncroll experiment``)."""
