"""``python -m asyncroll.report --comparison … --output … [--figure]``: the same as ``asyncroll report``
(an option given twice refused, the exit codes and signals of :func:`asyncroll.cli.main`)."""

from __future__ import annotations

if __name__ == "__main__":
    from asyncroll import cli_signals

    with cli_signals.starting():
        import typer

        from asyncroll.cli import main
        from asyncroll.commands.experiment import report
        from asyncroll.commands.single_values import SingleValueCommand

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
    app.command(cls=SingleValueCommand)(report)  # the only command: its options are the program's own
    main(app, prog_name="python -m asyncroll.report")
