"""The calibration's operating points over many workload draws, simulated: is one batch's verdict luck?

``bench.calibrate`` runs *one* generated workload (seed 1) for real and simulated; a policy's win or loss
there may belong to that draw — one trajectory's unusually long model turn whose job a rule deferred —
rather than to the policy. This bench generates the same kind of workload (``bench.synthetic``, same size
and means) with ``--seeds`` different seeds and simulates every policy on each draw at each operating
point, twice: as a pure model, and with the runtime's per-turn and per-job overheads (defaults: the
medians ``bench.calibrate`` measured on this project's 2-CPU VM, ≈ 0.9 ms and ≈ 2 ms). Reported per point,
mode and policy: the change of makespan against ``fifo`` on the same draw (mean with a 95% t interval,
min / median / max), how many draws it is more than 1% worse on, and the worst draw's seed.

Run: ``python -m bench.draws [--seeds 40] [--points 4/2/1,8/4/1,16/8/2,32/4/1]`` (≈ 4 min for the
defaults on 2 CPUs; simulated, so the figures do not depend on the machine's load).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from asyncroll.experiment.stats import t_interval
from asyncroll.simulation.engine import SimulationSettings
from bench import synthetic
from bench.calibrate import POINTS, simulated
from bench.common import machine, number_arg, points_arg, quantiles, run_main, scratch

POLICIES = ("fifo", "tool_first", "asyncroll", "asyncroll_chain")


def changes(
    workload: Path,
    point: tuple[int, int, int],
    settings: SimulationSettings,
    policies: list[str],
    seed: int = 1,
) -> dict[str, float]:
    """Each policy's simulated makespan on one draw, as a change against the first policy's."""
    makespans = {policy: simulated(workload, policy, point, settings, seed) for policy in policies}
    base = makespans[policies[0]]
    return {policy: makespans[policy] / base - 1 for policy in policies[1:]}


def row(policy: str, by_seed: dict[int, float]) -> str:
    values = list(by_seed.values())
    ci = t_interval(values)
    mean = (
        "n/a"
        if ci.mean is None or ci.low is None or ci.high is None
        else f"{100 * ci.mean:+.2f}% [{100 * ci.low:+.2f}%, {100 * ci.high:+.2f}%]"
    )
    lo, mid, hi = quantiles(values)
    worst = max(by_seed, key=lambda seed: by_seed[seed])
    worse = sum(v > 0.01 for v in values)
    return (
        f"| {policy} | {mean} | {100 * lo:+.1f}% / {100 * mid:+.1f}% / {100 * hi:+.1f}% "
        f"| {worse} of {len(values)} | {worst} ({100 * by_seed[worst]:+.1f}%) |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=number_arg(int, 2, 1000), default=40, help="draws (seeds 1..N)")
    parser.add_argument("--n", type=number_arg(int, 1, 100_000), default=40)
    parser.add_argument("--model-ms", type=number_arg(float, 0, 60_000), default=40.0)
    parser.add_argument("--cpu-ms", type=number_arg(float, 0, 60_000, low_open=True), default=25.0)
    parser.add_argument("--points", type=points_arg, default=list(POINTS))
    parser.add_argument("--turn-overhead-ms", type=number_arg(float, 0, 60_000), default=0.9)
    parser.add_argument("--job-overhead-ms", type=number_arg(float, 0, 60_000), default=2.0)
    args = parser.parse_args()
    policies = list(POLICIES)
    modes = {
        "pure model": SimulationSettings(),
        f"overheads {args.turn_overhead_ms:g} / {args.job_overhead_ms:g} ms": SimulationSettings(
            turn_overhead_ms=args.turn_overhead_ms, job_overhead_ms=args.job_overhead_ms
        ),
    }
    tmp = scratch("draws-")
    workloads = {
        seed: synthetic.write(tmp / f"s{seed}" / "w.jsonl", args.n, args.model_ms, args.cpu_ms, seed=seed)
        for seed in range(1, args.seeds + 1)
    }
    print(f"machine: {machine()}")
    print(
        f"workload: bench.synthetic n={args.n} model_ms={args.model_ms:g} cpu_ms={args.cpu_ms:g}, "
        f"seeds 1..{args.seeds} (bench.calibrate's batch is seed 1); simulated"
    )
    for point in args.points:
        for mode, settings in modes.items():
            by_policy: dict[str, dict[int, float]] = {p: {} for p in policies[1:]}
            for seed, workload in workloads.items():
                for policy, change in changes(workload, point, settings, policies, seed).items():
                    by_policy[policy][seed] = change
            print(f"\n### {point[0]} active / {point[1]} inflight / {point[2]} workers, {mode}\n")
            print(
                "| policy | makespan vs fifo, mean [95% t interval] | min / median / max "
                "| draws > 1% worse | worst draw (seed) |"
            )
            print("|---|---|---|---|---|")
            for policy, by_seed in by_policy.items():
                print(row(policy, by_seed))


if __name__ == "__main__":
    run_main("bench.draws", main)
