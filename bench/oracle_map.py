"""How much of FIFO's gap could *any* choice of "which queued CPU job next" close? Oracle rules that read
the scripted future, next to the default policy, on the pressure map's open cells.

Same workload, operating points, seeds and jitter as ``bench.pressure_map`` (``bench.synthetic``, 200
trajectories, model turns ~400 ms, ``crunch`` jobs ~300/500/600 ms). Arms, all on the same jittered
timings (paired with FIFO):

- ``asyncroll``: the default rule (``asyncroll_repair``: critical path, remaining work learned step by
  step, a first evaluation's repair counted at its own predicted time), with its learned predictor and
  remaining-work estimates;
- ``asyncroll_critical``: the default 2026-12-01 to 03, remaining work learned from finished trajectories;
- ``asyncroll_balanced``: the critical rule with the tail's straggler guard (kept for comparison);
- ``oracle SPT``: shortest *true* CPU time first at every dispatch (a grade job takes 0 s), no aging;
- ``oracle SPT → LRW``: the same while problems wait for admission, then in the batch's tail the job
  whose trajectory has the most true work left after it (every later model turn and CPU job) — the
  clairvoyant version of the default rule's tail, applied at every dispatch.

The oracles know every duration exactly (the jittered ``cpu_ms`` and ``latency_ms`` of the workload), so
they show what perfect knowledge would buy these two list rules (not a bound on every rule); they are
simulation-only instruments, not policies. Per cell: FIFO ÷ bound and each arm's ÷ bound (median over
seeds) with the share of FIFO's gap it closes; ``*`` marks an arm worse than FIFO beyond noise (the
paired 95% interval lies above 0; hence at least 2 seeds).

Run: ``python -m bench.oracle_map [--seeds 5] [--jobs N]`` (240 s on a 2-vCPU VM with the default
``--jobs``: every usable CPU; rows identical for any ``--jobs``).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncroll.experiment.stats import t_interval
from asyncroll.floats import left_to_right_sum
from asyncroll.policies.base import Decision, Policy, QueueSnapshot
from asyncroll.simulation.engine import SimulationSettings
from asyncroll.simulation.sweep import SweepSpec, run_sweep
from asyncroll.simulation.sweep_cells import usable_cpus
from asyncroll.workload import ToolAction, iter_problems
from bench import synthetic
from bench.common import cell_jobs, machine, number_arg, run_main, scratch
from bench.pressure_map import MIXES

CELLS = ((4, 4, 1), (4, 4, 2), (8, 4, 1), (8, 4, 2), (8, 4, 4), (16, 4, 2), (32, 4, 2), (16, 8, 2))
Key = tuple[str, int, str]  # (problem id, turn, job kind)


def true_durations(workload: Path) -> dict[Key, tuple[float, float]]:
    """(problem, turn, kind) → (the job's CPU seconds, its trajectory's work after the job)."""
    out: dict[Key, tuple[float, float]] = {}
    for _, pid, problem in iter_problems(workload):
        actions = list(problem.script or [])
        cpu = [(a.cpu_ms or 0.0) / 1000 if isinstance(a, ToolAction) else 0.0 for a in actions]
        model = [(a.latency_ms or 0.0) / 1000 for a in actions]
        for turn, action in enumerate(actions):
            kind = "tool" if isinstance(action, ToolAction) else "grade"
            rest = left_to_right_sum(model[turn + 1 :]) + left_to_right_sum(cpu[turn + 1 :])
            out[pid, turn, kind] = (cpu[turn], rest)
    return out


@dataclass(frozen=True)
class Oracle:
    """Shortest true CPU time first; with ``tail_lrw``, most true work left after the job once admission
    ends."""

    durations: dict[Key, tuple[float, float]]
    tail_lrw: bool = False
    name: str = "oracle"

    def choose(self, snapshot: QueueSnapshot) -> Decision:
        jobs = snapshot.jobs
        known = [self.durations[j.trajectory_id, j.turn, j.kind] for j in jobs]
        if self.tail_lrw and not snapshot.admission_pending:
            best = max(range(len(jobs)), key=lambda i: (known[i][1], -i))
        else:
            best = min(range(len(jobs)), key=lambda i: (known[i][0], i))
        return Decision(jobs[best].job_id, "oracle", eligible=len(jobs) > 1)


ARMS: dict[str, Callable[[Path], Policy]] = {
    "oracle SPT": lambda w: Oracle(true_durations(w)),
    "oracle SPT → LRW": lambda w: Oracle(true_durations(w), tail_lrw=True),
}


def cell_text(fifo: list[dict[str, Any]], arm: list[dict[str, Any]]) -> str:
    ratio = statistics.median(r["makespan_s"] / r["lower_bound_s"] for r in arm)
    fifo_ratio = statistics.median(r["makespan_s"] / r["lower_bound_s"] for r in fifo)
    change = [a["makespan_s"] / f["makespan_s"] - 1 for a, f in zip(arm, fifo, strict=True)]
    ci = t_interval(change)
    worse = "*" if ci.low is not None and ci.low > 0 else ""
    gap = fifo_ratio - 1
    closed = f" ({100 * (fifo_ratio - ratio) / gap:.0f}%)" if gap > 0.001 else ""
    return f"{ratio:.3f}{closed}{worse}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    # one seed has no interval: no arm could be marked worse than FIFO beyond noise, every cell read as not
    parser.add_argument("--seeds", type=number_arg(int, 2, 1_000_000), default=5)
    parser.add_argument("--n", type=number_arg(int, 1, 1_000_000), default=200)
    parser.add_argument(
        "--jobs",
        type=cell_jobs,
        default=usable_cpus(),
        help="processes running cells at once (default and at most: the CPUs this process may use)",
    )
    args = parser.parse_args()
    tmp = scratch("oracle-")
    print(f"machine: {machine()}")
    print(f"bench.synthetic n={args.n} model_ms=400, seed 0; {args.seeds} jitter seeds (σ 0.25); max_turns 6")
    policies = ("asyncroll", "asyncroll_critical", "asyncroll_balanced")
    labels = (*policies, *ARMS)
    for cpu_ms in MIXES:
        workload = synthetic.write(tmp / f"syn{cpu_ms:g}.jsonl", args.n, 400.0, cpu_ms, 0)
        print(f"\ncrunch ~{cpu_ms:g} ms, model ~400 ms — ÷ lower bound (share of FIFO's gap closed)")
        print("| active / inflight / workers | fifo | " + " | ".join(labels) + " |")
        print("|---|---:|" + "---:|" * len(labels))
        for a, i, w in CELLS:
            spec = SweepSpec(("fifo", *policies), (a,), (i,), (w,), args.seeds, 0.25)
            out = tmp / f"cpu{cpu_ms:g}-{a}-{i}-{w}"
            rows = run_sweep(
                workload,
                workload.parent,
                {"max_turns": 6},
                spec,
                SimulationSettings(),
                out,
                ARMS,
                jobs=args.jobs,
            )
            by = {
                label: sorted((r for r in rows if r["policy"] == label), key=lambda r: r["seed"])
                for label in ("fifo", *labels)
            }
            fifo_ratio = statistics.median(r["makespan_s"] / r["lower_bound_s"] for r in by["fifo"])
            cols = " | ".join(cell_text(by["fifo"], by[label]) for label in labels)
            print(f"| {a} / {i} / {w} | {fifo_ratio:.3f} | {cols} |", flush=True)


if __name__ == "__main__":
    run_main("bench.oracle_map", main)
