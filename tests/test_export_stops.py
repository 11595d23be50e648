"""A stop signal while a run writes its exports (trace.json, timeline.html), in a real ``asyncroll`` process
signalled at a deterministic point: its trace.json written under its temporary name, not yet renamed (a
hook waits there for the test's signal). The exports not written yet are skipped, none is left half
written, run.json still gets its final status and says which were skipped, and ``asyncroll timeline``
writes them afterwards. Every process has a hard timeout."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.children import end
from tests.cli_runs import SMOKE, cli
from tests.conftest import REPO, invoke, tool_problem, write_workload

#: ``asyncroll`` (argv from the fourth argument on) with two hooks: with argv[2] "run", the process sends
#: itself SIGINT once its first result is written (the run is interrupted); and, with argv[3] "trace",
#: trace.json, once written under its temporary name, waits there (30 s at most) for the test's signal,
#: after saying so in the file argv[1]; with "announce", the process waits so once the exports are
#: announced on stderr. Either way the exports are announced whatever the size of events.jsonl.
HOOKED = """
import os, signal, sys, time
from pathlib import Path
import asyncroll.outputs.rundir as rundir
import asyncroll.outputs.trace as trace
ready, first, where = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
rundir.ANNOUNCE_BYTES = 0
def wait(said):
    ready.with_name("saying").write_text(said)
    os.replace(ready.with_name("saying"), ready)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        time.sleep(0.01)
if first == "run":
    real_result = rundir.RunDirectory.write_result
    def write_result(self, line):
        real_result(self, line)
        if not getattr(self, "signalled", False):
            self.signalled = True
            os.kill(os.getpid(), signal.SIGINT)
    rundir.RunDirectory.write_result = write_result
if where == "trace":
    real_write = trace._write
    def _write(path, *args):
        real_write(path, *args)
        wait(path.name)
    trace._write = _write
else:
    real_announce = rundir.ExportStop.announce
    def announce(self, out):
        real_announce(self, out)
        wait("announced")
    rundir.ExportStop.announce = announce
sys.argv = ["asyncroll", *sys.argv[4:]]
from asyncroll.cli import main
main()
"""


def _workload(tmp_path: Path) -> Path:
    problems = [tool_problem(f"p{i}", model_ms=100, cpu_ms=50, turns=2) for i in range(12)]
    return write_workload(tmp_path / "w.jsonl", problems)


def _stopped_in_the_exports(
    tmp_path: Path, first: str, sig: signal.Signals, *args: str | Path, where: str = "trace"
) -> tuple[int, str]:
    """The command's exit status and stderr, ``sig`` sent while its trace.json waits to be renamed (or,
    ``where`` "announce", as soon as the exports are announced)."""
    ready = tmp_path / "exporting"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOOKED, str(ready), first, where, *map(str, args)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready.exists(), proc.communicate(timeout=10)
        assert ready.read_text() == {"trace": f".trace.json.{proc.pid}.tmp", "announce": "announced"}[where]
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        end(proc)
    return proc.returncode, stderr


def _skipped(out: Path) -> dict[str, Any]:
    receipt: dict[str, Any] = json.loads((out / "run.json").read_text())
    for name in ("trace.json", "timeline.html"):
        entry = receipt["exports"][name]
        assert (entry["ok"], entry["skipped"]) == (False, True), entry
        assert not (out / name).exists()
    assert (out / "summary.json").is_file()  # never skipped
    leftovers = [p.name for p in out.iterdir() if p.name.startswith(".")]
    assert leftovers == [], leftovers  # no temporary file of a skipped export left behind
    return receipt


def _regenerated(out: Path) -> None:
    """``asyncroll timeline`` writes the skipped exports afterwards and records them."""
    result = cli("timeline", out)
    assert result.returncode == 0, result.stderr
    assert (out / "trace.json").is_file() and (out / "timeline.html").is_file()
    receipt = json.loads((out / "run.json").read_text())
    assert all(receipt["exports_regenerated"][name]["ok"] for name in ("trace.json", "timeline.html"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("command", ["simulate", "run"])
def test_a_second_signal_during_the_exports_skips_them_and_the_run_stays_interrupted(
    tmp_path: Path, command: str
) -> None:
    """A QA round saw ≈ 30 s of silent exports after Ctrl-C on a 30k-trajectory simulation, and a second
    Ctrl-C ignored: a user then kills the process with -9, losing the final run.json."""
    out = tmp_path / "out"
    code, stderr = _stopped_in_the_exports(
        tmp_path, "run", signal.SIGTERM, command, "--workload", _workload(tmp_path), "--output", out
    )
    assert code == 130, stderr  # the documented exit code of an interrupted run
    assert "writing trace.json and timeline.html from events.jsonl" in stderr
    assert "Ctrl-C again to skip them" in stderr and f"asyncroll timeline {out}" in stderr
    assert "Traceback" not in stderr
    receipt = _skipped(out)
    assert (receipt["status"], receipt["exit_code"]) == ("interrupted", 130)
    assert receipt["error"] == "interrupted by SIGINT"
    assert "SIGTERM" in receipt["exports"]["trace.json"]["error"]
    assert "warning: trace.json was skipped: SIGTERM" in stderr and "timeline.html was skipped" in stderr
    _regenerated(out)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("where", ["trace", "announce"])
def test_a_signal_during_the_exports_of_a_complete_run_skips_them_and_keeps_it_complete(
    tmp_path: Path, where: str
) -> None:
    """A signal the moment the exports are announced skips them too: none is written after the line."""
    out = tmp_path / "out"
    code, stderr = _stopped_in_the_exports(
        tmp_path, "none", signal.SIGINT, "simulate", "--workload", SMOKE, "--output", out, where=where
    )
    assert code == 0, stderr
    assert "(Ctrl-C to skip them;" in stderr  # no signal before
    receipt = _skipped(out)
    assert (receipt["status"], receipt["exit_code"]) == ("complete", 0)
    assert "had finished: the run is complete, its exports skipped" in stderr  # not "so are its outputs"
    assert "warning: trace.json was skipped: SIGINT received while the exports" in stderr
    assert f"asyncroll timeline {out}" in stderr
    _regenerated(out)


@pytest.mark.timeout(120)
def test_a_small_run_does_not_announce_its_exports(tmp_path: Path) -> None:
    result = cli("simulate", "--workload", SMOKE, "--output", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert "writing trace.json" not in result.stderr
    assert (tmp_path / "out" / "trace.json").is_file()


@pytest.mark.timeout(180)
def test_a_signal_while_asyncroll_timeline_writes_says_so_and_keeps_the_exports_there(tmp_path: Path) -> None:
    """``asyncroll timeline`` (half a minute on a large run) used to exit 130 on Ctrl-C without a word, and
    to say nothing while it wrote either."""
    out = tmp_path / "out"
    assert invoke("simulate", "--workload", SMOKE, "--output", out).exit_code == 0  # made in this process
    before = {name: (out / name).read_bytes() for name in ("trace.json", "timeline.html")}
    (out / "trace.json").write_bytes(b"{}")  # an old one, replaced only by a whole new one
    before["trace.json"] = b"{}"
    code, stderr = _stopped_in_the_exports(tmp_path, "none", signal.SIGINT, "timeline", out)
    assert code == 130, stderr
    assert stderr.startswith("writing trace.json and timeline.html from events.jsonl (0 MiB) …\n"), stderr
    assert f"interrupted by SIGINT; {out}: an export not finished is left as it was" in stderr
    assert "Traceback" not in stderr
    assert {name: (out / name).read_bytes() for name in before} == before
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []


def test_a_signal_after_timeline_rewrote_trace_json_records_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while ``asyncroll timeline`` wrote timeline.html, its new trace.json already in place:
    run.json did not say that trace.json was rewritten (nor that timeline.html was not)."""
    from typer.testing import CliRunner

    import asyncroll.outputs.timeline as timeline
    from asyncroll.cli import app

    out = tmp_path / "out"
    assert invoke("simulate", "--workload", SMOKE, "--output", out).exit_code == 0  # made in this process
    page = (out / "timeline.html").read_bytes()

    def stopped(*_args: Any, **_kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(timeline, "write_timeline", stopped)
    result = CliRunner().invoke(app, ["timeline", str(out)])
    assert result.exit_code == 130, result.output
    assert f"{out / 'trace.json'} was written" in result.stderr, result.stderr
    regenerated = json.loads((out / "run.json").read_text())["exports_regenerated"]
    assert regenerated["trace.json"]["ok"] is True
    assert regenerated["timeline.html"] == {
        "ok": False,
        "skipped": True,
        "error": "skipped: SIGINT received while the exports were written",
    }
    assert (out / "timeline.html").read_bytes() == page  # left as it was
