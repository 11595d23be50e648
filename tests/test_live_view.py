"""The live view of a run: the progress line (a pure function of snapshots, then a real run on a real
pseudo-terminal) and ``--metrics-port`` (scraped over real HTTP while a real run with real workers runs)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import io
import json
import os
import pty
import select
import socket
import struct
import subprocess
import sys
import termios
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from asyncroll.config import build_config
from asyncroll.errors import UsageError
from asyncroll.runtime.dispatcher import DispatcherSnapshot
from asyncroll.runtime.limiter import LimiterSnapshot
from asyncroll.runtime.model_gate import ModelGateSnapshot
from asyncroll.runtime.pool import PoolSnapshot
from asyncroll.runtime.progress import ProgressLine, RunSnapshot, progress_enabled, render_progress
from tests.children import end
from tests.conftest import REPO, invoke, tool_problem, write_workload

SMOKE = REPO / "examples" / "smoke.jsonl"


def snap(
    done: dict[str, int], elapsed: float | None, *, total: int = 10, queued_cpu: int = 2, restarts: int = 0
) -> RunSnapshot:
    return RunSnapshot(
        total=total,
        elapsed_s=elapsed,
        admission=LimiterSnapshot(limit=4, holding=3, waiting=0, peak_holding=4, total_acquired=7),
        model=ModelGateSnapshot(limit=2, inflight=2, queued=1, peak_inflight=2, requests=9, failures=0),
        cpu=DispatcherSnapshot(queued=queued_cpu, decisions=5, reorders=1, peak_queued=3),
        pool=PoolSnapshot(size=2, idle=0, busy=2, restarting=0, peak_busy=2, restarts=restarts),
        finished=done,
    )


def test_progress_line_is_a_function_of_the_snapshot() -> None:
    line = render_progress(snap({"completed": 3, "failed": 1}, 8.0), width=200)
    assert line == (
        "4/10  40% | 0.50/s | ETA 0:12 | completed 3 | failed 1 | active 3/4 | model 2/2 +1 queued | "
        "cpu queue 2 | workers busy 2/2"
    )
    assert "starting (workers, warm-up)" in render_progress(snap({}, None))
    assert "ETA unknown" in render_progress(snap({}, 5.0))
    done = render_progress(snap({"completed": 9, "max_turns": 1}, 4000.0, restarts=2), width=200)
    # a trajectory that ran out of turns is not a success: the line says so
    assert done.startswith("10/10 100% | 9.0/h | done in 1:06:40 | completed 9 | failed 0 | max_turns 1 |")
    assert done.endswith("restarts 2")
    stalled = dataclasses.replace(snap({"completed": 3}, 8.0), loop_stalls=2, loop_stalled_s=1.26)
    assert render_progress(stalled, width=200).endswith("| workers busy 2/2 | loop stalled 1.3s")
    stopped = dataclasses.replace(stalled, process_stops=1, process_stopped_s=4.96)
    assert render_progress(stopped, width=200).endswith("| loop stalled 1.3s | stopped 5.0s")
    short = render_progress(snap({"completed": 3}, 8.0), width=30)
    assert len(short) == 30 and short.endswith("...") and short.isascii()
    assert "\r" not in line and "\n" not in line


class _View:
    def __init__(self) -> None:
        self.calls = 0

    def snapshot(self) -> RunSnapshot:
        self.calls += 1
        return snap({"completed": self.calls}, float(self.calls))


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.timeout(10)
def test_progress_line_redraws_in_place_and_ends_with_a_newline() -> None:
    stream = _Tty()
    line = ProgressLine(_View(), stream, period=0.01)  # type: ignore[arg-type]

    async def three_redraws() -> None:
        task = asyncio.create_task(line.run())
        while line.redraws < 3:  # noqa: ASYNC110 - polls a plain counter the redraw loop bumps
            await asyncio.sleep(0.005)
        line.stop()
        line.stop()  # idempotent: one final line, one newline
        await task

    asyncio.run(three_redraws())
    assert line.wait(5)
    text = stream.getvalue()
    # the terminal's thread draws the latest line handed to it: one redraw may replace another unwritten
    assert 2 <= text.count("\r") <= line.redraws and line.redraws >= 4
    assert text.endswith("\n") and text.count("\n") == 1
    assert text.split("\r")[-1].startswith(f"{line.redraws}/10")  # the final state, drawn by stop()
    assert progress_enabled(None, stream) and progress_enabled(True, stream)
    assert not progress_enabled(False, stream) and not progress_enabled(None, io.StringIO())


def test_progress_is_no_longer_refused_and_metrics_port_is_validated(tmp_path: Path) -> None:
    base = {"workload": SMOKE, "output": tmp_path / "o"}
    assert build_config({**base, "progress": True}).unavailable_features() == []
    assert build_config({**base, "metrics_port": 0}).metrics_host == "127.0.0.1"
    for bad in (-1, 65536):
        with pytest.raises(UsageError, match="--metrics-port"):
            build_config({**base, "metrics_port": bad})
    with pytest.raises(UsageError, match="--metrics-host only applies with --metrics-port"):
        build_config({**base, "metrics_host": "0.0.0.0"})


def _run_on_pty(args: list[str], timeout: float) -> tuple[int, str, str]:
    """Run the CLI with stderr on a pseudo-terminal and stdout on a pipe; returns (code, stdout, tty)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))  # 200 columns
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncroll.cli", *args],
        stdout=subprocess.PIPE,
        stderr=follower,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
    )
    os.close(follower)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.2)
            if ready:
                try:
                    data = os.read(leader, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        assert proc.stdout is not None
        out = proc.stdout.read().decode()
    finally:
        try:
            end(proc)
        finally:
            os.close(leader)
    return code, out, b"".join(chunks).decode(errors="replace")


@pytest.mark.timeout(60)
def test_progress_line_on_a_real_terminal(tmp_path: Path) -> None:
    code, out, tty = _run_on_pty(["run", "--workload", str(SMOKE), "--output", str(tmp_path / "a")], 50)
    assert code == 0, tty
    lines = tty.replace("\r\n", "\n").split("\n")
    progress = next(line for line in lines if "\r" in line)
    final = progress.split("\r")[-1].strip()
    assert final.startswith("3/3 100% |") and "done in" in final and "failed 0" in final
    assert "\r" not in out and out.startswith("complete: 3/3 completed")  # stdout stays clean
    code, out, tty = _run_on_pty(
        ["run", "--workload", str(SMOKE), "--output", str(tmp_path / "b"), "--no-progress"], 50
    )
    assert code == 0 and "\r" not in tty.replace("\r\n", "\n") and "| active" not in tty


def _scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            key = sample.name + (f"{{{labels}}}" if labels else "")
            values[key] = sample.value
    return values


def _metrics_port(run_json: Path, proc: subprocess.Popen[str]) -> int:
    """The metrics port in run.json, waiting while the run runs, however long (the test's hard timeout
    bounds it): a run's start-up on a loaded machine took ~13 s of imports; a fixed deadline guessed."""
    while True:
        ended = proc.poll() is not None  # read first: it may write the port, then end
        try:
            port = json.loads(run_json.read_text()).get("metrics", {}).get("port")
        except (OSError, ValueError):  # not written yet
            port = None
        if port:
            return int(port)
        assert not ended, f"the run ended ({proc.returncode}) before it reported its metrics port"
        time.sleep(0.05)


@pytest.mark.timeout(150)
def test_metrics_port_scraped_during_a_real_run(tmp_path: Path) -> None:
    # One worker, four 600 ms tool jobs arriving together: the CPU queue stays non-empty for ~1.8 s.
    problems = [tool_problem(f"p{i}", model_ms=200, cpu_ms=600) for i in range(4)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    out = tmp_path / "run"
    args = ["run", "--workload", workload, "--output", out, "--cpu-workers", "1", "--metrics-port", "0"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncroll.cli", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        # waits while the run runs, however long: the hard timeout bounds it (45 s was a guess at the load)
        port = _metrics_port(out / "run.json", proc)
        url = f"http://127.0.0.1:{port}/metrics"
        scrapes: list[dict[str, float]] = []
        while proc.poll() is None:
            try:
                scrapes.append(_scrape(url))
            except (urllib.error.URLError, ConnectionError):  # the run ended between poll and scrape
                break
            if scrapes[-1]["asyncroll_cpu_queue_depth"] >= 1:
                break
            time.sleep(0.05)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        end(proc)
    assert proc.returncode == 0, stderr
    mid = scrapes[-1]
    assert mid["asyncroll_cpu_queue_depth"] >= 1, scrapes  # caught mid-run, with work queued
    assert mid["asyncroll_measurement_elapsed_seconds"] > 0
    assert mid["asyncroll_workload_trajectories"] == 4 and mid["asyncroll_workers"] == 1
    assert mid["asyncroll_workers_busy"] == 1 and mid["asyncroll_worker_restarts_total"] == 0
    assert 1 <= mid["asyncroll_active_trajectories"] <= mid["asyncroll_active_trajectories_limit"] == 16
    assert 0 <= mid["asyncroll_model_requests_inflight"] <= mid["asyncroll_model_requests_limit"] == 4
    assert mid["asyncroll_trajectories_completed_total"] < 4 and mid["asyncroll_model_requests_total"] >= 4
    assert mid["asyncroll_scheduler_decisions_total"] >= 1
    assert mid["asyncroll_run_info{backend=scripted,output=" + str(out) + ",policy=fifo}"] == 1
    for name in ("asyncroll_trajectories_started_total", "asyncroll_scheduler_decisions_total"):
        series = [s[name] for s in scrapes]
        assert series == sorted(series), f"{name} went backwards: {series}"
    assert f"metrics: {url}" in stderr and "\r" not in stderr  # not a terminal: no progress line
    assert stdout.startswith("complete: 4/4 completed")
    with pytest.raises(urllib.error.URLError):  # the port is released when the run ends
        _scrape(url)
    receipt = json.loads((out / "run.json").read_text())
    assert receipt["metrics"] == {"host": "127.0.0.1", "port": port, "url": url, "requested_port": 0}


@pytest.mark.timeout(60)
def test_metrics_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["run", "--workload", SMOKE, "--output", tmp_path / "r", "--metrics-port", str(port)]
        proc = subprocess.run(
            [sys.executable, "-m", "asyncroll.cli", *map(str, args)],
            capture_output=True,
            text=True,
            timeout=50,
            cwd=REPO,
        )
    # a usage error, found before anything starts: exit 2 and no run directory
    assert proc.returncode == 2
    assert f"--metrics-port {port} on 127.0.0.1: cannot listen" in proc.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.timeout(60)
def test_metrics_host_that_cannot_be_bound_is_a_usage_error_with_any_free_port_too(tmp_path: Path) -> None:
    """``--metrics-port 0`` skipped the check (0 is falsy): a host no local interface has started the run,
    which then failed (exit 1) and left a failed run directory, where a fixed port gave exit 2 and none."""
    host = "192.0.2.1"  # TEST-NET-1 (RFC 5737): never a local address, refused at once, no name lookup
    args: list[str | Path] = [
        "run",
        "--workload",
        SMOKE,
        "--output",
        tmp_path / "r",
        "--metrics-port",
        "0",
        "--metrics-host",
        host,
    ]
    # a refusal before anything starts: in this process (the test above refuses a port in its own)
    proc = invoke(*args)
    assert proc.exit_code == 2, proc.stderr
    assert f"--metrics-port 0 on {host}: cannot listen" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_exporter_counts_requests_that_took_a_slot_and_server_outages() -> None:
    """``asyncroll_model_requests_total`` counts what its help says (requests that took a slot), apart
    from requests enqueued; the server circuit is a gauge and two counters, followed from the events."""
    from asyncroll.backends.base import ModelResponse
    from asyncroll.clock import SystemClock
    from asyncroll.event_log import EventLog
    from asyncroll.events import ServerAvailable, ServerUnavailable
    from asyncroll.runtime.model_gate import ModelGate
    from asyncroll.telemetry.exporter import RuntimeCollector
    from asyncroll.workload import FinalAction

    def scrape(gate: ModelGate) -> dict[str, float]:
        class View:
            def snapshot(self) -> RunSnapshot:
                return RunSnapshot(
                    total=3,
                    elapsed_s=1.0,
                    admission=LimiterSnapshot(
                        limit=4, holding=3, waiting=0, peak_holding=3, total_acquired=3
                    ),
                    model=gate.snapshot(),
                    cpu=DispatcherSnapshot(queued=0, decisions=0, reorders=0, peak_queued=0),
                    pool=PoolSnapshot(size=1, idle=1, busy=0, restarting=0, peak_busy=0, restarts=0),
                    finished={},
                )

        collector = RuntimeCollector(View())  # type: ignore[arg-type]
        return {s.name: s.value for family in collector.collect() for s in family.samples}

    async def main() -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
        clock = SystemClock()
        events = EventLog(clock)
        events.start_measurement()
        gate = ModelGate(1, clock, events)
        release, serving = asyncio.Event(), asyncio.Event()

        async def request() -> ModelResponse:
            serving.set()
            await release.wait()
            return ModelResponse(FinalAction(type="final", answer="x"))

        calls = [asyncio.create_task(gate.call(f"t{i}", 0, request)) for i in range(3)]
        await serving.wait()  # the first holds the slot; the other two ran up to their wait for it
        assert gate.snapshot().outstanding == 3
        events.emit(ServerUnavailable(failures=5, reason="transport: ConnectError", opened=1))
        await asyncio.sleep(0.05)
        during = scrape(gate)
        events.emit(ServerAvailable(paused_s=0.05, probes=1))
        after = scrape(gate)
        release.set()
        await asyncio.gather(*calls)
        return during, after, scrape(gate)

    during, after, done = asyncio.run(main())
    # inflight limit 1: 3 enqueued, 1 took a slot (the help text's count), 2 still queued
    assert (
        during["asyncroll_model_requests_total"] == 1
        and during["asyncroll_model_requests_enqueued_total"] == 3
    )
    assert during["asyncroll_model_requests_queued"] == 2
    assert (
        during["asyncroll_server_unavailable"] == 1
        and during["asyncroll_server_unavailable_events_total"] == 1
    )
    assert during["asyncroll_server_unavailable_seconds_total"] >= 0.04
    assert (
        after["asyncroll_server_unavailable"] == 0 and after["asyncroll_server_unavailable_events_total"] == 1
    )
    assert (
        after["asyncroll_server_unavailable_seconds_total"]
        >= during["asyncroll_server_unavailable_seconds_total"]
    )
    assert done["asyncroll_model_requests_total"] == done["asyncroll_model_requests_enqueued_total"] == 3


def test_the_port_check_binds_the_family_the_exporter_will() -> None:
    """``--metrics-host ::1`` with a fixed port was refused ("address family not supported"): the check
    bound IPv4 whatever the host; it now binds as prometheus_client will. A taken port is still an error."""
    from asyncroll.telemetry.exporter import listen_error

    for family, host in ((socket.AF_INET6, "::1"), (socket.AF_INET, "127.0.0.1")):
        with socket.socket(family) as probe:
            probe.bind((host, 0))
            port = probe.getsockname()[1]
        assert listen_error(host, port) is None
        with socket.create_server((host, port), family=family):
            assert listen_error(host, port) is not None
    assert listen_error("no-such-host.invalid", 8000) is not None


@pytest.mark.timeout(30)
def test_an_output_path_that_is_not_utf8_still_scrapes() -> None:
    """``--output`` is a label of ``asyncroll_run_info``; a directory name with a byte that is not UTF-8
    reaches Python as a lone surrogate, which prometheus_client cannot encode: every scrape of the run
    answered 500 (and printed a traceback on the run's stderr)."""
    from asyncroll.telemetry.exporter import MetricsExporter, RuntimeCollector

    class View:
        def snapshot(self) -> RunSnapshot:
            return snap({"completed": 1}, 1.0)

    output = os.fsdecode(b"/tmp/run-\xff")
    collector = RuntimeCollector(View(), None, {"policy": "fifo", "output": output})  # type: ignore[arg-type]
    exporter = MetricsExporter(collector, 0).start()
    try:
        values = _scrape(exporter.url)
    finally:
        exporter.stop()
    assert values["asyncroll_run_info{output=/tmp/run-?,policy=fifo}"] == 1
    assert values["asyncroll_trajectories_completed_total"] == 1


@pytest.mark.timeout(30)
def test_a_scrape_asking_for_some_names_gets_them() -> None:
    """``/metrics?name[]=…`` (prometheus_client's filter) answered an empty body: with ``auto_describe``
    off the registry knew no name of the collector's. ``describe`` names every family without a snapshot."""
    from asyncroll.telemetry.exporter import MetricsExporter, RuntimeCollector

    class View:
        def snapshot(self) -> RunSnapshot:
            return snap({"completed": 2}, 1.0)

    collector = RuntimeCollector(View(), info={"policy": "fifo"})  # type: ignore[arg-type]
    described = [(f.name, f.type, f.samples) for f in collector.describe()]
    assert [(name, kind) for name, kind, _ in described] == [(f.name, f.type) for f in collector.collect()]
    assert all(samples == [] for _, _, samples in described)
    exporter = MetricsExporter(collector, 0).start()
    try:
        query = "?name[]=asyncroll_workers&name[]=asyncroll_trajectories_completed_total"
        with urllib.request.urlopen(exporter.url + query, timeout=10) as reply:
            body = reply.read().decode()
    finally:
        exporter.stop()
    samples = {s.name: s.value for f in text_string_to_metric_families(body) for s in f.samples}
    assert samples == {"asyncroll_workers": 2.0, "asyncroll_trajectories_completed_total": 2.0}


@pytest.mark.timeout(150)
def test_a_terminal_paused_at_the_end_of_a_run_holds_only_its_last_line(tmp_path: Path) -> None:
    """A terminal paused with Ctrl-S (and left so: the user is away) holds the progress line's writes.
    The run's end waited for its final line before anything else: every trajectory had finished, but
    summary.json was not written, run.json said "running" and the workers lived on until Ctrl-Q. The
    outputs are written first now; the final line is on the terminal once resumed, and the run exits 0."""
    problems = [tool_problem(f"p{i}", model_ms=20, cpu_ms=20) for i in range(4)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    out = tmp_path / "run"
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    termios.tcflow(follower, termios.TCOOFF)  # Ctrl-S: every write to the terminal waits
    command = ["run", "--workload", str(workload), "--output", str(out), "--cpu-workers", "1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncroll.cli", *command],
        stdout=subprocess.DEVNULL,
        stderr=follower,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
    )
    seen = b""
    try:
        # A run held by the paused terminal never completes; one that is not completes once it had the CPU
        # it needs (~3 s, ~13 s of wall time where it gets a fifth of a core): the deadline only tells a
        # hang apart, so it is most of the test's timeout, not a guess at how slow a loaded machine is.
        deadline = time.monotonic() + 110
        status = None
        while status != "complete" and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
            with contextlib.suppress(OSError, ValueError, KeyError):
                status = json.loads((out / "run.json").read_text())["status"]
        assert status == "complete" and (out / "summary.json").exists(), status
        termios.tcflow(follower, termios.TCOON)  # Ctrl-Q
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            if select.select([leader], [], [], 0.2)[0]:
                seen += os.read(leader, 65536)
        assert proc.wait(timeout=5) == 0
        while select.select([leader], [], [], 0)[0]:
            seen += os.read(leader, 65536)
    finally:
        end(proc)
        os.close(follower)
        os.close(leader)
    assert seen.endswith(b"\r\n") and seen.count(b"\n") == 1
    assert seen.removesuffix(b"\r\n").split(b"\r")[-1].startswith(b"4/4 100%"), seen[-300:]


#: A session of its own on the pseudo-terminal ``argv[1]`` (its controlling terminal, ``stty tostop`` set)
#: running ``asyncroll ARGS`` as a background job, stderr on the terminal, as ``asyncroll run … &`` in an
#: interactive shell; says how the job ended ("exit N") or that the terminal stopped it.
BACKGROUND_JOB = """
import os, signal, sys, termios, time
os.setsid()
tty = os.open(sys.argv[1], os.O_RDWR)  # the session's controlling terminal; this group is its foreground
attrs = termios.tcgetattr(tty)
attrs[3] |= termios.TOSTOP
termios.tcsetattr(tty, termios.TCSANOW, attrs)
pid = os.fork()
if pid == 0:
    os.setpgid(0, 0)  # a job of its own, not the terminal's foreground
    os.dup2(tty, 2)
    os.execv(sys.executable, [sys.executable, "-m", "asyncroll.cli", *sys.argv[2:]])
deadline = time.monotonic() + 40
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
    if done and os.WIFSTOPPED(status):
        print("stopped by", signal.Signals(os.WSTOPSIG(status)).name, flush=True)
        attrs[3] &= ~termios.TOSTOP  # let it write and stop
        termios.tcsetattr(tty, termios.TCSANOW, attrs)
        os.kill(pid, signal.SIGTERM)
        os.kill(pid, signal.SIGCONT)
        _, status = os.waitpid(pid, 0)
        break
    if done:
        break
    time.sleep(0.05)
else:
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
print("exit", os.waitstatus_to_exitcode(status), flush=True)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["run"], "complete: 3/3 completed"),
        (["simulate", "--sweep", "--seeds", "1", "--active", "1,2", "--policies", "fifo"], "| policy"),
    ],
    ids=["run", "sweep"],
)
def test_a_run_in_the_background_of_its_terminal_draws_no_line_and_is_not_stopped(
    tmp_path: Path, command: list[str], said: str
) -> None:
    """``asyncroll run … &`` in an interactive shell: stderr is the terminal, but the shell and what is typed
    there own it. The line was drawn over the shell's prompt and, under ``stty tostop``, the first line's
    write stopped the whole run (SIGTTOU: 'Stopped (tty output)') with run.json "preparing", until ``fg``;
    a sweep's line likewise. A line is drawn only while the command is the terminal's foreground job, as
    git draws its progress."""
    leader, follower = pty.openpty()
    out = tmp_path / "out"
    try:
        args = [*command, "--workload", str(SMOKE), "--output", str(out)]
        proc = subprocess.run(
            [sys.executable, "-c", BACKGROUND_JOB, os.ttyname(follower), *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=50,
        )
        os.close(follower)
        drawn = b""
        while select.select([leader], [], [], 0.2)[0]:
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: nothing left on the terminal
                break
            if not data:
                break
            drawn += data
    finally:
        with contextlib.suppress(OSError):
            os.close(follower)
        os.close(leader)
    assert proc.stdout.splitlines()[-1] == "exit 0", proc.stdout + proc.stderr
    assert "stopped" not in proc.stdout and proc.stdout.startswith(said), proc.stdout
    if command == ["run"]:
        assert json.loads((out / "run.json").read_text())["status"] == "complete"
    assert b"\r" not in drawn, drawn
