"""The bench scripts' command lines: bad arguments are refused (exit 2) before anything runs."""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.children import end

BENCH = Path(__file__).resolve().parents[1] / "bench"
RUNNABLE = sorted(p.stem for p in BENCH.glob("*.py") if 'if __name__ == "__main__"' in p.read_text())


@pytest.mark.parametrize(
    ("module", "args", "message"),
    [
        ("simspeed", ["--sizes", "0"], "--sizes: must be an integer >= 1"),
        ("simspeed", ["--sizes", "5,,6"], "an empty item"),
        ("simspeed", ["--repeats", "0"], "--repeats: must be an integer >= 1"),
        ("paired", ["--seeds", "0"], "--seeds: must be an integer >= 1"),
        ("paired", ["--cpu-ms", "0"], "--cpu-ms: must be a finite number > 0"),
        ("paired", ["--points", "8/4"], "'8/4' is not an operating point active/inflight/workers"),
        ("paired", ["--points", "8/4/2,"], "'' is not an operating point"),
        ("paired", ["--points", "8/0/2"], "--points: must be an integer >= 1"),
        ("draws", ["--seeds", "1"], "--seeds: must be an integer >= 2"),
        ("draws", ["--points", "32/4"], "'32/4' is not an operating point"),
        ("decision", ["--repeats", "0"], "--repeats: must be an integer >= 1"),
        # One repeat has no spread: every real pair would read as decided (a "CONTRADICTS" verdict
        # against noise nobody measured); zero repeats was a StatisticsError traceback.
        ("calibrate", ["--repeats", "1"], "--repeats: must be an integer >= 2"),
        ("calibrate", ["--repeats", "0"], "--repeats: must be an integer >= 2"),
        ("calibrate", ["--n", "0"], "--n: must be an integer >= 1"),
        ("calibrate", ["--cpu-ms", "0"], "--cpu-ms: must be a finite number > 0"),
        ("counterfactual", ["--repeats", "1"], "--repeats: must be an integer >= 2"),
        ("counterfactual", ["--points", "8/4"], "'8/4' is not an operating point"),
        # Each of these was a traceback (IndexError, StatisticsError, FileNotFoundError) after set-up,
        # or, for bench.pressure_map, tables with a header and no row and exit 0.
        ("overhead", ["--repeats", "0"], "--repeats: must be an integer >= 1"),
        ("scaling", ["--repeats", "0"], "--repeats: must be an integer >= 1"),
        ("scaling", ["--latency-ms", "-1"], "--latency-ms: must be a finite number >= 0"),
        ("startup", ["--repeats", "0"], "--repeats: must be an integer >= 1"),
        ("telemetry", ["--repeats", "0"], "--repeats: must be an integer >= 1"),
        ("export", ["--repeats", "0"], "--repeats: must be an integer >= 1"),
        ("client", ["--requests", "0"], "--requests: must be an integer >= 1"),
        ("evaluator", ["--tests", "0"], "--tests: must be an integer >= 1"),
        ("pressure_map", ["--seeds", "0"], "--seeds: must be an integer >= 1"),
        ("pressure_map", ["--jobs", "0"], "--jobs: must be an integer >= 1"),
        ("pressure_map", ["--starvation-threshold", "0"], "--starvation-threshold: must be an integer >= 1"),
        # One seed has no interval, so no arm could be marked worse than FIFO beyond noise: every cell
        # read as not worse (--jobs 0 after it fails fast where --seeds 1 is taken and the map would run).
        ("oracle_map", ["--seeds", "1", "--jobs", "0"], "--seeds: must be an integer >= 2"),
        ("optimum_map", ["--seeds", "0"], "--seeds: must be an integer >= 1"),
        ("optimum_map", ["--time-limit", "0"], "--time-limit: must be a finite number > 0"),
        ("pressure_knobs", ["--jobs", "0"], "--jobs: must be an integer >= 1"),
        ("transformers_serve", ["--hf-python", "x", "--n", "0"], "--n: must be an integer >= 1"),
        # Each of these was a traceback after the machine line and the work before it: an --events
        # size parsed only when its run was due, an unknown policy when its first cell was simulated.
        ("export", ["--events", "1.5"], "--events: not an integer: '1.5'"),
        ("export", ["--events", "1000,0"], "--events: must be an integer >= 1"),
        ("export", ["--events", "1000,"], "an empty item"),
        (
            "pressure_map",
            ["--policies", "asyncrol"],
            "--policies: unknown policy 'asyncrol' (did you mean 'asyncroll'?; known: ",
        ),
        ("pressure_map", ["--policies", "asyncroll,"], "--policies: unknown policy ''"),
        ("optimum_map", ["--policy", "nope"], "--policy: unknown policy 'nope'"),
        # a table of zeros (as bench.pressure_map's --policies fifo, refused there)
        ("optimum_map", ["--policy", "fifo"], "--policy: it is measured against fifo; fifo against itself"),
        # bench.transformers_serve parsed --inflight only with the engine up, and a missing
        # --hf-python was a FileNotFoundError traceback from the model build
        (
            "transformers_serve",
            ["--hf-python", "x", "--inflight", "0"],
            "--inflight: must be an integer >= 1",
        ),
        ("transformers_serve", ["--hf-python", "x", "--inflight", "4,"], "an empty item"),
        ("transformers_serve", ["--hf-python", "no/python"], "no/python is not an executable file"),
    ],
)
def test_bench_arguments_are_checked_before_anything_runs(
    capsys: pytest.CaptureFixture[str], module: str, args: list[str], message: str
) -> None:
    import importlib
    import sys

    bench = importlib.import_module(f"bench.{module}")
    saved = sys.argv
    sys.argv = [module, *args]
    try:
        with pytest.raises(SystemExit) as exit_info:
            bench.main()
    finally:
        sys.argv = saved
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_the_benches_shared_run_helper_runs_a_scripted_workload() -> None:
    """bench.limits, paired, scaling and calibrate all run through ``run_once`` (scripted backend)."""
    from bench.common import run_once, tool_chain

    outcome, run_dir, _ = run_once(tool_chain(3, 1, 5.0), virtual=True)
    assert outcome.status == "complete" and (run_dir / "events.jsonl").exists()
    assert outcome.summary is not None and outcome.summary["counts"]["completed"] == 3


def test_operating_points_parse_in_order() -> None:
    from bench.common import points_arg

    assert points_arg("32/4/1, 8/4/2") == [(32, 4, 1), (8, 4, 2)]


@pytest.mark.parametrize("text", ["8/4/2,8/4/2", "8/4/2, 32/4/1, 08/4/2"])
def test_an_operating_point_given_twice_is_refused(text: str) -> None:
    """bench.paired, draws and counterfactual ran it twice: a second table (or rows) of the same point,
    with its own noise, read as another point (a policy named twice is refused for the same reason)."""
    from bench.common import points_arg

    with pytest.raises(argparse.ArgumentTypeError) as refused:
        points_arg(text)
    assert str(refused.value) == "operating point 8/4/2 given twice"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("asyncroll,asyncroll", "'asyncroll' given twice"),
        (
            "asyncroll,asyncroll_repair",
            "'asyncroll' and 'asyncroll_repair' are one policy (asyncroll_repair)",
        ),
        ("tool_first, gpu_first", "'tool_first' and 'gpu_first' are one policy (tool_first)"),
    ],
)
def test_a_policy_named_twice_in_a_bench_is_refused(text: str, message: str) -> None:
    """Each would be a duplicate row of the bench's table (bench.pressure_map ran the rule twice)."""
    from bench.common import policies_arg

    assert policies_arg("asyncroll_seed, asyncroll") == ["asyncroll_seed", "asyncroll"]
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        policies_arg(text)
    assert str(refused.value) == message


def test_every_runnable_bench_module_is_found() -> None:
    assert len(RUNNABLE) >= 18 and {"limits", "paired", "scaling", "synthetic"} <= set(RUNNABLE)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("module", RUNNABLE)
def test_every_bench_module_prints_usage_for_help(
    module: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m bench.X --help`` prints its usage and runs nothing (bench.limits ran its whole
    benchmark, about 15 s of real worker processes). Run as ``-m`` runs it (runpy, as ``__main__``), in
    this process: an interpreter each only repeated the imports."""
    monkeypatch.setattr(sys, "argv", [str(BENCH / f"{module}.py"), "--help"])
    monkeypatch.delitem(sys.modules, f"bench.{module}", raising=False)  # runpy runs a fresh copy
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module(f"bench.{module}", run_name="__main__", alter_sys=True)
    out, err = capsys.readouterr()
    assert exit_info.value.code in (0, None), err
    assert out.startswith("usage:"), out[:300]  # not "machine: …" of a run


@pytest.mark.timeout(120)
def test_the_simulation_speed_bench_runs_both_modes_on_a_tiny_workload() -> None:
    """bench.simspeed replaces the run's exports with nothing (``{}``) to time the simulation alone; a
    change to how a run reads its exports' outcome broke every full-outputs measurement, unseen until the
    bench was run by hand."""
    from bench.common import scratch, write_workload
    from bench.simspeed import one, small_workload

    workload = write_workload(scratch("simspeed-test-") / "w.jsonl", small_workload(12, seed=0))
    full = one(12, True, workload)  # full outputs: the mode the exports' change broke
    assert full["window_cpu_s"] > 0 and full["virtual_makespan_s"] > 0, full
    # summary only, in the child below (each child is seconds of start-up: one for the mode and the parts)
    # --parts times the estimator the policy subscribed: it timed only the per-trajectory means, which
    # the default rule (the chain) no longer subscribes, so its events and lookups went uncounted
    # (and, in the tail, each decision's estimates of the whole queue: estimate_queue)
    # with --at-once's active limit (every problem admitted at once): one child for both, a few seconds
    at_once = one(12, False, workload, "asyncroll", parts=True, active=12)
    calls = at_once["calls"]
    assert calls["__call__"] > 0 and calls["estimate_queue"] > 0 and calls["update"] > 0, calls
    assert at_once["window_cpu_s"] > 0 and at_once["virtual_makespan_s"] > 0, at_once


@pytest.mark.timeout(60)
def test_the_draws_bench_pairs_each_policy_with_fifo_on_the_same_draw() -> None:
    """bench.draws: each policy's change against fifo on one workload draw, and the row that reports the
    spread over draws names the worst draw's seed."""
    from asyncroll.simulation.engine import SimulationSettings
    from bench import synthetic
    from bench.common import scratch
    from bench.draws import changes, row

    workload = synthetic.write(scratch("draws-test-") / "w.jsonl", 6, 40.0, 25.0, seed=1)
    out = changes(workload, (4, 2, 1), SimulationSettings(), ["fifo", "fifo", "tool_first"])
    assert out.keys() == {"fifo", "tool_first"} and out["fifo"] == 0.0  # fifo against itself: no change
    assert row("x", {1: 0.0, 2: 0.02, 3: -0.01}) == (
        "| x | +0.33% [-3.46%, +4.13%] | -1.0% / +0.0% / +2.0% | 1 of 3 | 2 (+2.0%) |"
    )


def test_the_knobs_bench_prints_each_cell_with_its_spread_over_seeds() -> None:
    """RESULTS.md's knobs table gave only the median of 3 seeds: every figure must state its spread."""
    from bench.pressure_knobs import cell_text

    assert cell_text([0.036, -0.002, 0.043]) == "-0.2% / +3.6% / +4.3%"
    assert cell_text([0.0, 0.0, 0.0]) == "+0.0% / +0.0% / +0.0%"


class _Stopped:
    """A stand-in for the serve-sim process bench.client starts: already stopped, nothing to read."""

    stdout = None

    def terminate(self) -> None:
        pass

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def poll(self) -> int:
        return 0


@pytest.mark.timeout(30)
@pytest.mark.parametrize("where", ["existing", "no_parent", "a_directory"])
def test_the_client_bench_checks_its_json_file_before_starting_the_server(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``bench.client --json`` was opened with "w" after every repeat: an existing file was overwritten,
    and a missing folder or a directory lost a minute of measuring to a traceback at the very end."""
    from bench import client

    def start_server() -> Any:
        raise AssertionError("the server started before --json was checked")

    monkeypatch.setattr(client, "start_server", start_server)
    output = {"existing": tmp_path / "r.json", "no_parent": tmp_path / "no" / "r.json"}.get(where, tmp_path)
    if where == "existing":
        output.write_text("an earlier result\n")
    monkeypatch.setattr(sys, "argv", ["client", "--repeats", "1", "--json", str(output)])
    with pytest.raises(SystemExit) as exit_info:
        client.main()
    assert exit_info.value.code == 2 and f"--json {output}" in capsys.readouterr().err
    if where == "existing":
        assert output.read_text() == "an earlier result\n"


@pytest.mark.timeout(30)
def test_the_client_bench_prints_its_figures_when_the_json_file_cannot_be_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --json file that appeared while the bench measured is neither overwritten nor the end of the
    figures: they go to stdout, and the exit status says the file was not written."""
    from bench import client

    output = tmp_path / "r.json"

    def in_process(n: int) -> float:
        output.write_text("written meanwhile\n")
        return 150.0

    async def sequential(url: str, n: int) -> dict[str, float]:
        return dict.fromkeys(("wall_ms", "client_cpu_us", "httpx_cpu_us", "asyncroll_cpu_us"), 1.0)

    async def throughput(url: str, inflight: int, n: int) -> float:
        return 100.0

    monkeypatch.setattr(client, "start_server", lambda: (_Stopped(), "http://127.0.0.1:9"))
    monkeypatch.setattr(client, "in_process", in_process)
    monkeypatch.setattr(client, "sequential", sequential)
    monkeypatch.setattr(client, "throughput", throughput)
    monkeypatch.setattr(sys, "argv", ["client", "--repeats", "1", "--json", str(output)])
    with pytest.raises(SystemExit) as exit_info:
        client.main()
    out, err = capsys.readouterr()
    assert exit_info.value.code == 1 and f"--json {output}: cannot write" in err
    assert output.read_text() == "written meanwhile\n"
    assert json.loads(out[out.index("\n{") :])["in_process_us"] == [150.0]


def fake_hf_environment(root: Path, python: str, transformers: str) -> Path:
    """A bin/ folder with a ``python`` and a ``transformers`` program (shell scripts); returns the python."""
    bin_dir = root / "hf" / "bin"
    bin_dir.mkdir(parents=True)
    for name, body in (("python", python), ("transformers", transformers)):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir / "python"


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("build", "serve", "said"),
    [
        # the model build's output was captured and dropped: a CalledProcessError traceback, no reason
        (
            "echo \"ModuleNotFoundError: No module named 'torch'\" >&2; exit 1",
            "exit 1",
            ("building the model", "No module named 'torch'"),
        ),
        # an engine that exits before it answers /health (no weights, a bad flag): a RuntimeError traceback
        (
            "exit 0",
            "echo 'OSError: no weights here' >&2; exit 3",
            ("transformers serve exited (3)", "OSError: no weights here"),
        ),
    ],
    ids=["model-build", "engine-start"],
)
def test_the_transformers_bench_says_why_it_could_not_run_and_leaves_no_files(
    tmp_path: Path, build: str, serve: str, said: tuple[str, str]
) -> None:
    """The reason from the failing step's own output, no traceback, and the temporary folder
    (asyncroll-hf-*: model, runs, server log) removed (it was never removed, on success either)."""
    import subprocess

    hf_python = fake_hf_environment(tmp_path, build, serve)
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(BENCH.parent), "TMPDIR": str(temp)}
    done = subprocess.run(
        [sys.executable, "-m", "bench.transformers_serve", "--hf-python", str(hf_python)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert all(text in done.stderr for text in said), done.stderr[-2000:]
    assert list(temp.iterdir()) == []


@pytest.mark.timeout(60)
def test_the_transformers_bench_stops_the_engine_when_interrupted_while_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine runs in its own session, so a Ctrl-C at the terminal reaches only the bench: one while it
    waited for /health (up to 3 minutes) left ``transformers serve`` running, holding its port."""
    import subprocess

    from bench import transformers_serve

    hf_python = fake_hf_environment(tmp_path, "exit 1", "exec sleep 60")
    started: list[subprocess.Popen[bytes]] = []
    popen = subprocess.Popen

    def recording_popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        started.append(popen(*args, **kwargs))
        return started[-1]

    def interrupt(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(transformers_serve.subprocess, "Popen", recording_popen)
    monkeypatch.setattr(transformers_serve.httpx, "stream", interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            transformers_serve.start_engine(hf_python, tmp_path, tmp_path / "server.log")
        assert len(started) == 1 and started[0].poll() is not None
    finally:
        for process in started:
            end(process)


@pytest.mark.timeout(90)
def test_the_startup_bench_times_the_asyncroll_of_its_own_installation(tmp_path: Path) -> None:
    """bench.startup timed whichever ``asyncroll`` came first on PATH: another installation's (another
    version's start-up), or, run with a virtual environment's python not activated, none at all."""
    import subprocess

    if not (Path(sys.executable).parent / "asyncroll").exists():
        pytest.skip("this interpreter's installation has no asyncroll script beside it")
    other = tmp_path / "other-bin"
    other.mkdir()
    (other / "asyncroll").write_text(f"#!/bin/sh\ntouch {tmp_path / 'wrong-asyncroll-ran'}\n")
    (other / "asyncroll").chmod(0o755)
    done = subprocess.run(
        [sys.executable, "-m", "bench.startup", "--repeats", "1"],
        cwd=tmp_path,
        env={"PATH": f"{other}:/usr/bin:/bin", "PYTHONPATH": str(BENCH.parent)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| `asyncroll --help` |" in done.stdout and not (tmp_path / "wrong-asyncroll-ran").exists()


def test_the_pressure_map_measures_every_policy_against_the_operating_points_bound() -> None:
    """``sync`` admits one trajectory at a time, so its run's own lower bound is its serial makespan: its
    ratio to that was 1.000, "100% of FIFO's gap closed, half closed", for a schedule 2.5 times longer."""
    from bench.pressure_map import cells

    rows = [
        {"policy": policy, "active": 8, "inflight": 4, "workers": 1, "seed": seed, **figures}
        for seed in range(3)
        for policy, figures in (
            ("fifo", {"makespan_s": 12.0 + seed, "lower_bound_s": 10.0}),
            ("sync", {"makespan_s": 30.0 + seed, "lower_bound_s": 30.0 + seed}),
        )
    ]
    (cell,) = cells(rows, "sync", 3)
    assert cell["ratio"] == pytest.approx(3.1) and cell["closed"] < 0
    assert cell["verdict"] == "WORSE, < half closed"


@pytest.mark.timeout(30)
def test_the_client_bench_gives_up_on_a_server_that_never_says_it_listens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bench read serve-sim's first line with no time limit: a server that hung before it (a port it
    waited for, an import stuck on a network file system) hung the benchmark, with nothing said."""
    from bench import client

    silent = tmp_path / "python"  # (the real serve-sim, had it run, would have said it listens)
    silent.write_text("#!/bin/sh\nexec sleep 60\n")
    silent.chmod(0o755)
    monkeypatch.setattr(client.sys, "executable", str(silent))
    with pytest.raises(RuntimeError, match=r"serve-sim did not start: '\(no line in 0.5 s\)'"):
        client.start_server(start_timeout=0.5)


def test_the_client_bench_says_serve_sim_did_not_start_without_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """serve-sim exiting before it listens (an import error, a bad flag) ended the bench on a
    RuntimeError traceback."""
    from bench import client

    failing = tmp_path / "python"
    failing.write_text("#!/bin/sh\necho 'ImportError: no uvicorn' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setattr(client.sys, "executable", str(failing))
    monkeypatch.setattr(sys, "argv", ["client", "--repeats", "1"])
    with pytest.raises(SystemExit) as exit_info:
        client.main()
    assert (
        exit_info.value.code
        == "bench.client: serve-sim did not start: '(it exited with 1 before saying it listens)'"
    )


@pytest.mark.timeout(60)
def test_a_failed_bench_child_ends_it_with_the_childs_own_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """``check=True`` on a captured child (bench.simspeed's measured process, bench.startup's command,
    bench.export's memory probe) gave a CalledProcessError traceback that hid the child's stderr."""
    from bench import simspeed

    monkeypatch.setattr(simspeed, "CHILD", "import sys; sys.exit('the child could not import its workload')")
    with pytest.raises(SystemExit) as exit_info:
        simspeed.one(10, False, Path("unused.jsonl"))
    assert "exited with 1" in str(exit_info.value)
    assert "the child could not import its workload" in str(exit_info.value)


@pytest.mark.timeout(180)
def test_the_evaluator_bench_measures_the_layers_this_user_has() -> None:
    """As a user other than root the workers' evaluations were refused (IsolationError: no weak
    isolation allowed), and the bench died on an AssertionError traceback after printing that isolation
    was weak; it measures what this machine gives, as its isolation line says."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "bench.evaluator", "--repeats", "1", "--evals", "1", "--tests", "1"],
        cwd=BENCH.parent,
        env={**os.environ, "PYTHONPATH": str(BENCH.parent)},
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    isolation = "isolation: full;" if os.geteuid() == 0 else "isolation: weak, missing unprivileged_uid"
    assert isolation in done.stdout, done.stdout
    assert "| evaluations/s, 2 workers (1 test each)" in done.stdout


def test_a_paired_run_that_did_not_complete_every_trajectory_ends_the_bench_with_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A crunch job past the 60 s tool timeout (``--cpu-ms`` allows 60,000 ms, heavy-tailed) fails its
    trajectory; the bench then stopped on a bare ``AssertionError`` traceback."""
    import bench.paired as paired
    from asyncroll.runtime.run import RunOutcome

    counts = {"completed": 1, "failed": 1, "max_turns": 0}
    outcome = RunOutcome("complete", 0, {"counts": counts})
    monkeypatch.setattr(paired, "run_once", lambda *args, **kwargs: (outcome, Path(), 0.0))
    monkeypatch.setattr(sys, "argv", ["paired", "--seeds", "1", "--n", "2", "--points", "2/1/1"])
    with pytest.raises(SystemExit) as exit_info:
        paired.main()
    message = str(exit_info.value.code)
    assert "the run of fifo at 2/1/1, seed 0 completed 1 of 2 trajectories" in message
    assert "(1 failed, 0 at max turns)" in message
    assert "lower --cpu-ms" in message


def test_scaling_and_limits_end_with_why_on_a_run_that_did_not_complete(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both stopped on a bare ``AssertionError`` (bench.limits on no summary only: a run with failed
    trajectories went on to compare peaks of different work)."""
    import bench.limits as limits
    import bench.scaling as scaling
    from asyncroll.runtime.run import RunOutcome

    counts = {"completed": 1, "failed": 47, "max_turns": 0}
    outcome = RunOutcome("complete", 0, {"counts": counts})
    for bench in (limits, scaling):
        monkeypatch.setattr(bench, "run_once", lambda *args, **kwargs: (outcome, Path(), 0.0))
    with pytest.raises(SystemExit) as exit_info:
        scaling.one(48, 4, 0.0)
    assert "bench.scaling: the run of 48 trajectories, 4 inflight completed 1 of 48" in str(
        exit_info.value.code
    )
    monkeypatch.setattr(sys, "argv", ["limits"])
    with pytest.raises(SystemExit) as exit_info:
        limits.main()
    assert "bench.limits: the run of case " in str(exit_info.value.code)
    assert "completed 1 of 48 trajectories (47 failed" in str(exit_info.value.code)


def test_the_pressure_map_gives_no_share_of_a_gap_within_rounding_of_the_bound() -> None:
    """FIFO on the bound but for float rounding (ratio 1.0000002) has no gap to close: "n/a", not a "0%"
    (or, for a policy a little behind it, an absurd "-50000%")."""
    from bench.pressure_map import cells

    rows = [
        {"policy": policy, "active": 4, "inflight": 4, "workers": 4, "seed": seed, **figures}
        for seed in range(3)
        for policy, figures in (
            ("fifo", {"makespan_s": 10.000002, "lower_bound_s": 10.0}),
            ("asyncroll", {"makespan_s": 10.01, "lower_bound_s": 10.0}),
        )
    ]
    (cell,) = cells(rows, "asyncroll", 3)
    assert cell["closed"] is None


def test_a_maps_jobs_past_the_cpus_is_lowered_to_them_as_the_sweeps(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """bench.pressure_map/oracle_map/pressure_knobs took ``--jobs 1000`` as it came: a process per cell
    on a 2-core machine; ``simulate --sweep --jobs`` lowers it to the usable CPUs and says so."""
    from asyncroll.simulation.sweep_cells import usable_cpus
    from bench.common import cell_jobs

    assert cell_jobs("1") == 1 and capsys.readouterr().err == ""
    assert cell_jobs("1000") == usable_cpus()
    assert f"warning: --jobs 1000: this process may use {usable_cpus()} CPU(s)" in capsys.readouterr().err
    with pytest.raises(argparse.ArgumentTypeError, match="must be an integer >= 1"):
        cell_jobs("0")


@pytest.mark.timeout(120)
def test_the_counterfactual_bench_replays_every_real_run_under_every_policy(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench.counterfactual: each real run of a policy is replayed (simulate --from-run) under each
    policy, as it is and with the job overhead; a row per pair A → B, and every replay completes (one that
    did not ends the bench)."""
    import bench.counterfactual as cf

    made: list[tuple[str, float, float]] = []

    def counted(run_dir: Path, policy: str, job_overhead_ms: float, n: int) -> float:
        makespan = replay(run_dir, policy, job_overhead_ms, n)
        made.append((policy, job_overhead_ms, makespan))
        return makespan

    replay = cf.replay
    monkeypatch.setattr(cf, "replay", counted)
    monkeypatch.setattr(sys, "argv", ["counterfactual", "--n", "4", "--repeats", "2", "--points", "4/2/1"])
    cf.main()
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| 4 / 2 / 1 |")]
    pairs = [row.split(" | ")[1] for row in rows]
    assert pairs == [f"{a} → {b}" for a in cf.POLICIES for b in cf.POLICIES], out
    assert all(row.count("%)") == 2 and row.count(" / ") == 8 for row in rows), rows
    # 3 sources × 2 repeats × 3 targets, each as it is and with a measured overhead (> 0)
    assert len(made) == 36 and all(m > 0 for _, _, m in made), made
    assert sum(j == 0 for _, j, _ in made) == 18 and all(j > 0 for _, j, _ in made if j != 0)
    # the overhead is taken by the replays, not only passed: each job holds its worker that much longer
    with_it, without = (sum(m for _, j, m in made if (j > 0) is overhead) for overhead in (True, False))
    assert with_it > without, made
    assert out.count("\n4 / 2 / 1, from ") == 3 and "naive: B's replay against A's real" in out
