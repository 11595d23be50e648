"""Checks on a run's exports: the Trace Event Format rules Perfetto relies on (required fields per phase,
integer microseconds, durations >= 0, B/E pairs matched, proper nesting per thread, metadata naming every
process and thread, sorted events), the page's embedded data, and the page opened in headless Chromium
(Debian's ``chromium``; ``.ci/run`` installs it when missing)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

from asyncroll.outputs.trace import write_trace

DATA_RE = re.compile(r'<script type="application/json" id="data">(.*?)</script>', re.S)


def check_trace_format(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """Assert the Trace Event Format rules; returns the non-metadata events."""
    assert set(trace) >= {"traceEvents", "displayTimeUnit", "metadata"}
    events = trace["traceEvents"]
    phases = [e["ph"] for e in events]
    first_other = next((i for i, p in enumerate(phases) if p != "M"), len(phases))
    assert "M" not in phases[first_other:], "metadata events come first"
    processes, threads = set(), set()
    for e in events:
        assert {"name", "ph", "pid", "tid"} <= set(e), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "M" and e["name"] == "process_name":
            processes.add(e["pid"])
        if e["ph"] == "M" and e["name"] == "thread_name":
            threads.add((e["pid"], e["tid"]))
    body = events[first_other:]
    required = {"X": {"ts", "dur"}, "B": {"ts"}, "E": {"ts"}, "i": {"ts", "s"}, "C": {"ts", "args"}}
    open_b: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for e in body:
        assert e["ph"] in required, f"unexpected phase: {e}"
        assert required[e["ph"]] <= set(e), f"missing fields for phase {e['ph']}: {e}"
        assert isinstance(e["name"], str) and e["name"], e
        assert isinstance(e["ts"], int) and e["ts"] >= 0, e
        assert e["pid"] in processes, e
        if e["ph"] == "B":
            open_b[(e["pid"], e["tid"])].append(e)
        if e["ph"] == "E":
            assert open_b[(e["pid"], e["tid"])], f"E without B: {e}"
            assert open_b[(e["pid"], e["tid"])].pop()["ts"] <= e["ts"], e
        if e["ph"] == "X":
            assert isinstance(e["dur"], int) and e["dur"] >= 0, e
        if e["ph"] in ("X", "i", "B", "E"):
            assert (e["pid"], e["tid"]) in threads, e
        if e["ph"] == "i":
            assert e["s"] in ("t", "p", "g")
        if e["ph"] == "C":
            assert e["args"] and all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in e["args"].values()
            )
    assert not any(open_b.values()), f"B without E: {dict(open_b)}"
    assert [e["ts"] for e in body] == sorted(e["ts"] for e in body)
    stacks: dict[tuple[int, int], list[int]] = defaultdict(list)  # X spans nest properly on each thread
    for e in (e for e in body if e["ph"] == "X"):
        stack = stacks[(e["pid"], e["tid"])]
        while stack and stack[-1] <= e["ts"]:
            stack.pop()
        assert not stack or e["ts"] + e["dur"] <= stack[-1], f"overlapping spans on one track: {e}"
        stack.append(e["ts"] + e["dur"])
    return body


def load_trace(run: Path) -> dict[str, Any]:
    path = write_trace(run)
    assert path == run / "trace.json"
    trace: dict[str, Any] = json.loads(path.read_text())
    return trace


def thread_names(trace: dict[str, Any], pid: int) -> list[str]:
    named = [e for e in trace["traceEvents"] if e["name"] == "thread_name" and e["pid"] == pid]
    return [e["args"]["name"] for e in sorted(named, key=lambda e: e["tid"])]


def page_data(html: str) -> dict[str, Any]:
    match = DATA_RE.search(html)
    assert match, "embedded data block"
    data: dict[str, Any] = json.loads(match.group(1))
    return data


def read_trace(run: Path) -> dict[str, Any]:
    trace: dict[str, Any] = json.loads((run / "trace.json").read_text())
    return trace


def named_threads(trace: dict[str, Any]) -> dict[tuple[int, int], str]:
    return {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }


def chromium_page(
    page: Path, tmp_path: Path, screenshot: Path | None = None
) -> tuple[dict[str, str], list[str]]:
    """Open ``page`` in headless Chromium; returns the <body> data attributes after rendering and every
    console message the page produced (Chromium logs them as ``CONSOLE`` lines on stderr)."""
    chromium = shutil.which("chromium")
    assert chromium is not None
    cmd = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--enable-logging=stderr",
        "--v=0",
        "--window-size=1400,1000",
        *([f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]),
        page.as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    body = re.search(r"<body([^>]*)>", proc.stdout)
    attrs = dict(re.findall(r'data-([a-z]+)="([^"]*)"', body.group(1))) if body else {}
    assert screenshot or body, f"no DOM dumped (exit {proc.returncode}): {proc.stderr[-2000:]}"
    return attrs, console
