"""The pressure policy's goal measured against the *exact* optimum, on instances small enough to solve.

``bench.pressure_map`` judges the policy against the analytic makespan lower bound. Where few slots are
active that bound can be far below anything achievable, so "FIFO's gap to the bound" overstates what a
dispatcher could win. Here the same synthetic workload (``bench.synthetic``, model turns ~400 ms,
``crunch`` jobs ~300 or ~600 ms, heavy-tailed, 60% repair) is cut to ``--n`` trajectories so that CP-SAT
(``asyncroll optimum``; the ``optimum`` extra) can solve each seed's schedule: for every operating point
and jitter seed, FIFO and the policy run in simulation on the same timings, then the clairvoyant
optimum of those timings is solved once (the durations do not depend on the dispatch order).

Per cell: the analytic bound's looseness (proven optimum ÷ analytic bound), FIFO ÷ proven bound, policy
÷ proven bound, the share of FIFO's gap the policy closes (medians over seeds), the paired change, and
how many seeds were solved to optimality (otherwise the proven bound is CP-SAT's bound at the time limit,
still valid, and the gap is overstated). The clairvoyant optimum knows every duration in advance; no
online dispatcher can be expected to reach it.

Run: ``python -m bench.optimum_map [--n 20] [--seeds 5] [--time-limit 30]`` (≈ 20 minutes on 2 vCPUs).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from asyncroll.config import build_config
from asyncroll.simulation.engine import SimulationSettings, simulate
from asyncroll.simulation.optimum import Instance, instance_from_run, solve
from asyncroll.simulation.perturb import perturb_workload
from bench import synthetic
from bench.common import machine, number_arg, policy_arg, run_main, scratch
from bench.paired import interval

POINTS = ((4, 4, 1), (4, 4, 2), (8, 4, 2), (8, 4, 4), (16, 8, 2))
MIXES = (300.0, 600.0)


def one(workload: Path, out: Path, policy: str, point: tuple[int, int, int]) -> Path:
    active, inflight, workers = point
    config = build_config(
        {
            "workload": workload,
            "output": out,
            "policy": policy,
            "tool_root": workload.parent,
            "max_turns": 6,
            "max_active_trajectories": active,
            "max_inflight_model_requests": inflight,
            "cpu_workers": workers,
        }
    )
    simulate(config, SimulationSettings(), ["optimum_map"])
    return out


def _work(instance: Instance) -> list[list[tuple[str, float]]]:
    """The work alone (each step's kind and duration), without when the run placed it."""
    return [[(step.kind, step.seconds) for step in chain] for chain in instance.chains]


def gap_closed(fifo_ratio: float, mine_ratio: float) -> str:
    """The share of FIFO's gap to the proven bound that the policy closes; "n/a" where FIFO is on the
    bound but for float rounding (ratio 1.0000002): no share to close, not a "0%" (or, for a policy a
    little behind, an absurd "-50000%"), as ``bench.pressure_map`` says."""
    gap = fifo_ratio - 1
    return "n/a" if gap <= 0.001 else f"{100 * (fifo_ratio - mine_ratio) / gap:.0f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policy", type=policy_arg, default="asyncroll", help="the policy against fifo")
    parser.add_argument("--n", type=number_arg(int, 1, 1_000_000), default=20)
    parser.add_argument("--seeds", type=number_arg(int, 1, 1_000_000), default=5)
    parser.add_argument("--time-limit", type=number_arg(float, 0, 86_400, low_open=True), default=30.0)
    parser.add_argument("--threads", type=number_arg(int, 1, 1_000_000), default=2)
    args = parser.parse_args()
    if args.policy == "fifo":
        parser.error("--policy: it is measured against fifo; fifo against itself says nothing")
    tmp = scratch("optimum-")
    print(f"machine: {machine()}")
    print(
        f"bench.synthetic n={args.n} model_ms=400, seed 0; {args.seeds} jitter seeds (σ 0.25); max_turns 6; "
        f"CP-SAT {args.time_limit:g} s × {args.threads} threads per instance"
    )
    for cpu_ms in MIXES:
        base = synthetic.write(tmp / f"syn{cpu_ms:g}" / "w.jsonl", args.n, 400.0, cpu_ms, 0)
        print(f"\ncrunch ~{cpu_ms:g} ms, model ~400 ms — {args.policy} vs fifo against the proven optimum")
        print(
            "| active / inflight / workers | optimum ÷ analytic bound | fifo ÷ proven | policy ÷ proven "
            "| makespan change (min / med / max) | mean [95% t interval] | gap closed | solved exactly |"
        )
        print("|---|---:|---:|---:|---|---|---:|---:|")
        for point in POINTS:
            rows: list[dict[str, Any]] = []
            for seed in range(args.seeds):
                cell = tmp / f"syn{cpu_ms:g}" / f"{'-'.join(map(str, point))}-s{seed}"
                cell.mkdir(parents=True)
                workload = cell / "w.jsonl"
                perturb_workload(base, workload, seed, 0.25)
                (cell / synthetic.TOOLS_FILE).write_text(synthetic.TOOLS_SOURCE)
                fifo = instance_from_run(one(workload, cell / "fifo", "fifo", point))
                mine = instance_from_run(one(workload, cell / "policy", args.policy, point))
                if _work(fifo) != _work(mine):  # admission is in workload order under every policy
                    raise SystemExit(f"{cell}: the two policies ran different work")
                best = solve(fifo, time_limit_s=args.time_limit, threads=args.threads)
                assert fifo.makespan_s and mine.makespan_s and fifo.analytic_bound_s
                rows.append(
                    {
                        "loose": best.lower_bound_s / fifo.analytic_bound_s,
                        "fifo": fifo.makespan_s / best.lower_bound_s,
                        "mine": mine.makespan_s / best.lower_bound_s,
                        "change": mine.makespan_s / fifo.makespan_s - 1,
                        "exact": best.status == "optimal",
                    }
                )
            med = {k: statistics.median(r[k] for r in rows) for k in ("loose", "fifo", "mine")}
            change = [r["change"] for r in rows]
            closed = gap_closed(med["fifo"], med["mine"])
            print(
                f"| {' / '.join(map(str, point))} | {med['loose']:.3f} | {med['fifo']:.3f} "
                f"| {med['mine']:.3f} "
                f"| {100 * min(change):+.1f}% / {100 * statistics.median(change):+.1f}% / "
                f"{100 * max(change):+.1f}% | {interval(change)} | {closed} "
                f"| {sum(r['exact'] for r in rows)}/{len(rows)} |",
                flush=True,
            )


if __name__ == "__main__":
    run_main("bench.optimum_map", main)
