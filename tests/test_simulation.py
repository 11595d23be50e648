"""Simulation and the makespan lower bound: hand-made workloads with known optimal makespans, the
``simulate`` command, and replays of recorded runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import Result

from tests.children import end
from tests.cli_runs import SMOKE, cli, load_run
from tests.conftest import REPO, VirtualRun, invoke, tool_problem, write_workload


def simulate_here(*args: str | Path) -> Result:
    """``asyncroll simulate ARGS`` in this process: a virtual-clock run needs no interpreter of its own
    (test_simulate_smoke_writes_a_simulated_run and the signal tests run the real command)."""
    return invoke("simulate", *args)


#: The CLI with every virtual job also taking 50 ms of real time (in a sweep's spawned cell processes
#: too, which import this module), so that a signal reliably lands while simulations are running.
SLOW_CLI = """
import sys
import time

from asyncroll.simulation import engine

_duration = engine.builtin_duration


def slow(request):
    time.sleep(0.05)
    return _duration(request)


engine.builtin_duration = slow

if __name__ == "__main__":
    from asyncroll.cli import app

    sys.argv[0] = "asyncroll"
    app()
"""


def start_slow_cli(tmp_path: Path, *args: str | Path) -> subprocess.Popen[str]:
    script = tmp_path / "slow_cli.py"
    script.write_text(SLOW_CLI)
    return subprocess.Popen(
        [sys.executable, str(script), *map(str, args)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_until(ready: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} never happened")


def signal_and_wait(proc: subprocess.Popen[str], sig: signal.Signals) -> str:
    """Send ``sig``; the process's stderr once it exited (killed after 30 s: a hang fails the test)."""
    try:
        os.kill(proc.pid, sig)
        _, stderr = proc.communicate(timeout=30)
    finally:
        end(proc)
    return stderr


def _final(pid: str, ms: float) -> dict[str, Any]:
    return {"id": pid, "prompt": "p", "script": [{"type": "final", "answer": 1, "latency_ms": ms}]}


@pytest.mark.parametrize(
    ("problems", "limits", "optimal", "binding"),
    [
        ([tool_problem("a", model_ms=100, cpu_ms=50)], {}, 0.25, "longest_trajectory_s"),
        (
            [tool_problem(f"c{i}", model_ms=0, cpu_ms=100) for i in range(4)],
            {"cpu_workers": 2},
            0.2,
            "cpu_execute_s",
        ),
        (
            [_final(f"m{i}", 100) for i in range(8)],
            {"max_inflight_model_requests": 2},
            0.4,
            "model_service_s",
        ),
        (
            [tool_problem(f"t{i}", model_ms=50, cpu_ms=50, final_ms=0) for i in range(6)],
            {"max_active_trajectories": 2, "max_inflight_model_requests": 8, "cpu_workers": 8},
            0.3,
            "trajectory_work_s",
        ),
    ],
)
def test_lower_bound_equals_known_optimum(
    virtual_run: VirtualRun,
    problems: list[dict[str, Any]],
    limits: dict[str, int],
    optimal: float,
    binding: str,
) -> None:
    outcome, _, _ = virtual_run(problems, **limits)
    assert outcome.summary is not None
    bounds = outcome.summary["bounds"]
    assert outcome.summary["makespan_s"] == pytest.approx(optimal)
    assert bounds["lower_bound_s"] == pytest.approx(optimal)
    assert bounds["binding"] == binding
    assert bounds["efficiency"] == pytest.approx(1.0)


def test_lower_bound_below_makespan_when_the_schedule_is_not_ideal(virtual_run: VirtualRun) -> None:
    # One worker, one long job that arrives last: FIFO cannot overlap it with anything.
    problems = [tool_problem(f"s{i}", model_ms=10, cpu_ms=10) for i in range(4)]
    problems.append(tool_problem("long", model_ms=60, cpu_ms=200, final_ms=200))
    outcome, _, _ = virtual_run(problems, cpu_workers=1)
    assert outcome.summary is not None
    bounds = outcome.summary["bounds"]
    assert bounds["lower_bound_s"] <= outcome.summary["makespan_s"]
    assert 0 < bounds["efficiency"] <= 1


def test_simulate_smoke_writes_a_simulated_run(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    result = cli("simulate", "--workload", SMOKE, "--output", out, "--policy", "tool_first")
    assert result.returncode == 0, result.stderr
    receipt, summary, events = load_run(out)
    assert receipt["simulated"] is True and receipt["simulation"]["server"] == "fixed"
    assert receipt["simulation"]["workers"] == "virtual (no processes)"
    # says why there is no telemetry, without advising flags that simulate does not have
    assert receipt["telemetry"]["note"] == "a simulation (virtual clock) reads no server or GPU telemetry"
    assert summary["counts"]["completed"] == 3 and summary["accuracy"]["exact"] == 1.0
    assert summary["makespan_s"] == pytest.approx(0.03)  # smoke-sleep: 5 + 20 + 5 ms, exactly
    assert summary["bounds"]["efficiency"] == pytest.approx(1.0)
    assert all(e.pid is None for e in events if e.event == "worker_ready")
    assert "lower bound 0.030s" in result.stdout


def test_simulate_with_batching_server(tmp_path: Path) -> None:
    problems = [tool_problem(f"p{i}", model_ms=0, cpu_ms=5, turns=2) for i in range(12)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    outs = {}
    for seqs in (1, 64):
        out = tmp_path / f"sim{seqs}"
        result = simulate_here(
            "--workload",
            workload,
            "--output",
            out,
            "--server",
            "batching",
            "--max-num-seqs",
            str(seqs),
            "--max-inflight-model-requests",
            "16",
        )
        assert result.exit_code == 0, result.output
        outs[seqs] = load_run(out)
    receipt, summary, events = outs[64]
    assert receipt["simulation"]["server_model"]["max_num_seqs"] == 64
    finished = [e for e in events if e.event == "model_finished"]
    assert all(e.completion_tokens and e.prompt_tokens for e in finished)
    assert summary["bounds"]["model_capacity"] == 16
    single = outs[1][1]["bounds"]
    assert single["model_capacity"] == 16 and single["server_batch_capacity"] == 1
    # one batch slot: the requests' time in it, back to back, is the whole makespan; their latencies
    # (which include the wait for that slot) over the one slot would be far above it
    assert single["terms"]["model_service_s"] == single["totals"]["server_batch_s"]
    assert single["totals"]["model_service_s"] > 4 * outs[1][1]["makespan_s"]
    assert single["binding"] == "model_service_s" and 0.99 < single["efficiency"] <= 1
    # a batch of one serialises the model: far slower than letting the server batch
    assert outs[1][1]["makespan_s"] > 3 * summary["makespan_s"]


@pytest.mark.timeout(90)
def test_from_run_replays_the_recorded_timings(tmp_path: Path) -> None:
    problems = [tool_problem(f"p{i}", model_ms=30, cpu_ms=40, turns=2, tool="sleep_ms") for i in range(6)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    real = tmp_path / "real"
    assert cli("run", "--workload", workload, "--output", real, "--cpu-workers", "2").returncode == 0
    _, real_summary, real_events = load_run(real)
    assert real_summary["bounds"]["lower_bound_s"] <= real_summary["makespan_s"]
    sim = tmp_path / "sim"
    result = simulate_here("--from-run", real, "--output", sim)
    assert result.exit_code == 0, result.output
    receipt, summary, events = load_run(sim)
    assert receipt["simulation"]["from_run"] == str(real.resolve())
    assert receipt["simulation"]["replayed"]["trajectories"] == 6
    assert receipt["simulation"]["replayed"]["source_simulated"] is False
    assert "itself a simulation" not in result.stderr
    assert receipt["config"]["cpu_workers"] == 2 and receipt["config"]["policy"] == "fifo"
    # every model turn of the replay takes exactly the latency the real run measured for it
    real_lat = {(e.id, e.turn): e.latency_s for e in real_events if e.event == "model_finished"}
    sim_lat = {(e.id, e.turn): e.latency_s for e in events if e.event == "model_finished"}
    assert sim_lat.keys() == real_lat.keys()
    assert all(sim_lat[k] == pytest.approx(real_lat[k], abs=2e-6) for k in real_lat)
    replay = [json.loads(line) for line in (sim / "replay-workload.jsonl").read_text().splitlines()]
    assert all(a.get("cpu_ms") for p in replay for a in p["script"] if a["type"] == "tool")
    # the replay leaves out only the runtime's own overhead, so it is a little faster, never slower
    assert 0.5 * real_summary["makespan_s"] <= summary["makespan_s"] <= real_summary["makespan_s"] * 1.05


def test_simulate_refuses_bad_invocations(tmp_path: Path) -> None:
    neither = simulate_here("--output", tmp_path / "a")
    assert neither.exit_code == 2 and "give --workload, or --from-run" in neither.stderr
    missing = simulate_here("--from-run", tmp_path / "nope", "--output", tmp_path / "b")
    assert (
        missing.exit_code == 2 and "nope: not a directory (a run directory holds run.json)" in missing.stderr
    )
    assert not (tmp_path / "b").exists()
    (tmp_path / "empty").mkdir()
    empty = simulate_here("--from-run", tmp_path / "empty", "--output", tmp_path / "b")
    assert empty.exit_code == 2 and "empty: no run.json (not a run directory?)" in empty.stderr
    assert not (tmp_path / "b").exists()
    exists = tmp_path / "c"
    exists.mkdir()
    refused = simulate_here("--workload", SMOKE, "--output", exists)
    assert refused.exit_code == 2 and list(exists.iterdir()) == []
    bad_server = simulate_here("--workload", SMOKE, "--output", tmp_path / "d", "--server", "quantum")
    assert bad_server.exit_code == 2 and not (tmp_path / "d").exists()


def test_simulated_workers_are_bounded_as_real_ones_are(tmp_path: Path) -> None:
    """``--cpu-workers 1000000`` ran (96 s, 3.8 GB of memory for the 3-problem smoke workload); 10**8
    would have exhausted the memory. The cap is ten times the real one; the cap itself runs."""
    from asyncroll.config import MAX_SIMULATED_WORKERS

    huge = simulate_here("--workload", SMOKE, "--output", tmp_path / "a", "--cpu-workers", "1000000")
    assert huge.exit_code == 2, huge.output
    assert f"--cpu-workers 1000000: at most {MAX_SIMULATED_WORKERS} simulated workers" in huge.stderr
    assert not (tmp_path / "a").exists()
    most = str(MAX_SIMULATED_WORKERS)
    at_cap = simulate_here("--workload", SMOKE, "--output", tmp_path / "b", "--cpu-workers", most)
    assert at_cap.exit_code == 0, at_cap.output
    assert json.loads((tmp_path / "b" / "run.json").read_text())["config"]["cpu_workers"] == int(most)
    assert f"at most {most};" in " ".join(simulate_here("--help").stdout.split())  # --help says the cap


def test_client_cpu_blocked_time_is_exact(virtual_run: VirtualRun) -> None:
    # One trajectory: 100 ms model, 50 ms job (blocked: nothing for the model), 100 ms model.
    outcome, _, _ = virtual_run([tool_problem("a", model_ms=100, cpu_ms=50)])
    assert outcome.summary is not None
    blocked = outcome.summary["client_cpu_blocked"]
    assert blocked["seconds"] == pytest.approx(0.05) and blocked["intervals"] == 1
    # b's model turns (0-120, 170-290) leave 120-150 with both trajectories in CPU jobs: 30 ms blocked.
    outcome, _, _ = virtual_run(
        [tool_problem("a", model_ms=100, cpu_ms=50), tool_problem("b", model_ms=120, cpu_ms=50)]
    )
    assert outcome.summary is not None
    assert outcome.summary["client_cpu_blocked"]["seconds"] == pytest.approx(0.03)
    # b's model turns (0-160, 210-370) cover a's job and a's (150-250) cover b's: never blocked.
    outcome, _, _ = virtual_run(
        [tool_problem("a", model_ms=100, cpu_ms=50), tool_problem("b", model_ms=160, cpu_ms=50)]
    )
    assert outcome.summary is not None
    assert outcome.summary["client_cpu_blocked"]["seconds"] == pytest.approx(0.0)


def test_overheads_add_to_every_turn_and_job(tmp_path: Path) -> None:
    problems = [tool_problem("a", model_ms=100, cpu_ms=50, turns=2)]  # 3 model turns, 2 jobs
    workload = write_workload(tmp_path / "w.jsonl", problems)
    out = tmp_path / "sim"
    result = simulate_here(
        "--workload",
        workload,
        "--output",
        out,
        "--turn-overhead-ms",
        "2",
        "--job-overhead-ms",
        "5",
    )
    assert result.exit_code == 0, result.output
    receipt, summary, _ = load_run(out)
    assert summary["makespan_s"] == pytest.approx(0.4 + 3 * 0.002 + 2 * 0.005)
    assert receipt["simulation"]["turn_overhead_ms"] == 2 and receipt["simulation"]["job_overhead_ms"] == 5
    bad = simulate_here("--workload", workload, "--output", tmp_path / "x", "--job-overhead-ms", "-1")
    assert bad.exit_code == 2 and not (tmp_path / "x").exists()


def test_a_summary_only_run_summarises_exactly_as_a_recorded_one(tmp_path: Path) -> None:
    """``record=False`` (a sweep cell) skips the decision's candidate list, which only events.jsonl
    shows; every number of the summary stays the same, bit for bit."""
    from asyncroll.clock import VirtualClock
    from asyncroll.config import build_config
    from asyncroll.event_log import EventCapture
    from asyncroll.events import CpuSelected
    from asyncroll.runtime.run import Run, prepare
    from asyncroll.runtime.virtual_worker import virtual_factory
    from bench import synthetic

    workload = synthetic.write(tmp_path / "w.jsonl", 40, 40.0, 60.0, seed=3)
    summaries, captures = [], []
    for record in (True, False):
        cfg = build_config(
            {
                "workload": workload,
                "output": tmp_path / f"run-{record}",
                "policy": "asyncroll",
                "max_active_trajectories": 8,
                "max_inflight_model_requests": 2,
                "cpu_workers": 2,
            }
        )
        clock = VirtualClock()
        capture = EventCapture()
        run = Run(
            prepare(cfg, ["test"]),
            clock,
            worker_factory=virtual_factory(clock, simulate_tools=True),
            subscribers=(capture,),
            record=record,
        )
        outcome = clock.run(run.execute())
        assert outcome.summary is not None
        summaries.append({k: v for k, v in outcome.summary.items() if k != "cpu_cost"})
        captures.append(capture.of(CpuSelected))
    assert summaries[0] == summaries[1]
    assert summaries[0]["scheduler"]["reorders"] > 0
    recorded, summary_only = captures
    assert any(e.candidates for e in recorded) and not any(e.candidates for e in summary_only)
    strip = [e.model_copy(update={"candidates": []}) for e in recorded]
    assert strip == summary_only


def test_synthetic_turns_decode_for_their_scripted_latency_on_the_batching_server(tmp_path: Path) -> None:
    """bench.synthetic declares output_tokens = latency ÷ the default decode step, so a turn alone on the
    batching server takes its scripted latency plus its prefill, not its multi-KB arguments' size."""
    from bench import synthetic

    workload = synthetic.write(tmp_path / "w.jsonl", 4, 400.0, 300.0, seed=1)
    out = tmp_path / "sim"
    args = ("--server", "batching", "--max-active-trajectories", "1", "--max-inflight-model-requests", "1")
    assert simulate_here("--workload", workload, "--output", out, *args).exit_code == 0
    scripted = {
        p["id"]: [a["latency_ms"] / 1000 for a in p["script"]]
        for p in map(json.loads, workload.read_text().splitlines())
    }
    finished = [e for e in load_run(out)[2] if e.event == "model_finished"]
    assert len(finished) == sum(map(len, scripted.values()))
    for e in finished:
        decode = e.latency_s - e.prompt_tokens * 0.03 / 1000  # the default prefill cost
        assert decode == pytest.approx(scripted[e.id][e.turn], abs=0.007)  # within half a decode step


def test_cpu_cost_is_unknown_rather_than_zero_when_it_cannot_be_measured() -> None:
    from asyncroll.outputs.cpu_cost import cpu_cost

    known = cpu_cost((1.0, 10.0), (3.0, 16.0), replaced=False, completed=4)
    assert known == {
        "client_cpu_s": 2.0,
        "workers_cpu_s": 6.0,
        "total_cpu_s": 8.0,
        "per_completion_s": 2.0,
        "reason": None,
    }
    assert cpu_cost(None, (3.0, 16.0), False, 4)["client_cpu_s"] is None
    replaced = cpu_cost((1.0, 10.0), (3.0, 16.0), replaced=True, completed=4)
    assert (
        replaced["client_cpu_s"] == 2.0
        and replaced["total_cpu_s"] is None
        and "replaced" in replaced["reason"]
    )
    virtual = cpu_cost((1.0, None), (3.0, None), replaced=False, completed=4)
    assert virtual["workers_cpu_s"] is None and virtual["per_completion_s"] is None
    nothing = cpu_cost((1.0, 10.0), (3.0, 16.0), replaced=False, completed=0)
    assert nothing["total_cpu_s"] == 8.0 and nothing["per_completion_s"] is None
    assert nothing["reason"] == "no trajectory completed"


# --- refusals: bad input is one line on stderr, exit 2, and nothing created ---------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--server", "batching", "--chars-per-token", "0"], "--chars-per-token: must be >= 0.01"),
        (["--server", "batching", "--chars-per-token", "-1"], "--chars-per-token: must be >= 0.01"),
        (["--turn-overhead-ms", "nan"], "--turn-overhead-ms: must be a finite number"),
        (["--job-overhead-ms", "inf"], "--job-overhead-ms: must be a finite number"),
        (["--job-overhead-ms", "1e9"], "--job-overhead-ms: must be at most 86400000 ms (one day)"),
        (["--server", "batching", "--step-base-ms", "nan"], "--step-base-ms: must be a finite number"),
        (["--server", "batching", "--step-base-ms", "inf"], "--step-base-ms: must be a finite number"),
        (["--server", "batching", "--step-base-ms", "1e308"], "--step-base-ms: must be at most"),
        (["--server", "batching", "--step-per-seq-ms", "inf"], "--step-per-seq-ms: must be a finite"),
        (["--server", "batching", "--prefill-ms-per-token", "inf"], "--prefill-ms-per-token: must be a"),
        (["--server", "batching", "--max-num-seqs", "0"], "--max-num-seqs: must be >= 1"),
        (
            ["--server", "batching", "--step-base-ms", "0", "--step-per-seq-ms", "0"],
            "--step-base-ms and --step-per-seq-ms are both 0: a step must take some time",
        ),
        (["--tool-timeout", "inf"], "--tool-timeout: must be a finite number"),
        (["--tool-timeout", "nan"], "--tool-timeout: must be a finite number"),
        (["--sweep", "--jitter", "nan"], "--jitter: must be a finite number"),
        (["--sweep", "--jitter", "50"], "--jitter: must be at most 5"),
    ],
)
def test_non_finite_and_out_of_range_numbers_are_refused_before_anything_exists(
    tmp_path: Path, args: list[str], message: str
) -> None:
    """NaN would silently corrupt every duration it touches; infinity or a cost near float's limit would
    stop virtual time (the run never ends); chars-per-token 0 divided by zero mid-run."""
    out = tmp_path / "out"
    result = simulate_here("--workload", SMOKE, "--output", out, *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and result.stderr.count("\n") == 1
    assert not out.exists()


def test_simulation_settings_refuse_what_the_cli_refuses() -> None:
    from asyncroll.backends.server_model import ServerModelConfig
    from asyncroll.simulation.engine import SimulationSettings

    for bad in (
        {"chars_per_token": 0.0},
        {"turn_overhead_ms": float("nan")},
        {"job_overhead_ms": float("inf")},
    ):
        with pytest.raises(ValueError, match="must be a finite number"):
            SimulationSettings(**bad)  # type: ignore[arg-type]
    # the server model's costs are refused by its own config, for serve-sim too (test_server_model.py)
    with pytest.raises(ValueError, match="--step-base-ms must be a finite number"):
        ServerModelConfig(step_base_ms=float("inf"))
    with pytest.raises(ValueError, match="--prefill-ms-per-token must be from 0 to 86400000 ms"):
        ServerModelConfig(prefill_ms_per_token=1e308)


# --- replays of recorded runs ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A completed (simulated) run to replay: eight trajectories, two of them failed by a tool timeout."""
    from bench import synthetic

    tmp = tmp_path_factory.mktemp("recorded")
    workload = synthetic.write(tmp / "w.jsonl", 8, 20.0, 15.0, seed=0)
    run = tmp / "run"
    result = simulate_here("--workload", workload, "--output", run, "--tool-timeout", "0.015")
    assert result.exit_code == 0, result.output
    return run


def _statuses(run: Path) -> dict[str, str]:
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    return {row["id"]: row["status"] for row in rows}


@pytest.mark.timeout(60)
def test_a_replay_of_a_run_with_tool_timeouts_reproduces_every_trajectorys_outcome(
    recorded: Path, tmp_path: Path
) -> None:
    """A timed-out job's only measurement is its round trip, which equals the timeout; replayed as that,
    it no longer exceeded the timeout and its trajectory completed. It is replayed just over it."""
    statuses = _statuses(recorded)
    assert sorted(statuses.values()).count("failed") >= 1  # the timeout did bite
    replay = tmp_path / "replay"
    result = simulate_here("--from-run", recorded, "--output", replay)
    assert result.exit_code == 0, result.output
    assert _statuses(replay) == statuses
    _, source, source_events = load_run(recorded)
    _, summary, _ = load_run(replay)
    assert summary["counts"] == source["counts"]
    assert summary["workers"]["restarts"] == source["workers"]["restarts"]
    timeouts = sum(e.event == "cpu_failed" and e.reason == "timeout" for e in source_events)
    replayed = [
        a
        for line in (replay / "replay-workload.jsonl").read_text().splitlines()
        for a in json.loads(line)["script"]
    ]
    assert timeouts and sum(a.get("cpu_ms") == 15.001 for a in replayed) == timeouts  # 1 µs over


@pytest.mark.timeout(60)
@pytest.mark.parametrize("status", ["interrupted", "failed", "running", "preparing"])
def test_from_run_refuses_a_run_that_did_not_complete(recorded: Path, tmp_path: Path, status: str) -> None:
    """Only part of such a run's turns were measured; the rest would silently take scripted timings."""
    import shutil

    source = tmp_path / "source"
    shutil.copytree(recorded, source)
    receipt = json.loads((source / "run.json").read_text())
    (source / "run.json").write_text(json.dumps({**receipt, "status": status}))
    out = tmp_path / "out"
    result = simulate_here("--from-run", source, "--output", out)
    assert result.exit_code == 2
    assert f"the run's status is {status!r}, not 'complete'" in result.stderr
    assert not out.exists()


@pytest.mark.timeout(60)
def test_a_timed_out_job_is_replayed_just_over_the_timeout_not_at_its_round_trip(
    recorded: Path, tmp_path: Path
) -> None:
    """A real timed-out job's round trip also holds the kill (here 6 ms more): only "past the timeout" is
    known of the job, so it is replayed 1 µs over the timeout, a lower bound under a longer timeout."""
    import shutil

    source = tmp_path / "source"
    shutil.copytree(recorded, source)

    def slow_kill(lines: list[str]) -> list[str]:
        out = []
        for line in lines:
            event = json.loads(line)
            if event["event"] == "cpu_failed" and event["reason"] == "timeout":
                line = json.dumps({**event, "roundtrip_s": 0.021}) + "\n"
            out.append(line)
        return out

    _edit_lines(source / "events.jsonl", slow_kill)
    replay = tmp_path / "replay"
    result = simulate_here("--from-run", source, "--output", replay, "--tool-timeout", "10")
    assert result.exit_code == 0, result.output
    cpu_ms = [
        a.get("cpu_ms")
        for line in (replay / "replay-workload.jsonl").read_text().splitlines()
        for a in json.loads(line)["script"]
    ]
    assert 15.001 in cpu_ms and 21.0 not in cpu_ms


@pytest.mark.timeout(60)
@pytest.mark.parametrize("replay", [False, True])
def test_from_run_refuses_an_agent_mode_http_run_whose_actions_the_model_chose(
    recorded: Path, tmp_path: Path, replay: bool
) -> None:
    """An agent-mode run's timings belong to the model's actions, not to the workload's script; an HTTP
    run with --replay took its actions from the script and can be replayed."""
    import shutil

    source = tmp_path / "source"
    shutil.copytree(recorded, source)
    _edit_json(
        source / "run.json", lambda r: {**r, "config": {**r["config"], "backend": "vllm", "replay": replay}}
    )
    out = tmp_path / "out"
    result = simulate_here("--from-run", source, "--output", out)
    if replay:
        assert result.exit_code == 0, result.output
    else:
        assert result.exit_code == 2, result.output
        assert "the run's actions came from the model (--backend vllm without --replay)" in result.stderr
        assert not out.exists()


def _edit_json(path: Path, edit: Any) -> None:
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))


def _edit_lines(path: Path, edit: Any) -> None:
    path.write_text("".join(edit(path.read_text().splitlines(keepends=True))))


def _drop_first_turn(lines: list[str]) -> list[str]:
    out, dropped = [], False
    for line in lines:
        event = json.loads(line)
        if event["event"] == "model_finished" and not dropped:
            del event["turn"]
            line, dropped = json.dumps(event) + "\n", True
        out.append(line)
    return out


@pytest.mark.timeout(60)
def test_a_signal_after_the_replay_workload_is_written_but_before_the_run_leaves_nothing(
    recorded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGINT between the replay workload and run.json left OUT holding only replay-workload.jsonl,
    said "partial outputs", and the same command was then refused (OUT exists). As `run` does, the
    directory the command had just made is removed and "nothing written" is said."""
    from asyncroll.simulation import engine

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(engine, "simulate", interrupted)
    out = tmp_path / "replay"
    result = simulate_here("--from-run", recorded, "--output", out)
    assert result.exit_code == 130, result.output
    assert "nothing written" in result.stderr and not out.exists()
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep").write_text("")
    result = simulate_here("--workload", SMOKE, "--output", existing)
    assert result.exit_code == 130 and (existing / "keep").exists()  # not its own: never removed


def _drop_last_trajectory(lines: list[str]) -> list[str]:
    started = [json.loads(line)["id"] for line in lines if '"trajectory_started"' in line]
    return [line for line in lines if json.loads(line).get("id") != started[-1]]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: (d / "run.json").write_text("[1, 2]"), r"run\.json: not a run receipt \(a JSON list\)"),
        (lambda d: (d / "run.json").write_text("{"), "cannot read run.json"),
        (
            lambda d: _edit_json(d / "run.json", lambda r: {**r, "schema_version": 99}),
            r"run\.json: schema_version 99; this asyncroll reads run\.json version 1 only",
        ),
        (
            lambda d: _edit_json(d / "run.json", lambda r: {**r, "workload": "w.jsonl"}),
            r"run\.json: 'workload' is missing or not an object",
        ),
        (
            lambda d: _edit_json(
                d / "run.json", lambda r: {**r, "config": {**r["config"], "tool_timeout": "x"}}
            ),
            "config.tool_timeout is not a positive number",
        ),
        (
            lambda d: _edit_lines(d / "events.jsonl", _drop_first_turn),
            r"events\.jsonl:\d+: 'model_finished' lacks a valid 'turn'",
        ),
        (
            lambda d: _edit_lines(d / "events.jsonl", lambda lines: [*lines[:-1], lines[-1][:25]]),
            r"events\.jsonl:\d+: not valid JSON",
        ),
        (
            lambda d: _edit_lines(
                d / "events.jsonl", lambda lines: [ln.replace('"v":1,', '"v":99,') for ln in lines]
            ),
            r"events\.jsonl:1: event schema version 99; this asyncroll reads version 1 only",
        ),
        (
            lambda d: _edit_lines(d / "events.jsonl", lambda lines: ["[]\n", *lines]),
            r"events\.jsonl:1: not a JSON object",
        ),
        (
            lambda d: _edit_lines(
                d / "results.jsonl", lambda lines: [*lines, '{"id": "x", "generations": "2"}\n']
            ),
            r"results\.jsonl:9: 'generations' or 'id' is not valid",
        ),
        (lambda d: (d / "events.jsonl").unlink(), r"cannot read .*events\.jsonl"),
        # an infinite replay cost was written as null: the timed-out jobs took 0 s in the replay
        (
            lambda d: _edit_json(
                d / "run.json", lambda r: {**r, "config": {**r["config"], "tool_timeout": 1e308}}
            ),
            r"events\.jsonl:\d+: tool job \d+ .* timed out, but run\.json's config\.tool_timeout 1e\+308 s",
        ),
        # one trajectory's events all removed: it would vanish from the replay, its work with it
        (
            lambda d: _edit_lines(d / "events.jsonl", _drop_last_trajectory),
            r"results\.jsonl:\d+: trajectory '[^']+' ended in the run, but .*events\.jsonl has no "
            "trajectory_started for it",
        ),
        (
            lambda d: _edit_lines(d / "results.jsonl", lambda lines: lines[:-1]),
            r"events\.jsonl:\d+: trajectory '[^']+' started, but .*results\.jsonl has no row for it",
        ),
    ],
)
def test_from_run_refuses_damaged_or_other_version_run_dirs_naming_the_file(
    recorded: Path, tmp_path: Path, damage: Any, message: str
) -> None:
    import re
    import shutil

    source = tmp_path / "source"
    shutil.copytree(recorded, source)
    damage(source)
    out = tmp_path / "out"
    result = simulate_here("--from-run", source, "--output", out)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: --from-run ") and re.search(message, result.stderr), result.stderr
    assert "Traceback" not in result.output and not out.exists()


@pytest.mark.timeout(60)
def test_from_run_resolves_a_relative_tool_root_without_the_original_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run.json keeps --tool-root as typed; a relative one is recovered from the tool files it records
    (absolute) or from its cwd, so the replay does not depend on where it is started. Where nothing pins
    it down (an older run.json without cwd), the user is told to pass --tool-root, which then overrides
    it."""
    from bench import synthetic

    project = tmp_path / "project"
    synthetic.write(project / "tools" / "w.jsonl", 3, 20.0, 10.0, seed=1)
    monkeypatch.chdir(project)
    assert (
        simulate_here("--workload", "tools/w.jsonl", "--output", "run", "--tool-root", "tools").exit_code == 0
    )
    assert json.loads((project / "run" / "run.json").read_text())["config"]["tool_root"] == "tools"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = simulate_here("--from-run", project / "run", "--output", "replay")
    assert result.exit_code == 0, result.output
    receipt = json.loads((elsewhere / "replay" / "run.json").read_text())
    assert receipt["config"]["tool_root"] == str(project / "tools")

    # built-in tools only: run.json's cwd says what "sub" was relative to
    (project / "sub").mkdir()
    monkeypatch.chdir(project)
    assert simulate_here("--workload", SMOKE, "--output", "smoke", "--tool-root", "sub").exit_code == 0
    monkeypatch.chdir(elsewhere)
    found = simulate_here("--from-run", project / "smoke", "--output", "r1")
    assert found.exit_code == 0, found.output
    assert json.loads((elsewhere / "r1" / "run.json").read_text())["config"]["tool_root"] == str(
        project / "sub"
    )
    # a run directory from before run.json recorded its cwd: nothing says what "sub" was relative to
    receipt_path = project / "smoke" / "run.json"
    receipt = json.loads(receipt_path.read_text())
    del receipt["cwd"]
    receipt_path.write_text(json.dumps(receipt))
    refused = simulate_here("--from-run", project / "smoke", "--output", "r2")
    assert refused.exit_code == 2 and "pass --tool-root" in refused.stderr and not Path("r2").exists()
    given = simulate_here("--from-run", project / "smoke", "--output", "r2", "--tool-root", project / "sub")
    assert given.exit_code == 0, given.output


# --- signals --------------------------------------------------------------------------------------------


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_interrupts_a_simulation_as_it_does_a_run(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGTERM, like SIGINT, stops the simulation: exit 130, run.json and summary.json say interrupted and
    by which signal (SIGTERM used to kill the process and leave run.json ``running``)."""
    problems = [tool_problem(f"p{i}", model_ms=10, cpu_ms=10, turns=2) for i in range(100)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    out = tmp_path / "sim"
    proc = start_slow_cli(tmp_path, "simulate", "--workload", workload, "--output", out)
    receipt = out / "run.json"
    try:
        wait_until(lambda: receipt.exists() and '"running"' in receipt.read_text(), "the simulation start")
        stderr = signal_and_wait(proc, sig)
    finally:
        end(proc)
    assert proc.returncode == 130, stderr
    assert f"interrupted by {sig.name}; partial outputs in {out}" in stderr and "Traceback" not in stderr
    receipt_data, summary, events = load_run(out)
    assert receipt_data["status"] == "interrupted" and receipt_data["error"] == f"interrupted by {sig.name}"
    assert summary["status"] == "interrupted" and summary["counts"]["unfinished"] > 0
    assert events[-1].event == "measurement_finished" and events[-1].status == "interrupted"


# --- bench.synthetic ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--n", "-5"], "--n: must be an integer >= 1"),
        (["--n", "0"], "--n: must be an integer >= 1"),
        (["--model-ms", "-1"], "--model-ms: must be a finite number >= 0"),
        (["--cpu-ms", "0"], "--cpu-ms: must be a finite number > 0"),
        (["--cpu-ms", "inf"], "--cpu-ms: must be a finite number"),
        (["--repair-fraction", "2"], "--repair-fraction: must be a finite number >= 0 and <= 1"),
        (["--repair-fraction", "-1"], "--repair-fraction: must be a finite number >= 0 and <= 1"),
        (["--cpu-sigma", "-1"], "--cpu-sigma: must be a finite number >= 0"),
        (["--noise", "-0.5"], "--noise: must be a finite number >= 0"),
        (["--noise", "nan"], "--noise: must be a finite number"),
        (["--model-ms", "80000000"], "over a workload's one-day limit"),
    ],
)
def test_synthetic_refuses_parameters_outside_their_documented_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    from bench import synthetic

    with pytest.raises(SystemExit) as exit_info:
        synthetic.main([*args, "--output", str(tmp_path / "w.jsonl")])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_synthetic_never_overwrites_another_tools_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench import synthetic

    synthetic.main(["--n", "3", "--output", str(tmp_path / "a.jsonl")])
    synthetic.main(["--n", "3", "--output", str(tmp_path / "b.jsonl")])  # the same tools file: fine
    assert (tmp_path / synthetic.TOOLS_FILE).read_text() == synthetic.TOOLS_SOURCE
    mine = "def crunch(data):\n    return 0\n"
    (tmp_path / synthetic.TOOLS_FILE).write_text(mine)
    with pytest.raises(SystemExit) as exit_info:
        synthetic.main(["--n", "3", "--output", str(tmp_path / "c.jsonl")])
    assert exit_info.value.code == 2 and "is not this generator's tools file" in capsys.readouterr().err
    assert (tmp_path / synthetic.TOOLS_FILE).read_text() == mine and not (tmp_path / "c.jsonl").exists()
    before = (tmp_path / "a.jsonl").read_bytes()
    with pytest.raises(SystemExit) as exit_info:  # nor an existing workload
        synthetic.main(["--n", "4", "--output", str(tmp_path / "a.jsonl")])
    assert exit_info.value.code == 2 and "already exists" in capsys.readouterr().err
    assert (tmp_path / "a.jsonl").read_bytes() == before


def test_pressure_flags_unread_by_the_policy_are_named(tmp_path: Path) -> None:
    """A pressure setting given to a policy that never reads it is said to do nothing (a flag that is
    silently ignored misleads); a recorded run's own settings, kept by ``--from-run``, are not."""
    fifo = simulate_here(
        "--workload", SMOKE, "--output", tmp_path / "a", "--policy", "fifo", "--aging-weight", "1"
    )
    assert fifo.exit_code == 0, fifo.output
    assert "warning: --aging-weight has no effect with --policy fifo" in fifo.stderr
    pressure = simulate_here(
        "--workload", SMOKE, "--output", tmp_path / "b", "--policy", "asyncroll", "--aging-weight", "1"
    )
    assert pressure.exit_code == 0 and "warning" not in pressure.stderr
    sweep = ("--workload", SMOKE, "--sweep", "--seeds", "1", "--jobs", "1", "--starvation-threshold", "1")
    baselines = simulate_here(*sweep, "--output", tmp_path / "c", "--policies", "fifo,tool_first")
    assert baselines.exit_code == 0, baselines.output
    assert "--starvation-threshold has no effect with --policies fifo,tool_first" in baselines.stderr
    mixed = simulate_here(*sweep, "--output", tmp_path / "d", "--policies", "fifo,asyncroll")
    assert mixed.exit_code == 0 and "warning" not in mixed.stderr
    replay = simulate_here("--from-run", tmp_path / "b", "--output", tmp_path / "e", "--policy", "fifo")
    assert replay.exit_code == 0 and "has no effect" not in replay.stderr  # aging 1 was the recorded run's


def test_gpu_first_warns_and_two_names_of_one_policy_are_refused_in_a_sweep(tmp_path: Path) -> None:
    single = simulate_here("--workload", SMOKE, "--output", tmp_path / "a", "--policy", "gpu_first")
    assert single.exit_code == 0 and "--policy gpu_first is a deprecated alias of tool_first" in single.stderr
    sweep = ("--workload", SMOKE, "--sweep", "--seeds", "1", "--jobs", "1")
    for policies, message in (
        ("fifo,gpu_first,tool_first", "'gpu_first' and 'tool_first' are the same policy (tool_first)"),
        ("asyncroll_repair,asyncroll", "'asyncroll_repair' and 'asyncroll' are the same policy"),
    ):
        out = tmp_path / policies.replace(",", "-")
        refused = simulate_here(*sweep, "--output", out, "--policies", policies)
        assert refused.exit_code == 2 and message in refused.stderr, refused.output
        assert not out.exists()
    alias = simulate_here(*sweep, "--output", tmp_path / "b", "--policies", "fifo,gpu_first")
    assert alias.exit_code == 0 and "gpu_first is a deprecated alias" in alias.stderr


def test_a_replay_refuses_the_batching_server(tmp_path: Path) -> None:
    """A replay's model turns take their measured latencies; the batching model would silently replace
    them (a 51 ms turn replayed at 345 ms) from token counts a recorded run does not carry."""
    real = tmp_path / "real"
    assert simulate_here("--workload", SMOKE, "--output", real).exit_code == 0
    refused = simulate_here("--from-run", real, "--output", tmp_path / "r", "--server", "batching")
    assert (
        refused.exit_code == 2 and "--from-run replays the run's measured model latencies" in refused.stderr
    )
    assert not (tmp_path / "r").exists()


def test_submissions_without_a_verdict_are_said_to_pass(tmp_path: Path) -> None:
    """Untrusted code is never run in a simulation, so a submit without ``passes`` passes: the bundled
    one-repair example (whose first programs really fail) simulated with no repair turn and no word why.
    stderr now counts those submissions, and run.json states the rule; declared verdicts are quiet."""
    lines = (REPO / "examples" / "livecodebench" / "workload.jsonl").read_text().splitlines()
    problems = [json.loads(line) for line in lines]
    for problem in problems:  # declared: the first submission fails, the repair passes
        submits = [a for a in problem["script"] if a["type"] == "submit"]
        assert len(submits) == 2 and all("passes" not in a for a in submits)
        submits[0]["passes"], submits[1]["passes"] = False, True
    declared = write_workload(tmp_path / "declared.jsonl", problems)
    said = simulate_here(
        "--workload", REPO / "examples" / "livecodebench" / "workload.jsonl", "--output", tmp_path / "a"
    )
    quiet = simulate_here("--workload", declared, "--output", tmp_path / "b")
    assert said.exit_code == 0 and quiet.exit_code == 0, said.output + quiet.output
    assert (
        f"warning: {len(problems)} submission(s) passed because their script declares no verdict"
        in said.stderr
    )
    assert "declares no verdict" not in quiet.stderr
    results = [json.loads(line) for line in (tmp_path / "b" / "results.jsonl").read_text().splitlines()]
    assert all(r["repair_attempted"] and r["passed"] for r in results)
    receipt = json.loads((tmp_path / "a" / "run.json").read_text())
    assert "a submission passes unless its action declares passes: false" in receipt["simulation"]["verdicts"]


def test_a_file_tool_without_cpu_ms_is_said_to_take_no_time(tmp_path: Path) -> None:
    """A simulation cannot know what a trusted file tool costs: without cpu_ms its calls take 0 s, which
    run.json states and stderr counts (it was silent: a custom workload simulated at a fraction of its
    real makespan with no word why)."""
    (tmp_path / "mine.py").write_text("def work(n):\n    return sum(range(n))\n")
    tool = {"name": "work", "inputs": {"n": "int"}, "implementation": "mine.py"}

    def problem(pid: str, cpu_ms: float | None) -> dict[str, object]:
        call = {"type": "tool", "name": "work", "arguments": {"n": 5}, "latency_ms": 10}
        if cpu_ms is not None:
            call["cpu_ms"] = cpu_ms
        final = {"type": "final", "answer": "10", "latency_ms": 10}
        return {"id": pid, "prompt": "sum", "tools": [tool], "script": [call, final]}

    untimed = write_workload(tmp_path / "a.jsonl", [problem("a", None), problem("b", None)])
    timed = write_workload(tmp_path / "b.jsonl", [problem("a", 20.0)])
    said = simulate_here("--workload", untimed, "--output", tmp_path / "a")
    quiet = simulate_here("--workload", timed, "--output", tmp_path / "b")
    assert said.exit_code == 0 and quiet.exit_code == 0, said.output + quiet.output
    assert "2 CPU job(s) took 0 s (mine.py::work ×2) because their script gives no cpu_ms" in said.stderr
    assert "no cpu_ms" not in quiet.stderr
    receipt = json.loads((tmp_path / "a" / "run.json").read_text())
    assert (
        "a file tool's call or an evaluation without cpu_ms takes no time"
        in receipt["simulation"]["cpu_jobs"]
    )


@pytest.mark.timeout(60)
def test_a_run_recorded_elsewhere_replays_with_its_workload_where_it_is_now(tmp_path: Path) -> None:
    """run.json records the workload's absolute path: a run directory copied from another machine (or a
    workload folder moved since) is replayed with ``--workload`` naming the copy, checked by SHA-256."""
    import shutil

    from bench import synthetic

    there = tmp_path / "there"
    there.mkdir()
    workload = synthetic.write(there / "w.jsonl", 6, 20.0, 15.0, seed=1)
    run = tmp_path / "run"
    assert simulate_here("--workload", workload, "--output", run).exit_code == 0
    at_home = simulate_here("--from-run", run, "--output", tmp_path / "at-home")
    assert at_home.exit_code == 0, at_home.output
    here = tmp_path / "here"
    there.rename(here)  # the workload and its tool file, moved
    lost = simulate_here("--from-run", run, "--output", tmp_path / "lost")
    assert lost.exit_code == 2 and "no longer exists" in lost.stderr and "pass --workload" in lost.stderr
    assert not (tmp_path / "lost").exists()
    moved = simulate_here("--from-run", run, "--workload", here / "w.jsonl", "--output", tmp_path / "moved")
    assert moved.exit_code == 0, moved.output
    replays = [(tmp_path / d / "replay-workload.jsonl").read_bytes() for d in ("at-home", "moved")]
    assert replays[0] == replays[1]
    assert (tmp_path / "moved" / "summary.json").read_bytes() == (
        tmp_path / "at-home" / "summary.json"
    ).read_bytes()
    receipt, _, _ = load_run(tmp_path / "moved")
    assert receipt["config"]["tool_root"] == str(here)  # the tools beside the workload, where it is now
    other = shutil.copy(here / "w.jsonl", tmp_path / "other.jsonl")
    with open(other, "a", encoding="utf-8") as f:
        f.write("\n")
    wrong = simulate_here("--from-run", run, "--workload", other, "--output", tmp_path / "wrong")
    assert wrong.exit_code == 2 and "is not the workload the run read" in wrong.stderr
    assert not (tmp_path / "wrong").exists()
