"""bench.soak: its workload is valid and calls every misbehaving tool; its sampler reads a process."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from asyncroll.workload import scan_workload
from bench.soak import FAULTS, TOOLS_SOURCE, report, sample, workload


def test_the_soak_workload_validates_and_calls_every_fault(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    workload(path, 400, 0.5, 1.0, 0)
    scan = scan_workload(path, tmp_path, scripted=True)
    assert scan.problems == [] and scan.count == 400
    called = {a.get("name") for line in path.read_text().splitlines() for a in json.loads(line)["script"]}
    assert called == {*FAULTS, "spin_ms", None}  # None: the final answers
    assert (tmp_path / "soak_tools.py").read_text() == TOOLS_SOURCE
    hang = next(
        a
        for line in path.read_text().splitlines()
        for a in json.loads(line)["script"]
        if a.get("name") == "hang"
    )
    assert hang["arguments"]["seconds"] > 1.0  # past the tool timeout: the worker is killed


def test_a_sample_reads_this_process_and_the_report_has_every_quantity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    found = sample(os.getpid(), tmp_path / "events.jsonl")
    assert found is not None and found["rss_mib"] > 0 and found["fds"] >= 3 and found["threads"] >= 1
    assert found["events_mib"] == 0.0  # none yet: such samples are before the run began, not reported
    report([{**found, "events_mib": 1.0}] * 6)
    out = capsys.readouterr().out
    for key in found:
        assert key in out
