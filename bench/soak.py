"""Soak a real ``asyncroll run``: does the runtime's memory, fds, threads or children grow over a long run?

Writes a workload of many short trajectories (``spin_ms`` jobs) mixed, by ``--faults``, with tools that
crash their worker, hang past ``--tool-timeout``, raise, return a large result or leak memory (past
``--worker-max-rss-mb``), so workers are replaced all run long. Runs it (the scripted backend, or with
``--http`` the vllm backend against ``asyncroll serve-sim`` on loopback) and samples from outside every
``--interval`` s: the run's RSS, open fds, threads, live children and zombies, its workers' summed RSS and
the size of events.jsonl. Prints min/median/max of each per third of the run (the first third is warm-up):
what grows from the second to the last third grows with jobs or with worker replacements. Ctrl-C stops
the run as the time limit does and reports the samples so far (exit status 130).

Run: ``python -m bench.soak --minutes 5 --faults 0.02 --output /tmp/soak``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from asyncroll.workers.orphans import ORIGIN_ENV
from bench.common import machine, number_arg, run_main

TOOLS_SOURCE = '''"""Tools that misbehave, for bench.soak."""

import os
import subprocess
import time

_HELD = []


def crash(code: int) -> int:
    os._exit(code)


def orphan(code: int) -> int:
    subprocess.Popen(["sleep", "600"], start_new_session=True)  # detached: left behind when the worker dies
    os._exit(code)


def hang(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def fail(message: str) -> str:
    raise ValueError(message)


def huge(chars: int) -> str:
    return "x" * chars


def hog(mib: int) -> int:
    _HELD.append(bytearray(mib * 2**20))
    return len(_HELD)
'''
FAULTS = ("crash", "orphan", "hang", "fail", "huge", "hog")
_INPUTS = {
    "crash": "code",
    "orphan": "code",
    "hang": "seconds",
    "fail": "message",
    "huge": "chars",
    "hog": "mib",
}
# Per trajectory: steps of ~1 ms of model latency and a few ms of tool CPU: the run is all overhead.
_SPIN_MS = 2.0
_LATENCY_MS = 1.0


def _fault_args(name: str, tool_timeout: float) -> Any:
    return {"crash": 3, "orphan": 3, "hang": tool_timeout + 1.0, "fail": 7, "huge": 200_000, "hog": 50}[name]


def workload(path: Path, n: int, faults: float, tool_timeout: float, seed: int) -> None:
    rng = random.Random(seed)
    tools = [{"name": "spin_ms", "description": "spin", "inputs": {"milliseconds": "number"}}]
    tools += [
        {"name": f, "description": f, "inputs": {_INPUTS[f]: "number"}, "implementation": "soak_tools.py"}
        for f in FAULTS
    ]
    (path.parent / "soak_tools.py").write_text(TOOLS_SOURCE)
    with path.open("w") as out:
        for i in range(n):
            script: list[dict[str, Any]] = []
            for _ in range(rng.randint(1, 3)):
                name = rng.choice(FAULTS) if rng.random() < faults else "spin_ms"
                arg = _fault_args(name, tool_timeout) if name in FAULTS else _SPIN_MS
                key = _INPUTS.get(name, "milliseconds")
                script.append(
                    {"type": "tool", "name": name, "arguments": {key: arg}, "latency_ms": _LATENCY_MS}
                )
            script.append({"type": "final", "answer": str(i), "latency_ms": _LATENCY_MS})
            problem = {"id": f"soak-{i}", "prompt": f"soak {i}", "tools": tools, "reference_answer": str(i)}
            out.write(json.dumps({**problem, "script": script}) + "\n")


def _status_kib(pid: int, key: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, state) of every process whose parent is ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[1]) == pid:
                found.append((int(entry), fields[0]))
    return found


def sample(pid: int, events: Path) -> dict[str, float] | None:
    rss = _status_kib(pid, "VmRSS")
    try:
        fds, threads = len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None
    if rss is None:
        return None
    kids = _children(pid)
    live = [k for k, state in kids if state != "Z"]
    return {
        "rss_mib": rss / 1024,
        "fds": fds,
        "threads": threads,
        "children": len(live),
        "zombies": len(kids) - len(live),
        "workers_rss_mib": sum(_status_kib(k, "VmRSS") or 0 for k in live) / 1024,
        "events_mib": events.stat().st_size / 2**20 if events.exists() else 0.0,
    }


def left_behind(pid: int) -> list[int]:
    """Processes still carrying an origin of the run's workers (``ASYNCROLL_WORKER_ORIGIN`` = ``pid:…``)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes() if entry.isdigit() else b""
        except OSError:
            continue
        if f"{ORIGIN_ENV}={pid}:".encode() in env:
            found.append(int(entry))
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, limit: float, server: subprocess.Popen[bytes], log: Path) -> None:
    """Until serve-sim listens on ``port``; one that exits first ends the soak at once with its reason
    (its stderr, in ``log``), not after the whole ``limit`` with none."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if server.poll() is not None:
            tail = (
                "\n".join(log.read_text(errors="replace").strip().splitlines()[-10:]) or "(nothing on stderr)"
            )
            raise SystemExit(
                f"bench.soak: serve-sim exited with {server.returncode} before it listened:\n{tail}"
            )
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise SystemExit(f"bench.soak: serve-sim did not listen on {port} within {limit:g}s (its stderr: {log})")


def report(samples: list[dict[str, float]]) -> None:
    samples = [s for s in samples if s["events_mib"] > 0]  # before: the workload is still being read
    if len(samples) < 3:
        print("too few samples")
        return
    third = len(samples) // 3
    windows = [samples[:third], samples[third : 2 * third], samples[2 * third :]]
    print(f"{'quantity':<16}" + "".join(f"{'third ' + str(i + 1) + ' min/med/max':>30}" for i in range(3)))
    for key in samples[0]:
        cells = []
        for window in windows:
            values = [s[key] for s in window]
            cells.append(f"{min(values):.1f}/{statistics.median(values):.1f}/{max(values):.1f}")
        print(f"{key:<16}" + "".join(f"{c:>30}" for c in cells))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=number_arg(float, 0, 600, low_open=True), default=5.0)
    parser.add_argument("--trajectories", type=number_arg(int, 1, 10_000_000), default=1_000_000)
    parser.add_argument(
        "--faults", type=number_arg(float, 0, 1), default=0.02, help="share of bad tool calls"
    )
    parser.add_argument("--tool-timeout", type=number_arg(float, 0.1, 60), default=1.0)
    parser.add_argument("--interval", type=number_arg(float, 0.1, 60), default=5.0)
    parser.add_argument("--http", action="store_true", help="--backend vllm against serve-sim on loopback")
    parser.add_argument("--output", type=Path, required=True, help="a new folder")
    args = parser.parse_args(argv)
    if args.output.exists() or args.output.is_symlink():
        parser.error(f"--output {args.output} already exists; choose a new folder (nothing is overwritten)")
    try:
        args.output.mkdir(parents=True)
    except OSError as exc:  # a file on its path, no permission: said as the option's, not a traceback
        parser.error(f"--output {args.output}: cannot create it: {exc.strerror or exc}")
    path = args.output / "workload.jsonl"
    workload(path, args.trajectories, args.faults, args.tool_timeout, 0)
    cmd = [sys.executable, "-m", "asyncroll", "run", "--workload", str(path), "--output"]
    cmd += [str(args.output / "run"), "--tool-timeout", str(args.tool_timeout), "--worker-max-rss-mb", "64"]
    cmd += ["--tool-errors", "observe", "--progress", "--cpu-workers", "2", "--max-active-trajectories", "16"]
    server: subprocess.Popen[bytes] | None = None
    run: subprocess.Popen[bytes] | None = None
    samples: list[dict[str, float]] = []
    interrupted = False
    try:  # serve-sim too is stopped however the soak ends (it was left running when it did not listen)
        if args.http:
            port = _free_port()
            serve = [sys.executable, "-m", "asyncroll", "serve-sim", "--port", str(port), "--model", "sim"]
            log = args.output / "serve-sim.txt"
            with log.open("wb") as server_err:
                server = subprocess.Popen(
                    [*serve, "--step-base-ms", "1"], stdout=subprocess.DEVNULL, stderr=server_err
                )
            _wait_port(port, 60, server, log)
            cmd += ["--backend", "vllm", "--model", "sim", "--endpoint", f"http://127.0.0.1:{port}"]
            cmd += ["--replay", "--max-tokens", "4", "--max-inflight-model-requests", "16"]
        print(f"machine: {machine()}")
        print(
            f"soak: up to {args.minutes:g} min, a sample every {args.interval:g} s, {args.trajectories} "
            f"trajectories, faults {args.faults:g}, tool timeout {args.tool_timeout:g} s; {shlex.join(cmd)}",
            flush=True,
        )
        with (args.output / "stderr.txt").open("w") as err:
            run = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + args.minutes * 60
        try:
            while run.poll() is None and time.monotonic() < deadline:
                time.sleep(args.interval)
                found = sample(run.pid, args.output / "run" / "events.jsonl")
                if found is not None:
                    samples.append(found)
                    print(json.dumps({k: round(v, 1) for k, v in found.items()}), flush=True)
        except KeyboardInterrupt:  # Ctrl-C: the run stops as at the time limit; the samples are reported
            interrupted = True
            print("bench.soak: interrupted; stopping the run", file=sys.stderr, flush=True)
        if run.poll() is None:
            run.send_signal(signal.SIGINT)  # the run's own Ctrl-C path: it ends cleanly and writes its books
            run.wait(120)
    finally:
        for process, stop in ((run, "kill"), (server, "terminate")):
            if process is not None and process.poll() is None:
                getattr(process, stop)()
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(30)
    report(samples)
    print(f"exit status {run.returncode}; left behind: {left_behind(run.pid) or 'nothing'}")
    if interrupted:
        raise SystemExit(130)


if __name__ == "__main__":
    run_main("bench.soak", main)
