"""Concurrency scaling: a fixed scripted model latency at growing inflight limits.

N one-turn trajectories whose model turn takes ``--latency-ms`` (default 20 ms) on the system clock,
with real worker processes started (idle) and events written to a real file. Active trajectories are
never the bound (``max_active_trajectories`` = N); only ``max_inflight_model_requests`` changes.
For each setting: wall time of the measured window (makespan), speed-up over inflight 1, the ideal
speed-up (N ÷ ceil(N ÷ inflight)), and whether the results (id, status, answer) and the multiset of
event types ("callbacks") are identical to inflight 1.

Run: ``python -m bench.scaling [--trajectories 1024] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter

from bench.common import events, final_only, incomplete, machine, number_arg, quantiles, run_main, run_once

SETTINGS = (1, 2, 4, 8, 16, 64, 256)
CPU_WORKERS = 2


def one(n: int, inflight: int, latency_ms: float) -> tuple[float, list[tuple[str, str, str]], Counter[str]]:
    outcome, run_dir, _ = run_once(
        final_only(n, latency_ms),
        max_active_trajectories=n,
        max_inflight_model_requests=inflight,
        cpu_workers=CPU_WORKERS,
    )
    if outcome.summary is None or outcome.summary["counts"]["completed"] != n:
        raise SystemExit(incomplete("bench.scaling", f"{n} trajectories, {inflight} inflight", n, outcome))
    results = sorted(
        (r["id"], r["status"], json.dumps(r["answer"]))
        for r in map(json.loads, (run_dir / "results.jsonl").read_text().splitlines())
    )
    kinds = Counter(e["event"] for e in events(run_dir))
    return outcome.summary["makespan_s"], results, kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trajectories", type=number_arg(int, 1, 1_000_000), default=1024)
    parser.add_argument("--latency-ms", type=number_arg(float, 0, 60_000), default=20.0)
    parser.add_argument("--repeats", type=number_arg(int, 1, 1_000_000), default=3)
    args = parser.parse_args()
    n = args.trajectories
    print(f"machine: {machine()}")
    print(
        f"{n} one-turn trajectories, {args.latency_ms:g} ms scripted model latency, {args.repeats} repeats; "
        f"{n} active, {CPU_WORKERS} (idle) workers; makespan = measured window"
    )
    print(
        "| inflight | makespan s (min / median / max) | speed-up (median) | ideal | results identical "
        "| callbacks identical |"
    )
    print("|---:|---|---:|---:|---|---|")
    base_time = None
    base_results = base_kinds = None
    for inflight in SETTINGS:
        runs = [one(n, inflight, args.latency_ms) for _ in range(args.repeats)]
        lo, mid, hi = quantiles([r[0] for r in runs])
        if base_time is None:
            base_time, base_results, base_kinds = mid, runs[0][1], runs[0][2]
        same_results = all(r[1] == base_results for r in runs)
        same_kinds = all(r[2] == base_kinds for r in runs)
        ideal = n / math.ceil(n / inflight)
        print(
            f"| {inflight} | {lo:.3f} / {mid:.3f} / {hi:.3f} | {base_time / mid:.1f}× | {ideal:.0f}× "
            f"| {'yes' if same_results else 'NO'} | {'yes' if same_kinds else 'NO'} |"
        )


if __name__ == "__main__":
    run_main("bench.scaling", main)
