"""The sandboxed evaluator's cost: evaluations per second on real workers, and its fixed cost per test.

Measures, each repeated ``--repeats`` times (table: min / median / max over repeats):

* **evaluations/s, 1 worker** and **2 workers**: ``--evals`` evaluations per worker of a trivial correct
  stdin program (one test: ``print(sum(map(int, input().split())))``) through real
  :class:`~asyncroll.workers.ProcessWorker` processes running the built-in ``lcb_evaluate``, all
  workers busy at once; wall time from the first job sent to the last reply. The first call of each
  worker (which runs the one-off isolation probe) is a warm-up outside the timed window.
* **fixed cost per test**: one :meth:`Sandbox.run <asyncroll.evaluator.sandbox.Sandbox.run>` of the
  empty program ``pass`` in this process, every isolation layer on: launcher, namespaces, cgroups,
  interpreter start, harness, prelude imports, kill and clean-up (median of ``--tests`` runs).
* the same **without the per-test cgroups** (every other layer on), to show what joining a
  ``memory``/``pids`` cgroup (v1, or v2 on a host without v1 hierarchies) costs per test;
* reference points for what the fixed cost is made of, each a plain ``subprocess.run`` with the
  sandbox's interpreter (median of ``--tests`` runs): the **bare interpreter start**
  (``python -I -c pass``), the start plus
  **LiveCodeBench's prelude imports** (the modules the harness puts in scope before every program),
  and the start inside **fresh PID, mount and network namespaces** (``unshare … python -I -c pass``).

Run: ``python -m bench.evaluator [--repeats 5] [--evals 40] [--tests 40]`` (as root for full isolation;
as another user it measures the layers that work there, named on its isolation line).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from asyncroll.evaluator.harness import PRELUDE_MODULES
from asyncroll.evaluator.isolation import detect
from asyncroll.evaluator.sandbox import Sandbox
from asyncroll.workers import JobRequest, ProcessWorker, ToolSpec
from bench.common import machine, number_arg, quantiles, run_child, run_main

PROGRAM = "print(sum(map(int, input().split())))\n"
TESTS = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]


async def _evaluations_per_second(workers: int, evals: int, weak: bool) -> float:
    """``weak``: the layers this machine has (printed above the table) are accepted, as ``asyncroll run
    --allow-weak-isolation`` accepts them: the program is this bench's own."""
    pool = [ProcessWorker(i, (ToolSpec("lcb_evaluate"),), startup_timeout=60) for i in range(workers)]
    await asyncio.gather(*(w.start() for w in pool))
    try:
        job = {"code": PROGRAM, "tests": TESTS, **({"allow_weak_isolation": True} if weak else {})}
        warm = await asyncio.gather(*(w.call(JobRequest(0, "lcb_evaluate", job), 60) for w in pool))
        assert all(r.reply.ok and r.reply.value["passed"] for r in warm), warm

        async def drive(worker: ProcessWorker) -> None:
            for i in range(1, evals + 1):
                reply = (await worker.call(JobRequest(i, "lcb_evaluate", job), 60)).reply
                assert reply.ok and reply.value["passed"], reply

        began = time.perf_counter()
        await asyncio.gather(*(drive(w) for w in pool))
        return workers * evals / (time.perf_counter() - began)
    finally:
        await asyncio.gather(*(w.aclose() for w in pool))


def _fixed_cost_ms(sandbox: Sandbox, tests: int) -> float:
    scratch = Path(tempfile.mkdtemp(prefix="asyncroll-bench-eval-"))
    try:
        code = scratch / "solution.py"
        code.write_text("pass\n")
        out = []
        for _ in range(tests):
            began = time.perf_counter()
            execution = sandbox.run(code, b"", scratch)
            out.append((time.perf_counter() - began) * 1000)
            assert execution.done == {"kind": "done", "ok": True}, execution
        return statistics.median(out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _command_ms(command: list[str], tests: int) -> float:
    out = []
    for _ in range(tests):
        began = time.perf_counter()
        run_child(command)  # a failing command ends the bench with its reason (a prelude import missing)
        out.append((time.perf_counter() - began) * 1000)
    return statistics.median(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=number_arg(int, 1, 1_000_000), default=5)
    parser.add_argument(
        "--evals",
        type=number_arg(int, 1, 1_000_000),
        default=40,
        help="timed evaluations per worker per repeat",
    )
    parser.add_argument(
        "--tests",
        type=number_arg(int, 1, 1_000_000),
        default=40,
        help="sandbox runs per repeat for the fixed cost",
    )
    args = parser.parse_args()
    began = time.perf_counter()
    report = detect()
    probe_s = time.perf_counter() - began
    print(f"machine: {machine()}; load average at start {os.getloadavg()[0]:.1f} (other work on the machine)")
    active = [name for name, layer in report.to_dict()["layers"].items() if layer["active"]]
    print(
        f"isolation: {'weak, missing ' + ', '.join(report.missing) if report.weak else 'full'}; active: "
        f"{', '.join(active)}; interpreter {report.config.python}; one-off probe {probe_s:.2f} s"
    )
    sandbox = Sandbox(report.config)
    with_cgroups = report.config.cgroup_version is not None
    plain = replace(report.config, memory_cgroup=None, pids_cgroup=None, cgroup_v2=None)
    no_cgroups = Sandbox(plain) if with_cgroups else None
    rows: dict[str, list[float]] = {
        "evaluations/s, 1 worker (1 test each)": [],
        "evaluations/s, 2 workers (1 test each)": [],
        "fixed cost per test, ms (sandbox.run of `pass`)": [],
        "  compare: same without the per-test cgroups, ms": [],
        "  compare: bare `python -I -c pass`, ms": [],
        "  compare: bare start + LCB prelude imports, ms": [],
        "  compare: bare start in fresh pid+mount+net ns, ms": [],
    }
    python = report.config.python
    prelude = "import " + ",".join(m for m in PRELUDE_MODULES if m != "builtins")
    unshare = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--net", "--"]
    names = list(rows)
    for _ in range(args.repeats):
        rows[names[0]].append(asyncio.run(_evaluations_per_second(1, args.evals, report.weak)))
        rows[names[1]].append(asyncio.run(_evaluations_per_second(2, args.evals, report.weak)))
        rows[names[2]].append(_fixed_cost_ms(sandbox, args.tests))
        if no_cgroups is not None:
            rows[names[3]].append(_fixed_cost_ms(no_cgroups, args.tests))
        rows[names[4]].append(_command_ms([python, "-I", "-c", "pass"], args.tests))
        rows[names[5]].append(_command_ms([python, "-I", "-c", prelude], args.tests))
        if report.config.pid_namespace:
            rows[names[6]].append(_command_ms([*unshare, python, "-I", "-c", "pass"], args.tests))
    print(f"repeats: {args.repeats}; {args.evals} evaluations per worker; {args.tests} runs per fixed cost")
    print(f"| {'measure':<56} | {'min':>7} | {'median':>7} | {'max':>7} |")
    print(f"|{'-' * 58}|{'-' * 9}|{'-' * 9}|{'-' * 9}|")
    unmeasured = {  # the layers this machine lacks (the isolation line): their rows say so, not vanish
        names[3]: None if with_cgroups else "no per-test cgroups here",
        names[6]: None if report.config.pid_namespace else "no PID namespace here",
    }
    for name, values in rows.items():
        if not values:
            label = f"{name} ({unmeasured.get(name) or 'not measured'})"
            print(f"| {label:<56} | {'n/a':>7} | {'n/a':>7} | {'n/a':>7} |")
            continue
        lo, mid, hi = quantiles(values)
        print(f"| {name:<56} | {lo:7.1f} | {mid:7.1f} | {hi:7.1f} |")
    print(f"load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    run_main("bench.evaluator", main)
