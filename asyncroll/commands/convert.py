"""`asyncroll convert-toolmath` and `convert-livecodebench`: real datasets into workloads."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from asyncroll.commands.common import Opt, fail, say


def convert_toolmath(
    source: Annotated[Path, Opt("--source", help="ToolMATH.json: a JSON list of tool records.")],
    functions_dir: Annotated[
        Path,
        Opt("--functions-dir", help="Folder of the tool files (DIR/<function> or DIR/function_ToolMATH/…)."),
    ],
    output: Annotated[
        str, Opt("--output", metavar="<path>", help="Workload JSONL to create; must not exist.")
    ],
    limit: Annotated[int | None, Opt(help="Keep the first N problems in seeded order.")] = None,
    seed: Annotated[int, Opt(help="Seed of the order-independent selection.")] = 0,
    answers_from_solution: Annotated[
        bool,
        Opt(
            "--answers-from-solution",
            help="Derive reference_answer from the solution's last \\boxed{…} (labelled in metadata).",
        ),
    ] = False,
    skip_unsupported: Annotated[
        bool,
        Opt(
            "--skip-unsupported",
            help="Leave out problems whose tools take an input type a workload cannot declare "
            "(a tuple, say; the release's List[List[float]] matrices are declared); they are listed on "
            "stderr. Without it they are "
            "errors.",
        ),
    ] = False,
) -> None:
    """Convert ToolMATH tool records: one problem per source problem, with all its tools."""
    from asyncroll.convert.output import output_path
    from asyncroll.convert.toolmath import convert_toolmath as convert
    from asyncroll.errors import AsyncrollError

    try:
        report = convert(
            source,
            functions_dir,
            output_path(output),
            limit=limit,
            seed=seed,
            answers_from_solution=answers_from_solution,
            skip_unsupported=skip_unsupported,
        )
    except AsyncrollError as exc:  # a usage error (2), or a write that failed (a full disk: 1)
        raise fail(str(exc), exc.exit_code) from None
    hint = (
        ""
        if report.output.parent.resolve() == functions_dir.resolve()
        else f"; run with --tool-root {shlex.quote(str(functions_dir))}"
    )
    left_out = f", {report.skipped} left out by --skip-unsupported" if report.skipped else ""
    say(
        f"{report.output}: {report.written} of {report.problems - report.skipped} problems "
        f"({report.records} tool records{left_out}), seed {seed}{hint}"
    )
    _fewer_than_limit(report.written, limit)
    _note(report.left_out, "left out: a tool takes an input type a workload cannot declare", "; ")
    _note(report.disagreements, "have a null metadata level or type: their records disagree on it", "; ")
    _note(
        report.without_answer,
        "have no reference_answer (no \\boxed{} answer, or their records box different ones; "
        "metadata.reference_answer_source says which)",
        ", ",
    )


def _note(problems: list[str], what: str, sep: str) -> None:
    """``note: N problem(s) WHAT: the first ten, and M more`` on stderr, when there are any."""
    if problems:
        more = f", and {len(problems) - 10} more" if len(problems) > 10 else ""
        typer.echo(f"note: {len(problems)} problem(s) {what}: {sep.join(problems[:10])}{more}", err=True)


def convert_livecodebench(
    source: Annotated[Path, Opt("--source", help="LiveCodeBench rows: JSON array, object or JSONL.")],
    output: Annotated[
        str, Opt("--output", metavar="<path>", help="Workload JSONL to create; must not exist.")
    ],
    limit: Annotated[int | None, Opt(help="Keep the first N problems in seeded order.")] = None,
    seed: Annotated[int, Opt(help="Seed of the order-independent selection.")] = 0,
    stdin_only: Annotated[bool, Opt("--stdin-only", help="Drop functional (LeetCode) problems.")] = False,
) -> None:
    """Convert LiveCodeBench code-generation rows to one-repair problems evaluated by lcb_evaluate."""
    from asyncroll.convert.livecodebench import convert_livecodebench as convert
    from asyncroll.convert.output import output_path
    from asyncroll.errors import AsyncrollError

    try:
        report = convert(source, output_path(output), limit=limit, seed=seed, stdin_only=stdin_only)
    except AsyncrollError as exc:  # a usage error (2), or a write that failed (a full disk: 1)
        raise fail(str(exc), exc.exit_code) from None
    kept = report.rows - report.skipped
    dropped = ", dropped by --stdin-only" if report.skipped else ""
    say(
        f"{report.output}: {report.written} of {kept} problems ({report.rows} source row(s), "
        f"{report.functional} functional{dropped}), seed {seed}"
    )
    _fewer_than_limit(report.written, limit)


def _fewer_than_limit(written: int, limit: int | None) -> None:
    """Say so when the source held fewer problems than ``--limit`` asked for: a protocol that names a
    workload size (219 problems) should not find out from a checksum later."""
    if limit is not None and written < limit:
        typer.echo(
            f"note: --limit {limit} asked for more problems than the source holds: {written} written",
            err=True,
        )
