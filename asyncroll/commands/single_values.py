"""Every command's refusal of an option of one value given more than once.

click keeps the last of a repeated option silently: ``run --workload a.jsonl --workload b.jsonl`` ran
b.jsonl, ``--policy fifo --policy sync`` ran sync, ``--progress --no-progress`` was off. Each command of
the app is a :class:`SingleValueCommand`, which refuses that as a usage error (exit 2) naming the option.
Options meant to repeat (``multiple=True``: a ``list[...]`` parameter; ``count=True``) are not touched.

The same command class does the app's other checks of a command line before the command runs: a path
given as an empty string (:func:`empty_paths`), an unknown option (answered with
:func:`likely_options`), and a current directory removed since (``uses_cwd``; :class:`PathlessCommand`
takes no path and skips it).
"""

from __future__ import annotations

import inspect
import os
from collections import Counter
from collections.abc import Iterable
from difflib import get_close_matches
from pathlib import Path
from typing import Any, get_args, get_type_hints

from typer.core import TyperCommand

from asyncroll.commands.click_errors import NoSuchOption
from asyncroll.commands.common import fail
from asyncroll.commands.help_page import HelpThroughSay


def repeated_single_values(order: Iterable[Any]) -> list[tuple[str, int]]:
    """The options of one value among ``order`` (the parser's params, once per occurrence), each with how
    many times it was given, where that is more than once."""
    counts: Counter[Any] = Counter(order)
    repeated = []
    for param, n in counts.items():
        if n < 2 or param.param_type_name != "option" or param.multiple or param.count:
            continue  # a list option or a counter is meant to repeat (an argument is parsed once)
        if not param.expose_value:
            continue  # --help: it ends the command before anything is read
        repeated.append(("/".join([*param.opts, *param.secondary_opts]), n))
    return repeated


def empty_paths(callback: Any, params: Iterable[Any], values: dict[str, Any]) -> list[str]:
    """The path options and arguments given as an empty string (``--tool-root "$ROOT"`` with ``ROOT``
    unset), which ``Path("")`` reads as the current directory, silently: each as errors show it. The
    command function's annotations say which parameters are paths (only read when a value is empty)."""
    given = {name: v if isinstance(v, list | tuple) else [v] for name, v in values.items()}
    if callback is None or not any("" in v for v in given.values()):
        return []
    hints = get_type_hints(inspect.unwrap(callback))
    empty = []
    for param in params:
        if "" in given.get(param.name, ()) and _is_path(hints.get(param.name)):
            opt = param.param_type_name == "option"
            empty.append(
                f"Option '{param.opts[0]}'" if opt else f"Argument '{param.metavar or param.name.upper()}'"
            )
    return empty


def _is_path(hint: Any) -> bool:
    """``Path``, ``Path | None`` or ``list[Path]``."""
    return hint is Path or any(_is_path(arg) for arg in get_args(hint))


def likely_options(typed: str, known: Iterable[str]) -> list[str]:
    """What an unknown option most likely meant: a close spelling of one of ``known``, or the options
    whose names start with it (cut short: ``--max-inflight``). click offered any name 60% alike, which
    sent ``simulate --config`` to ``--inflight``."""
    names = sorted(set(known))
    close = get_close_matches(typed, names, n=3, cutoff=0.75)
    longer = [name for name in names if name.startswith(typed) and name not in close]
    return close + (longer if len(close) + len(longer) <= 3 else [])


class SingleValueCommand(HelpThroughSay, TyperCommand):
    """A command whose options of one value may each be given once (and whose ``--help`` goes through
    ``say``: :mod:`asyncroll.commands.help_page`); an unknown option is answered with the options it
    most likely meant (:func:`likely_options`), or none. Started in a current directory that was removed
    since (``rmdir`` from another shell), it is refused (exit 2), not with a traceback from the first
    relative path or ``os.getcwd()`` it meets: after parsing, so that its ``--help`` is still shown."""

    #: False for a command that takes no path (:class:`PathlessCommand`): it never needs the directory
    uses_cwd = True

    def invoke(self, ctx: Any) -> Any:
        if self.uses_cwd:
            try:
                os.getcwd()
            except FileNotFoundError:
                raise fail(
                    "the current directory no longer exists (removed?): cd into one that does"
                ) from None
        return super().invoke(ctx)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            if not ctx.resilient_parsing:  # shell completion parses partial lines: never refused there
                values, _, order = self.make_parser(ctx).parse_args(args=list(args))
                for name, n in repeated_single_values(order):
                    ctx.fail(f"Option '{name}' given {n} times: it takes one value (give it once)")
                for name in empty_paths(self.callback, self.get_params(ctx), values):
                    ctx.fail(f"{name} is an empty path (an unset shell variable?): give a file or folder")
            return super().parse_args(ctx, args)
        except NoSuchOption as exc:
            if exc.option_name.startswith("--"):
                known = [
                    name for param in self.get_params(ctx) for name in (*param.opts, *param.secondary_opts)
                ]
                exc.possibilities = likely_options(exc.option_name, (n for n in known if n.startswith("--")))
            raise


class PathlessCommand(SingleValueCommand):
    """A command that takes no path (``serve-sim``, ``schema``, ``experiment schema``): it runs in a removed
    current directory."""

    uses_cwd = False
