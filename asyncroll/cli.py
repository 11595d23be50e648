"""The command line: ``asyncroll …`` or ``python -m asyncroll.cli …``. Each command starts its one event
loop at its edge (``asyncio.run`` in ``commands/run.py``; the virtual clock's loop for simulations;
serve-sim's server). The commands live in ``asyncroll/commands/``, one module per family; this module
assembles them into one app.

Imports stay light at module level so that ``asyncroll --help`` starts fast; each command imports what
it needs. ``asyncroll --version`` prints the running package's version (the one run.json records).
Exit codes: 0 run complete, 1 run failed, 2 usage or validation error, 130 interrupted.
"""

from __future__ import annotations

from typing import Annotated

import typer
from typer.core import TyperCommand

from asyncroll import cli_signals
from asyncroll.commands import convert, experiment, files, optimum, run, serve, simulate
from asyncroll.commands.common import say, stderr_keeps_paths, stderr_may_go, stdout_lost
from asyncroll.commands.help_page import HelpGroup
from asyncroll.commands.single_values import PathlessCommand, SingleValueCommand
from asyncroll.std_fds import hold_standard_fds

app = typer.Typer(
    name="asyncroll",
    cls=HelpGroup,
    help="Run agentic rollouts with bounded trajectories, model requests and warm CPU workers; measure them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: rich (its markdown renderer) costs ~0.2 s of start-up
)


def _print_version(wanted: bool) -> None:
    if not wanted:
        return
    # The code's own version, the one run.json and experiment.json record. The installed metadata can be
    # another's: an editable install left from before the version changed, or a wheel in the environment
    # while ``python -m asyncroll`` runs a checkout; it printed that version for code that was not it.
    from importlib.metadata import PackageNotFoundError, version

    from asyncroll import __version__

    say(f"asyncroll {__version__}")
    try:
        installed = version("asyncroll")
    except PackageNotFoundError:  # run from a checkout that was never installed
        installed = __version__
    if installed != __version__:
        typer.echo(
            f"note: the installed asyncroll's metadata says {installed}; the code running is {__version__}"
            " (an install older than this code: pip install it again)",
            err=True,
        )
    raise typer.Exit(0)


@app.callback()
def _options(
    show_version: Annotated[
        bool,
        typer.Option("--version", is_eager=True, callback=_print_version, help="Print the version and exit."),
    ] = False,
) -> None:
    """The app's own options (``--version``); each command has its own."""


# Registered in the order ``asyncroll --help`` lists them.
app.command()(run.run)
app.command()(files.timeline)
app.command()(simulate.simulate)
app.command()(optimum.optimum)
app.command()(files.validate)
app.command(cls=PathlessCommand)(files.schema)
app.command("convert-toolmath")(convert.convert_toolmath)
app.command("convert-livecodebench")(convert.convert_livecodebench)
app.command("serve-sim", cls=PathlessCommand)(serve.serve_sim)
app.add_typer(experiment.experiment_app, name="experiment")
app.command()(experiment.report)


def _single_values_once(typer_app: typer.Typer) -> None:
    """Every command of ``typer_app`` and of its sub-apps refuses an option of one value given twice
    (click would keep the last one silently): one place, so no command can be registered without it."""
    for command in typer_app.registered_commands:
        if command.cls in (None, TyperCommand):  # typer's default, not a class a command chose
            command.cls = SingleValueCommand
    for group in typer_app.registered_groups:
        if isinstance(group.typer_instance, typer.Typer):
            _single_values_once(group.typer_instance)


_single_values_once(app)


def _unhandled_interrupt(exc: SystemExit) -> bool:
    """Whether ``exc`` is typer's exit for a KeyboardInterrupt that no command handled (parsing the options,
    building the settings): ``raise Exit(130) from`` the interrupt, then ``sys.exit`` inside its handler.
    Such an exit said nothing; a command that handles its interrupt says what it kept and exits 130 itself."""
    ended = exc.__context__
    return ended is not None and isinstance(ended.__cause__, KeyboardInterrupt)


def main(typer_app: typer.Typer | None = None, prog_name: str | None = None) -> None:
    """Run ``typer_app`` (default: the whole ``asyncroll`` app) with the CLI's exit codes and signals."""
    hold_standard_fds()  # already done by ``asyncroll``; not by ``python -m asyncroll.cli``
    cli_signals.guard()  # SIGTERM and SIGHUP stop the command as Ctrl-C does, from the first instant
    stderr_keeps_paths()
    stderr_may_go()
    try:
        (typer_app or app)(prog_name=prog_name)
    except SystemExit as exc:  # click ends every command this way
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code == 130 and _unhandled_interrupt(exc):  # typer's silent exit for a Ctrl-C: say so
            typer.echo(f"interrupted by {cli_signals.interrupted_by() or 'SIGINT'}", err=True)
        if code == 0 and stdout_lost():  # the output asked for did not all arrive (| head -1)
            code = exc.code = 1
        cli_signals.leave_with(code)
        raise
    except KeyboardInterrupt:  # a Ctrl-C no command caught (say, as one ended): 130, no traceback
        cli_signals.leave_with(130)
        typer.echo(f"interrupted by {cli_signals.interrupted_by() or 'SIGINT'}", err=True)
        raise SystemExit(130) from None
    except Exception as exc:
        name = cli_signals.interrupted_by()
        if name is None:
            raise
        # the interruption surfaced as another exception (a Ctrl-C while numpy's C extension imports
        # is an ImportError): the command was interrupted, and says so without a traceback
        cli_signals.leave_with(130)
        typer.echo(f"interrupted by {name} ({type(exc).__name__}: {exc})", err=True)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
