"""`asyncroll convert-toolmath` and `convert-livecodebench`: real datasets into workloads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from asyncroll.commands.common import Opt, fail


def convert_toolmath(
    source: Annotated[Path, Opt("--source", help="ToolMATH.json: a JSON list of tool records.")],
    functions_dir: Annotated[
        Path,
        Opt("--functions-dir", help="Folder of the tool files (DIR/<function> or DIR/function_ToolMATH/…)."),
    ],
    output: Annotated[Path, Opt("--output", help="Workload JSONL to create; must not exist.")],
    limit: Annotated[int | None, Opt(help="Keep the first N problems in seeded order.")] = None,
    seed: Annotated[int, Opt(help="Seed of the order-independent selection.")] = 0,
    answers_from_solution: Annotated[
        bool,
        Opt(
            "--answers-from-solution",
            help="Derive reference_answer from the solution's last \\boxed{…} (labelled in metadata).",
        ),
    ] = False,
) -> None:
    """Convert ToolMATH tool records: one problem per source problem, with all its tools."""
    from asyncroll.convert.toolmath import convert_toolmath as convert
    from asyncroll.errors import UsageError

    try:
        report = convert(
            source, functions_dir, output, limit=limit, seed=seed, answers_from_solution=answers_from_solution
        )
    except UsageError as exc:
        raise fail(str(exc)) from None
    hint = (
        ""
        if output.parent.resolve() == functions_dir.resolve()
        else f"; run with --tool-root {functions_dir}"
    )
    typer.echo(
        f"{output}: {report.written} of {report.problems} problems ({report.records} tool records), "
        f"seed {seed}{hint}"
    )
    if report.without_answer:
        typer.echo(
            f"note: {len(report.without_answer)} problem(s) have no \\boxed{{}} answer and no "
            f"reference_answer: {', '.join(report.without_answer[:10])}",
            err=True,
        )


def convert_livecodebench(
    source: Annotated[Path, Opt("--source", help="LiveCodeBench rows: JSON array, object or JSONL.")],
    output: Annotated[Path, Opt("--output", help="Workload JSONL to create; must not exist.")],
    limit: Annotated[int | None, Opt(help="Keep the first N problems in seeded order.")] = None,
    seed: Annotated[int, Opt(help="Seed of the order-independent selection.")] = 0,
    stdin_only: Annotated[bool, Opt("--stdin-only", help="Drop functional (LeetCode) problems.")] = False,
) -> None:
    """Convert LiveCodeBench code-generation rows to one-repair problems evaluated by lcb_evaluate."""
    from asyncroll.convert.livecodebench import convert_livecodebench as convert
    from asyncroll.errors import UsageError

    try:
        report = convert(source, output, limit=limit, seed=seed, stdin_only=stdin_only)
    except UsageError as exc:
        raise fail(str(exc)) from None
    kept = report.rows - report.skipped
    dropped = ", dropped by --stdin-only" if report.skipped else ""
    typer.echo(
        f"{output}: {report.written} of {kept} problems ({report.rows} source row(s), "
        f"{report.functional} functional{dropped}), seed {seed}"
    )
