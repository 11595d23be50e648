"""Calibration: the same scripted workload run for real and simulated, at a few operating points.

Real: the runtime on the system clock with real worker processes busy-looping (the ``crunch`` tool of
``bench.synthetic``). Simulated twice with fixed latencies (each action's ``latency_ms``) and virtual
workers whose jobs last their declared ``cpu_ms``: once as a pure model, and once with the per-turn and
per-job overheads *measured in the real runs' own events* (model latency beyond the scripted one; the
time a CPU job holds its worker beyond its execute time, from the moment it could have started — queued,
worker free — to its result), passed as ``--turn-overhead-ms`` / ``--job-overhead-ms``.
Reports per policy and operating point the real makespan (min/median/max over repeats), both simulated
makespans with their error against the real median, and whether each ranks the policies like reality.

Ranking is judged pair by pair, with the real noise taken into account: a real pair is *decided* when
the two policies' real makespan ranges (min–max over repeats) do not overlap, otherwise it is a tie
within noise. The simulator *contradicts* reality when it orders a decided pair the other way; it agrees
on a decided pair when it orders it the same way; equal simulated makespans order it neither way
(counted apart). Ties are reported, not scored: no simulator can be right or wrong about a difference
that reality itself does not resolve.

Run: ``python -m bench.calibrate [--repeats 3] [--n 40]`` (``--repeats`` at least 2).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterator
from pathlib import Path

from asyncroll.clock import VirtualClock
from asyncroll.config import build_config
from asyncroll.runtime.run import Run, prepare
from asyncroll.simulation.engine import SimulationSettings, backend_for, workers_for
from bench import synthetic
from bench.common import events, incomplete, machine, number_arg, quantiles, run_main, run_once, scratch

Point = tuple[int, int, int]
POINTS: tuple[Point, ...] = ((4, 2, 1), (8, 4, 1), (16, 8, 2), (32, 4, 1))
POLICIES = ("fifo", "tool_first", "asyncroll")


def verdicts(
    real: dict[str, list[float]], simulated: dict[str, float]
) -> tuple[list[str], int, int, int, int]:
    """Pairwise comparison of a simulated ranking with the real one (see the module docstring).
    Returns a line per pair and the counts of (agreeing decided, contradicting decided, decided but
    simulated equal, tied) pairs: equal simulated makespans order a decided pair neither way."""
    lines: list[str] = []
    agree = contradict = unordered = ties = 0
    names = list(real)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if max(real[a]) < min(real[b]):
                truth = "<"
            elif max(real[b]) < min(real[a]):
                truth = ">"
            else:
                truth = "~"
            sim = "<" if simulated[a] < simulated[b] else ">" if simulated[a] > simulated[b] else "="
            if truth == "~":
                ties += 1
                word = "tie within real noise"
            elif sim == truth:
                agree += 1
                word = "agrees"
            elif sim == "=":
                unordered += 1
                word = "not ordered by the simulation"
            else:
                contradict += 1
                word = "CONTRADICTS"
            lines.append(f"{a} {truth} {b} real; {a} {sim} {b} simulated: {word}")
    return lines, agree, contradict, unordered, ties


def overheads(run_dir: Path, workload: Path) -> tuple[float, float]:
    """Median (model latency − scripted latency) and median time a CPU job holds its worker beyond its
    execute time, in ms, from events.

    A job could start once it was queued and its worker had finished the previous job; everything from
    then to its result beyond the execute time is the runtime's: the dispatch decision (a predictor
    refit included), the hand-off to the job's task, two pipes and the worker's wake-up."""
    scripts = {p["id"]: p["script"] for p in map(json.loads, workload.read_text().splitlines())}
    evs = events(run_dir)
    turn = [
        e["latency_s"] - scripts[e["id"]][e["turn"]]["latency_ms"] / 1000
        for e in evs
        if e["event"] == "model_finished"
    ]
    queued = {e["job_id"]: e["t"] for e in evs if e["event"] == "cpu_enqueued"}
    worker = {e["job_id"]: e["worker"] for e in evs if e["event"] == "cpu_selected"}
    free: dict[int, float] = {}  # worker → when it finished its previous job
    job = []
    for e in evs:
        if e["event"] == "cpu_finished":
            ready = max(queued[e["job_id"]], free.get(worker[e["job_id"]], 0.0))
            job.append(e["t"] - ready - e["execute_s"])
            free[worker[e["job_id"]]] = e["t"]
    return 1000 * statistics.median(turn), 1000 * statistics.median(job)


def simulated(
    workload: Path, policy: str, point: tuple[int, int, int], settings: SimulationSettings, seed: int = 1
) -> float:
    """The simulated makespan of a workload (``seed``: the draw it was generated from, named when a
    trajectory did not complete)."""
    active, inflight, workers = point
    cfg = build_config(
        {
            "workload": workload,
            "output": scratch("sim-") / "sim",
            "policy": policy,
            "max_active_trajectories": active,
            "max_inflight_model_requests": inflight,
            "cpu_workers": workers,
            "max_turns": 6,
        }
    )
    clock = VirtualClock()
    backend, capacity = backend_for(settings, clock)
    run = Run(
        prepare(cfg, ["calibrate"]),
        clock,
        worker_factory=workers_for(settings, clock),
        backend=backend,
        model_capacity=capacity,
        record=False,
    )
    outcome = clock.run(run.execute())
    n = len(workload.read_text().splitlines())
    if outcome.summary is None or outcome.summary["counts"]["completed"] != n:
        where = f"{policy} at {'/'.join(map(str, point))}, seed {seed}"
        raise SystemExit(incomplete("bench (simulated)", where, n, outcome))
    return float(outcome.summary["makespan_s"])


def real_runs(
    bench: str, workload: Path, point: Point, repeats: int, n: int
) -> Iterator[tuple[str, float, Path]]:
    """Each policy's real runs at ``point``, repeat by repeat, each repeat starting with the next policy
    (so that drift does not favour one): (policy, makespan, run directory) of each, all ``n`` trajectories
    completed, else the bench ends naming the run."""
    for repeat in range(repeats):
        for k in range(len(POLICIES)):
            policy = POLICIES[(repeat + k) % len(POLICIES)]
            outcome, run_dir, _ = run_once(
                workload,
                policy=policy,
                max_active_trajectories=point[0],
                max_inflight_model_requests=point[1],
                cpu_workers=point[2],
                max_turns=6,
            )
            if outcome.summary is None or outcome.summary["counts"]["completed"] != n:
                where = f"{policy} at {'/'.join(map(str, point))}, real, repeat {repeat + 1}"
                raise SystemExit(incomplete(bench, where, n, outcome))
            yield policy, outcome.summary["makespan_s"], run_dir


def add_real_run_arguments(parser: argparse.ArgumentParser) -> None:
    """``--repeats``, ``--n``, ``--model-ms``, ``--cpu-ms``: the real runs and their workload (this bench's
    and ``bench.counterfactual``'s)."""
    # A pair is *decided* only where the real ranges (min–max over repeats) are apart: one repeat has no
    # range, and every pair would read as decided outside a noise nobody measured.
    parser.add_argument(
        "--repeats",
        type=number_arg(int, 2, 1000),
        default=3,
        help="real runs per policy and point (>= 2: the ranking is judged against their spread)",
    )
    parser.add_argument("--n", type=number_arg(int, 1, 100_000), default=40)
    parser.add_argument("--model-ms", type=number_arg(float, 0, 60_000), default=40.0)
    parser.add_argument("--cpu-ms", type=number_arg(float, 0, 60_000, low_open=True), default=25.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_real_run_arguments(parser)
    args = parser.parse_args()
    workload = synthetic.write(
        scratch("cal-") / "w.jsonl",
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
        "| active / inflight / workers | policy | real makespan s (min / med / max) | simulated s (error) "
        "| overheads turn / job ms (median of the point's runs) | simulated with them s (error) |"
    )
    print("|---|---|---|---|---|---|")
    rankings: list[tuple[Point, dict[str, list[float]], dict[str, float], dict[str, float]]] = []
    for point in POINTS:
        pure: dict[str, float] = {}
        tuned: dict[str, float] = {}
        turn_ms: list[float] = []
        job_ms: list[float] = []
        real: dict[str, list[float]] = {policy: [] for policy in POLICIES}
        for policy, makespan, run_dir in real_runs("bench.calibrate", workload, point, args.repeats, args.n):
            real[policy].append(makespan)
            t, j = overheads(run_dir, workload)
            turn_ms.append(t)
            job_ms.append(j)
        # The overheads are the runtime's on this machine, not a policy's: one pair per operating point,
        # the median over every run there, so that per-arm measurement noise cannot reorder the arms.
        t, j = statistics.median(turn_ms), statistics.median(job_ms)
        for policy in POLICIES:
            lo, mid, hi = quantiles(real[policy])
            pure[policy] = simulated(workload, policy, point, SimulationSettings())
            tuned[policy] = simulated(
                workload, policy, point, SimulationSettings(turn_overhead_ms=t, job_overhead_ms=j)
            )
            print(
                f"| {point[0]} / {point[1]} / {point[2]} | {policy} | {lo:.3f} / {mid:.3f} / {hi:.3f} "
                f"| {pure[policy]:.3f} ({100 * (pure[policy] / mid - 1):+.1f}%) | {t:.2f} / {j:.2f} "
                f"| {tuned[policy]:.3f} ({100 * (tuned[policy] / mid - 1):+.1f}%) |",
                flush=True,
            )
        rankings.append((point, real, pure, tuned))

    totals = {"pure model": [0, 0, 0, 0], "with overheads": [0, 0, 0, 0]}
    for point, real, pure, tuned in rankings:
        print(f"\n{point[0]} / {point[1]} / {point[2]}:")
        for label, sim in (("pure model", pure), ("with overheads", tuned)):
            lines, *counts = verdicts(real, sim)
            for k, v in enumerate(counts):
                totals[label][k] += v
            print(f"- {label}: " + "; ".join(lines))
    print()
    for label, (agree, contradict, unordered, ties) in totals.items():
        print(
            f"- {label}: of the real pairwise differences outside noise, {agree} ordered the same, "
            f"{contradict} the other way, {unordered} not at all (equal simulated makespans); {ties} "
            "pairs tied within the real spread"
        )


if __name__ == "__main__":
    run_main("bench.calibrate", main)
