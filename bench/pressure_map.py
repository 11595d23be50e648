"""The pressure policy's goal, checked in simulation cell by cell, as a ratio to the makespan lower bound.

For three CPU:model mixes of ``bench.synthetic`` (200 trajectories; model turns ~400 ms; ``crunch`` jobs
~300, ~500 or ~600 ms, heavy-tailed; 60% repair) and the operating points active ∈ {4, 8, 16, 32} ×
workers ∈ {1, 2, 4} at 4 inflight, plus 16 active / 8 inflight / 2 workers, every policy runs on the same
5 jitter seeds (common random numbers: the comparison is paired). Per cell and policy: FIFO ÷ bound,
policy ÷ bound (median over seeds; the operating point's bound, FIFO's, for every policy), the paired
makespan change against FIFO (min / median / max, and the mean with a 95% t interval), the share of
FIFO's gap to the bound the policy closes, and the goal's verdict: *never worse than FIFO beyond noise*
(the interval's lower end ≤ 0) and, where FIFO is more than 5% above the bound, *at least half of the gap
closed*.

``--starvation-threshold N`` runs every pressure-aware policy with that trigger instead of its default (the
inflight limit); a threshold above any cell's inflight limit makes every decision with two or more jobs
queued eligible (the trigger never holds a reorder back).

Run: ``python -m bench.pressure_map [--policies asyncroll,asyncroll_seed] [--seeds 5] [--jobs N]
[--starvation-threshold N]`` (144 s on a 2-vCPU VM for the default two policies with the default
``--jobs``: every usable CPU; rows identical for any ``--jobs``).
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from asyncroll.experiment.stats import t_interval
from asyncroll.simulation.engine import SimulationSettings
from asyncroll.simulation.sweep import SweepSpec, run_sweep
from asyncroll.simulation.sweep_cells import usable_cpus
from bench import synthetic
from bench.common import cell_jobs, machine, number_arg, policies_arg, run_main, scratch
from bench.paired import interval

MIXES = (300.0, 500.0, 600.0)  # crunch ms; model ms is 400 throughout
# (active, inflight, workers) grids: the main one, and 16 / 8 / 2
GRIDS: tuple[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]], ...] = (
    ((4, 8, 16, 32), (4,), (1, 2, 4)),
    ((16,), (8,), (2,)),
)


def cells(rows: list[dict[str, Any]], policy: str, seeds: int) -> list[dict[str, Any]]:
    by = {(r["policy"], r["active"], r["inflight"], r["workers"], r["seed"]): r for r in rows}
    points = sorted({(r["active"], r["inflight"], r["workers"]) for r in rows})
    out = []
    for a, i, w in points:
        fifo = [by["fifo", a, i, w, s] for s in range(seeds)]
        mine = [by[policy, a, i, w, s] for s in range(seeds)]
        change = [m["makespan_s"] / f["makespan_s"] - 1 for m, f in zip(mine, fifo, strict=True)]
        fifo_ratio = statistics.median(f["makespan_s"] / f["lower_bound_s"] for f in fifo)
        # the operating point's bound (FIFO's, as every dispatch order's): sync admits one trajectory at
        # a time, and the bound of its own run is that serial schedule's
        mine_ratio = statistics.median(
            m["makespan_s"] / f["lower_bound_s"] for m, f in zip(mine, fifo, strict=True)
        )
        gap = fifo_ratio - 1
        # a gap within float rounding of the bound (FIFO on it, ratio 1.0000002) has no share to close
        closed = (fifo_ratio - mine_ratio) / gap if gap > 0.001 else None
        ci = t_interval(change)
        # one seed gives no interval, so no verdict on noise
        verdict = "n/a (no interval)" if ci.low is None else "ok" if ci.low <= 0 else "WORSE"
        if gap > 0.05:
            verdict += ", half closed" if closed is not None and closed >= 0.5 else ", < half closed"
        out.append(
            {
                "point": f"{a} / {i} / {w}",
                "fifo_ratio": fifo_ratio,
                "ratio": mine_ratio,
                "change": change,
                "closed": closed,
                "verdict": verdict,
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--policies",
        type=policies_arg,
        default="asyncroll,asyncroll_seed",
        help="comma-separated policies, each against fifo",
    )
    parser.add_argument("--seeds", type=number_arg(int, 1, 1_000_000), default=5)
    parser.add_argument("--n", type=number_arg(int, 1, 1_000_000), default=200)
    parser.add_argument(
        "--jobs",
        type=cell_jobs,
        default=usable_cpus(),
        help="processes running cells at once (default and at most: the CPUs this process may use)",
    )
    parser.add_argument(
        "--starvation-threshold",
        type=number_arg(int, 1, 1_000_000),
        default=None,
        help="the pressure-aware policies' trigger in every cell (default: each cell's inflight limit)",
    )
    args = parser.parse_args()
    policies = tuple(args.policies)
    if "fifo" in policies:
        parser.error("--policies: each is measured against fifo; fifo against itself says nothing")
    tmp = scratch("map-")
    print(f"machine: {machine()}")
    threshold = args.starvation_threshold
    trigger = "" if threshold is None else f"; starvation threshold {threshold}"
    print(
        f"bench.synthetic n={args.n} model_ms=400, seed 0; {args.seeds} jitter seeds (σ 0.25); max_turns 6"
        f"{trigger}"
    )
    for cpu_ms in MIXES:
        workload = synthetic.write(tmp / f"syn{cpu_ms:g}.jsonl", args.n, 400.0, cpu_ms, 0)
        base: dict[str, Any] = {"max_turns": 6}
        if threshold is not None:
            base["starvation_threshold"] = threshold
        rows: list[dict[str, Any]] = []
        for n, (active, inflight, workers) in enumerate(GRIDS):
            spec = SweepSpec(("fifo", *policies), active, inflight, workers, args.seeds, 0.25)
            out = tmp / f"cpu{cpu_ms:g}-{n}"
            rows += run_sweep(
                workload, workload.parent, base, spec, SimulationSettings(), out, jobs=args.jobs
            )
        for policy in policies:
            print(f"\ncrunch ~{cpu_ms:g} ms, model ~400 ms — {policy} vs fifo")
            print(
                "| active / inflight / workers | fifo ÷ bound | policy ÷ bound | makespan change "
                "(min / med / max) | mean [95% t interval] | gap closed | goal |"
            )
            print("|---|---:|---:|---|---|---:|---|")
            for c in cells(rows, policy, args.seeds):
                lo, mid, hi = min(c["change"]), statistics.median(c["change"]), max(c["change"])
                closed = "n/a" if c["closed"] is None else f"{100 * c['closed']:.0f}%"
                print(
                    f"| {c['point']} | {c['fifo_ratio']:.3f} | {c['ratio']:.3f} "
                    f"| {100 * lo:+.1f}% / {100 * mid:+.1f}% / {100 * hi:+.1f}% | {interval(c['change'])} "
                    f"| {closed} | {c['verdict']} |"
                )


if __name__ == "__main__":
    run_main("bench.pressure_map", main)
