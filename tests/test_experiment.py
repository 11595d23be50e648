"""Paired experiments end to end on CPU: serve-sim per arm, stages, a killed and resumed runner, failing
arms kept, the report and its figure; statistics against SciPy; ``plan`` on the LiveCodeBench config."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from asyncroll.experiment.comparison import build_comparison
from asyncroll.experiment.config import Gate, load_experiment_config
from asyncroll.experiment.gates import evaluate_gates
from asyncroll.experiment.plan import build_plan, pair_order
from asyncroll.experiment.report import aggregate
from asyncroll.experiment.report_markdown import markdown
from asyncroll.experiment.server import startup_evidence
from asyncroll.experiment.stats import bootstrap_interval, paired_change, t_interval, t_ppf
from tests.children import end
from tests.conftest import invoke

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "experiments" / "serve_sim_smoke.json"
CLI = [sys.executable, "-m", "asyncroll.cli"]


def cli(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False
    )


def read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def recorded_processes(out: Path) -> list[dict[str, Any]]:
    found = []
    for arm_json in out.glob("arms/*/arm.json"):
        data = read(arm_json)
        for role in ("server", "client"):
            process = data.get(role, {}).get("process")
            if process:
                found.append(process)
    return found


def alive(record: dict[str, Any]) -> bool:
    try:
        proc = psutil.Process(record["pid"])
        return (
            abs(proc.create_time() - record["create_time"]) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE
        )
    except psutil.Error:
        return False


def kill_recorded(out: Path) -> None:
    for record in recorded_processes(out):
        if alive(record):
            os.killpg(record["pgid"], signal.SIGKILL)


def write_config(tmp: Path, **changes: Any) -> Path:
    data = json.loads(SMOKE.read_text())
    data["workload"]["path"] = str(ROOT / "examples" / "smoke.jsonl")
    for key, value in changes.items():
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    path = tmp / "experiment.json"
    path.write_text(json.dumps(data))
    return path


def wait_for_client(runner: subprocess.Popen[bytes], arm_json: Path, log: Path, within_s: float = 60) -> None:
    """Until the arm's receipt says its client runs: synchronise on the receipt, not on a guessed delay."""
    deadline = time.monotonic() + within_s
    while True:
        assert runner.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"{arm_json.parent.name} never reached its client"
        try:
            if read(arm_json)["status"] == "running_client":
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.02)


@pytest.fixture(scope="module")
def experiment(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The smoke experiment, SIGKILLed while its second arm's client runs, then resumed to the end."""
    tmp = tmp_path_factory.mktemp("exp")
    out = tmp / "out"
    log = (tmp / "runner.log").open("wb")
    runner = subprocess.Popen(
        [*CLI, "experiment", "run", "--config", str(SMOKE), "--output", str(out)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    try:
        wait_for_client(runner, out / "arms" / "opportunity-1-fifo" / "arm.json", tmp / "runner.log")
        first_before = read(out / "arms" / "qualification-1-fifo" / "arm.json")
        orphans = [p for p in recorded_processes(out) if alive(p)]
        runner.kill()  # SIGKILL: no cleanup runs; the arm's server and client are left behind
        runner.wait(10)
        killed = read(out / "experiment.json")
        resumed = cli("experiment", "run", "--config", SMOKE, "--output", out, "--resume", timeout=150)
        return {
            "out": out,
            "first_before": first_before,
            "orphans": orphans,
            "killed": killed,
            "resumed": resumed,
        }
    finally:
        try:
            end(runner)
        finally:
            kill_recorded(out)


@pytest.mark.timeout(180)
def test_end_to_end_stages_pairs_resume(experiment: dict[str, Any]) -> None:
    out: Path = experiment["out"]
    resumed = experiment["resumed"]
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming" in resumed.stdout and "1 unfinished arm(s) set aside" in resumed.stdout
    # at the kill, the first arm was complete and the second was running
    killed = experiment["killed"]
    assert killed["status"] == "running"
    assert killed["arms"]["qualification-1-fifo"]["status"] == "complete"
    assert killed["arms"]["opportunity-1-fifo"]["status"] == "running"
    # the killed runner's server and client were alive, and the resume killed them
    assert len(experiment["orphans"]) == 2
    assert not any(alive(p) for p in experiment["orphans"])
    exp = read(out / "experiment.json")
    assert exp["status"] == "complete"
    assert [exp["stages"][s]["status"] for s in ("qualification", "opportunity", "activation")] == [
        "passed"
    ] * 3
    assert exp["stages"]["comparison"]["status"] == "complete"
    assert all(a["status"] == "complete" for a in exp["arms"].values())
    # the finished arm was not run again: same receipt, same creation time, run only once
    first_after = read(out / "arms" / "qualification-1-fifo" / "arm.json")
    assert first_after == experiment["first_before"]
    assert "qualification-1-fifo" not in resumed.stdout
    # the interrupted arm was set aside (kept) and run afresh
    attempt = exp["arms"]["opportunity-1-fifo"]["attempts_interrupted"]
    assert len(attempt) == 1 and Path(attempt[0]["dir"]).is_dir()
    assert read(Path(attempt[0]["dir"]) / "arm.json")["status"] == "running_client"
    assert attempt[0]["orphans"] == {"client": "killed", "server": "killed"}
    # pairs alternate: AB then BA
    order = [a["id"] for a in exp["plan"] if a["stage"] == "comparison"]
    assert order == ["pair1-fifo", "pair1-asyncroll", "pair2-asyncroll", "pair2-fifo"]
    started = {k: v["started_at"] for k, v in exp["arms"].items()}
    assert sorted(order, key=started.__getitem__) == order
    # every arm: fresh server, readiness, evidence, whole group stopped, nothing left running
    ports = set()
    for arm_id in order:
        arm = read(out / "arms" / arm_id / "arm.json")
        assert [t["status"] for t in arm["transitions"]] == [
            "pending",
            "checking_gpu",
            "starting_server",
            "running_client",
            "stopping_server",
            "complete",
        ]
        assert arm["gpu"]["declared"] is False
        # the first readiness path that answered: /health, or /v1/models when the server began to listen
        # between the two probes of one poll
        assert arm["server"]["via"] in ("/health", "/v1/models") and arm["server"]["models"] == ["sim"]
        assert arm["server"]["startup_evidence"]["listening"]
        assert arm["server"]["stop"]["how"] == "term" and arm["server"]["stop"]["leftover"] == []
        assert arm["client"]["exit_code"] == 0
        ports.add(arm["server"]["url"])
    assert len(ports) == len(order)  # one fresh server per arm
    assert not any(alive(p) for p in recorded_processes(out))
    comparison = read(out / "comparison.json")
    assert [p["complete"] for p in comparison["pairs"]] == [True, True]
    assert comparison["failed_arms"] == []
    for pair in comparison["pairs"]:
        for arm in pair["arms"].values():
            assert arm["counts"]["completed"] == 3
            assert arm["metrics"]["completed_per_gpu_hour"] > 0


def test_the_clients_run_must_match_the_plan(experiment: dict[str, Any], tmp_path: Path) -> None:
    """After each arm, the client's run.json must show the plan's policy and seed and the experiment's
    pinned tool hashes and software versions, not only its workload (extra_args could once override)."""
    from asyncroll.experiment.arms import ArmFailed, Expected, _check_client

    out: Path = experiment["out"]
    exp = read(out / "experiment.json")
    plan = next(a for a in build_plan(load_experiment_config(SMOKE)) if a.id == "pair1-fifo")
    expected = Expected.from_fingerprint(exp["fingerprint"])

    def check(run_changes: dict[str, Any], summary_changes: dict[str, Any]) -> str:
        run_dir = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        run_dir.mkdir()
        run, summary = (read(out / "arms" / "pair1-fifo" / "run" / n) for n in ("run.json", "summary.json"))
        for key, value in run_changes.items():
            node = run
            *parents, leaf = key.split(".")
            for part in parents:
                node = node[part]
            node[leaf] = value
        summary.update(summary_changes)
        (run_dir / "run.json").write_text(json.dumps(run))
        (run_dir / "summary.json").write_text(json.dumps(summary))
        return _check_client(run_dir, 0, tmp_path / "client.log", plan, expected).status

    assert check({}, {}) == "complete"
    with pytest.raises(ArmFailed, match=r"seed 99, not the plan's 20260927"):
        check({"config.seed": 99}, {})
    with pytest.raises(
        ArmFailed, match=r"policy 'tool_first' \(summary: 'tool_first'\), not the plan's 'fifo'"
    ):
        check({"config.policy": "tool_first"}, {"policy": "tool_first"})
    with pytest.raises(ArmFailed, match=r"tool file add: ran 0{64}, the experiment pinned None"):
        check({"tools.add": {"path": "/elsewhere/add.py", "sha256": "0" * 64}}, {})
    with pytest.raises(ArmFailed, match=r"software version httpx: ran 0\.0, the experiment pinned"):
        check({"versions.httpx": "0.0"}, {})


@pytest.mark.timeout(180)
def test_report_and_figure(experiment: dict[str, Any], tmp_path: Path) -> None:
    out: Path = experiment["out"]
    done = cli("report", "--comparison", out / "comparison.json", "--output", tmp_path / "r", "--figure")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "r" / "REPORT.md").read_text()
    agg = read(tmp_path / "r" / "aggregate.json")
    assert agg["pairs_complete"] == 2
    change = agg["paired"]["asyncroll"]["completed_per_gpu_hour"]
    assert len(change["ratios"]) == 2 and all(r > 0 for r in change["ratios"])
    assert change["mean_percent_change_t95"]["low"] is not None
    assert "## Paired: asyncroll vs fifo" in text and "mean % change [95% t]" in text
    # the rule `asyncroll` ran, from the arms' summaries (the name alone changes meaning between versions)
    assert agg["policy_rules"] == {"fifo": ["fifo"], "asyncroll": ["asyncroll_repair"]}
    assert "| metric | fifo (fifo) | asyncroll (asyncroll = asyncroll_repair) |" in text
    comparison = read(out / "comparison.json")
    for pair in comparison["pairs"]:
        del pair["arms"]["asyncroll"]["policy_rule"]  # as written before the field: the name alone
    (tmp_path / "old.json").write_text(json.dumps(comparison))
    old = invoke("report", "--comparison", tmp_path / "old.json", "--output", tmp_path / "old")
    assert old.exit_code == 0, old.stderr
    assert "| metric | fifo (fifo) | asyncroll (asyncroll) |" in (tmp_path / "old" / "REPORT.md").read_text()
    for name in ("figure.png", "figure.pdf"):
        assert (tmp_path / "r" / name).stat().st_size > 5000
    assert (tmp_path / "r" / "figure.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the module entry point is the same command
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "asyncroll.report",
            "--comparison",
            str(out / "comparison.json"),
            "--output",
            str(tmp_path / "r2"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    assert read(tmp_path / "r2" / "aggregate.json") == agg
    # written again without --figure: the report's own files are replaced, the old figure removed
    (tmp_path / "r" / "notes.txt").write_text("mine")
    redone = invoke("report", "--comparison", out / "comparison.json", "--output", tmp_path / "r")
    assert redone.exit_code == 0, redone.stderr
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["REPORT.md", "aggregate.json", "notes.txt"]
    assert "figure.png" not in (tmp_path / "r" / "REPORT.md").read_text()


def test_figure_names_a_pair_with_an_unknown_value(experiment: dict[str, Any], tmp_path: Path) -> None:
    """A complete pair with one unknown value cannot be drawn as a line: its known points are drawn and
    the panel names it as unknown, never dropping it silently (the medians count its known values)."""
    from asyncroll.experiment.figure import draw, pair_values, unknown_note

    comparison = read(experiment["out"] / "comparison.json")
    second = next(p for p in comparison["pairs"] if p["pair"] == 2)
    second["arms"]["fifo"]["metrics"]["completed_per_gpu_hour"] = None
    complete = [p for p in comparison["pairs"] if p.get("complete")]
    lines, partial = pair_values(complete, ["fifo", "asyncroll"], "completed_per_gpu_hour")
    assert [n for n, _ in lines] == [1] and [n for n, _ in partial] == [2]
    assert partial[0][1][0] is None and partial[0][1][1] is not None
    assert unknown_note(partial, ["fifo", "asyncroll"]) == "unknown: p2 (fifo)"
    paths = draw(comparison, aggregate(comparison), tmp_path / "figure")
    assert all(path.stat().st_size > 5000 for path in paths)


@pytest.mark.timeout(90)
def test_failing_arms_are_kept_and_reported(tmp_path: Path) -> None:
    """A server that exits at once: every arm fails at its step, is kept, and the rest still run."""
    config = write_config(
        tmp_path,
        **{
            "server.command": ["{python}", "-c", "import sys; print('boom'); sys.exit(3)", "{port}"],
            "stages": {},
            "pairs": 1,
        },
    )
    out = tmp_path / "out"
    done = invoke("experiment", "run", "--config", config, "--output", out)
    assert done.exit_code == 1, done.stdout + done.stderr
    assert "failed arms kept and reported: pair1-fifo, pair1-asyncroll" in done.stderr
    # the console shows the cause from the log tail, not only "…; log tail:"
    assert "[pair1-fifo] failed: server exited with code 3 before it was ready: boom" in done.stdout
    exp = read(out / "experiment.json")
    assert exp["status"] == "complete"
    for arm_id in ("pair1-fifo", "pair1-asyncroll"):
        arm = read(out / "arms" / arm_id / "arm.json")
        assert arm["status"] == "failed" and arm["failed_step"] == "starting_server"
        assert "exited with code 3" in arm["error"] and "boom" in arm["error"]
        assert "client" not in arm
    comparison = read(out / "comparison.json")
    assert len(comparison["failed_arms"]) == 2 and comparison["pairs"][0]["complete"] is False
    # resume: nothing is retried
    again = invoke("experiment", "run", "--config", config, "--output", out, "--resume")
    assert again.exit_code == 1 and "0 unfinished arm(s)" in again.stdout
    assert read(out / "arms" / "pair1-fifo" / "arm.json") == read(out / "arms" / "pair1-fifo" / "arm.json")
    # a changed protocol refuses to resume, naming what changed
    changed = write_config(
        tmp_path,
        **{
            "server.command": ["{python}", "-c", "import sys; sys.exit(3)", "{port}"],
            "stages": {},
            "pairs": 1,
        },
    )
    refused = invoke("experiment", "run", "--config", changed, "--output", out, "--resume")
    assert refused.exit_code == 2 and "protocol changed" in refused.stderr and "config:" in refused.stderr
    # without --resume an existing experiment is never overwritten
    exists = invoke("experiment", "run", "--config", config, "--output", out)
    assert exists.exit_code == 2 and "--resume" in exists.stderr
    # the report of an experiment without a complete pair says unknown, and still draws the figure
    rep = invoke("report", "--comparison", out / "comparison.json", "--output", tmp_path / "r", "--figure")
    assert rep.exit_code == 0, rep.stderr
    text = (tmp_path / "r" / "REPORT.md").read_text()
    assert "unknown (no pair with a known value)" in text
    assert "- `pair1-fifo`: server exited with code 3 before it was ready: boom" in text


@pytest.mark.timeout(60)
def test_declared_gpu_is_checked_before_the_server_starts(tmp_path: Path) -> None:
    config = write_config(tmp_path, gpu={"index": 0, "name_contains": "H100"}, stages={}, pairs=1)
    out = tmp_path / "out"
    done = invoke("experiment", "run", "--config", config, "--output", out)
    arm = read(out / "arms" / "pair1-fifo" / "arm.json")
    if arm["status"] == "failed":  # a machine without that idle GPU
        assert arm["failed_step"] == "checking_gpu" and "GPU 0" in arm["error"]
        assert "server" not in arm and done.exit_code == 1
    else:  # an idle H100 really is here
        assert arm["gpu"]["checked"] and "H100" in arm["gpu"]["name"]
    kill_recorded(out)


@pytest.mark.timeout(60)
def test_a_code_workload_s_runner_prepares_its_cgroup_before_any_arm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each arm's client (``asyncroll run``, the runner's child) prepares per-test cgroups; on cgroup v2
    it refused a domain that still held the runner (tests/test_cgroups_v2.py), so the runner prepares
    first, before any arm. The arm then fails at its GPU check here (none declared is idle)."""
    from asyncroll.evaluator import cgroups_v2

    out = tmp_path / "out"
    calls: list[bool] = []
    monkeypatch.setattr(cgroups_v2, "prepare_for_children", lambda: calls.append((out / "arms").exists()))
    code = ROOT / "examples" / "livecodebench" / "workload.jsonl"
    changes = {"workload.path": str(code), "workload.sha256": None, "client.replay": False}
    config = write_config(tmp_path, gpu={"index": 0, "name_contains": "H100"}, stages={}, pairs=1, **changes)
    invoke("experiment", "run", "--config", config, "--output", out)
    kill_recorded(out)
    assert calls == [False]  # once, before any arm existed
    assert (out / "arms" / "pair1-fifo" / "arm.json").exists()
    calls.clear()
    smoke = write_config(tmp_path, gpu={"index": 0, "name_contains": "H100"}, stages={}, pairs=1)
    invoke("experiment", "run", "--config", smoke, "--output", tmp_path / "o2")
    kill_recorded(tmp_path / "o2")
    assert calls == []  # no code to isolate: the runner's cgroup is left as it is


@pytest.mark.timeout(30)
def test_workload_sha256_mismatch_refuses_before_anything_starts(tmp_path: Path) -> None:
    config = write_config(tmp_path, **{"workload.sha256": "0" * 64})
    done = invoke("experiment", "run", "--config", config, "--output", tmp_path / "out")
    assert done.exit_code == 2 and "is not the config's workload.sha256" in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(30)
def test_config_errors_name_the_field(tmp_path: Path) -> None:
    config = write_config(tmp_path, **{"client.max_active_trajectories": 0, "pairs": "two"})
    done = invoke("experiment", "plan", "--config", config)
    assert done.exit_code == 2
    assert (
        f"{config}: client.max_active_trajectories: Input should be greater than or equal to 1" in done.stderr
    )
    assert f"{config}: pairs: Input should be a valid integer" in done.stderr
    config = write_config(tmp_path, **{"server.command": ["serve", "{nope}"], "baseline": "zzz"})
    done = invoke("experiment", "plan", "--config", config)
    assert done.exit_code == 2
    assert "unknown placeholder(s) ['nope']" in done.stderr and "baseline: 'zzz' is not an arm" in done.stderr


def test_a_free_port_the_server_command_is_never_told_is_refused(tmp_path: Path) -> None:
    """server.port 0 picks a port for each arm; a command without {port} never passes it on, so the
    server listens elsewhere and every arm waited its whole startup_timeout_s (900 s by default) to fail
    with a ConnectError. Refused with the config, before any server starts (run and plan)."""
    serve = json.loads(SMOKE.read_text())["server"]["command"]
    fixed = [token if token != "{port}" else "18799" for token in serve]
    config = write_config(tmp_path, **{"server.command": fixed})
    out = tmp_path / "out"
    for args in (("plan",), ("run", "--output", str(out))):
        done = invoke("experiment", *args, "--config", config)
        assert done.exit_code == 2, done.stdout
        assert f"{config}: config: server.command: server.port is 0" in done.stderr
        assert "no {port} placeholder" in done.stderr
    assert not out.exists()
    # the port given in the command is fine once server.port says it; so is {port} inside a token
    assert load_experiment_config(write_config(tmp_path, **{"server.command": fixed, "server.port": 18799}))
    inline = [*serve[: serve.index("--port")], "--port={port}", *serve[serve.index("--port") + 2 :]]
    assert load_experiment_config(write_config(tmp_path, **{"server.command": inline}))


@pytest.mark.timeout(30)
def test_plan_livecodebench_prints_exact_commands_without_a_gpu() -> None:
    done = cli(
        "experiment",
        "plan",
        "--config",
        ROOT / "experiments" / "livecodebench_bounded_8x4.json",
        "--output",
        "/runs/lcb",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    servers = [ln for ln in lines if ln.startswith("  server: ")]
    clients = [ln for ln in lines if ln.startswith("  client: ")]
    assert len(servers) == len(clients) == 6 + sum(ln.startswith("[") and "pair" not in ln for ln in lines)
    assert servers[0].startswith("  server: vllm serve Qwen/Qwen2.5-Coder-7B-Instruct ")
    assert "--served-model-name qwen2.5-coder-7b-instruct" in servers[0] and "--port 8000" in servers[0]
    first_pair = [ln for ln in clients if "/runs/lcb/arms/pair1-" in ln]
    assert len(first_pair) == 2
    for flag in (
        "--max-active-trajectories 8",
        "--max-inflight-model-requests 4",
        "--cpu-workers 2",
        "--max-tokens 2048",
        "--backend vllm",
        "--dedicated-gpu",
        "--nvml-device 0",
    ):
        assert flag in first_pair[0]
    assert "--policy fifo" in first_pair[0] and "--policy asyncroll" in first_pair[1]
    assert "index 0, idle check before each arm" in done.stdout


def test_pair_orders() -> None:
    names = ["a", "b"]
    assert [pair_order(names, i, "alternating") for i in range(4)] == [
        ["a", "b"],
        ["b", "a"],
        ["a", "b"],
        ["b", "a"],
    ]
    assert [pair_order(names, i, "balanced") for i in range(4)] == [
        ["a", "b"],
        ["b", "a"],
        ["b", "a"],
        ["a", "b"],
    ]
    three = ["a", "b", "c"]
    firsts = [pair_order(three, i, "alternating")[0] for i in range(3)]
    assert sorted(firsts) == three
    cfg = load_experiment_config(SMOKE)
    ids = [a.id for a in build_plan(cfg)]
    assert ids[:3] == ["qualification-1-fifo", "opportunity-1-fifo", "activation-1-asyncroll"]


def test_startup_evidence_from_a_vllm_log() -> None:
    log = "\n".join(
        [
            "INFO 11-29 api_server.py:712] vLLM API server version 0.8.5",
            "INFO cuda.py:240] Using Flash Attention backend.",
            "INFO backends.py:430] Using FLASH_ATTN backend.",
            "INFO backends.py:132] torch.compile takes 21.3 s in total",
            "INFO gpu_model_runner.py:1700] Graph capturing finished in 14 secs, took 0.51 GiB",
            "INFO loader.py:458] Loading weights took 3.20 seconds",
        ]
    )
    ev = startup_evidence(log)
    assert ev["vllm_version"] == ["0.8.5"]
    assert "FLASH_ATTN" in ev["attention_backend"]
    assert ev["compile"] == ["torch.compile takes 21.3 s in total"]
    assert ev["cuda_graph"][0].startswith("Graph capturing finished in 14 secs")


# --- statistics against SciPy -------------------------------------------------------------------------

DATA = [2.1, -0.4, 3.3, 1.7, 0.2, 4.0, -1.2]


def test_t_interval_matches_scipy() -> None:
    import scipy.stats as scipy_stats

    assert t_ppf(0.975, 4) == pytest.approx(2.7764451051977987, rel=1e-12)  # the textbook value
    with pytest.raises(ValueError, match="0 < q < 1"):
        t_ppf(1.0, 3)
    ours = t_interval(DATA)
    mean = sum(DATA) / len(DATA)
    low, high = scipy_stats.t.interval(0.95, len(DATA) - 1, loc=mean, scale=scipy_stats.sem(DATA))
    assert ours.mean == pytest.approx(mean) and ours.low == pytest.approx(low, rel=1e-9)
    assert ours.high == pytest.approx(high, rel=1e-9)
    assert t_interval([1.0]).low is None and t_interval([]).mean is None


def test_bootstrap_is_seeded_and_agrees_with_scipy() -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    a = bootstrap_interval(DATA, seed=7, resamples=20_000)
    assert a == bootstrap_interval(DATA, seed=7, resamples=20_000)
    assert a != bootstrap_interval(DATA, seed=8, resamples=20_000)
    assert a.low is not None and a.high is not None and a.low < a.mean < a.high  # type: ignore[operator]
    ref = scipy_stats.bootstrap(
        (DATA,),
        lambda x, axis: x.mean(axis=axis),
        n_resamples=20_000,
        method="percentile",
        confidence_level=0.95,
        rng=7,
    ).confidence_interval
    assert a.low == pytest.approx(ref.low, abs=0.08) and a.high == pytest.approx(ref.high, abs=0.08)


def test_paired_change_handles_unknown_and_zero_baselines() -> None:
    out = paired_change([100.0, 200.0, None], [110.0, 190.0, 5.0], seed=0, resamples=500)
    assert out["ratios"] == [1.1, 0.95, None] and out["unknown_pairs"] == 1 and out["undefined_pairs"] == 0
    assert out["pair_notes"] == [None, None, "unknown (not measured)"]
    t = out["mean_percent_change_t95"]
    assert isinstance(t, dict) and t["mean"] == pytest.approx(2.5) and t["n"] == 2
    assert t["note"] == "1 of 3 pairs left out (pair 3: a value not measured)"  # said, never silent
    half = t_ppf(0.975, 1) * math.sqrt(((10 - 2.5) ** 2 + (-5 - 2.5) ** 2) / 1) / math.sqrt(2)
    assert t["high"] == pytest.approx(2.5 + half)
    # a measured baseline of 0: no ratio, so that pair's % change and the mean % change are undefined
    # (leaving the pair out would bias the mean); the mean difference still covers every pair
    zero = paired_change([100.0, 200.0, 0.0], [110.0, 190.0, 1.0], seed=0, resamples=500)
    assert zero["ratios"] == [1.1, 0.95, None] and zero["undefined_pairs"] == 1
    assert zero["pair_notes"] == [None, None, "undefined (baseline 0, treatment 1)"]
    for key in ("mean_percent_change_t95", "mean_percent_change_bootstrap95"):
        d = zero[key]
        assert isinstance(d, dict) and d["mean"] is None
        assert d["note"].startswith("undefined: baseline 0 in pair 3")
    diff = zero["mean_difference_t95"]
    assert isinstance(diff, dict) and diff["n"] == 3 and diff["mean"] == pytest.approx(1 / 3)


def test_report_marks_unknown_metrics() -> None:
    experiment = {
        "config": {
            "name": "x",
            "arms": [{"name": "a", "policy": "fifo"}, {"name": "b", "policy": "asyncroll"}],
            "baseline": "a",
            "seed": 0,
            "bootstrap_resamples": 200,
        },
        "status": "complete",
        "fingerprint": {"sha256": "f" * 64},
        "stages": {},
        "plan": [
            {"id": f"pair{p + 1}-{n}", "stage": "comparison", "pair": p, "arm": n, "policy": n, "seed": p}
            for p in range(2)
            for n in ("a", "b")
        ],
        "arms": {f"pair{p + 1}-{n}": {"status": "complete"} for p in range(2) for n in ("a", "b")},
    }

    def summary(gpu_hour: float | None, completed: int) -> dict[str, Any]:
        return {
            "throughput": {"completed_per_gpu_hour": gpu_hour, "allocated_gpu_hours": None},
            "counts": {"completed": completed, "trajectories": 4},
            "cpu_cost": {"per_completion_s": None},
        }

    summaries = {
        "pair1-a": summary(None, 4),
        "pair1-b": summary(None, 3),
        "pair2-a": summary(None, 4),
        "pair2-b": summary(None, 4),
    }
    agg = aggregate(build_comparison(experiment, summaries))
    assert agg["medians"]["a"]["completed_per_gpu_hour"] is None
    assert agg["pooled"]["b"]["completion_rate"] == pytest.approx(7 / 8)
    assert agg["pooled"]["a"]["completed_per_gpu_hour"] is None
    text = markdown(agg)
    assert "| completions per allocated GPU-hour | unknown | unknown |" in text


@pytest.mark.timeout(60)
def test_serving_ablation_against_serve_sim(tmp_path: Path) -> None:
    """The model-only measurement against a real loopback server: counts, tokens and percentiles agree."""
    log = (tmp_path / "sim.log").open("wb")
    server = subprocess.Popen(
        [*CLI, "serve-sim", "--port", "0", "--model", "sim", "--step-base-ms", "1", "--step-per-seq-ms", "0"],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    try:
        deadline = time.monotonic() + 30
        while not (text := (tmp_path / "sim.log").read_text()).startswith("serve-sim listening on "):
            assert server.poll() is None and time.monotonic() < deadline, text
            time.sleep(0.02)
        url = text.split()[3]
        done = subprocess.run(
            [
                sys.executable,
                "scripts/serving_ablation.py",
                "--endpoint",
                url,
                "--model",
                "sim",
                "--workload",
                "examples/toolmath/workload.jsonl",
                "--concurrency",
                "3",
                "--requests",
                "10",
                "--max-tokens",
                "8",
                "--fixed-length",
                "--repeats",
                "2",
                "--warmup",
                "1",
                "--output",
                str(tmp_path / "r.json"),
            ],
            capture_output=True,
            text=True,
            timeout=45,
            cwd=ROOT,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        result = read(tmp_path / "r.json")
        assert len(result["repeats"]) == 2
        for rep in result["repeats"]:
            assert rep["ok"] == 10 and rep["errors"] == {} and rep["output_tokens"] == 80
            lat = rep["latency_s"]
            assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
            assert rep["requests_per_s"] == pytest.approx(10 / rep["wall_s"])
        assert "| requests_per_s |" in done.stdout
        # The machine and the client's versions go next to the numbers, printed and in the JSON.
        assert done.stdout.startswith("machine: ") and "logical CPUs" in done.stdout.splitlines()[0]
        assert {"cpu", "logical_cpus", "python", "platform"} <= set(result["machine"])
        assert set(result["versions"]) == {"asyncroll", "httpx"} and result["versions"]["httpx"]
    finally:
        try:
            with contextlib.suppress(ProcessLookupError):  # the group is gone already
                os.killpg(server.pid, signal.SIGTERM)
            server.wait(10)
        finally:
            end(server)


@pytest.mark.timeout(30)
def test_serving_ablation_counts_odd_replies_without_failing_the_pass() -> None:
    """A 200 whose body is not a completion (not JSON; JSON without an object; ``usage`` not an object)
    is one ``bad_response``, not an exception that ends the pass; good replies are still measured."""
    import argparse
    import asyncio
    import importlib.util
    from http.server import BaseHTTPRequestHandler

    import httpx

    from tests.loopback import LoopbackServer

    spec = importlib.util.spec_from_file_location("serving_ablation", ROOT / "scripts/serving_ablation.py")
    assert spec is not None and spec.loader is not None
    ablation = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ablation)
    bodies = [b"<html>busy</html>", b"[1, 2]", b'{"usage": 7}', b'{"usage": {"completion_tokens": 5}}']

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            data = bodies[current[0]]
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            return None

    args = argparse.Namespace(
        model="m", max_tokens=4, seed=0, fixed_length=False, concurrency=2, request_timeout=5.0
    )
    current = [0]
    results = []
    with LoopbackServer(Handler) as server:

        async def one() -> dict[str, Any]:
            async with httpx.AsyncClient(base_url=server.url, trust_env=False) as client:
                return await ablation.one_pass(args, ["p", "q"], client)

        for index in range(len(bodies)):
            current[0] = index
            results.append(asyncio.run(one()))
    assert [r["errors"] for r in results[:3]] == [{"bad_response": 2}] * 3
    assert all(r["ok"] == 0 for r in results[:3])
    assert results[3]["errors"] == {} and results[3]["ok"] == 2 and results[3]["output_tokens"] == 10


@pytest.mark.timeout(60)
def test_sigterm_stops_the_arm_cleanly(tmp_path: Path) -> None:
    """A second runner on the directory is refused while the first runs; then SIGTERM to the runner: the
    client and the server's group are stopped, the arm is interrupted."""
    from asyncroll.errors import UsageError
    from asyncroll.experiment.runner import ExperimentRunner

    command = json.loads(SMOKE.read_text())["server"]["command"]
    command[command.index("--step-base-ms") + 1] = "150"  # a client that runs long enough to be refused
    config = write_config(tmp_path, stages={}, pairs=1, **{"server.command": command})
    out = tmp_path / "out"
    log = (tmp_path / "runner.log").open("wb")
    runner = subprocess.Popen(
        [*CLI, "experiment", "run", "--config", str(config), "--output", str(out)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    arm_json = out / "arms" / "pair1-fifo" / "arm.json"
    try:
        deadline = time.monotonic() + 40
        while True:
            assert runner.poll() is None and time.monotonic() < deadline, (
                tmp_path / "runner.log"
            ).read_text()
            try:
                if read(arm_json)["status"] == "running_client":
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.02)
        live = read(arm_json)
        # a --resume (or a new run) on a directory a live runner uses is refused; nothing is touched
        for resume in (True, False):
            second = ExperimentRunner(load_experiment_config(config), out, resume=resume, echo=lambda _: None)
            with pytest.raises(UsageError, match=f"being run by pid {runner.pid} "):
                second.run()
        assert read(arm_json)["status"] == "running_client" and not list(out.glob("arms/*.interrupted-*"))
        assert all(alive(p) for p in (live["server"]["process"], live["client"]["process"]))
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(40) == 130
    finally:
        try:
            end(runner)
        finally:
            kill_recorded(out)
    arm = read(arm_json)
    assert arm["status"] == "interrupted" and arm["error"] == "interrupted while running_client"
    assert arm["server"]["stop"]["leftover"] == [] and "stop" in arm["client"]
    assert not any(alive(p) for p in recorded_processes(out))
    exp = read(out / "experiment.json")
    assert exp["status"] == "interrupted" and exp["arms"]["pair1-fifo"]["status"] == "interrupted"
    assert exp["arms"]["pair1-asyncroll"]["status"] == "pending"
    assert exp["stop_reason"] == "interrupted by SIGTERM"  # REPORT.md says why, not only "interrupted"
    assert read(out / "comparison.json")["stop_reason"] == "interrupted by SIGTERM"
    assert "resume with --resume" in (tmp_path / "runner.log").read_text()


@pytest.mark.timeout(60)
def test_a_failed_stage_stops_the_experiment_before_the_comparison(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        **{
            "server.command": ["{python}", "-c", "import sys; sys.exit(4)", "{port}"],
            "stages": {"qualification": {"arms": ["fifo"], "gates": []}},
        },
    )
    out = tmp_path / "out"
    done = invoke("experiment", "run", "--config", config, "--output", out)
    assert done.exit_code == 1 and "stage qualification failed its gate" in done.stderr
    exp = read(out / "experiment.json")
    assert exp["status"] == "stopped" and exp["stages"]["qualification"]["status"] == "failed"
    assert exp["stages"]["qualification"]["failed_arms"] == ["qualification-1-fifo"]
    assert exp["stages"]["comparison"]["status"] == "pending"
    assert {k for k, v in exp["arms"].items() if v["status"] != "pending"} == {"qualification-1-fifo"}
    assert not (out / "arms" / "pair1-fifo").exists()
    again = invoke("experiment", "run", "--config", config, "--output", out, "--resume")
    assert again.exit_code == 1 and "stopped earlier at qualification" in again.stderr


def test_gates_fail_on_unknown_and_on_the_threshold() -> None:
    gates = [
        Gate(metric="counts.completed", op=">=", value=3),
        Gate(metric="resources.sampled_starvation_s", op=">", value=0.5, arm="b"),
    ]
    summaries: dict[str, dict[str, Any] | None] = {
        "a": {"counts": {"completed": 3}},
        "b": {"counts": {"completed": 2}, "resources": {"sampled_starvation_s": None}},
    }
    verdicts = evaluate_gates(gates, ["a", "b"], summaries)
    assert [(v["arm"], v["observed"], v["passed"]) for v in verdicts] == [
        ("a", 3.0, True),
        ("b", 2.0, False),
        ("b", None, False),
    ]
    assert verdicts[2]["note"].startswith("unknown")
    assert evaluate_gates(gates[:1], ["a"], {"a": None})[0]["passed"] is False  # failed arm


@pytest.mark.timeout(240)
def test_a_receipt_write_that_fails_after_an_arm_finished_never_loses_the_arm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk for a moment: one receipt write fails (OSError ENOSPC, injected once) after the arm's
    client finished and its outputs passed the checks — first the arm.json of its server's stop, then,
    in a second experiment, the experiment.json that records it complete. The arm stayed failed for
    ever (a resume never looked again). Now the measurement stands: the arm is complete, the experiment
    stops with the error (exit 1, no traceback), and --resume finishes the rest."""
    import errno

    import asyncroll.experiment.receipts as receipts
    from asyncroll.experiment.config import load_experiment_config
    from asyncroll.experiment.runner import ExperimentRunner

    config = write_config(tmp_path, pairs=1, stages={})
    cfg = load_experiment_config(config)
    real = receipts.write_json_atomic
    for when in ("stopping_server", "recorded complete"):
        out = tmp_path / when.replace(" ", "-")
        fired: list[Path] = []

        def once(path: Path, data: dict[str, Any], when: str = when, fired: list[Path] = fired) -> None:
            hit = (
                path.name == "arm.json" and data.get("status") == "stopping_server"
                if when == "stopping_server"
                else path.name == "experiment.json"
                and any(a["status"] == "complete" for a in data["arms"].values())
            )
            if hit and not fired:
                fired.append(path)
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
            real(path, data)

        monkeypatch.setattr(receipts, "write_json_atomic", once)
        try:
            outcome = ExperimentRunner(cfg, out, config_path=config, echo=lambda _: None).run()
        finally:
            kill_recorded(out)
        monkeypatch.setattr(receipts, "write_json_atomic", real)
        assert fired, when
        assert (outcome.status, outcome.exit_code) == ("failed", 1), outcome.message
        assert "No space left on device" in outcome.message
        first = read(out / "experiment.json")["arms"]["pair1-fifo"]
        assert first["status"] == "complete", (when, first)
        assert read(out / "arms" / "pair1-fifo" / "arm.json")["status"] == "complete"
        resumed = invoke("experiment", "run", "--config", config, "--output", out, "--resume")
        assert resumed.exit_code == 0, resumed.stdout + resumed.stderr
        arms = read(out / "experiment.json")["arms"]
        assert {k: v["status"] for k, v in arms.items()} == {
            "pair1-fifo": "complete",
            "pair1-asyncroll": "complete",
        }
        assert not [p for p in recorded_processes(out) if alive(p)]


def test_a_signal_during_a_resumes_recovery_waits_for_it_then_interrupts() -> None:
    """A Ctrl-C while --resume killed the dead runner's server (a GPU held) cut the sweep short and left
    it running; the guard now records it and interrupts once the recovery is done."""
    from asyncroll.experiment.arms import ExperimentInterrupted
    from asyncroll.experiment.signals import SignalGuard

    with SignalGuard() as guard:
        with guard.deferred():
            signal.raise_signal(signal.SIGINT)  # recorded, not raised: the recovery goes on
            recovered = True
        assert recovered and guard.received == "SIGINT"
        with pytest.raises(ExperimentInterrupted, match="SIGINT"):
            guard.raise_deferred()
        guard.raise_deferred()  # once
        signal.raise_signal(signal.SIGTERM)  # a later signal is counted, as before
        assert guard.ignored == 1
