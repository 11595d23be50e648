"""Sweeps: policies × operating points (active, inflight, workers) × seeds, one simulation per cell.

Each seed jitters the workload's timings once (:mod:`asyncroll.simulation.perturb`), so every policy and
operating point of a seed sees the same durations. Each cell runs the real runtime on a virtual clock
without writing files; the sweep writes ``sweep.csv`` (one row per cell and seed), ``sweep.md`` (one row
per cell: min/median/max over seeds and the paired change against ``fifo``) and ``sweep.json`` (the
rows and cells again, with everything that produced them: the spec, the simulation, run and policy
settings, the workload's SHA-256, the versions, the host and the command line).
"""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import itertools
import json
import multiprocessing
import os
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from asyncroll import cli_signals
from asyncroll.clock import VirtualClock
from asyncroll.code_identity import code_version_once
from asyncroll.config import build_config
from asyncroll.errors import OutputExistsError, OutputWriteError, SimulationError, UsageError
from asyncroll.outputs.lines import open_staged
from asyncroll.outputs.receipt import environment, file_sha256, host, versions
from asyncroll.policies.base import Policy
from asyncroll.policies.registry import canonical_policy
from asyncroll.runtime.prepare import refuse_unwritable
from asyncroll.runtime.run import PreparedRun, Run
from asyncroll.runtime.signals import interruptible, stop_signals_blocked
from asyncroll.simulation.engine import Assumed, SimulationSettings, backend_for, workers_for
from asyncroll.simulation.perturb import perturb_workload
from asyncroll.simulation.sweep_cells import cell_process, died, finished, starting, stop
from asyncroll.simulation.sweep_table import aggregate, markdown
from asyncroll.workload import WorkloadScan, scan_workload

COLUMNS = (
    "policy",
    "active",
    "inflight",
    "workers",
    "seed",
    "makespan_s",
    "completed",
    "failed",
    "completed_per_hour",
    "lower_bound_s",
    "efficiency",
    "binding",
    "cpu_blocked_s",
    "reorders",
    "decisions",
)


#: The most seeds a sweep takes: each writes its jittered workload before any cell runs (≈ 5 MB for 200
#: trajectories of ``bench.synthetic``: ≈ 5 GB at this limit) and multiplies every cell; 10**9 was
#: accepted and wrote ≈ 9,000 seed workloads in 20 s (the 3-problem smoke workload) before any cell ran.
MAX_SEEDS = 1000
#: The most simulations (policies × operating points × seeds) one sweep runs: every cell is queued at once,
#: with the stop signals blocked, so 24 million took 14 GB of memory within minutes, deaf to Ctrl-C.
MAX_SIMULATIONS = 100_000


AXES = ("policies", "active", "inflight", "workers")


@dataclass(frozen=True)
class SweepSpec:
    policies: tuple[str, ...]
    active: tuple[int, ...]
    inflight: tuple[int, ...]
    workers: tuple[int, ...]
    seeds: int
    jitter: float

    def __post_init__(self) -> None:
        if self.simulations > MAX_SIMULATIONS:
            sizes = (len(self.policies), len(self.active), len(self.inflight), len(self.workers))
            grid = " × ".join(f"{n} {axis}" for n, axis in zip(sizes, AXES, strict=True))
            raise UsageError(
                f"--sweep: {grid} × {self.seeds} seeds = {self.simulations:,} simulations; at most "
                f"{MAX_SIMULATIONS:,} in one sweep (split the grid over several sweeps)"
            )

    @property
    def simulations(self) -> int:
        return len(self.policies) * len(self.active) * len(self.inflight) * len(self.workers) * self.seeds

    def points(self) -> list[tuple[int, int, int]]:
        return list(itertools.product(self.active, self.inflight, self.workers))


def run_sweep(
    workload: Path,
    tool_root: Path,
    base: dict[str, Any],
    spec: SweepSpec,
    settings: SimulationSettings,
    output: Path,
    custom: Mapping[str, Callable[[Path], Policy]] | None = None,
    jobs: int = 1,
    progress: Callable[[int, int, dict[str, Any]], None] | None = None,
    argv: list[str] | None = None,
    assumed: Assumed | None = None,
    made: list[Path] | None = None,
) -> list[dict[str, Any]]:
    """Run every cell; ``output`` must be a new directory (created here, and appended to ``made`` then).

    ``custom`` adds arms by label, each a policy object built from the seed's jittered workload (a
    bench's oracle rule that reads the scripted durations); their rows carry the label.

    ``jobs`` > 1 runs cells in that many fresh processes. Each cell is a deterministic function of its
    inputs, so the rows are the same, in the same order, for any ``jobs`` (tested); a custom arm's
    policy object must then be picklable. ``progress(done, total, row)`` is called after each row, in
    order. ``argv`` is the command line recorded in ``sweep.json`` (default: this process's).
    ``assumed`` sums what the simulations assumed for want of a declaration (see :class:`Assumed`)."""
    record = _record(workload, tool_root, base, sys.argv if argv is None else argv)
    try:
        output.mkdir(parents=True)
    except FileExistsError as exc:  # a dangling symbolic link too
        raise OutputExistsError(output) from exc
    except OSError as exc:
        raise UsageError(f"--output {output}: cannot create: {exc.strerror or exc}") from exc
    if made is not None:
        made.append(output)
    refuse_unwritable(output)
    (output / "workloads").mkdir()
    _scan.cache_clear()  # a scan is cached by path: a later sweep may reuse a deleted output's paths
    cells: list[Cell] = []
    for seed in range(spec.seeds):
        seeded = output / "workloads" / f"seed-{seed}.jsonl"
        try:
            perturb_workload(workload, seeded, seed, spec.jitter, base.get("limit"))
        except BaseException:  # a full disk, a signal: no workload cut short is left for a cell to run
            seeded.unlink(missing_ok=True)
            raise
        scan_workload(seeded, tool_root, scripted=True, limit=base.get("limit")).raise_if_invalid()
        arms: list[tuple[str, Policy | None]] = [(policy, None) for policy in spec.policies]
        arms += [(label, make(seeded)) for label, make in (custom or {}).items()]
        for (label, rule), point in itertools.product(arms, spec.points()):
            cells.append(Cell(seeded, tool_root, base, settings, label, rule, point, seed))
    rows: list[dict[str, Any]] = []
    pool = None
    futures: list[Future[tuple[dict[str, Any], Assumed]]] = []
    stopped: BaseException | None = None
    try:
        if jobs > 1 and len(cells) > 1:
            # blocked as the pool makes its queues: multiprocessing's resource tracker starts then and
            # ignores only SIGINT and SIGTERM, so the terminal's SIGHUP to the process group killed it
            with starting(jobs, semaphores=True), stop_signals_blocked():
                context = multiprocessing.get_context("spawn")  # no inherited threads or event loops
                pool = ProcessPoolExecutor(min(jobs, len(cells)), context, cell_process, (os.getpid(),))
        with starting(jobs), stop_signals_blocked():  # the pool starts its processes as cells come
            futures = [] if pool is None else [pool.submit(run_cell, cell) for cell in cells]
        results = map(run_cell, cells) if pool is None else (future.result() for future in futures)
        for row, cell_assumed in results:
            rows.append(row)
            _add(assumed, cell_assumed)
            if progress is not None:
                progress(len(rows), len(cells), row)
    except _FinishedThenStopped as exc:  # the signal came after this cell had finished: its row counts
        rows.append(exc.row)
        if progress is not None:
            progress(len(rows), len(cells), exc.row)
        stopped = exc
    except BrokenProcessPool as exc:  # a cell process killed (the OOM killer): a failed cell, said so
        stopped = SimulationError(died(pool))
        stopped.__cause__ = exc
    except BaseException as exc:  # noqa: BLE001 - raised again below, once the cell processes are gone
        stopped = exc
    if pool is not None:
        stop(pool, kill=stopped is not None)  # a signal during this wait is one more reason to stop
        if isinstance(stopped, KeyboardInterrupt):  # cells that finished while an earlier one still ran
            for row, cell_assumed in finished(futures[len(rows) :]):
                rows.append(row)
                _add(assumed, cell_assumed)
                if progress is not None:
                    progress(len(rows), len(cells), row)
    if stopped is not None and len(rows) == len(cells) and isinstance(stopped, KeyboardInterrupt):
        stopped = None  # every cell had finished: the sweep is whole
    if stopped is None:
        _write(output, rows, spec, settings, record, total=len(cells))
        return rows
    if isinstance(stopped, KeyboardInterrupt) and rows:  # what finished is kept, marked partial
        # a cell's own run names its signal; one that came while this process waited on its cell processes
        # (--jobs above 1) is the CLI's bare KeyboardInterrupt, whose signal cli_signals recorded
        name = str(stopped) or cli_signals.interrupted_by() or "SIGINT"
        _write(output, rows, spec, settings, record, total=len(cells), stopped=name)
        raise SweepInterrupted(name, len(rows), len(cells)) from stopped
    if isinstance(stopped, SimulationError):  # a cell failed: what ran is kept, and where it is said
        failed = cells[len(rows)]  # the cells run and report in order: the first one without its row
        if rows:
            at = " / ".join(map(str, failed.point))
            why = f"a failed simulation ({failed.label} at {at}, seed {failed.seed})"
            if isinstance(stopped.__cause__, BrokenProcessPool):  # which cell it ran is not known
                why = "a cell process that ended abruptly"
            _write(output, rows, spec, settings, record, total=len(cells), stopped=why)
            before = (
                "the simulation before it is"
                if len(rows) == 1
                else f"the {len(rows)} simulations before it are"
            )
            kept = f"{before} in {output} (sweep.md, marked partial)"
        elif (output / "workloads").is_dir():
            kept = f"its seeded workloads are in {output / 'workloads'}"
        else:  # removed while the sweep ran (a scratch cleaner): nothing of it is left to point at
            kept = f"{output / 'workloads'} was removed while the sweep ran"
        raise SimulationError(f"{stopped}; {kept}; a new --output runs the sweep again") from stopped
    if isinstance(stopped, Exception) and rows:  # unforeseen (a defect): what finished is kept all the same
        why = f"an unexpected error ({type(stopped).__name__})"
        _write(output, rows, spec, settings, record, total=len(cells), stopped=why)
        kept = (
            "simulation that finished is" if len(rows) == 1 else f"{len(rows)} simulations that finished are"
        )
        stopped.add_note(f"the {kept} in {output} (sweep.md, marked partial)")
    raise stopped


def _add(assumed: Assumed | None, cell: Assumed) -> None:
    if assumed is not None:
        assumed.untimed.update(cell.untimed)
        assumed.passed += cell.passed


class SweepInterrupted(KeyboardInterrupt):
    """A sweep stopped by SIGINT/SIGTERM/SIGHUP after ``done`` of ``total`` cells; their rows were written."""

    def __init__(self, signal_name: str, done: int, total: int) -> None:
        super().__init__(signal_name)
        self.done, self.total = done, total


class _FinishedThenStopped(KeyboardInterrupt):
    """A cell that finished, then saw a signal (in the sweep's own process): its row, and stop."""

    def __init__(self, signal_name: str, row: dict[str, Any]) -> None:
        super().__init__(signal_name)
        self.row = row


@dataclass(frozen=True)
class Cell:
    """One simulation of a sweep: a seed's jittered workload, an arm, an operating point."""

    workload: Path
    tool_root: Path
    base: dict[str, Any]
    settings: SimulationSettings
    label: str  # a policy name, or a custom arm's label
    rule: Policy | None  # a custom arm's policy object (the config then names fifo)
    point: tuple[int, int, int]  # active, inflight, workers
    seed: int


@functools.lru_cache(maxsize=4)
def _scan(workload: Path, tool_root: Path, limit: int | None) -> WorkloadScan:
    return scan_workload(workload, tool_root, scripted=True, limit=limit)


def run_cell(cell: Cell) -> tuple[dict[str, Any], Assumed]:
    """Simulate one cell without writing files; its row of ``sweep.csv`` and what it assumed."""
    active, inflight, workers = cell.point
    config = build_config(
        {
            **cell.base,
            "workload": cell.workload,
            "output": cell.workload.parent / "unused",
            "policy": cell.label if cell.rule is None else "fifo",
            "tool_root": cell.tool_root,
            "max_active_trajectories": active,
            "max_inflight_model_requests": inflight,
            "cpu_workers": workers,
        }
    )
    clock, assumed = VirtualClock(), Assumed()
    backend, capacity = backend_for(cell.settings, clock)
    run = Run(
        PreparedRun(config, _scan(cell.workload, cell.tool_root, cell.base.get("limit")), ["sweep"]),
        clock,
        backend=backend,
        model_capacity=capacity,
        worker_factory=workers_for(cell.settings, clock, assumed=assumed, tool_timeout=config.tool_timeout),
        record=False,
        policy=cell.rule,
    )
    outcome = clock.run(interruptible(run, keep_ignored=True))
    if outcome.status == "interrupted":
        raise KeyboardInterrupt(run.interrupt_reason or "")
    if outcome.status != "complete" or outcome.summary is None:
        raise SimulationError(
            f"sweep cell {cell.label} at {active} / {inflight} / {workers}, seed {cell.seed}: the simulated "
            f"run ended {outcome.status}: {outcome.error}"
        )
    s = outcome.summary
    row = {
        "policy": cell.label,
        "active": active,
        "inflight": inflight,
        "workers": workers,
        "seed": cell.seed,
        "makespan_s": s.get("makespan_s"),
        "completed": s["counts"]["completed"],
        "failed": s["counts"]["failed"],
        "completed_per_hour": s["throughput"]["completed_per_wall_hour"],
        "lower_bound_s": s["bounds"]["lower_bound_s"],
        "efficiency": s["bounds"]["efficiency"],
        "binding": s["bounds"]["binding"],
        "cpu_blocked_s": s["client_cpu_blocked"]["seconds"],
        "reorders": s["scheduler"]["reorders"],
        "decisions": s["scheduler"]["decisions"],
    }
    if outcome.late_signal:  # the cell finished, then a signal came: its row counts, the sweep stops
        raise _FinishedThenStopped(outcome.late_signal, row)
    return row, assumed


def _record(workload: Path, tool_root: Path, base: dict[str, Any], argv: list[str]) -> dict[str, Any]:
    """What ``sweep.json`` says produced the rows, besides the spec and the simulation settings."""
    config = build_config({**base, "workload": workload, "output": workload.parent / "unused"})
    return {
        "workload": str(workload.resolve()),
        "workload_sha256": file_sha256(workload),
        "run_settings": {
            "max_turns": config.max_turns,
            "limit": config.limit,
            "tool_timeout": config.tool_timeout,
            "tool_errors": config.tool_errors,
            "tool_root": str(tool_root.resolve()),
        },
        # the pressure policy's knobs, the same in every cell (threshold None: each cell's inflight limit)
        "policy_settings": {
            "starvation_threshold": config.starvation_threshold,
            "aging_seconds": config.aging_seconds,
            "aging_weight": config.aging_weight,
        },
        "command": list(argv),
        "cwd": os.getcwd(),  # where the command's relative paths were taken from
        "versions": versions(),
        "code": code_version_once(),  # which asyncroll ran: its policies and simulator decide every row
        "host": host(),
        "environment": environment(),
    }


def _write(
    output: Path,
    rows: list[dict[str, Any]],
    spec: SweepSpec,
    settings: SimulationSettings,
    record: dict[str, Any],
    *,
    total: int,
    stopped: str | None = None,
) -> None:
    """sweep.csv, sweep.md and sweep.json, each written whole (a temporary file renamed over it). ``stopped``:
    what stopped the sweep after ``len(rows)`` of ``total`` cells; the tables then hold those cells only and
    say so (``complete`` false in sweep.json, a first line in sweep.md). A stop signal meanwhile waits until
    they are written, then is dropped: the sweep stops anyway, or every cell had finished (it is whole). A
    table that could not be written is raised all the same (the dropped signal's KeyboardInterrupt replaced
    it, and the sweep said it had finished)."""
    failed: OutputWriteError | None = None
    with contextlib.suppress(KeyboardInterrupt), cli_signals.deferred():
        failed = _write_tables(output, rows, spec, settings, record, total, stopped)
    if failed is not None:
        raise failed


def _write_tables(
    output: Path,
    rows: list[dict[str, Any]],
    spec: SweepSpec,
    settings: SimulationSettings,
    record: dict[str, Any],
    total: int,
    stopped: str | None,
) -> OutputWriteError | None:
    """:func:`_write`'s tables; one that cannot be written ends it, its error returned."""
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=COLUMNS, lineterminator="\r\n")
    writer.writeheader()
    writer.writerows(rows)
    agg = aggregate(rows)
    note = ""
    if stopped is not None:
        note = (
            f"**Partial: stopped by {stopped} after {len(rows)} of {total} simulations**; a cell's "
            "spread and its change against fifo are over the seeds that finished.\n\n"
        )
    document = {
        "workload": record["workload"],
        "spec": asdict(spec),
        # the rule each name ran: ``asyncroll`` names whichever is the default when the sweep runs
        "policy_rules": {name: canonical_policy(name) for name in spec.policies},
        "simulation": settings.describe(),
        **{k: v for k, v in record.items() if k != "workload"},
        "complete": stopped is None,
        "simulations": {"done": len(rows), "total": total},
        "stopped_by": stopped,
        "rows": rows,
        "cells": agg,
    }
    for name, text in (
        ("sweep.csv", table.getvalue()),
        ("sweep.md", note + markdown(agg)),
        ("sweep.json", json.dumps(document, indent=2)),
    ):
        staged = output / f".{name}.tmp"
        try:
            with open_staged(staged, "w") as handle:  # never through a link planted at the staged name
                handle.write(text)
            os.replace(staged, output / name)
        except OSError as exc:  # a full disk: said in one line, naming the file
            staged.unlink(missing_ok=True)
            why = f"cannot write ({exc.strerror or exc}); the sweep's tables are incomplete"
            error = OutputWriteError(f"{output / name}: {why}")
            error.__cause__ = exc
            return error
        except BaseException:
            staged.unlink(missing_ok=True)
            raise
    return None
