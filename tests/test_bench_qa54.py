"""The bench scripts (QA 54a): each states its settings, shows what it could not measure as n/a, ends on a
failure or Ctrl-C with why, and leaves nothing running."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.children import end


@pytest.mark.timeout(60)
def test_the_telemetry_bench_runs_with_fewer_than_four_calls(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole exposition was parsed ``--calls // 4`` times: 0 for ``--calls 3``, and the bench ended on
    a StatisticsError traceback (no median for empty data) after measuring the rest."""
    from bench import telemetry

    monkeypatch.setattr(sys, "argv", ["telemetry", "--repeats", "1", "--calls", "3"])
    telemetry.main()
    out = capsys.readouterr().out
    assert "1 repeats of 3 calls (1 for prometheus_client)" in out, out
    assert "prometheus_client, whole exposition" in out and "one server sample" in out, out


def _main(module: Any, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", [module.__name__, *argv])
    module.main()


def test_the_simulation_speed_bench_states_its_settings(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench.simspeed printed the machine and its tables, not the repeats or the limits it ran at."""
    from bench import simspeed

    figures = {"window_cpu_s": 1.0, "cpu_s": 2.0, "rss_mb": 100.0, "growth_mb": 1.0}
    monkeypatch.setattr(simspeed, "one", lambda *args, **kwargs: {**figures, "virtual_makespan_s": 9.0})
    _main(simspeed, ["--sizes", "5,7", "--repeats", "2"], monkeypatch)
    out = capsys.readouterr().out
    assert "sizes 5,7, 2 repeats, each in a fresh process" in out, out
    assert "64 active / 16 inflight / 4 workers" in out, out


def test_the_decision_bench_states_its_settings(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench.decision printed no repeats and no count of the calls each median is over."""
    from bench import decision

    monkeypatch.setattr(decision, "warm_import", lambda: None)
    monkeypatch.setattr(decision, "one_repeat", lambda seed: (float(seed),) * 8)
    _main(decision, ["--repeats", "2"], monkeypatch)
    out = capsys.readouterr().out
    assert "2 repeats (seeds 0–1) of 2000 timed calls per measure (50 refits); 64 queued jobs" in out, out


def test_the_scaling_bench_states_its_workers(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """RESULTS.md says "2 workers"; the bench's own header did not say how many."""
    from bench import scaling

    monkeypatch.setattr(scaling, "one", lambda n, inflight, latency: (1.0, [], Counter()))
    _main(scaling, ["--trajectories", "3", "--repeats", "1"], monkeypatch)
    assert "3 active, 2 (idle) workers" in capsys.readouterr().out


def test_the_client_bench_states_its_throughput_requests(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench import client
    from tests.test_bench_cli import _Stopped  # serve-sim's stand-in, already stopped

    async def sequential(url: str, n: int) -> dict[str, float]:
        return dict.fromkeys(("wall_ms", "client_cpu_us", "httpx_cpu_us", "asyncroll_cpu_us"), 1.0)

    async def throughput(url: str, inflight: int, n: int) -> float:
        return 100.0

    monkeypatch.setattr(client, "start_server", lambda: (_Stopped(), "http://127.0.0.1:9"))
    monkeypatch.setattr(client, "in_process", lambda n: 150.0)
    monkeypatch.setattr(client, "sequential", sequential)
    monkeypatch.setattr(client, "throughput", throughput)
    _main(client, ["--repeats", "1", "--requests", "7", "--sequential", "3"], monkeypatch)
    out = capsys.readouterr().out
    assert "sequential requests per repeat: 3; requests per throughput measurement: 7" in out, out


@pytest.mark.timeout(90)
def test_the_soak_bench_states_the_machine_and_its_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """bench.soak printed samples and their thirds with neither the machine nor the settings."""
    from bench import soak

    out_dir = tmp_path / "soak"
    argv = ["--minutes", "0.01", "--interval", "0.1", "--trajectories", "20", "--output", str(out_dir)]
    soak.main(argv)
    out = capsys.readouterr().out
    assert out.startswith("machine: "), out[:300]
    assert "soak: up to 0.01 min, a sample every 0.1 s, 20 trajectories, faults 0.02" in out, out
    assert "--cpu-workers 2 --max-active-trajectories 16" in out and "left behind: nothing" in out, out


@pytest.mark.timeout(90)
def test_the_soak_bench_stops_serve_sim_when_it_does_not_listen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--http``: serve-sim that did not listen in time ended the soak (SystemExit) with serve-sim left
    running, as it was on any failure before the run started."""
    from bench import soak

    started: list[subprocess.Popen[bytes]] = []
    popen = subprocess.Popen

    def recording_popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        started.append(popen(*args, **kwargs))
        return started[-1]

    def never(port: int, limit: float, server: Any, log: Path) -> None:
        raise SystemExit(f"serve-sim did not listen on {port} within {limit:g}s")

    monkeypatch.setattr(soak.subprocess, "Popen", recording_popen)
    monkeypatch.setattr(soak, "_wait_port", never)
    try:
        with pytest.raises(SystemExit, match="did not listen"):
            soak.main(["--trajectories", "5", "--http", "--output", str(tmp_path / "soak")])
        assert len(started) == 1 and started[0].poll() is not None
    finally:
        for process in started:
            end(process)


@pytest.mark.parametrize("under", ["a_file", "unwritable"])
def test_the_soak_bench_refuses_an_output_it_cannot_create(
    under: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file on the --output path was a NotADirectoryError traceback, not the option's error."""
    from bench import soak

    parent = tmp_path / under
    if under == "a_file":
        parent.write_text("not a folder\n")
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into a folder without write permission")
        parent.mkdir(mode=0o500)
    with pytest.raises(SystemExit) as exit_info:
        soak.main(["--output", str(parent / "soak")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and f"--output {parent / 'soak'}: cannot create it: " in err, err


def test_the_evaluator_bench_shows_a_layer_it_could_not_measure_as_missing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without per-test cgroups or a PID namespace the two comparison rows vanished from the table: a
    reader could not tell "not measured here" from a table that never had them."""
    import dataclasses

    from asyncroll.evaluator.isolation import detect
    from bench import evaluator

    real = detect()
    bare = dataclasses.replace(
        real.config, memory_cgroup=None, pids_cgroup=None, cgroup_v2=None, pid_namespace=False
    )
    monkeypatch.setattr(evaluator, "detect", lambda: dataclasses.replace(real, config=bare))

    async def per_second(workers: int, evals: int, weak: bool) -> float:
        return 8.0

    monkeypatch.setattr(evaluator, "_evaluations_per_second", per_second)
    monkeypatch.setattr(evaluator, "_fixed_cost_ms", lambda sandbox, tests: 120.0)
    monkeypatch.setattr(evaluator, "_command_ms", lambda command, tests: 20.0)
    _main(evaluator, ["--repeats", "1", "--evals", "1", "--tests", "1"], monkeypatch)
    out = capsys.readouterr().out
    assert "compare: same without the per-test cgroups, ms (no per-test cgroups here) |     n/a |" in out
    assert "fresh pid+mount+net ns, ms (no PID namespace here) |     n/a |" in out, out
    assert "fixed cost per test, ms (sandbox.run of `pass`)          |   120.0 |" in out, out


def test_the_evaluator_bench_ends_with_a_failing_reference_commands_reason() -> None:
    """A reference command that failed (the sandbox interpreter without one of LiveCodeBench's prelude
    modules) was a CalledProcessError traceback after the evaluations were measured."""
    from bench import evaluator

    with pytest.raises(SystemExit) as exit_info:
        evaluator._command_ms(
            [sys.executable, "-c", "import sys; sys.exit('No module named sortedcontainers')"], 1
        )
    assert "exited with 1" in str(exit_info.value) and "No module named sortedcontainers" in str(
        exit_info.value
    )


def test_the_export_bench_ends_with_why_when_the_page_does_not_render(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page that headless Chromium did not draw ended bench.export on a RuntimeError traceback."""
    from bench import export

    chromium = tmp_path / "chromium"
    chromium.write_text("#!/bin/sh\necho '<html><body></body></html>'\necho 'GPU process crashed' >&2\n")
    chromium.chmod(0o755)
    monkeypatch.setattr(export.shutil, "which", lambda name: str(chromium))
    page = tmp_path / "timeline.html"
    page.write_text("<html></html>")
    with pytest.raises(SystemExit) as exit_info:
        export.draw_ms(page, tmp_path / "profile")
    message = str(exit_info.value.code)
    assert message.startswith(f"bench.export: the page {page} did not render in headless chromium:"), message
    assert message.endswith("GPU process crashed"), message


@pytest.mark.timeout(90)
def test_a_soak_stopped_with_ctrl_c_stops_the_run_and_reports_its_samples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C during a soak (minutes of samples) ended it on a KeyboardInterrupt traceback: no thirds, no
    exit status of the run, no check of what it left behind."""
    from bench import soak

    sleeps = []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 8:
            raise KeyboardInterrupt
        real_sleep(seconds)

    monkeypatch.setattr(soak.time, "sleep", sleep)
    argv = ["--minutes", "1", "--interval", "0.25", "--trajectories", "2000", "--output", str(tmp_path / "s")]
    with pytest.raises(SystemExit) as exit_info:
        soak.main(argv)
    out, err = capsys.readouterr()
    assert exit_info.value.code == 130 and "bench.soak: interrupted; stopping the run" in err, err
    assert "left behind: nothing" in out and ("quantity" in out or "too few samples" in out), out
    assert "exit status None" not in out, out


@pytest.mark.timeout(60)
def test_the_soak_bench_says_at_once_why_serve_sim_did_not_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--http`` with a serve-sim that exits at start (its stderr thrown away) waited the whole 60 s and
    said only that it "did not listen"."""
    from bench import soak

    failing = tmp_path / "python"
    failing.write_text("#!/bin/sh\necho 'ModuleNotFoundError: no uvicorn' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setattr(soak.sys, "executable", str(failing))
    began = time.monotonic()
    with pytest.raises(SystemExit) as exit_info:
        soak.main(["--trajectories", "5", "--http", "--output", str(tmp_path / "soak")])
    assert time.monotonic() - began < 20
    assert str(exit_info.value.code) == (
        "bench.soak: serve-sim exited with 1 before it listened:\nModuleNotFoundError: no uvicorn"
    )


def test_the_startup_bench_shows_the_script_it_could_not_time_as_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no ``asyncroll`` script beside the interpreter the bench's headline row vanished."""
    from bench import startup

    monkeypatch.setattr(startup.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr(startup, "run_child", lambda argv: None)
    _main(startup, ["--repeats", "1"], monkeypatch)
    out = capsys.readouterr().out
    assert f"| `asyncroll --help` (no {tmp_path / 'asyncroll'}) | n/a | n/a | n/a | 0 |" in out, out
    assert "| `python -m asyncroll.cli --help` |" in out, out
