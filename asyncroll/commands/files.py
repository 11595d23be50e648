"""Commands about files: `validate` a workload, print output `schema`s, regenerate a run's `timeline`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from asyncroll.commands.common import Opt, fail, say
from asyncroll.errors import no_directory
from asyncroll.json_depth import json_loads, read_json_object
from asyncroll.paths import resolved


def validate(
    workload: Annotated[Path, typer.Argument(help="Workload JSONL to check.", metavar="WORKLOAD")],
    tool_root: Annotated[
        Path | None, Opt(help="Root of trusted tool files (default: the workload's folder).")
    ] = None,
    backend: Annotated[
        str, Opt(help="Backend the workload is meant for (scripted needs scripts).")
    ] = "scripted",
) -> None:
    """Check a workload without running it; reports every problem, not just the first (a line's
    cross-field checks — its tools, its script's calls, a duplicate id — once its fields are valid)."""
    from typing import get_args

    from asyncroll.config import BackendName
    from asyncroll.workload import scan_workload

    if backend not in get_args(BackendName):  # the same choices `run` accepts
        raise fail(f"--backend {backend!r}: choose from {', '.join(get_args(BackendName))}")
    if tool_root is not None and not tool_root.is_dir():
        raise fail(f"--tool-root {tool_root}: {no_directory(tool_root)}")
    root = tool_root or workload.parent
    root = resolved(root)  # a symlink loop: a workload in it is refused as unreadable by the scan
    scan = scan_workload(workload, root, scripted=backend == "scripted")
    if scan.problems:
        for line in scan.messages():
            typer.echo(line, err=True)
        typer.echo(f"{workload}: {scan.error_summary()}", err=True)
        raise typer.Exit(2)
    problems = f"{scan.count} problem{'' if scan.count == 1 else 's'}"
    tools = f"{len(scan.tools)} distinct tool{'' if len(scan.tools) == 1 else 's'}"
    say(f"{workload}: ok, {problems}, {tools}, sha256 {scan.sha256}")


def schema(
    which: Annotated[str, typer.Argument(help="workload | events | run | summary | config | all")] = "all",
) -> None:
    """Print JSON Schemas of workload lines, events, run.json, summary.json and the run config."""
    from asyncroll.schemas import schemas

    all_schemas = schemas()
    if which != "all" and which not in all_schemas:
        raise fail(f"unknown schema {which!r}; choose from {', '.join(['all', *all_schemas])}")
    chosen = all_schemas if which == "all" else all_schemas[which]
    say(json.dumps(chosen, indent=2))


def timeline(
    run_dir: Annotated[Path, typer.Argument(help="A run directory holding events.jsonl.", metavar="RUN_DIR")],
) -> None:
    """Regenerate trace.json and timeline.html of a finished (or interrupted) run from its events."""
    try:
        os.stat(run_dir)  # a name too long, say: is_dir() would raise
    except (FileNotFoundError, NotADirectoryError):
        pass  # said below
    except OSError as exc:
        raise fail(f"{run_dir}: {exc.strerror or exc}") from None
    if not run_dir.is_dir():
        raise fail(f"{run_dir}: {no_directory(run_dir)}")
    if not (run_dir / "events.jsonl").is_file():
        raise fail(f"{run_dir}: no events.jsonl (not a run directory?)")
    if not os.access(run_dir, os.W_OK | os.X_OK):  # another user's run, say: the exports go beside events
        raise fail(
            f"{run_dir}: this user may not write there, where trace.json and timeline.html go; copy the run "
            "directory (cp -r) and give the copy"
        )
    still = still_running(run_dir)
    if still is not None:
        raise fail(f"{run_dir}: the run is still going ({still}); its own exports follow when it ends")
    from asyncroll.outputs.rundir import EXPORTS, announce_exports, export

    other = other_schema_version(run_dir)
    if other is not None:
        raise fail(
            f"{other}: draw it with the asyncroll that wrote the run (run.json: versions.asyncroll); its "
            "files are kept as they are"
        )
    exported = [name for name in EXPORTS if (run_dir / name).exists()]
    if (run_dir / "events.jsonl").stat().st_size == 0 and exported:
        raise fail(
            f"{run_dir / 'events.jsonl'} is empty: nothing to draw; the existing {' and '.join(exported)} "
            "kept",
            1,
        )
    announce_exports(run_dir)
    from asyncroll.outputs.receipt import record_regenerated_exports

    exports: dict[str, Any] = {}
    try:
        export(run_dir, _never_finished(run_dir), into=exports)
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP (cli_signals.guard): exit 130, said
        from asyncroll.cli_signals import interrupted_by
        from asyncroll.outputs.rundir import mark_skipped

        by = interrupted_by() or "SIGINT"
        done = [name for name in EXPORTS if exports.get(name, {}).get("ok")]
        note = ""
        if done:  # the one written is the run's export now: run.json says so, and which was skipped
            mark_skipped(exports, by)
            unrecorded = record_regenerated_exports(run_dir, exports)
            note = f"; {run_dir / done[0]} was written" + ("" if unrecorded is None else f" ({unrecorded})")
        typer.echo(
            f"interrupted by {by}; {run_dir}: an export not finished is left as it was (none is half "
            f"written){note}",
            err=True,
        )
        raise typer.Exit(130) from None

    failed = [f"{name}: {exports[name]['error']}" for name in EXPORTS if not exports[name]["ok"]]
    written = [str(run_dir / name) for name in EXPORTS if exports[name]["ok"]]
    if failed:
        # the one written is the run's export now: run.json says so, and which one failed
        unrecorded = record_regenerated_exports(run_dir, exports) if written else None
        kept = f" ({written[0]} was written)" if written else ""
        note = "" if unrecorded is None else f"; warning: {unrecorded}"
        raise fail("export failed: " + "; ".join(failed) + kept + note, 1)
    say(f"wrote {run_dir / 'trace.json'} and {run_dir / 'timeline.html'}")
    unrecorded = record_regenerated_exports(run_dir, exports)
    if unrecorded is not None:
        typer.echo(f"warning: {unrecorded}", err=True)
    invalid = exports.get("events_skipped", {}).get("invalid_lines", 0)
    if invalid:
        typer.echo(
            f"warning: {invalid} line(s) of {run_dir / 'events.jsonl'} are not valid events (a file cut "
            "short or damaged?) and were skipped: the exports show only the valid ones",
            err=True,
        )


def other_schema_version(run_dir: Path) -> str | None:
    """Where ``run_dir`` says another schema version wrote it — run.json's ``schema_version``, or the
    ``v`` of the first event in events.jsonl (one version writes a whole run) — else None. An unreadable
    file is not judged here: the exports skip or report what they cannot read."""
    from asyncroll.events import SCHEMA_VERSION
    from asyncroll.outputs.receipt import RECEIPT_SCHEMA_VERSION

    receipt = read_json_object(run_dir / "run.json")
    if (
        receipt is not None
        and receipt.get("schema_version", RECEIPT_SCHEMA_VERSION) != RECEIPT_SCHEMA_VERSION
    ):
        return (
            f"{run_dir / 'run.json'}: schema_version {repr(receipt['schema_version'])[:40]}; this "
            f"asyncroll reads run.json version {RECEIPT_SCHEMA_VERSION} only"
        )
    try:
        handle = (run_dir / "events.jsonl").open("rb")
    except OSError:
        return None
    with handle:
        for number, line in enumerate(handle, 1):
            try:
                event = json_loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(event, dict) and "v" in event:
                if event["v"] == SCHEMA_VERSION:
                    return None
                return (
                    f"{run_dir / 'events.jsonl'} line {number}: event schema version "
                    f"{repr(event['v'])[:40]}; this asyncroll reads version {SCHEMA_VERSION} only"
                )
    return None


def _never_finished(run_dir: Path) -> dict[str, Any] | None:
    """For a run whose receipt still says preparing or running, its process gone (killed outright): the
    page's status says so, rather than "running". None for a run that ended (its receipt says how)."""
    receipt = read_json_object(run_dir / "run.json") or {}
    status = receipt.get("status")
    if status not in ("preparing", "running") or receipt.get("error"):
        return None
    return {"status": status, "error": "run.json never finalised: its process ended without a word (killed?)"}


def still_running(run_dir: Path) -> str | None:
    """Why ``run_dir`` belongs to a run in progress (its receipt says so and its process, on this host,
    is alive), else None. A run killed outright keeps ``running`` in its receipt; it can be exported."""
    import socket
    from datetime import datetime

    import psutil

    from asyncroll.proctree import start_mark

    try:
        receipt = json_loads((run_dir / "run.json").read_text())
        status, pid = receipt["status"], receipt["pid"]
        hostname = receipt["host"]["hostname"]
        created = datetime.fromisoformat(receipt["created_at"]).timestamp()
    except (OSError, ValueError, RecursionError, KeyError, TypeError):
        return None
    if status not in ("preparing", "running") or not isinstance(pid, int) or hostname != socket.gethostname():
        return None
    mark = receipt.get("pid_start")
    try:
        process = psutil.Process(pid)
        # the same process, not a later one given a reused pid: its start mark (no wall-clock step moves
        # it); a receipt without one: it started before the receipt was written
        same = start_mark(pid) == mark if isinstance(mark, str) else process.create_time() <= created + 1
        alive = same and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return None
    return f"status {status!r}, process {pid} alive" if alive else None
