"""``--help`` printed through :func:`~asyncroll.commands.common.say`, as every other line on stdout is.

click prints a help page itself, with its own ``echo``: ``asyncroll --help > /dev/full`` (or a stdout on
a full disk) ended in an ``OSError`` traceback. Every command and group of the app takes its help option
from :class:`HelpThroughSay`: a stdout that fails silences it and the command exits 1 (``cli.main``).
"""

from __future__ import annotations

from difflib import get_close_matches
from typing import Any

from typer.core import TyperGroup

from asyncroll.commands.click_errors import UsageError
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
    """The app's groups (``asyncroll``, ``asyncroll experiment``). An unknown command is offered the
    commands it starts (``asyncroll convert``: both converters; click's close match named only
    ``convert-toolmath``), else the close spellings, in the same words whichever typer is installed
    (typer 0.19, the floor, offered none)."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        try:
            return super().resolve_command(ctx, args)
        except UsageError as error:
            if not args or not error.message.startswith("No such command"):
                raise
            typed, names = args[0], sorted(self.commands)
            offered = [name for name in names if typed and name.startswith(typed)] or get_close_matches(
                typed, names
            )
            said = f"No such command {typed!r}."
            if offered:
                listed = ", ".join(repr(name) for name in offered)
                said += f" Did you mean {'one of ' if len(offered) > 1 else ''}{listed}?"
            raise UsageError(said, ctx=error.ctx) from None
