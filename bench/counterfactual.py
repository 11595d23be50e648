"""Counterfactuals: does ``simulate --from-run RUN --policy B`` predict what a real run of B does?

The workload, the real runs and the ranking rule are ``bench.calibrate``'s: ``bench.synthetic``'s
``crunch`` tool busy-looping on real workers, each policy run ``--repeats`` times per operating point,
repeat by repeat, each repeat starting with the next policy. Every real run of a policy A is then
replayed (``simulate --from-run``, in this process: the command's steps, not a child per replay) under
each policy B, once as it is and once with ``--job-overhead-ms`` set to the job overhead measured in A's
own events (``bench.calibrate.overheads``: the time a job holds its worker beyond its execute time; the
per-turn overhead is already inside the measured latencies the replay takes, and the flag is refused).

Reported per operating point and pair A → B: B's real makespan (min / median / max over its repeats),
the replays of A's runs under B (min / median / max over A's repeats) with the error of their median
against B's real median — A → A is the known "a replay omits the runtime's overhead" bias — and the same
with the overhead. Then, per operating point and source policy A, the ranking the replays of A's runs
give (median over A's repeats) against reality, pair by pair with ``bench.calibrate.verdicts``' rule (a
real pair is *decided* when the real ranges do not overlap); and the naive reading a user might make,
B's replay against A's *real* makespan, judged on the pairs A/B alike.

Run: ``python -m bench.counterfactual [--repeats 3] [--n 40] [--points 4/2/1,8/4/1,16/8/2]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from asyncroll.config import build_config
from asyncroll.simulation.engine import SimulationSettings, prepare_from_run, simulate
from asyncroll.simulation.from_run import kept_settings
from bench import synthetic
from bench.calibrate import add_real_run_arguments, overheads, real_runs, verdicts
from bench.common import incomplete, machine, points_arg, quantiles, run_main, scratch

Point = tuple[int, int, int]
POINTS: tuple[Point, ...] = ((4, 2, 1), (8, 4, 1), (16, 8, 2))
POLICIES = ("fifo", "tool_first", "asyncroll")


def replay(run_dir: Path, policy: str, job_overhead_ms: float, n: int) -> float:
    """The makespan of ``asyncroll simulate --from-run run_dir --policy policy [--job-overhead-ms X]``,
    as the command computes it (its output a scratch directory); a replay that did not complete every
    trajectory ends the bench."""
    output = scratch("replay-") / "replay"
    derived = prepare_from_run(run_dir, output, job_overhead_ms=job_overhead_ms)
    given = {"policy": policy, "output": output}
    values = {
        **kept_settings(run_dir, derived.source_config, set(given)),
        **given,
        "workload": derived.workload,
        "tool_root": derived.tool_root,
    }
    outcome = simulate(
        build_config(values),
        SimulationSettings(job_overhead_ms=job_overhead_ms),
        ["counterfactual"],
        derived=derived,
        source=str(run_dir.resolve()),
    )
    if outcome.summary is None or outcome.summary["counts"]["completed"] != n:
        raise SystemExit(incomplete("bench.counterfactual (replay)", f"{run_dir} as {policy}", n, outcome))
    return float(outcome.summary["makespan_s"])


def decided(real: dict[str, list[float]], a: str, b: str) -> bool:
    """``verdicts``' rule: the real ranges (min–max over repeats) of ``a`` and ``b`` do not overlap."""
    return max(real[a]) < min(real[b]) or max(real[b]) < min(real[a])


def naive(
    real: dict[str, list[float]], source: str, replayed: dict[str, float]
) -> tuple[list[int], list[float]]:
    """B's replay against A's real makespan (what a user holding only A's run would compare), judged on
    each pair A/B by ``verdicts``' rule: the counts (agreeing decided, contradicting decided, unordered,
    tied) and, for each tied pair, how far apart the comparison puts the two (a fraction)."""
    counts = [0, 0, 0, 0]
    gaps = []
    for other in real:
        if other == source:
            continue
        actual = statistics.median(real[source])
        _, *pair = verdicts(
            {source: real[source], other: real[other]}, {source: actual, other: replayed[other]}
        )
        counts = [c + v for c, v in zip(counts, pair, strict=True)]
        if not decided(real, source, other):
            gaps.append(abs(replayed[other] / actual - 1))
    return counts, gaps


def tied_gaps(real: dict[str, list[float]], sim: dict[str, float]) -> list[float]:
    """How far apart ``sim`` puts each pair that reality ties within its spread (fractions)."""
    names = list(real)
    return [
        abs(sim[a] / sim[b] - 1)
        for i, a in enumerate(names)
        for b in names[i + 1 :]
        if not decided(real, a, b)
    ]


def spread(label: str, xs: list[float]) -> str:
    lo, mid, hi = quantiles(xs)
    return f"{label} {100 * lo:+.1f}% / {100 * mid:+.1f}% / {100 * hi:+.1f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_real_run_arguments(parser)
    parser.add_argument(
        "--points",
        type=points_arg,
        default=list(POINTS),
        help="active/inflight/workers, comma-separated (default 4/2/1,8/4/1,16/8/2)",
    )
    args = parser.parse_args()
    began = time.perf_counter()
    workload = synthetic.write(scratch("cf-") / "w.jsonl", args.n, args.model_ms, args.cpu_ms, seed=1)
    print(f"machine: {machine()}")
    print(
        f"workload: bench.synthetic n={args.n} model_ms={args.model_ms:g} cpu_ms={args.cpu_ms:g} seed=1; "
        f"{args.repeats} real repeats; every real run replayed under every policy"
    )
    print(
        "| active / inflight / workers | run A → replayed as B | B real s (min / med / max) "
        "| replay s (min / med / max; error of med) | job overhead ms (A's runs, med) "
        "| replay with it s (min / med / max; error of med) |"
    )
    print("|---|---|---|---|---|---|")
    judged: list[tuple[Point, str, dict[str, list[float]], dict[str, float], dict[str, float]]] = []
    errors: dict[tuple[bool, bool], list[float]] = {(s, t): [] for s in (True, False) for t in (True, False)}
    for point in args.points:
        real: dict[str, list[float]] = {policy: [] for policy in POLICIES}
        runs: dict[str, list[Path]] = {policy: [] for policy in POLICIES}
        job_ms: dict[str, list[float]] = {policy: [] for policy in POLICIES}
        for policy, makespan, run_dir in real_runs(
            "bench.counterfactual", workload, point, args.repeats, args.n
        ):
            real[policy].append(makespan)
            runs[policy].append(run_dir)
            job_ms[policy].append(overheads(run_dir, workload)[1])
        for source in POLICIES:
            pure: dict[str, float] = {}
            tuned: dict[str, float] = {}
            for target in POLICIES:
                plain = [replay(r, target, 0.0, args.n) for r in runs[source]]
                with_job = [
                    replay(r, target, j, args.n) for r, j in zip(runs[source], job_ms[source], strict=True)
                ]
                pure[target] = statistics.median(plain)
                tuned[target] = statistics.median(with_job)
                lo, mid, hi = quantiles(real[target])
                p, t = quantiles(plain), quantiles(with_job)
                errors[(source == target, False)].append(p[1] / mid - 1)
                errors[(source == target, True)].append(t[1] / mid - 1)
                print(
                    f"| {point[0]} / {point[1]} / {point[2]} | {source} → {target} "
                    f"| {lo:.3f} / {mid:.3f} / {hi:.3f} "
                    f"| {p[0]:.3f} / {p[1]:.3f} / {p[2]:.3f} ({100 * (p[1] / mid - 1):+.1f}%) "
                    f"| {statistics.median(job_ms[source]):.2f} "
                    f"| {t[0]:.3f} / {t[1]:.3f} / {t[2]:.3f} ({100 * (t[1] / mid - 1):+.1f}%) |",
                    flush=True,
                )
            judged.append((point, source, real, pure, tuned))

    print(
        "\nerror of the replays' median against B's real median (min / median / max over the rows): "
        + "; ".join(
            spread(f"{what}, {how}", errors[(same, tuned)])
            for same, what in ((True, "A → A"), (False, "A → B ≠ A"))
            for tuned, how in ((False, "as they are"), (True, "with A's job overhead"))
        )
    )
    totals: dict[str, list[int]] = {}
    gaps: dict[str, list[float]] = {}
    for point, source, real, pure, tuned in judged:
        print(f"\n{point[0]} / {point[1]} / {point[2]}, from {source}'s runs:")
        for label, sim in (("as they are", pure), ("with A's job overhead", tuned)):
            lines, *counts = verdicts(real, sim)
            key = f"replays of A's runs ranked against each other, {label}"
            totals[key] = [a + b for a, b in zip(totals.get(key, [0, 0, 0, 0]), counts, strict=True)]
            gaps.setdefault(key, []).extend(tied_gaps(real, sim))
            print(f"- {label}: " + "; ".join(lines))
            key = f"naive: B's replay against A's real makespan (pairs A/B), {label}"
            counts, tied = naive(real, source, sim)
            totals[key] = [a + b for a, b in zip(totals.get(key, [0, 0, 0, 0]), counts, strict=True)]
            gaps.setdefault(key, []).extend(tied)
    print()
    for label, (agree, contradict, unordered, ties) in totals.items():
        apart = (
            f"; the comparison put the tied pairs {100 * statistics.median(gaps[label]):.1f}% apart "
            f"(median), {100 * max(gaps[label]):.1f}% at most"
            if gaps[label]
            else ""
        )
        print(
            f"- {label}: of the real pairwise differences outside noise, {agree} ordered the same, "
            f"{contradict} the other way, {unordered} not at all (equal makespans); {ties} pairs tied "
            f"within the real spread{apart}"
        )
    print(f"\n{time.perf_counter() - began:.0f} s in all")


if __name__ == "__main__":
    run_main("bench.counterfactual", main)
