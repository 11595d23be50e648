"""`asyncroll experiment run|plan|schema` and `asyncroll report`: paired experiments and their report."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from asyncroll.commands.common import Opt, fail, say
from asyncroll.commands.help_page import HelpGroup
from asyncroll.commands.single_values import PathlessCommand

_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # a full disk, a quota, a file size limit

experiment_app = typer.Typer(
    cls=HelpGroup,
    help="Paired policy experiments: a fresh inference server per arm, staged gates, receipts, resume.",
    no_args_is_help=True,
    rich_markup_mode=None,  # plain help: rich (its markdown renderer) costs ~0.2 s of start-up
)


def _experiment_config(config: Path, overrides: dict[str, Any] | None = None) -> Any:
    from asyncroll.errors import UsageError
    from asyncroll.experiment.config import load_experiment_config

    try:
        return load_experiment_config(config, overrides)
    except UsageError as exc:
        raise fail(str(exc), exc.exit_code) from None


@experiment_app.command("run")
def experiment_run(
    config: Annotated[Path, Opt("--config", help="Experiment config (JSON; see `experiment schema`).")],
    output: Annotated[Path, Opt("--output", help="Experiment directory to create (or resume).")],
    resume: Annotated[
        bool, Opt("--resume", help="Continue an interrupted experiment; finished arms are not re-run.")
    ] = False,
) -> None:
    """Run an experiment: qualification → opportunity → activation gates, then the paired comparison."""
    from asyncroll.errors import UsageError
    from asyncroll.experiment.runner import ExperimentRunner

    cfg = _experiment_config(config)
    runner = ExperimentRunner(cfg, output, resume=resume, config_path=config, echo=say)
    try:
        outcome = runner.run()
    except UsageError as exc:
        raise fail(str(exc), exc.exit_code) from None
    except OSError as exc:  # a receipt that could not be written (a full disk): the files say how far it got
        room = " once there is room" if exc.errno in _NO_ROOM else ""
        raise fail(f"experiment failed: {exc}; --resume continues it{room}", 1) from None
    if outcome.exit_code == 0:
        say(outcome.message)
    else:
        typer.echo(outcome.message, err=True)
    raise typer.Exit(outcome.exit_code)


@experiment_app.command("plan")
def experiment_plan(
    config: Annotated[Path, Opt("--config", help="Experiment config (JSON).")],
    output: Annotated[Path | None, Opt("--output", help="Shown in the client commands.")] = None,
) -> None:
    """Validate a config (and the workload against a declared workload.sha256, as `run` does) and print
    every server and client command, in order; starts nothing."""
    from asyncroll.errors import UsageError
    from asyncroll.experiment.preflight import checked_plan, deprecated_policies

    cfg = _experiment_config(config)
    try:
        plan = checked_plan(cfg, output)  # a declared workload.sha256 is checked, as `run` checks it
    except UsageError as exc:
        raise fail(str(exc), exc.exit_code) from None
    for warning in deprecated_policies(cfg):
        typer.echo(warning, err=True)
    say(plan)


@experiment_app.command("schema", cls=PathlessCommand)
def experiment_schema() -> None:
    """Print the JSON Schema of an experiment config."""
    from asyncroll.experiment.config import ExperimentConfig
    from asyncroll.schemas import standard_bounds

    say(json.dumps(standard_bounds(ExperimentConfig.model_json_schema()), indent=2))


def report(
    comparison: Annotated[Path, Opt("--comparison", help="comparison.json of an experiment.")],
    output: Annotated[Path, Opt("--output", help="Folder for REPORT.md, aggregate.json and the figure.")],
    figure: Annotated[bool, Opt("--figure", help="Also draw the three-panel figure (PNG and PDF).")] = False,
) -> None:
    """Report an experiment: medians, paired ratios, % change with t and bootstrap intervals, figure."""
    from asyncroll.errors import AsyncrollError
    from asyncroll.experiment.report import write_report

    verdicts: list[str] = []
    try:
        files = write_report(
            comparison,
            output,
            figure=figure,
            warn=lambda text: typer.echo(text, err=True),
            tell=verdicts.append,
        )
    except AsyncrollError as exc:  # a usage error (2), or a report that could not be written (1)
        raise fail(str(exc), exc.exit_code) from None
    say("wrote " + ", ".join(str(f) for f in files))
    for line in verdicts:  # each arm's answer on its headline metric (REPORT.md's "Did it help?")
        say(line)
