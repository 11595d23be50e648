"""What ``simulate`` refuses: bad invocations, more simulated workers than its cap, and numbers that are
not finite or out of range (one line on stderr, exit 2, nothing created)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_runs import SMOKE
from tests.simulations import simulate_here


def test_simulate_refuses_bad_invocations(tmp_path: Path) -> None:
    neither = simulate_here("--output", tmp_path / "a")
    assert neither.exit_code == 2 and "give --workload, or --from-run" in neither.stderr
    missing = simulate_here("--from-run", tmp_path / "nope", "--output", tmp_path / "b")
    assert (
        missing.exit_code == 2 and "nope: does not exist (a run directory holds run.json)" in missing.stderr
    )
    assert not (tmp_path / "b").exists()
    (tmp_path / "loop").symlink_to(tmp_path / "loop")  # there, but no folder can be reached through it
    looped = simulate_here("--from-run", tmp_path / "loop", "--output", tmp_path / "b")
    assert looped.exit_code == 2 and "loop: Too many levels of symbolic links (a run" in looped.stderr
    assert "does not exist" not in looped.stderr and not (tmp_path / "b").exists()
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
    no_output = simulate_here("--workload", SMOKE)
    assert no_output.exit_code == 2 and "missing required option: --output" in no_output.stderr


def test_a_replay_refuses_what_the_recorded_run_decides(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert simulate_here("--workload", SMOKE, "--output", run).exit_code == 0
    twice = simulate_here("--from-run", run, "--from-run", run, "--output", tmp_path / "a")
    assert twice.exit_code == 2 and "--from-run given 2 times: a replay is of one run" in twice.stderr
    limited = simulate_here("--from-run", run, "--limit", "2", "--output", tmp_path / "b")
    assert limited.exit_code == 2 and "--limit comes from the recorded run with --from-run" in limited.stderr
    no_output = simulate_here("--from-run", run)
    assert no_output.exit_code == 2 and "missing required option: --output" in no_output.stderr
    # the measured latencies hold the client's cost per turn already (bench/calibrate measures the overhead
    # as the latency beyond the scripted one): adding it again made every turn of the replay longer
    overhead = simulate_here("--from-run", run, "--turn-overhead-ms", "1", "--output", tmp_path / "o")
    assert overhead.exit_code == 2 and not (tmp_path / "o").exists(), overhead.output
    assert "--turn-overhead-ms does not apply with --from-run" in overhead.stderr
    jobs = simulate_here("--from-run", run, "--job-overhead-ms", "1", "--output", tmp_path / "j")
    assert jobs.exit_code == 0, jobs.output  # a replayed job takes its execute time: its dispatch is apart
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    (tmp_path / "loop").symlink_to(tmp_path / "loop")  # Path.resolve: 'RuntimeError: Symlink loop' (3.11)
    looped = simulate_here("--from-run", run, "--tool-root", tmp_path / "loop", "--output", tmp_path / "c")
    assert looped.exit_code == 2, looped.output
    assert f"--tool-root {tmp_path / 'loop'}: Too many levels of symbolic links" in looped.stderr
    assert "Traceback" not in looped.output and not (tmp_path / "c").exists()


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
        # a value just past a bound is shown in full, not rounded by 6 digits to the bound itself
        (["--job-overhead-ms", "86400000.5"], "at most 86400000 ms (one day), got 86400000.5\n"),
        (["--server", "batching", "--chars-per-token", "0.00999999"], "must be >= 0.01, got 0.00999999\n"),
        (["--sweep", "--jitter", "5.0000001"], "--jitter: must be at most 5, got 5.0000001\n"),
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
        {"turn_overhead_ms": -1.0},  # a finite cost is still refused out of range: below 0 or above a day
        {"job_overhead_ms": 86_400_001.0},
        {"turn_overhead_ms": 86_400_001.0},
        {"job_overhead_ms": -0.5},
    ):
        with pytest.raises(ValueError, match="must be a finite number"):
            SimulationSettings(**bad)  # type: ignore[arg-type]
    # and accept what it accepts, up to one day
    SimulationSettings(turn_overhead_ms=86_400_000.0, job_overhead_ms=86_400_000.0)
    # the server model's costs are refused by its own config, for serve-sim too (test_server_model.py)
    with pytest.raises(ValueError, match="--step-base-ms must be a finite number"):
        ServerModelConfig(step_base_ms=float("inf"))
    with pytest.raises(ValueError, match="--prefill-ms-per-token must be from 0 to 86400000 ms"):
        ServerModelConfig(prefill_ms_per_token=1e308)
