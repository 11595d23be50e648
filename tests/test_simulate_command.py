"""The ``simulate`` command on a workload: the simulated run it writes, the batching server, overheads,
warnings for what a simulation cannot know or a flag that does nothing, the same run under another hash
seed, and a signal mid-simulation."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.simspeed import small_workload
from tests.children import end
from tests.cli_runs import SMOKE, cli, load_run
from tests.conftest import REPO, tool_problem, write_workload
from tests.simulations import signal_and_wait, simulate_here, start_slow_cli, wait_until


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


def test_pressure_flags_unread_by_the_policy_are_named(tmp_path: Path) -> None:
    """A pressure setting given to a policy that never reads it is said to do nothing (a flag that is
    silently ignored misleads); a recorded run's own settings, kept by ``--from-run``, are not."""
    fifo = simulate_here(
        "--workload", SMOKE, "--output", tmp_path / "a", "--policy", "fifo", "--aging-weight", "1"
    )
    assert fifo.exit_code == 0, fifo.output
    warning = "warning: --aging-weight has no effect with --policy fifo (read only by the pressure-aware"
    assert warning in fifo.stderr
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


def test_a_limit_past_the_workload_is_said_as_the_converters_say_it(tmp_path: Path) -> None:
    """``--limit 100`` on a 3-problem workload simulated 3 without a word (the converters say it); a sweep
    says it once; a limit the workload fills says nothing."""
    past = simulate_here("--workload", SMOKE, "--output", tmp_path / "a", "--limit", "100")
    assert past.exit_code == 0, past.output
    assert "note: --limit 100 asked for more problems than the workload holds: 3 simulated" in past.stderr
    sweep = ("--workload", SMOKE, "--sweep", "--seeds", "1", "--jobs", "1", "--policies", "fifo")
    swept = simulate_here(*sweep, "--output", tmp_path / "b", "--limit", "4")
    assert swept.exit_code == 0, swept.output
    assert swept.stderr.count("note: --limit 4 asked for more problems than the workload holds: 3") == 1
    fits = simulate_here("--workload", SMOKE, "--output", tmp_path / "c", "--limit", "3")
    assert fits.exit_code == 0 and "note" not in fits.stderr, fits.output


def test_sync_says_an_active_limit_has_no_effect_as_run_does(tmp_path: Path) -> None:
    """``run --policy sync --max-active-trajectories 8`` warns that the limit has no effect (sync runs one
    trajectory at a time); ``simulate`` ran the same settings without a word."""
    args = ("--workload", SMOKE, "--policy", "sync")
    given = simulate_here(*args, "--output", tmp_path / "a", "--max-active-trajectories", "8")
    assert given.exit_code == 0, given.output
    assert (
        "warning: --policy sync runs one trajectory at a time: --max-active-trajectories 8 has no effect"
        in (given.stderr)
    )
    plain = simulate_here(*args, "--output", tmp_path / "b")
    assert plain.exit_code == 0 and "no effect" not in plain.stderr


def test_an_inflight_limit_above_the_active_one_says_it_has_no_effect(tmp_path: Path) -> None:
    """A trajectory has one model request at a time at most, so an inflight limit above the active one
    never binds (the summary's model capacity is their minimum): ``--max-inflight-model-requests 8`` with
    ``--max-active-trajectories 2`` ran as 2, and a sweep's ``--inflight 2,8`` at ``--active 2`` wrote two
    rows of one simulation, without a word."""
    args = ("--workload", SMOKE, "--max-active-trajectories", "2")
    above = simulate_here(*args, "--output", tmp_path / "a", "--max-inflight-model-requests", "8")
    assert above.exit_code == 0, above.output
    want = "warning: --max-inflight-model-requests 8 has no effect above --max-active-trajectories 2"
    assert want in above.stderr
    sync = simulate_here(
        "--workload",
        SMOKE,
        "--policy",
        "sync",
        "--output",
        tmp_path / "s",
        "--max-inflight-model-requests",
        "2",
    )
    assert "--max-inflight-model-requests 2 has no effect above --policy sync's one" in sync.stderr
    for inflight in ("2", "1"):
        fits = simulate_here(
            *args, "--output", tmp_path / inflight, "--max-inflight-model-requests", inflight
        )
        assert fits.exit_code == 0 and "no effect" not in fits.stderr, fits.output
    sweep = ("--workload", SMOKE, "--sweep", "--seeds", "1", "--jobs", "1", "--policies", "fifo")
    swept = simulate_here(*sweep, "--output", tmp_path / "w", "--active", "2,4", "--inflight", "2,8")
    assert swept.exit_code == 0, swept.output
    assert "warning: --inflight 8 has no effect at --active 2, 4" in swept.stderr
    plain = simulate_here(*sweep, "--output", tmp_path / "p", "--active", "4,8", "--inflight", "2,4")
    assert "no effect" not in plain.stderr, plain.output


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


def test_a_simulated_job_records_no_cpu_time_it_did_not_spend(tmp_path: Path) -> None:
    """A virtual worker spends no CPU and serialises nothing: its ``cpu_finished`` has ``cpu_s`` and
    ``serialize_s`` null, as summary.json's ``cpu_cost`` is. It wrote the job's virtual duration as its
    CPU time (a 20 ms ``sleep_ms`` "used" 0.02 CPU-seconds) and 0.0 for the serialisation."""
    out = tmp_path / "sim"
    result = simulate_here("--workload", SMOKE, "--output", out)
    assert result.exit_code == 0, result.output
    finished = [
        json.loads(line)
        for line in (out / "events.jsonl").read_text().splitlines()
        if '"cpu_finished"' in line
    ]
    assert [e["tool"] for e in finished if e["execute_s"] > 0] == ["sleep_ms"]
    assert all(e["cpu_s"] is None and e["serialize_s"] is None for e in finished), finished


@pytest.mark.timeout(60)
def test_the_published_pressure_simulation_gives_its_published_counts_on_this_python(tmp_path: Path) -> None:
    """RESULTS.md's CLI run of the pressure rule (``bench.synthetic --n 120 --model-ms 400 --cpu-ms 500
    --seed 3``; 8 active, 2 workers, 6 turns): 370 decisions, 171 eligible, 133 reorders, 8 tail picks.
    The virtual clock drives asyncio's own loop and the rule compares floats at ties, so a Python whose
    scheduling order or float sums differed would decide otherwise; the suite runs on 3.11 to 3.13, and
    the figures (makespan to the µs included) were the same on each on 2026-12-04."""
    from bench import synthetic

    workload = synthetic.write(tmp_path / "w.jsonl", 120, 400.0, 500.0, seed=3)
    out = tmp_path / "sim"
    args = ["--policy", "asyncroll", "--max-active-trajectories", "8", "--cpu-workers", "2"]
    done = simulate_here("--workload", workload, "--output", out, *args, "--max-turns", "6")
    assert done.exit_code == 0, done.output
    summary = json.loads((out / "summary.json").read_text())
    scheduler = summary["scheduler"]
    assert scheduler["decisions"] == 370 and scheduler["eligible_decisions"] == 171
    assert scheduler["reorders"] == 133 and scheduler["reasons"]["tail_critical_path"] == 8
    assert summary["makespan_s"] == 48.010285 and summary["counts"]["completed"] == 120


@pytest.mark.timeout(60)
def test_a_simulated_run_is_the_same_under_another_hash_seed(tmp_path: Path) -> None:
    """A simulation reads no string hash: simulated in this process and in one with another
    ``PYTHONHASHSEED``, the same workload gives the same events (but measurement_started's wall time),
    results, summary and trace, byte for byte. Six tools (the predictor's tool buckets), repairs (a tool
    called twice), the learned pressure rule choosing among many queued jobs: every keyed table decides."""
    names = [f"tool_{c}" for c in "abcdef"]
    (tmp_path / "tools.py").write_text("".join(f"def {name}(x):\n    return x\n" for name in names))
    rng = random.Random(5)
    problems = []
    for i in range(40):
        calls = [rng.choice(names) for _ in range(rng.randint(1, 4))]
        script: list[dict[str, object]] = [
            {
                "type": "tool",
                "name": name,
                "arguments": {"x": "y" * rng.randint(1, 3000)},
                "latency_ms": round(rng.uniform(50, 400), 3),
                "cpu_ms": round(rng.uniform(10, 600), 3),
            }
            for name in calls
        ]
        script.append({"type": "final", "answer": "ok", "latency_ms": 100})
        tools = [
            {"name": n, "inputs": {"x": "str"}, "implementation": "tools.py"} for n in dict.fromkeys(calls)
        ]
        problems.append({"id": f"p{i}", "prompt": "p", "tools": tools, "script": script})
    workload = write_workload(tmp_path / "w.jsonl", problems)
    args = ["--workload", str(workload), "--policy", "asyncroll", "--max-active-trajectories", "8"]
    here = simulate_here(*args, "--output", tmp_path / "here")
    assert here.exit_code == 0, here.output
    seed = os.environ.get("PYTHONHASHSEED", "")
    other = str(int(seed) + 1) if seed.isdigit() else "1"  # this process's: `seed`, or a random one
    there = subprocess.run(
        [sys.executable, "-m", "asyncroll.cli", "simulate", *args, "--output", str(tmp_path / "there")],
        env={**os.environ, "PYTHONHASHSEED": other},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert there.returncode == 0, there.stderr

    def written(out: Path) -> list[str]:
        events = re.sub(r'"wall_time":[^,]+,', "", (out / "events.jsonl").read_text(), count=1)
        return [
            events,
            *((out / name).read_text() for name in ("results.jsonl", "summary.json", "trace.json")),
        ]

    assert written(tmp_path / "here") == written(tmp_path / "there")
    scheduler = json.loads((tmp_path / "here" / "summary.json").read_text())["scheduler"]
    assert scheduler["reorders"] > 10 and scheduler["prediction"]["sources"]["ridge"] > 50


# --- signals --------------------------------------------------------------------------------------------


@pytest.mark.timeout(150)
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
        wait_until(lambda: receipt.exists() and '"running"' in receipt.read_text(), "the start", writer=proc)
        stderr = signal_and_wait(proc, sig)
    finally:
        end(proc)
    assert proc.returncode == 130, stderr
    assert f"interrupted by {sig.name}; partial outputs in {out}" in stderr and "Traceback" not in stderr
    receipt_data, summary, events = load_run(out)
    assert receipt_data["status"] == "interrupted" and receipt_data["error"] == f"interrupted by {sig.name}"
    assert summary["status"] == "interrupted" and summary["counts"]["unfinished"] > 0
    assert events[-1].event == "measurement_finished" and events[-1].status == "interrupted"


@pytest.mark.timeout(120)
def test_every_worker_start_is_recorded_at_the_largest_worker_count(tmp_path: Path) -> None:
    """The events before measurement_started (a worker_ready per worker) wait in memory until the clock
    starts; past 10,000 of them the rest were dropped without a word: at --cpu-workers 10240,
    events.jsonl (and the exports drawn from it) lacked 240 workers' start-up."""
    out = tmp_path / "sim"
    done = simulate_here("--workload", SMOKE, "--output", out, "--cpu-workers", "10240")
    assert done.exit_code == 0, done.output
    lines = (out / "events.jsonl").read_text().splitlines()
    ready = [json.loads(line)["worker"] for line in lines if '"worker_ready"' in line]
    assert sorted(ready) == list(range(10240))


def test_jobs_longer_than_the_tool_timeout_are_said_to_have_timed_out(tmp_path: Path) -> None:
    """A workload of minutes-long jobs under the default --tool-timeout (60 s) failed almost every
    trajectory (1,921 of 2,000, counted as worker restarts) with nothing saying why."""
    workload = write_workload(
        tmp_path / "w.jsonl",
        [tool_problem("long", model_ms=10, cpu_ms=5000), tool_problem("short", model_ms=10, cpu_ms=50)],
    )
    # in this process: a virtual-clock warning (test_simulate_smoke_writes_a_simulated_run runs the command)
    done = simulate_here("--workload", workload, "--output", tmp_path / "s", "--tool-timeout", "1")
    assert done.exit_code == 0, done.stderr
    assert "warning: 1 tool job(s) ran past --tool-timeout 1 s and timed out, as in a real run" in done.stderr
    done = simulate_here("--workload", workload, "--output", tmp_path / "t", "--tool-timeout", "6")
    assert done.exit_code == 0 and "timed out" not in done.stderr, done.stderr


#: sha256 of events.jsonl (``wall_time`` of measurement_started blanked: the one measured field),
#: results.jsonl and summary.json of the simulations below, as the runtime wrote them when they were
#: recorded. A change of speed must leave every byte alone; a change that means to alter these outputs
#: records the new digests (the asyncroll policy's ridge fits could differ in the last bits elsewhere).
OUTPUT_DIGESTS: dict[tuple[int, str], tuple[str, str, str]] = {
    (1, "fifo"): (
        "b62dceacbd3422dd5ff097b6bc91d7723c4abe301a247eb1b76004bde8fed7f4",
        "38a9c185431b6a0f8321dc005a0cb718228e28493fd737c7526d4e3f88ff7ff3",
        "0b0ea2b5c8bd871852c20ce4243a1ede096269310bacf0c482b94cf127625609",
    ),
    (2, "tool_first"): (
        "90604e58fdf6e66ce3d8a50c6c6659011a3d807fbe8d8b4a3bcea5b813b63b9b",
        "05e76bb5f2cf541b6095fdccbd74669c4b4e5f9b1ac3f2f6db9b61860f9d1cee",
        "040a9763c48d903d73a91029b553dedb2f772f92031636cc4f3ac02385864322",
    ),
    (3, "asyncroll"): (
        "3d399fda5719d27612de3a2d4182cf7a6db63ad356d2aad2719c996ce4ffcf37",
        "de866a99344c8faa0ff4bba932b6fd26ff35e2b81574a17182d1ab0a42dace51",
        "c3b859ace105e97a33b70b45834e0dbde323215e8d05d656d88f23272b1cd1c5",
    ),
    (1, "asyncroll"): (
        "1e8e6ec6b2e23136ca06d9a19636e7fe543daa283c09126a8a839bb47d9c9945",
        "4f43fee67273fa8e03b0054286a2c19efe20e341001fc6339a484d6f9f5dcdc4",
        "48a6880ca790e71c9396b62bf4a04bfe594e5cdd8250231caadc8ab7d446b51d",
    ),
}


def _output_digests(out: Path) -> tuple[str, str, str]:
    events = re.sub(rb'"wall_time":[0-9.e+-]+', b'"wall_time":0', (out / "events.jsonl").read_bytes())
    return (
        hashlib.sha256(events).hexdigest(),
        hashlib.sha256((out / "results.jsonl").read_bytes()).hexdigest(),
        hashlib.sha256((out / "summary.json").read_bytes()).hexdigest(),
    )


@pytest.mark.parametrize(("seed", "policy"), sorted(OUTPUT_DIGESTS))
def test_simulated_outputs_are_byte_for_byte_as_recorded(tmp_path: Path, seed: int, policy: str) -> None:
    workload = write_workload(tmp_path / "w.jsonl", small_workload(60, seed=seed))
    out = tmp_path / "sim"
    result = simulate_here(
        "--workload",
        workload,
        "--output",
        out,
        "--policy",
        policy,
        "--max-active-trajectories",
        "16",
        "--max-inflight-model-requests",
        "4",
        "--cpu-workers",
        "3",
    )
    assert result.exit_code == 0, result.output
    assert _output_digests(out) == OUTPUT_DIGESTS[seed, policy]
