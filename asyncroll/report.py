"""``python -m asyncroll.report --comparison … --output … [--figure]``: the same as ``asyncroll report``."""

from __future__ import annotations

if __name__ == "__main__":
    import typer

    from asyncroll.commands.experiment import report

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
    app.command()(report)  # the only command: its options are the program's own
    app(prog_name="python -m asyncroll.report")
