"""Calibration: the same scripted workload run for real and simulated, at a few operating points.

Real: ``asyncroll run`` machinery on the system clock with real worker processes busy-looping (the
``crunch`` tool of ``bench.synthetic``). Simulated: ``simulate`` with fixed latencies (each action's
``latency_ms``) and virtual workers whose jobs last their declared ``cpu_ms``. Reports, per policy and
operating point, the real makespan (min/median/max over repeats), the simulated one, the error of the
simulation against the real median, and whether the two rank the policies the same way.

Run: ``python -m bench.calibrate [--repeats 3] [--n 40]``."""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from asyncroll.clock import VirtualClock
from asyncroll.config import build_config
from asyncroll.runtime.run import Run, prepare
from asyncroll.runtime.virtual_worker import virtual_factory
from bench import synthetic
from bench.common import machine, quantiles, run_once

POINTS = ((4, 2, 1), (8, 4, 1), (16, 8, 2))
POLICIES = ("fifo", "tool_first", "asyncroll")


def simulated(workload: Path, policy: str, point: tuple[int, int, int]) -> float:
    tmp = Path(tempfile.mkdtemp(prefix="asyncroll-cal-"))
    active, inflight, workers = point
    cfg = build_config(
        {
            "workload": workload,
            "output": tmp / "sim",
            "policy": policy,
            "max_active_trajectories": active,
            "max_inflight_model_requests": inflight,
            "cpu_workers": workers,
            "max_turns": 6,
        }
    )
    clock = VirtualClock()
    factory = virtual_factory(clock, simulate_tools=True)
    run = Run(prepare(cfg, ["calibrate"]), clock, worker_factory=factory, record=False)
    outcome = clock.run(run.execute())
    assert outcome.summary is not None and outcome.summary["counts"]["failed"] == 0
    return float(outcome.summary["makespan_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n", type=int, default=40)
    parser.add_argument("--model-ms", type=float, default=40.0)
    parser.add_argument("--cpu-ms", type=float, default=25.0)
    args = parser.parse_args()
    workload = synthetic.write(
        Path(tempfile.mkdtemp(prefix="asyncroll-cal-")) / "w.jsonl",
        args.n,
        args.model_ms,
        args.cpu_ms,
        seed=1,
    )
    print(f"machine: {machine()}")
    print(
        f"workload: bench.synthetic n={args.n} model_ms={args.model_ms:g} cpu_ms={args.cpu_ms:g} seed=1; "
        f"{args.repeats} real repeats"
    )
    print(
        "| active / inflight / workers | policy | real makespan s (min / med / max) | simulated s | error |"
    )
    print("|---|---|---|---:|---:|")
    rankings = []
    for point in POINTS:
        real_med, sim = {}, {}
        for policy in POLICIES:
            reals = []
            for _ in range(args.repeats):
                outcome, _, _ = run_once(
                    workload,
                    policy=policy,
                    max_active_trajectories=point[0],
                    max_inflight_model_requests=point[1],
                    cpu_workers=point[2],
                    max_turns=6,
                )
                assert outcome.summary is not None
                reals.append(outcome.summary["makespan_s"])
            lo, mid, hi = quantiles(reals)
            real_med[policy] = statistics.median(reals)
            sim[policy] = simulated(workload, policy, point)
            error = sim[policy] / real_med[policy] - 1
            print(
                f"| {point[0]} / {point[1]} / {point[2]} | {policy} | {lo:.3f} / {mid:.3f} / {hi:.3f} "
                f"| {sim[policy]:.3f} | {100 * error:+.1f}% |"
            )
        real_rank = sorted(POLICIES, key=lambda p: real_med[p])
        sim_rank = sorted(POLICIES, key=lambda p: sim[p])
        rankings.append((point, real_rank, sim_rank))
    print()
    for point, real_rank, sim_rank in rankings:
        same = "same" if real_rank == sim_rank else "DIFFERENT"
        print(f"- {point}: real ranking {' < '.join(real_rank)}; simulated {' < '.join(sim_rank)} ({same})")


if __name__ == "__main__":
    main()
