"""Export cost of ``trace.json`` and ``timeline.html`` as runs grow: 1k, 10k and 100k events.

Each size is one run of the real runtime on a virtual clock with virtual workers (seconds of CPU, no real
waiting; the workload of :mod:`bench.simspeed`, ~20 events per trajectory), written to a run directory with
the exports switched off; then :func:`asyncroll.outputs.rundir.export` — the very function a run calls — is
timed ``--repeats`` times on it: parsing ``events.jsonl`` once, then writing each file. Reported: min /
median / max seconds of each step and the files' sizes. Where ``chromium`` is installed, the page is also
opened headless (``#redraws``) and the page times itself with ``performance.now()``: its first draw
(``data-firstdrawms``, includes warm-up) and the median of nine further full redraws (``data-redrawms``,
what one zoom or pan step costs), each min / median / max over the repeats. Headless Chromium here draws
in software (``--disable-gpu``), so a desktop browser is likely faster, not slower. Memory: the export once
more in a fresh process (``python -c``), which reports its peak RSS (``ru_maxrss``) and its RSS after the
imports (``VmHWM`` of ``/proc/self/status``), so the difference is what the export itself needed (SPEC §3:
it must not grow with the run).

Run: ``python -m bench.export [--events 1000,10000,100000] [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import asyncroll.outputs.rundir as rundir
from asyncroll.clock import VirtualClock
from asyncroll.config import build_config
from asyncroll.runtime.run import Run, prepare
from asyncroll.runtime.virtual_worker import virtual_factory
from bench.common import machine, number_arg, quantiles, run_child, run_main, sizes_arg, write_workload
from bench.simspeed import small_workload

EVENTS_PER_TRAJECTORY = 20  # roughly, for this workload; the table reports the real count


def make_run(target_events: int, tmp: Path) -> Path:
    """A recorded virtual-clock run with about ``target_events`` events, exports not yet written."""
    n = max(1, round(target_events / EVENTS_PER_TRAJECTORY))
    workload = write_workload(tmp / f"w{target_events}.jsonl", small_workload(n, seed=0))
    out = tmp / f"run{target_events}"
    cfg = build_config(
        {
            "workload": workload,
            "output": out,
            "max_active_trajectories": 64,
            "max_inflight_model_requests": 16,
            "cpu_workers": 4,
            "max_turns": 6,
        }
    )
    clock = VirtualClock()
    real_export = rundir.export

    def no_export(
        out: Path,
        final: Mapping[str, Any] | None = None,
        stop: rundir.ExportStop | None = None,
        into: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return {}  # the run's own export is what we time below, separately

    rundir.export = no_export
    try:
        outcome = clock.run(
            Run(
                prepare(cfg, ["bench.export"]),
                clock,
                worker_factory=virtual_factory(clock, simulate_tools=True),
            ).execute()
        )
    finally:
        rundir.export = real_export
    assert outcome.status == "complete", outcome.error
    return out


def draw_ms(page: Path, profile: Path) -> tuple[float, float] | None:
    """(first draw, median redraw) in ms, as the page measured them in headless Chromium; None without it."""
    chromium = shutil.which("chromium")
    if chromium is None:
        return None
    cmd = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        f"--user-data-dir={profile}",
        "--window-size=1400,1000",
        "--dump-dom",
        page.as_uri() + "#redraws",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"bench.export: headless chromium did not draw {page} within 300 s") from None
    body = re.search(r"<body([^>]*)>", proc.stdout)
    attrs = dict(re.findall(r'data-([a-z]+)="([^"]*)"', body.group(1))) if body else {}
    if "redrawms" not in attrs:  # the bench's end with chromium's reason, not a RuntimeError traceback
        tail = proc.stderr.strip()[-1000:] or f"(nothing on stderr; exit status {proc.returncode})"
        raise SystemExit(f"bench.export: the page {page} did not render in headless chromium:\n{tail}")
    return float(attrs["firstdrawms"]), float(attrs["redrawms"])


NO_CHROMIUM = "chromium not installed"
PEAK_RSS = """
import sys
from pathlib import Path
import asyncroll.outputs.rundir, asyncroll.outputs.timeline, asyncroll.outputs.trace

def kb(field):  # this process's own figures: ru_maxrss would count the forking parent's pages
    return next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith(field + ":"))

base = kb("VmHWM")
exports = asyncroll.outputs.rundir.export(Path(sys.argv[1]))
assert exports["trace.json"]["ok"] and exports["timeline.html"]["ok"], exports
print(base, kb("VmHWM"))
"""


def peak_rss_mb(out: Path) -> tuple[float, float] | None:
    """(peak RSS, RSS after imports) in MB of a fresh process that exports ``out`` once (Linux only)."""
    if not Path("/proc/self/status").exists():
        return None
    proc = run_child([sys.executable, "-c", PEAK_RSS, str(out)], timeout=3600)
    base, peak = (int(x) / 1024 for x in proc.stdout.split())
    return peak, base


def fmt(xs: list[float], digits: int = 3) -> str:
    lo, mid, hi = quantiles(xs)
    return f"{lo:.{digits}f} / {mid:.{digits}f} / {hi:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--events",
        type=sizes_arg,
        default=[1000, 10000, 100000],
        help="comma-separated run sizes, events (about 20 a trajectory)",
    )
    parser.add_argument("--repeats", type=number_arg(int, 1, 1_000_000), default=5)
    args = parser.parse_args()
    print(f"machine: {machine()}")
    sizes = ",".join(map(str, args.events))
    print(f"command: python -m bench.export --events {sizes} --repeats {args.repeats}")
    print(
        "| events | trajectories | parse events.jsonl s | write trace.json s | write timeline.html s "
        "| trace.json MB | timeline.html MB | export peak RSS MB (after imports) | page "
        "| first draw ms | one redraw (zoom/pan step) ms |"
    )
    print("|---:|---:|---|---|---|---:|---:|---:|---|---|---|")
    tmp = Path(tempfile.mkdtemp(prefix="asyncroll-export-"))
    try:
        for target in args.events:
            out = make_run(target, tmp)
            events = sum(1 for _ in (out / "events.jsonl").open("rb"))
            trajectories = sum(1 for _ in (out / "results.jsonl").open("rb"))
            timings: dict[str, list[float]] = {"parse": [], "trace": [], "timeline": []}
            first: list[float] = []
            redraw: list[float] = []
            for i in range(args.repeats):
                began = time.perf_counter()
                exports: dict[str, Any] = rundir.export(out)
                assert time.perf_counter() - began > 0
                assert exports["trace.json"]["ok"] and exports["timeline.html"]["ok"], exports
                timings["parse"].append(exports["events_parse_seconds"])
                timings["trace"].append(exports["trace.json"]["seconds"])
                timings["timeline"].append(exports["timeline.html"]["seconds"])
                ms = draw_ms(out / "timeline.html", tmp / f"profile{i}")
                if ms is not None:
                    first.append(ms[0])
                    redraw.append(ms[1])
            html = (out / "timeline.html").read_text()
            data = re.search(r"([0-9,]+) of ([0-9,]+) spans drawn individually", html)
            assert data is not None
            note = f"{data.group(1)} of {data.group(2)} spans individual"
            note += ", rest merged into bars (says so)" if "Down-sampled:" in html else ""
            mb = [(out / name).stat().st_size / 1e6 for name in ("trace.json", "timeline.html")]
            rss = peak_rss_mb(out)
            memory = f"{rss[0]:.0f} ({rss[1]:.0f})" if rss else "n/a"
            print(
                f"| {events:,} | {trajectories:,} | {fmt(timings['parse'])} | {fmt(timings['trace'])} "
                f"| {fmt(timings['timeline'])} | {mb[0]:.2f} | {mb[1]:.2f} | {memory} | {note} "
                f"| {fmt(first, 1) if first else NO_CHROMIUM} "
                f"| {fmt(redraw, 1) if redraw else NO_CHROMIUM} |",
                flush=True,
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    run_main("bench.export", main)
