"""Shared helpers for the benchmarks: the machine they ran on, workloads, one run in-process."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, get_args

from asyncroll import cli_signals
from asyncroll.clock import Clock, SystemClock, VirtualClock
from asyncroll.config import PolicyName, build_config
from asyncroll.outputs.receipt import cpu_model, host
from asyncroll.runtime.run import Run, RunOutcome, prepare
from asyncroll.runtime.virtual_worker import virtual_factory


def machine() -> str:
    usable = host()["usable_cpus"]  # a benchmark run under taskset or a cpuset says so
    cpus = f"{os.cpu_count()} logical CPUs" + (
        f" ({usable} usable)" if usable not in (None, os.cpu_count()) else ""
    )
    return (
        f"{platform.node()}: {cpu_model()}, {cpus}, "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}"
    )


def write_workload(path: Path, problems: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(p) + "\n" for p in problems))
    return path


def final_only(n: int, latency_ms: float) -> list[dict[str, Any]]:
    return [
        {
            "id": f"p{i}",
            "prompt": "answer",
            "script": [{"type": "final", "answer": i, "latency_ms": latency_ms}],
        }
        for i in range(n)
    ]


def tool_chain(
    n: int, calls: int, model_ms: float, tool: str = "add", cpu_ms: float = 0
) -> list[dict[str, Any]]:
    args = {"a": 1, "b": 2} if tool == "add" else {"milliseconds": cpu_ms}
    step = {"type": "tool", "name": tool, "arguments": args, "latency_ms": model_ms}
    return [
        {
            "id": f"p{i}",
            "prompt": "work",
            "tools": [{"name": tool}],
            "script": [step] * calls + [{"type": "final", "answer": i, "latency_ms": model_ms}],
        }
        for i in range(n)
    ]


_SCRATCH: tempfile.TemporaryDirectory[str] | None = None


def run_main(
    name: str,
    main: Callable[[], None],
    stopped: str = "what it printed above is whole, the rest was not measured",
) -> None:
    """Run a bench's ``main`` as ``python -m bench.X`` does: a stop signal (Ctrl-C; SIGTERM from
    ``timeout`` or ``kill``; SIGHUP but under ``nohup``) stops it as Ctrl-C does — a run's event loop
    cancels the run, which stops its workers — then one line on stderr, exit 130, and the scratch
    directory is removed on the way out. SIGTERM and SIGHUP used to kill the process outright, leaving the
    scratch directory (hundreds of MB for a map) in the temporary directory; Ctrl-C printed a
    KeyboardInterrupt traceback. SIGINT keeps Python's own handler, which asyncio's runner replaces with
    its cancelling one during a run (a handler raising KeyboardInterrupt inside the loop left a task's
    exception unretrieved, printed at exit); SIGTERM and SIGHUP are passed on to it as a SIGINT.
    ``stopped`` says what the stop leaves. The handlers in place before are put back after (a test runs
    ``main`` in the test's process)."""
    received: list[str] = []

    def as_ctrl_c(signum: int, _frame: FrameType | None) -> None:
        received.append(signal.Signals(signum).name)
        signal.raise_signal(signal.SIGINT)

    others = [sig for sig in (getattr(signal, n, None) for n in ("SIGTERM", "SIGHUP")) if sig is not None]
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, *others)}
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a script's background job starts ignoring it
    for sig in others:
        if not (sig == getattr(signal, "SIGHUP", None) and before[sig] == signal.SIG_IGN):  # nohup's stays
            signal.signal(sig, as_ctrl_c)
    try:
        main()
    except KeyboardInterrupt:
        sys.stdout.flush()
        print(f"{name}: interrupted by {received[0] if received else 'SIGINT'}; {stopped}", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        for sig, handler in before.items():
            cli_signals.put_back(sig, handler)


def scratch(prefix: str) -> Path:
    """A new empty directory for a benchmark's working files (workloads, run directories), removed when
    the process exits: benchmarks report figures, and their runs (hundreds of MB over a map) must not
    pile up in the temporary directory."""
    global _SCRATCH
    if _SCRATCH is None:
        _SCRATCH = tempfile.TemporaryDirectory(prefix="asyncroll-bench-")
    return Path(tempfile.mkdtemp(prefix=prefix, dir=_SCRATCH.name))


def run_once(
    problems: list[dict[str, Any]] | Path, *, virtual: bool = False, **settings: Any
) -> tuple[RunOutcome, Path, float]:
    """Run a workload (problems, or a workload file) through the real runtime, writing real run files;
    returns the outcome, the run directory and the wall seconds."""
    tmp = scratch("run-")
    workload = problems if isinstance(problems, Path) else write_workload(tmp / "workload.jsonl", problems)
    cfg = build_config({"workload": workload, "output": tmp / "run", **settings})
    clock: Clock = VirtualClock() if virtual else SystemClock()
    factory = virtual_factory(clock, simulate_tools=True) if isinstance(clock, VirtualClock) else None
    run = Run(prepare(cfg, ["bench"]), clock, worker_factory=factory)
    began = time.perf_counter()
    outcome = clock.run(run.execute())
    return outcome, tmp / "run", time.perf_counter() - began


def run_child(argv: list[str], *, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """Run a benchmark's child process with its output captured. A child that fails ends the benchmark
    with its command and the end of its stderr (``check=True`` gave a CalledProcessError traceback that
    named the command and hid the reason, which the capture had kept)."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-20:]) or "(nothing on stderr)"
        raise SystemExit(f"{' '.join(argv[:4])} … exited with {done.returncode}:\n{tail}")
    return done


def incomplete(bench: str, where: str, n: int, outcome: RunOutcome) -> str:
    """Why a bench stops at a run (real or simulated) that did not complete every trajectory: its
    figures compare the same work (a crunch job past the 60 s tool timeout fails its trajectory)."""
    if outcome.summary is None:
        return f"{bench}: the run of {where} ended {outcome.status}: {outcome.error}"
    counts = outcome.summary["counts"]
    return (
        f"{bench}: the run of {where} completed {counts['completed']} of {n} trajectories "
        f"({counts['failed']} failed, {counts['max_turns']} at max turns); the comparison needs every "
        "trajectory completed (a job over the 60 s tool timeout fails its trajectory: lower --cpu-ms)"
    )


def events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def quantiles(xs: list[float]) -> tuple[float, float, float]:
    """Min, median, max. The median is the true one (the mean of the two middle values for an even
    count), not the upper middle value, which for two seeds is the max."""
    s = sorted(xs)
    return s[0], statistics.median(s), s[-1]


def number_arg(kind: type, low: float, high: float, *, low_open: bool = False) -> Callable[[str], Any]:
    """An argparse type: a finite ``kind`` in [low, high] (or (low, high] with ``low_open``)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not {'an integer' if kind is int else 'a number'}: {text!r}"
            ) from None
        too_low = value <= low if low_open else value < low
        if not math.isfinite(value) or too_low or value > high:
            what = "an integer" if kind is int else "a finite number"
            bounds = f"{'>' if low_open else '>='} {low:.10g} and <= {high:.10g}"
            raise argparse.ArgumentTypeError(f"must be {what} {bounds}, got {text}")
        return value

    return parse


def cell_jobs(text: str) -> int:
    """An argparse type for a map's ``--jobs`` (processes running cells at once): at least 1, and more
    than the CPUs this process may use is lowered to them, said on stderr, as ``simulate --sweep --jobs``
    does (``--jobs 1000`` started a process per cell on a 2-core machine)."""
    from asyncroll.commands.simulate_flags import sweep_jobs

    return sweep_jobs(None, number_arg(int, 1, 1_000_000)(text))


def points_arg(text: str) -> list[tuple[int, int, int]]:
    """An argparse type: comma-separated operating points, each ``active/inflight/workers``
    (positive integers), e.g. ``8/4/2,32/4/1``, none twice."""
    parse = number_arg(int, 1, 10_000)
    points = []
    for item in text.split(","):
        parts = item.strip().split("/")
        if len(parts) != 3 or not all(part.strip() for part in parts):
            raise argparse.ArgumentTypeError(
                f"{item.strip()!r} is not an operating point active/inflight/workers (e.g. 8/4/2)"
            )
        active, inflight, workers = (parse(part.strip()) for part in parts)
        if (active, inflight, workers) in points:  # run twice, it read as two points
            raise argparse.ArgumentTypeError(f"operating point {active}/{inflight}/{workers} given twice")
        points.append((active, inflight, workers))
    return points


def sizes_arg(text: str) -> list[int]:
    """An argparse type: a comma-separated list of positive integers."""
    parse = number_arg(int, 1, 10_000_000)
    items = text.split(",")
    if any(not item.strip() for item in items):
        raise argparse.ArgumentTypeError(f"an empty item in {text!r}")
    return [parse(item.strip()) for item in items]


def policy_arg(text: str) -> str:
    """An argparse type: a policy name the runtime knows (``--policy`` of ``asyncroll run``)."""
    from asyncroll.policies.registry import unknown_policy_hint

    if text not in get_args(PolicyName):
        raise argparse.ArgumentTypeError(f"unknown policy {text!r}{unknown_policy_hint(text)}")
    return text


def policies_arg(text: str) -> list[str]:
    """An argparse type: a comma-separated list of policy names the runtime knows, no policy twice
    (``asyncroll`` is the default rule's name, ``gpu_first`` is ``tool_first``): each would be a
    duplicate row of its table."""
    from asyncroll.policies.registry import canonical_policy, two_names_of_one

    names = [policy_arg(item.strip()) for item in text.split(",")]
    pair = two_names_of_one(names)
    if pair is not None:
        first, second = pair
        why = (
            "given twice"
            if first == second
            else f"and {second!r} are one policy ({canonical_policy(second)})"
        )
        raise argparse.ArgumentTypeError(f"{first!r} {why}")
    return names
