"""How the pressure policy's knobs move it relative to FIFO, in simulation.

Sweeps ``--aging-weight`` × ``--starvation-threshold`` (proactive = the inflight limit, 4; reactive = 1)
for ``asyncroll_seed`` against ``fifo`` on a ``bench.synthetic`` workload, at 8 or 32 active, 4
inflight, 1 or 2 workers, 3 seeds of timing jitter; prints the paired makespan change against FIFO
(min / median / max over seeds; negative is better).

Run: ``python -m bench.pressure_knobs`` (≈ 3 minutes).
"""

from __future__ import annotations

import argparse

from asyncroll.simulation.engine import SimulationSettings
from asyncroll.simulation.sweep import SweepSpec, run_sweep
from asyncroll.simulation.sweep_cells import usable_cpus
from bench import synthetic
from bench.common import cell_jobs, machine, quantiles, run_main, scratch

POINTS = ((8, 1), (8, 2), (32, 1), (32, 2))


def cell_text(change: list[float]) -> str:
    """One cell: the paired makespan changes over seeds as min / median / max, in percent."""
    return " / ".join(f"{100 * v:+.1f}%" for v in quantiles(change))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--jobs",
        type=cell_jobs,
        default=usable_cpus(),
        help="processes running cells at once (default and at most: the CPUs this process may use)",
    )
    args = parser.parse_args()
    tmp = scratch("knobs-")
    workload = synthetic.write(tmp / "syn.jsonl", 200, 400.0, 500.0, 0)
    print(f"machine: {machine()}")
    print(
        "workload: bench.synthetic n=200 model_ms=400 cpu_ms=500 seed=0; 3 seeds, jitter 0.25; inflight 4; "
        "cells: paired makespan change vs fifo, min / median / max over seeds"
    )
    print("| aging weight | threshold | " + " | ".join(f"{a} active / {w} workers" for a, w in POINTS) + " |")
    print("|---:|---:|" + "---:|" * len(POINTS))
    for weight in (0.02, 0.2, 1.0):
        for threshold in (4, 1):
            spec = SweepSpec(("fifo", "asyncroll_seed"), (8, 32), (4,), (1, 2), 3, 0.25)
            base = {"max_turns": 6, "aging_weight": weight, "starvation_threshold": threshold}
            out = tmp / f"w{weight}-t{threshold}"
            rows = run_sweep(workload, workload.parent, base, spec, SimulationSettings(), out, jobs=args.jobs)
            fifo = {
                (r["active"], r["workers"], r["seed"]): r["makespan_s"] for r in rows if r["policy"] == "fifo"
            }
            cells = []
            for point in POINTS:
                change = [
                    r["makespan_s"] / fifo[(r["active"], r["workers"], r["seed"])] - 1
                    for r in rows
                    if r["policy"] == "asyncroll_seed" and (r["active"], r["workers"]) == point
                ]
                cells.append(cell_text(change))
            print(f"| {weight} | {threshold} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    run_main("bench.pressure_knobs", main)
