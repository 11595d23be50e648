"""NVTX ranges: started and ended around every wait and request, a no-op when off, and a missing or
broken package refused before anything starts."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from asyncroll.clock import VirtualClock
from asyncroll.config import build_config
from asyncroll.errors import UsageError
from asyncroll.event_log import EventCapture
from asyncroll.events import CpuEnqueued, CpuFinished, ModelEnqueued, ModelStarted
from asyncroll.runtime.run import Run, prepare
from asyncroll.runtime.virtual_worker import builtin_duration, virtual_factory
from asyncroll.telemetry.nvtx import NO_RANGES, NvtxRanges, NvtxUnavailable, RangeName, make_ranges
from tests.conftest import tool_problem, write_workload


class RecordingRanges:
    """Records every range: each started handle must be ended exactly once."""

    enabled = True

    def __init__(self) -> None:
        self.started: list[tuple[int, RangeName, int | None]] = []
        self.ended: list[int] = []

    def start(self, name: RangeName, payload: int | None = None) -> Any:
        handle = len(self.started)
        self.started.append((handle, name, payload))
        return handle

    def end(self, handle: Any) -> None:
        self.ended.append(handle)

    def count(self, name: RangeName) -> int:
        return sum(1 for _, n, _ in self.started if n == name)


def test_nvtx_ranges_start_and_end_around_every_wait_and_request(tmp_path: Path) -> None:
    workload = write_workload(
        tmp_path / "w.jsonl",
        [tool_problem(f"p{i}", model_ms=40, cpu_ms=30, turns=2) for i in range(6)],
    )
    cfg = build_config({"workload": workload, "output": tmp_path / "run", "cpu_workers": 2})
    clock = VirtualClock()
    capture = EventCapture()
    ranges = RecordingRanges()
    run = Run(
        prepare(cfg, ["test"]),
        clock,
        worker_factory=virtual_factory(clock, builtin_duration),
        subscribers=(capture,),
        ranges=ranges,
    )
    outcome = clock.run(run.execute())
    assert outcome.status == "complete"
    assert sorted(ranges.ended) == list(range(len(ranges.started)))  # every range closed once
    assert ranges.count("run") == 1
    assert ranges.count("model wait") == len(capture.of(ModelEnqueued)) == 18
    assert ranges.count("model request") == len(capture.of(ModelStarted)) == 18
    assert ranges.count("cpu queue") == len(capture.of(CpuEnqueued)) == 12
    assert ranges.count("cpu execution") == len(capture.of(CpuFinished)) == 12
    request_ids = {p for _, n, p in ranges.started if n == "model request"}
    assert request_ids == {e.request_id for e in capture.of(ModelStarted)}


def test_nvtx_off_is_a_no_op_and_on_uses_the_real_package() -> None:
    assert make_ranges(False) is NO_RANGES and NO_RANGES.start("run") is None
    pytest.importorskip("nvtx")
    ranges = make_ranges(True)
    assert isinstance(ranges, NvtxRanges)
    for name in ("run", "model wait", "model request", "cpu queue", "cpu execution"):
        ranges.end(ranges.start(name, 7))  # real calls (no profiler attached: nvtx's own no-op domain)


def test_nvtx_without_the_package_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nvtx", None)
    with pytest.raises(NvtxUnavailable, match=r"asyncroll\[profiling\]"):
        NvtxRanges()
    workload = write_workload(tmp_path / "w.jsonl", [tool_problem("p1", model_ms=1, cpu_ms=1)])
    cfg = build_config({"workload": workload, "output": tmp_path / "run", "nvtx": True})
    with pytest.raises(UsageError, match=r"--nvtx needs the nvtx package: .*asyncroll\[profiling\]"):
        prepare(cfg, ["test"])
    assert not (tmp_path / "run").exists()  # refused before anything started


def test_nvtx_found_but_broken_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package that exists but fails to import (a broken install) is refused at validation too, not
    with a traceback after the run directory exists."""
    broken = tmp_path / "site"
    broken.mkdir()
    (broken / "nvtx.py").write_text("raise OSError('libnvToolsExt missing')\n")
    monkeypatch.syspath_prepend(str(broken))
    monkeypatch.delitem(sys.modules, "nvtx", raising=False)
    workload = write_workload(tmp_path / "w.jsonl", [tool_problem("p1", model_ms=1, cpu_ms=1)])
    cfg = build_config({"workload": workload, "output": tmp_path / "run", "nvtx": True})
    with pytest.raises(UsageError, match=r"asyncroll\[profiling\]' \(import failed: libnvToolsExt missing\)"):
        prepare(cfg, ["test"])
    assert not (tmp_path / "run").exists()
