"""Paired measurement on this machine: ``fifo`` vs ``tool_first`` vs ``asyncroll``, real runs.

For each operating point and seed, one ``bench.synthetic`` workload is generated (the seed changes the
workload), and every policy runs it for real (system clock, real worker processes doing the work), in an
order that rotates with the seed so that no policy always runs first. Reported per policy: completions
per hour, client CPU-blocked seconds, CPU-queue wait p95 (min / median / max over seeds), and the paired
change of completions per hour against ``fifo`` (min / median / max, mean with a 95% t interval).

Run: ``python -m bench.paired [--seeds 5] [--n 40] [--points 8/4/2,8/4/1]`` (operating points as
active/inflight/workers).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from typing import Any

from asyncroll.experiment.stats import t_interval
from asyncroll.runtime.run import RunOutcome
from bench import common, synthetic
from bench.common import machine, number_arg, points_arg, quantiles, run_main, run_once, scratch

POINTS = ((8, 4, 2), (8, 4, 1))
POLICIES = ("fifo", "tool_first", "asyncroll")


def interval(xs: list[float]) -> str:
    """Mean paired change with its 95% Student t interval (``asyncroll.experiment.stats``) and n."""
    ci = t_interval(xs)
    if ci.low is None or ci.high is None or ci.mean is None:
        return f"n/a (n={ci.n})"
    return f"{100 * ci.mean:+.1f}% [{100 * ci.low:+.1f}%, {100 * ci.high:+.1f}%] (n={ci.n})"


def spread(xs: Sequence[float | None], fmt: str = "{:.1f}") -> str:
    """min / median / max (the true median: the mean of the middle two for an even count); "unknown"
    when a run has no value (a CPU-queue p95 of a run without CPU jobs): missing is never 0."""
    if not xs or any(x is None for x in xs):
        return "unknown"
    lo, mid, hi = quantiles([x for x in xs if x is not None])
    return " / ".join(fmt.format(v) for v in (lo, mid, hi))


def incomplete(policy: str, point: tuple[int, int, int], seed: int, n: int, outcome: RunOutcome) -> str:
    return common.incomplete(
        "bench.paired", f"{policy} at {'/'.join(map(str, point))}, seed {seed}", n, outcome
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=number_arg(int, 1, 1000), default=5)
    parser.add_argument("--n", type=number_arg(int, 1, 100_000), default=40)
    parser.add_argument("--model-ms", type=number_arg(float, 0, 60_000), default=40.0)
    parser.add_argument("--cpu-ms", type=number_arg(float, 0, 60_000, low_open=True), default=50.0)
    parser.add_argument(
        "--points",
        type=points_arg,
        default=list(POINTS),
        help="operating points, active/inflight/workers, comma-separated (default: 8/4/2,8/4/1)",
    )
    args = parser.parse_args()
    tmp = scratch("paired-")
    print(f"machine: {machine()}")
    print(
        f"workload: bench.synthetic n={args.n} model_ms={args.model_ms:g} cpu_ms={args.cpu_ms:g}, "
        f"seeds 0..{args.seeds - 1}; real runs, order rotating per seed"
    )
    for point in args.points:
        rows: dict[str, list[dict[str, Any]]] = {p: [] for p in POLICIES}
        for seed in range(args.seeds):
            workload = synthetic.write(
                tmp / f"p{point}-s{seed}" / "w.jsonl", args.n, args.model_ms, args.cpu_ms, seed
            )
            order = POLICIES[seed % len(POLICIES) :] + POLICIES[: seed % len(POLICIES)]
            for policy in order:
                outcome, _, _ = run_once(
                    workload,
                    policy=policy,
                    max_active_trajectories=point[0],
                    max_inflight_model_requests=point[1],
                    cpu_workers=point[2],
                    max_turns=6,
                )
                s = outcome.summary
                if s is None or s["counts"]["completed"] != args.n:
                    raise SystemExit(incomplete(policy, point, seed, args.n, outcome))
                rows[policy].append(
                    {
                        "per_hour": s["throughput"]["completed_per_wall_hour"],
                        "blocked": s["client_cpu_blocked"]["seconds"],
                        "queue_p95_ms": None
                        if (p95 := s["latency"]["cpu_queue_s"]["p95"]) is None
                        else 1000 * p95,
                        "eligible": s["scheduler"]["eligible_decisions"],
                        "decisions": s["scheduler"]["decisions"],
                        "reorders": s["scheduler"]["reorders"],
                        "efficiency": s["bounds"]["efficiency"],
                    }
                )
        print(f"\n### {point[0]} active / {point[1]} inflight / {point[2]} workers\n")
        print(
            "| policy | completions per hour (min / med / max) | CPU-blocked s | CPU-queue p95 ms "
            "| efficiency | eligible / decisions, reorders (median) "
            "| paired change in completions/h vs fifo: min / med / max | mean [95% t interval] |"
        )
        print("|---|---|---|---|---|---|---|---|")
        fifo = [r["per_hour"] for r in rows["fifo"]]
        for policy in POLICIES:
            rs = rows[policy]
            change = [r["per_hour"] / f - 1 for r, f in zip(rs, fifo, strict=True)]
            paired = "n/a" if policy == "fifo" else spread(change, "{:+.1%}")
            mean = "n/a" if policy == "fifo" else interval(change)
            elig = (
                f"{statistics.median(r['eligible'] for r in rs):.0f} / "
                f"{statistics.median(r['decisions'] for r in rs):.0f}, "
                f"{statistics.median(r['reorders'] for r in rs):.0f}"
            )
            print(
                f"| {policy} | {spread([r['per_hour'] for r in rs], '{:.0f}')} "
                f"| {spread([r['blocked'] for r in rs], '{:.2f}')} "
                f"| {spread([r['queue_p95_ms'] for r in rs])} "
                f"| {spread([r['efficiency'] for r in rs], '{:.3f}')} | {elig} | {paired} | {mean} |"
            )


if __name__ == "__main__":
    run_main("bench.paired", main)
