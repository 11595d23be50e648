"""The exports of real runs of ``asyncroll run`` as a subprocess (``examples/smoke.jsonl``, and a tool that
times out so its worker is killed and replaced; each run once per module, shared by the tests below):
their trace.json, their pages in headless Chromium, and ``asyncroll timeline`` regenerating them.

Perfetto's own trace processor: ``pip install perfetto`` works here, but its ``TraceProcessor`` downloads
the ``trace_processor_shell`` binary from commondatastorage.googleapis.com at first use, which this offline
machine cannot reach (curl exit 6), and no Debian package ships it. So the Perfetto test runs only where a
``trace_processor_shell`` binary is on PATH (or named by ``$TRACE_PROCESSOR_SHELL``) and otherwise skips
saying so; the format rules (tests/export_checks.py) are what is checked here."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.cli_runs import cli
from tests.conftest import invoke, tool_problem, write_workload
from tests.export_checks import check_trace_format, chromium_page, named_threads, page_data, read_trace
from tests.synthetic_runs import SMOKE


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("smoke") / "run"
    result = cli("run", "--workload", SMOKE, "--output", out)
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def timeout_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tool that spins past ``--tool-timeout``: its worker is killed and replaced, the trajectory fails."""
    base = tmp_path_factory.mktemp("timeout")
    problems = [
        tool_problem("slow", model_ms=1, cpu_ms=30_000, tool="spin_ms"),
        tool_problem("after", model_ms=300, cpu_ms=5, tool="spin_ms"),
    ]
    workload = write_workload(base / "w.jsonl", problems)
    out = base / "run"
    args = ("--cpu-workers", "1", "--tool-timeout", "0.5")
    result = cli("run", "--workload", workload, "--output", out, *args)
    assert result.returncode == 0, result.stderr
    return out


@pytest.mark.timeout(90)
def test_real_smoke_run_trace(smoke_run: Path) -> None:
    trace = read_trace(smoke_run)
    body = check_trace_format(trace)
    receipt = json.loads((smoke_run / "run.json").read_text())
    assert receipt["exports"]["trace.json"]["ok"] and receipt["exports"]["timeline.html"]["ok"]
    ids = [json.loads(line)["id"] for line in (smoke_run / "results.jsonl").read_text().splitlines()]
    threads = named_threads(trace)
    assert sorted(name for (pid, _), name in threads.items() if pid == 1) == sorted(
        f"trajectory {i}" for i in ids
    )
    assert {name for (pid, _), name in threads.items() if pid == 2} == {"worker 0", "worker 1"}
    spans = [e for e in body if e["ph"] == "X"]
    on_traj = {e["cat"] for e in spans if e["pid"] == 1}
    assert on_traj == {"trajectory", "model_queue", "model", "cpu_queue", "cpu"}
    assert {e["cat"] for e in spans if e["pid"] == 2} == {"cpu", "execute"}
    assert all(e["name"] == "completed" for e in spans if e["cat"] == "trajectory")
    assert not [e for e in body if e["name"].endswith(")")], "nothing failed, incomplete or unmatched"
    counters = {e["name"] for e in body if e["ph"] == "C"}
    assert counters == {"CPU queue depth", "model requests outstanding", "active trajectories"}
    ready = [e for e in body if e["ph"] == "i" and e["name"] == "worker ready"]
    assert len(ready) == 2 and all(e["args"]["generation"] == 0 for e in ready)
    meta = trace["metadata"]
    assert meta["policy"] == "fifo" and meta["status"] == "complete" and meta["unknown_events"] == {}
    assert meta["invalid_lines"] == 0 and meta["telemetry_sources"] is None  # no source: no probe event
    panel = page_data((smoke_run / "timeline.html").read_text())["telemetry"]
    assert panel["sources"] == [] and panel["note"] == receipt["telemetry"]["note"]  # the receipt says why


@pytest.mark.timeout(90)
def test_real_worker_timeout_run_trace(timeout_run: Path) -> None:
    trace = read_trace(timeout_run)
    body = check_trace_format(trace)
    failed = [e for e in body if e["ph"] == "X" and e.get("args", {}).get("state") == "failed"]
    assert {(e["pid"], e["cat"], e["name"]) for e in failed} >= {
        (1, "cpu", "spin_ms (failed)"),  # on the trajectory's track
        (2, "cpu", "spin_ms (failed)"),  # and on the worker's
        (1, "trajectory", "failed"),
    }
    job = next(e for e in failed if e["pid"] == 2)
    assert job["args"]["error"].startswith("timeout:") and 400_000 <= job["dur"] <= 30_000_000
    restart = next(e for e in body if e["ph"] == "i" and e["name"] == "worker restart: timeout")
    ready = [e for e in body if e["ph"] == "i" and e["name"] == "worker ready"]
    assert [e["args"]["generation"] for e in ready] == [0, 1] and ready[0]["args"]["pid"] != ready[1]["args"][
        "pid"
    ]
    assert restart["tid"] == ready[1]["tid"] and restart["ts"] <= ready[1]["ts"]  # same worker track
    assert restart["args"]["old_pid"] == ready[0]["args"]["pid"]
    after = [
        e for e in body if e["ph"] == "X" and e["cat"] == "cpu" and e["pid"] == 2 and "state" not in e["args"]
    ]
    assert len(after) == 1 and after[0]["args"]["generation"] == 1 and after[0]["ts"] >= ready[1]["ts"]
    traj = {named_threads(trace)[(1, e["tid"])]: e["name"] for e in body if e.get("cat") == "trajectory"}
    assert traj == {"trajectory slow": "failed", "trajectory after": "completed"}


@pytest.mark.timeout(120)
@pytest.mark.skipif(
    shutil.which("chromium") is None, reason="chromium is not installed (.ci/run installs it)"
)
def test_real_run_timeline_in_headless_chromium(smoke_run: Path, timeout_run: Path, tmp_path: Path) -> None:
    for run in (smoke_run, timeout_run):
        page = run / "timeline.html"
        data = page_data(page.read_text())
        attrs, console = chromium_page(page, tmp_path)
        assert console == [], console
        assert "error" not in attrs, attrs["error"]
        assert attrs["rows"] == str(len(data["rows"])) and attrs["counters"] == "3"
        visible = [
            s
            for s in data["spans"]
            if s[1] <= data["window"][1] * 1e6 and s[1] + s[2] >= data["window"][0] * 1e6
        ]
        assert int(attrs["rendered"]) == len(visible) > 0
        assert attrs["view"] == "{:.6f}-{:.6f}".format(*data["window"])
    shot = tmp_path / "timeline.png"
    _, console = chromium_page(timeout_run / "timeline.html", tmp_path, screenshot=shot)
    assert console == [] and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


@pytest.mark.timeout(120)
def test_a_run_that_fails_before_measurement_shows_its_final_status(tmp_path: Path) -> None:
    """The exports are written before the final receipt: the page must not say "preparing"."""
    out = tmp_path / "run"
    args = ("--backend", "vllm", "--model", "sim", "--endpoint", "http://127.0.0.1:9", "--replay")
    # in this process (the runs above are the command's own processes)
    result = invoke("run", "--workload", SMOKE, "--output", out, *args)
    assert result.exit_code == 1, result.stderr
    assert json.loads((out / "run.json").read_text())["status"] == "failed"
    page = page_data((out / "timeline.html").read_text())
    status = dict(page["header"])["status"]
    assert status.startswith("failed (") and "warm-up request 1/2 failed" in status
    # nor "not probed yet" as if the run went on: the telemetry note of the final receipt
    assert page["telemetry"]["note"] == "not probed: the run stopped before the probe"


def test_timeline_command_regenerates_exports(smoke_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "copy"
    shutil.copytree(smoke_run, run)
    (run / "trace.json").unlink()
    (run / "timeline.html").unlink()
    result = cli("timeline", run)
    assert result.returncode == 0, result.stderr
    assert "wrote" in result.stdout
    regenerated = read_trace(run)
    check_trace_format(regenerated)
    assert regenerated["traceEvents"] == read_trace(smoke_run)["traceEvents"]
    assert (
        page_data((run / "timeline.html").read_text())["spans"]
        == page_data((smoke_run / "timeline.html").read_text())["spans"]
    )
    # the refusals and the regenerations below in this process (the real command: above)
    missing = invoke("timeline", tmp_path / "nope")
    assert missing.exit_code == 2 and "nope: does not exist" in missing.stderr
    (tmp_path / "empty").mkdir()
    empty = invoke("timeline", tmp_path / "empty")
    assert empty.exit_code == 2 and "no events.jsonl" in empty.stderr
    # a receipt that says running, of a process that is alive (this one): the run's own exports will
    # follow, so none are written under it; once that process is gone (killed outright), they are
    receipt = json.loads((run / "run.json").read_text())
    from asyncroll.proctree import start_mark

    receipt.update(status="running", pid=os.getpid(), pid_start=start_mark(os.getpid()))
    (run / "run.json").write_text(json.dumps(receipt))
    going = invoke("timeline", run)
    assert going.exit_code == 2 and "the run is still going" in going.stderr
    # a receipt written before pid_start: this process started before its created_at
    (run / "run.json").write_text(json.dumps({k: v for k, v in receipt.items() if k != "pid_start"}))
    assert invoke("timeline", run).exit_code == 2
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    (run / "run.json").write_text(json.dumps({**receipt, "pid": int(dead.stdout)}))
    assert invoke("timeline", run).exit_code == 0
    status = dict(page_data((run / "timeline.html").read_text())["header"])["status"]
    assert "(run.json never finalised: its process ended without a word (killed?))" in status


def test_the_timeline_command_keeps_exports_from_an_empty_file_and_says_what_it_skipped(
    smoke_run: Path, tmp_path: Path
) -> None:
    """An empty events.jsonl replaced good exports with empty ones, and a file cut mid-line regenerated a
    page of half the run, both with exit 0 and nothing on stderr. Now the empty file is refused (the
    exports kept), and the skipped lines are counted on stderr."""
    from typer.testing import CliRunner

    from asyncroll.cli import app

    run = tmp_path / "copy"
    shutil.copytree(smoke_run, run)
    trace, page = (run / "trace.json").read_bytes(), (run / "timeline.html").read_bytes()
    lines = (run / "events.jsonl").read_bytes().splitlines(keepends=True)
    (run / "events.jsonl").write_bytes(b"")
    empty = CliRunner().invoke(app, ["timeline", str(run)])
    assert empty.exit_code == 1, empty.output
    assert "is empty: nothing to draw; the existing trace.json and timeline.html kept" in empty.stderr
    assert (run / "trace.json").read_bytes() == trace and (run / "timeline.html").read_bytes() == page
    half = len(lines) // 2
    (run / "events.jsonl").write_bytes(b"".join(lines[:half]) + lines[half][:12])
    cut = CliRunner().invoke(app, ["timeline", str(run)])
    assert cut.exit_code == 0, cut.output
    assert "warning: 1 line(s) of" in cut.stderr and "were skipped" in cut.stderr
    (run / "events.jsonl").write_bytes(b"".join(lines))
    whole = CliRunner().invoke(app, ["timeline", str(run)])
    assert whole.exit_code == 0 and whole.stderr == "", whole.output
    assert json.loads((run / "trace.json").read_bytes()) == json.loads(trace)


def trace_processor_shell() -> str | None:
    return os.environ.get("TRACE_PROCESSOR_SHELL") or shutil.which("trace_processor_shell")


@pytest.mark.timeout(120)
@pytest.mark.skipif(
    trace_processor_shell() is None,
    reason="Perfetto's trace_processor_shell is not available offline here (the perfetto package downloads "
    "it at first use); set $TRACE_PROCESSOR_SHELL to run this test",
)
def test_real_trace_loads_in_perfetto_trace_processor(timeout_run: Path) -> None:
    binary = trace_processor_shell()
    assert binary is not None
    query = "select count(*) as n from slice where name = 'spin_ms (failed)';"
    proc = subprocess.run(
        [binary, "--query-string", query, str(timeout_run / "trace.json")],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"\b2\b", proc.stdout), proc.stdout  # on the trajectory's track and the worker's


def test_regenerated_exports_are_recorded_beside_the_runs_own(smoke_run: Path, tmp_path: Path) -> None:
    """run.json's ``exports`` said what the run itself wrote (a failure on a full disk, say) and went on
    saying it after ``asyncroll timeline`` had written them again: a reader took the good files for the
    failed ones. The regeneration is now recorded beside it; a run.json that cannot take it is named."""
    run = tmp_path / "copy"
    shutil.copytree(smoke_run, run)
    receipt = json.loads((run / "run.json").read_text())
    receipt["exports"]["trace.json"] = {"ok": False, "error": "OSError: [Errno 28] No space left on device"}
    (run / "run.json").write_text(json.dumps(receipt))
    (run / "trace.json").unlink()
    result = invoke("timeline", run)
    assert result.exit_code == 0 and result.stderr == "", result.output
    after = json.loads((run / "run.json").read_text())
    assert after["exports"] == receipt["exports"]  # the run's own record stays
    again = after["exports_regenerated"]
    assert again["trace.json"]["ok"] and again["timeline.html"]["ok"] and again["asyncroll"]
    assert {k: v for k, v in after.items() if k != "exports_regenerated"} == receipt
    (run / "run.json").write_text("[]")
    odd = invoke("timeline", run)
    assert odd.exit_code == 0 and "is not a receipt (not a JSON object); left as it was" in odd.stderr
    assert (run / "run.json").read_text() == "[]"
    (run / "run.json").write_text('{"status": "compl')  # cut short: it was "(JSONDecodeError: ...)"
    cut = invoke("timeline", run)
    said = f"{run / 'run.json'} is not valid JSON (Unterminated string starting at, line 1, column 12)"
    assert cut.exit_code == 0 and f"{said}; left as it was" in cut.stderr, cut.stderr
    assert "Error" not in cut.stderr


def test_a_run_still_going_is_seen_so_after_the_wall_clock_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``timeline`` and ``optimum`` ask whether a run whose receipt says running is still going: its pid
    alive and the same process. That was psutil's create_time against the receipt's created_at, and
    create_time is /proc/stat's wall-clock boot time plus the start: NTP stepping the clock an hour on
    mid-run made the running process look an hour younger than its receipt, so ``timeline`` wrote its
    exports (and run.json) under a run still writing them. The receipt's pid_start mark moves with no
    step; one pid given to a later process does not carry it."""
    import psutil._pslinux as pslinux

    from asyncroll.commands.files import still_running
    from asyncroll.outputs.receipt import host
    from asyncroll.proctree import start_mark

    receipt = {
        "status": "running",
        "pid": os.getpid(),
        "pid_start": start_mark(os.getpid()),
        "host": host(),
        "created_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
    }
    (tmp_path / "run.json").write_text(json.dumps(receipt))
    stepped = pslinux.boot_time() + 3600.0  # /proc/stat's btime after the clock stepped an hour on
    monkeypatch.setattr(pslinux, "boot_time", lambda: stepped)
    # psutil before 6 keeps the boot time it read first (BOOT_TIME): stepped too
    monkeypatch.setattr(pslinux, "BOOT_TIME", stepped, raising=False)
    assert still_running(tmp_path) == f"status 'running', process {os.getpid()} alive"
    (tmp_path / "run.json").write_text(json.dumps({**receipt, "pid_start": "another boot:1"}))
    assert still_running(tmp_path) is None  # the pid is another process's now
