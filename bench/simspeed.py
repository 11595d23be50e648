"""Simulation speed and memory as the workload grows: trajectories simulated per CPU-second of the
measured window (start-up — worker set-up, the scikit-learn import — is reported apart), the RSS
of the process when the run ends (not ``ru_maxrss``: Linux carries it over from the forking parent),
and the RSS growth between ``measurement_started`` and ``measurement_finished``
(what the simulation itself accumulates; also per trajectory, in KiB). Each size runs in a fresh
subprocess on a virtual clock with virtual workers. ``summary only`` writes no files (what a sweep cell
does); ``full outputs`` writes the run directory (events, results, summary) without the trace/timeline
exports.

Workload: seeded, small arguments (so that the runtime, not JSON parsing of large payloads, is measured):
1 or 2 ``spin_ms`` calls (60% two) with lognormal model latency and CPU cost, then a graded answer; 64 active,
16 inflight, 4 workers. Run: ``python -m bench.simspeed [--sizes 1000,10000,30000] [--repeats 3]``.

``--parts`` adds a second table: the CPU that the policy code itself takes per trajectory — the duration
predictor (``update``, the predictions the dispatcher asks for, with its refits; ``observe``) and the
remaining-work estimator the policy subscribes (the default's chain, ``StepwiseWork``, or the per-trajectory
means, ``RemainingWork``: its event handling and its lookups) — under the default policy and under ``fifo``
(which logs predictions too). Each call is timed with the thread's CPU clock, in separate runs (the timers add
their own cost to the rate). Whatever engine runs this policy code pays at least that much per trajectory, so
``10⁶ ÷ µs`` is a ceiling on its rate.

``--at-once`` adds a third table: each size with every problem admitted at once (active = trajectories),
so the CPU queue holds thousands of jobs and every decision sees them all, under the default policy,
``fifo`` and ``tool_first`` (CPU seconds of the measured window, summary only).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.common import (
    machine,
    number_arg,
    quantiles,
    run_child,
    run_main,
    scratch,
    sizes_arg,
    write_workload,
)

CHILD = r"""
import json, sys, tempfile, time
from pathlib import Path
import asyncroll.outputs.rundir as rundir
from asyncroll.clock import VirtualClock
from asyncroll.config import build_config
from asyncroll.runtime.run import Run, prepare
from asyncroll.runtime.virtual_worker import virtual_factory
n, record, workload = int(sys.argv[1]), sys.argv[2] == "1", Path(sys.argv[3])
policy, parts, active = sys.argv[4], sys.argv[5] == "1", int(sys.argv[6])
rundir.export = lambda out, final=None, stop=None: {}
spent, calls = {}, {}
def timed(cls, name):
    inner = getattr(cls, name)
    def call(*args, **kwargs):
        t0 = time.thread_time()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.thread_time() - t0
            calls[name] = calls.get(name, 0) + 1
    setattr(cls, name, call)
class Empty:
    def nothing(self): pass
timed(Empty, "nothing")
empty = Empty()
for _ in range(20000):
    empty.nothing()
timer_s = spent.pop("nothing") / calls.pop("nothing")  # what the timing itself adds to one call
if parts:
    from asyncroll.policies.predictor import DurationPredictor
    from asyncroll.policies.remaining import RemainingWork, StepwiseWork, _Subscriber
    for name in ("update", "observe"):  # update: the dispatcher's predictions, refits included
        timed(DurationPredictor, name)
    timed(_Subscriber, "__call__")  # both estimators' event handling (the class they share)
    for estimator in (RemainingWork, StepwiseWork):  # whichever the policy subscribed
        for name in ("estimate", "estimate_queue"):  # a decision's logged jobs; a tail snapshot's queue
            timed(estimator, name)
scratch = tempfile.TemporaryDirectory(prefix="asyncroll-simspeed-")  # removed at exit
tmp = Path(scratch.name)
cfg = build_config({"workload": workload, "output": tmp / "run", "max_active_trajectories": active,
                    "max_inflight_model_requests": 16, "cpu_workers": 4, "max_turns": 6,
                    "policy": policy})
clock = VirtualClock()
import psutil
from asyncroll.events import MeasurementFinished, MeasurementStarted
rss = {}
def probe(event):
    if isinstance(event, (MeasurementStarted, MeasurementFinished)):
        rss[event.event] = psutil.Process().memory_info().rss / 2**20
        rss[event.event + "_cpu"] = time.process_time()
factory = virtual_factory(clock, simulate_tools=True)
run = Run(prepare(cfg, ["simspeed"]), clock, worker_factory=factory, record=record,
          subscribers=(probe,))
c0 = time.process_time()
outcome = clock.run(run.execute())
cpu = time.process_time() - c0
assert outcome.summary["counts"]["completed"] == n
window = rss["measurement_finished_cpu"] - rss["measurement_started_cpu"]
print(json.dumps({"cpu_s": cpu, "window_cpu_s": window, "rss_mb": rss["measurement_finished"],
                  "growth_mb": rss["measurement_finished"] - rss["measurement_started"],
                  "virtual_makespan_s": outcome.summary["makespan_s"],
                  "policy_s": max(0.0, sum(spent.values()) - timer_s * sum(calls.values())),
                  "calls": calls}))
"""


def small_workload(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)

    def ms(mean: float, sigma: float) -> float:
        return round(mean * math.exp(rng.gauss(-sigma * sigma / 2, sigma)), 3)

    problems = []
    for i in range(n):
        calls = 2 if rng.random() < 0.6 else 1
        script: list[dict[str, Any]] = [
            {
                "type": "tool",
                "name": "spin_ms",
                "arguments": {"milliseconds": ms(300, 1.0)},
                "latency_ms": ms(400, 0.5),
            }
            for _ in range(calls)
        ]
        script.append({"type": "final", "answer": str(i), "latency_ms": ms(400, 0.5)})
        problems.append(
            {
                "id": f"s{i}",
                "prompt": "p",
                "tools": [{"name": "spin_ms"}],
                "reference_answer": str(i),
                "script": script,
            }
        )
    return problems


def one(
    n: int, record: bool, workload: Path, policy: str = "asyncroll", parts: bool = False, active: int = 64
) -> dict[str, Any]:
    argv = [
        sys.executable,
        "-c",
        CHILD,
        str(n),
        "1" if record else "0",
        str(workload),
        policy,
        "1" if parts else "0",
        str(active),
    ]
    out = run_child(argv)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=sizes_arg, default=[1000, 10000, 30000])
    parser.add_argument("--repeats", type=number_arg(int, 1, 1000), default=3)
    parser.add_argument(
        "--parts", action="store_true", help="also measure the policy code's own CPU per trajectory"
    )
    parser.add_argument(
        "--at-once",
        action="store_true",
        help="also run every problem admitted at once (active = trajectories: a CPU queue of thousands), "
        "per policy",
    )
    args = parser.parse_args()
    sizes: list[int] = args.sizes
    print(f"machine: {machine()}")
    print(
        f"sizes {','.join(map(str, sizes))}, {args.repeats} repeats, each in a fresh process; virtual clock, "
        "64 active / 16 inflight / 4 workers (--at-once: active = trajectories), max 6 turns, workload seed 0"
    )
    print(
        "| trajectories | mode | trajectories per CPU-second in the run (min / med / max) "
        "| CPU s incl. start-up (median) | RSS at end MB (max) | RSS growth during the run MB (max) "
        "| RSS growth per trajectory KB (min / max) | virtual makespan s |"
    )
    print("|---:|---|---|---:|---:|---:|---:|---:|")
    tmp = scratch("simspeed-")
    for n in sizes:
        # written here, so that the child's peak memory is the simulation's, not the generator's
        workload = write_workload(tmp / f"w{n}.jsonl", small_workload(n, seed=0))
        for record in (False, True):
            runs = [one(n, record, workload) for _ in range(args.repeats)]
            rates = [n / r["window_cpu_s"] for r in runs]
            lo, mid, hi = quantiles(rates)
            total = statistics.median(r["cpu_s"] for r in runs)
            mode = "full outputs" if record else "summary only"
            rss = max(r["rss_mb"] for r in runs)
            growth = max(r["growth_mb"] for r in runs)
            per_kb = [r["growth_mb"] * 1024 / n for r in runs]  # MiB → KiB, per trajectory
            print(
                f"| {n} | {mode} | {lo:,.0f} / {mid:,.0f} / {hi:,.0f} | {total:.1f} | {rss:.0f} "
                f"| {growth:.1f} | {min(per_kb):.2f} / {max(per_kb):.2f} "
                f"| {runs[0]['virtual_makespan_s']:.0f} |"
            )
    if args.parts:
        print()
        print(
            "| trajectories | policy | policy code CPU per trajectory µs (min / med / max) "
            "| share of the run's CPU (median) | ceiling on trajectories per CPU-second (median) |"
        )
        print("|---:|---|---|---:|---:|")
        for n in sizes:
            workload = tmp / f"w{n}.jsonl"
            for policy in ("asyncroll", "fifo"):
                runs = [one(n, False, workload, policy, parts=True) for _ in range(args.repeats)]
                per = [r["policy_s"] / n * 1e6 for r in runs]
                lo, mid, hi = quantiles(per)
                share = statistics.median(r["policy_s"] / r["window_cpu_s"] for r in runs)
                print(
                    f"| {n} | {policy} | {lo:.0f} / {mid:.0f} / {hi:.0f} | {share:.0%} | {1e6 / mid:,.0f} |"
                )
    if args.at_once:
        print()
        print(
            "| trajectories, all admitted at once | policy | CPU s of the run (min / med / max) "
            "| trajectories per CPU-second (median) |"
        )
        print("|---:|---|---|---:|")
        for n in sizes:
            workload = tmp / f"w{n}.jsonl"
            for policy in ("asyncroll", "fifo", "tool_first"):
                runs = [one(n, False, workload, policy, active=n) for _ in range(args.repeats)]
                lo, mid, hi = quantiles([r["window_cpu_s"] for r in runs])
                print(f"| {n} | {policy} | {lo:.1f} / {mid:.1f} / {hi:.1f} | {n / mid:,.0f} |")


if __name__ == "__main__":
    run_main("bench.simspeed", main)
