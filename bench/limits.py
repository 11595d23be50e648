"""Three-limits check: each bound is reached on its own when the other two are loose.

Real clock, real worker processes, scripted model latency and real CPU work (``spin_ms``/``sleep_ms``).
For each case only one limit is tight; the table shows the peak observed concurrency of all three,
read twice: from the limiters' own snapshots (summary.json ``peaks``) and reconstructed from events.jsonl.

Run: ``python -m bench.limits``.
"""

from __future__ import annotations

import argparse
from typing import Any

from bench.common import events, incomplete, machine, run_main, run_once, tool_chain

CASES: list[tuple[str, dict[str, Any]]] = [
    ("active tight", {"max_active_trajectories": 3, "max_inflight_model_requests": 64, "cpu_workers": 8}),
    ("inflight tight", {"max_active_trajectories": 64, "max_inflight_model_requests": 3, "cpu_workers": 8}),
    ("workers tight", {"max_active_trajectories": 64, "max_inflight_model_requests": 64, "cpu_workers": 3}),
]


def _peak(evs: list[dict[str, Any]], up: str, down: set[str]) -> int:
    level = peak = 0
    for e in evs:
        if e["event"] == up:
            level += 1
        elif e["event"] in down:
            level -= 1
        peak = max(peak, level)
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.parse_args()  # no options: --help prints the usage instead of running the benchmark
    print(f"machine: {machine()}")
    print("workload: 48 trajectories × 3 sleep_ms(30) tool calls, 30 ms scripted model turns")
    print(
        "| case | limits (active / inflight / workers) | peak active | peak inflight | peak busy workers "
        "| snapshot = events | makespan s |"
    )
    print("|---|---|---:|---:|---:|---|---:|")
    for name, limits in CASES:
        outcome, run_dir, _ = run_once(tool_chain(48, 3, 30, tool="sleep_ms", cpu_ms=30), **limits)
        if outcome.summary is None or outcome.summary["counts"]["completed"] != 48:
            raise SystemExit(incomplete("bench.limits", f"case {name}", 48, outcome))
        peaks = outcome.summary["peaks"]
        evs = events(run_dir)
        observed = (
            _peak(evs, "trajectory_started", {"trajectory_finished"}),
            _peak(evs, "model_started", {"model_finished", "model_failed"}),
            _peak(evs, "cpu_started", {"cpu_finished", "cpu_failed"}),
        )
        snap = (peaks["active_trajectories"], peaks["inflight_model_requests"], peaks["busy_workers"])
        lim = (
            limits["max_active_trajectories"],
            limits["max_inflight_model_requests"],
            limits["cpu_workers"],
        )
        print(
            f"| {name} | {lim[0]} / {lim[1]} / {lim[2]} | {observed[0]} | {observed[1]} | {observed[2]} "
            f"| {'yes' if snap == observed else f'NO {snap}'} | {outcome.summary['makespan_s']:.2f} |"
        )


if __name__ == "__main__":
    run_main("bench.limits", main)
