"""Simulation and the makespan lower bound: hand-made workloads with known optimal makespans, the
``simulate`` command, and replays of recorded runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import VirtualRun, tool_problem, write_workload
from tests.test_cli import SMOKE, cli, load_run


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
        result = cli(
            "simulate",
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
        assert result.returncode == 0, result.stderr
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
    result = cli("simulate", "--from-run", real, "--output", sim)
    assert result.returncode == 0, result.stderr
    receipt, summary, events = load_run(sim)
    assert receipt["simulation"]["from_run"] == str(real.resolve())
    assert receipt["simulation"]["replayed"]["trajectories"] == 6
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
    both = cli("simulate", "--workload", SMOKE, "--from-run", tmp_path, "--output", tmp_path / "a")
    assert both.returncode == 2 and "exactly one of --workload and --from-run" in both.stderr
    missing = cli("simulate", "--from-run", tmp_path / "nope", "--output", tmp_path / "b")
    assert missing.returncode == 2 and "cannot read run.json" in missing.stderr
    assert not (tmp_path / "b").exists()
    exists = tmp_path / "c"
    exists.mkdir()
    refused = cli("simulate", "--workload", SMOKE, "--output", exists)
    assert refused.returncode == 2 and list(exists.iterdir()) == []
    bad_server = cli("simulate", "--workload", SMOKE, "--output", tmp_path / "d", "--server", "quantum")
    assert bad_server.returncode == 2 and not (tmp_path / "d").exists()


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
    result = cli(
        "simulate",
        "--workload",
        workload,
        "--output",
        out,
        "--turn-overhead-ms",
        "2",
        "--job-overhead-ms",
        "5",
    )
    assert result.returncode == 0, result.stderr
    receipt, summary, _ = load_run(out)
    assert summary["makespan_s"] == pytest.approx(0.4 + 3 * 0.002 + 2 * 0.005)
    assert receipt["simulation"]["turn_overhead_ms"] == 2 and receipt["simulation"]["job_overhead_ms"] == 5
    bad = cli("simulate", "--workload", workload, "--output", tmp_path / "x", "--job-overhead-ms", "-1")
    assert bad.returncode == 2 and not (tmp_path / "x").exists()


def test_a_summary_only_run_summarises_exactly_as_a_recorded_one(tmp_path: Path) -> None:
    """``record=False`` (a sweep cell) skips the decision's candidate list, which only events.jsonl
    shows; every number of the summary stays the same, bit for bit."""
    from asyncroll.clock import VirtualClock
    from asyncroll.config import build_config
    from asyncroll.events import CpuSelected, EventCapture
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
    assert cli("simulate", "--workload", workload, "--output", out, *args).returncode == 0
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
