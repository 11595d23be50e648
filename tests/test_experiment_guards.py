"""The experiment's guards: a protocol change mid-experiment, one runner per directory, managed client
flags, signals during cleanup (and a hang-up under ``nohup``, which the runner survives), a helper the
server detaches, unexpected errors, a damaged comparison.json, undefined ratios, and the report's numbers
(pooled rates, the failure cause, the bootstrap's resample count, bench medians)."""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

import asyncroll.experiment.arms as arms_module
import asyncroll.experiment.runner as runner_module
from asyncroll.errors import UsageError
from asyncroll.experiment.comparison import build_comparison
from asyncroll.experiment.config import (
    MANAGED_CLIENT_FLAGS,
    ExperimentConfig,
    load_experiment_config,
)
from asyncroll.experiment.lock import OutputLock
from asyncroll.experiment.plan import build_plan, client_command
from asyncroll.experiment.receipts import one_line
from asyncroll.experiment.report import aggregate, load_comparison
from asyncroll.experiment.report_markdown import markdown
from asyncroll.experiment.runner import ExperimentRunner
from asyncroll.experiment.server import ManagedProcess
from asyncroll.experiment.stats import bootstrap_interval, distinct_resamples
from tests.conftest import invoke
from tests.test_experiment import (
    ROOT,
    alive,
    kill_recorded,
    read,
    recorded_processes,
    wait_for_client,
    write_config,
)


def lean(tmp: Path, **changes: Any) -> ExperimentConfig:
    """The smoke experiment without stages, one pair unless ``changes`` say otherwise."""
    return load_experiment_config(write_config(tmp, **{"stages": {}, "pairs": 1, **changes}))


def is_client(process: ManagedProcess) -> bool:
    return process.command[1:4] == ["-m", "asyncroll.cli", "run"]


# --- 1. the protocol fingerprint, before and after every arm ------------------------------------------


def tool_workload(tmp: Path) -> tuple[Path, Path]:
    """A one-problem workload whose tool is a trusted file (hashed into the fingerprint)."""
    tool = tmp / "tools" / "sub.py"
    tool.parent.mkdir()
    tool.write_text("def sub(a, b):\n    return a - b\n")
    problem = {
        "id": "sub",
        "prompt": "What is 5 - 3?",
        "tools": [
            {
                "name": "sub",
                "description": "a - b",
                "inputs": {"a": "number", "b": "number"},
                "implementation": "tools/sub.py",
            }
        ],
        "reference_answer": "2",
        "script": [
            {"type": "tool", "name": "sub", "arguments": {"a": 5, "b": 3}, "latency_ms": 1},
            {"type": "final", "answer": "2", "latency_ms": 1},
        ],
    }
    workload = tmp / "workload.jsonl"
    workload.write_text(json.dumps(problem) + "\n")
    return workload, tool


@pytest.mark.timeout(120)
def test_a_tool_file_changed_during_an_arm_fails_it_and_stops_the_experiment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pair1-fifo: its tool file differs only while its client runs, so only the client's run.json shows
    it (the tools check). pair1-asyncroll: the file changes for good while its client runs, so the
    fingerprint computed when the client exits differs: the arm fails and the experiment stops there."""
    workload, tool = tool_workload(tmp_path)
    cfg = lean(tmp_path, pairs=2, workload={"path": str(workload)})
    out = tmp_path / "out"
    original = tool.read_text()
    real_start, real_wait = ManagedProcess.start, ManagedProcess.wait

    def start(self: ManagedProcess) -> None:
        if is_client(self) and "pair1-fifo" in str(self.log):
            tool.write_text(original + "# while pair1-fifo's client runs\n")
        real_start(self)

    def wait(self: ManagedProcess, timeout: float) -> int | None:
        code = real_wait(self, timeout)
        if code is None:  # the runner waits in short steps, watching the server meanwhile
            return code
        if is_client(self) and "pair1-fifo" in str(self.log):
            tool.write_text(original)
        elif is_client(self) and "pair1-asyncroll" in str(self.log):
            tool.write_text(original + "# for good\n")
        return code

    monkeypatch.setattr(ManagedProcess, "start", start)
    monkeypatch.setattr(ManagedProcess, "wait", wait)
    lines: list[str] = []
    try:
        outcome = ExperimentRunner(cfg, out, echo=lines.append).run()
    finally:
        kill_recorded(out)
    assert outcome.status == "stopped" and outcome.exit_code == 1, lines
    first = read(out / "arms" / "pair1-fifo" / "arm.json")
    assert first["status"] == "failed" and first["failed_step"] == "running_client"
    assert "the client's run does not match the plan: tool file tools/sub.py:sub: ran " in first["error"]
    second = read(out / "arms" / "pair1-asyncroll" / "arm.json")
    assert second["status"] == "failed" and second["failed_step"] == "checking_protocol"
    assert second["error"].startswith("after pair1-asyncroll ran: the protocol changed")
    assert "tools: tools/sub.py:sub " in second["error"]
    assert second["server"]["stop"]["leftover"] == []
    exp = read(out / "experiment.json")
    assert exp["status"] == "stopped" and exp["stop_reason"] == second["error"]
    assert [exp["arms"][a]["status"] for a in ("pair2-asyncroll", "pair2-fifo")] == ["pending", "pending"]
    assert not (out / "arms" / "pair2-asyncroll").exists()
    assert not any(alive(p) for p in recorded_processes(out))


def fake_arm(status: str = "failed", error: str | None = "fake arm") -> Any:
    """A stand-in for run_arm that starts nothing."""

    def run_arm(cfg: Any, plan: Any, arm_dir: Path, *args: Any, **kwargs: Any) -> Any:
        arm_dir.mkdir(parents=True)
        return SimpleNamespace(status=status, data={"error": error, "failed_step": "running_client"})

    return run_arm


def test_the_protocol_is_computed_again_before_every_arm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workload = tmp_path / "workload.jsonl"
    workload.write_text((ROOT / "examples" / "smoke.jsonl").read_text())
    cfg = lean(tmp_path, workload={"path": str(workload)})
    ran: list[str] = []
    inner = fake_arm()

    def run_arm(cfg: Any, plan: Any, arm_dir: Path, *args: Any, **kwargs: Any) -> Any:
        ran.append(plan.id)
        workload.write_text(workload.read_text() + "\n")  # a changed workload, after the first arm
        return inner(cfg, plan, arm_dir)

    monkeypatch.setattr(runner_module, "run_arm", run_arm)
    out = tmp_path / "out"
    outcome = ExperimentRunner(cfg, out, echo=lambda _: None).run()
    assert ran == ["pair1-fifo"] and outcome.status == "stopped"
    exp = read(out / "experiment.json")
    assert exp["stop_reason"].startswith("before pair1-asyncroll: the protocol changed")
    assert "workload: " in exp["stop_reason"] and exp["arms"]["pair1-asyncroll"]["status"] == "pending"


# --- 2. one runner per output directory ---------------------------------------------------------------


def test_one_runner_per_output_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    held = OutputLock.acquire(tmp_path)
    with pytest.raises(UsageError, match=f"being run by pid {os.getpid()} on "):
        OutputLock.acquire(tmp_path)
    held.release()
    OutputLock.acquire(tmp_path).release()
    # a resume started while the runner is inside an arm is refused, and touches nothing
    cfg = lean(tmp_path)
    out = tmp_path / "out"
    refusals: list[str] = []
    inner = fake_arm()

    def run_arm(cfg: Any, plan: Any, arm_dir: Path, *args: Any, **kwargs: Any) -> Any:
        result = inner(cfg, plan, arm_dir)
        try:
            ExperimentRunner(cfg, out, resume=True, echo=lambda _: None).run()
        except UsageError as exc:
            refusals.append(str(exc))
        return result

    monkeypatch.setattr(runner_module, "run_arm", run_arm)
    ExperimentRunner(cfg, out, echo=lambda _: None).run()
    assert len(refusals) == 2 and all(f"being run by pid {os.getpid()}" in r for r in refusals)
    assert sorted(p.name for p in (out / "arms").iterdir()) == ["pair1-asyncroll", "pair1-fifo"]
    # once the runner has returned, the directory is free again
    lines: list[str] = []
    ExperimentRunner(cfg, out, resume=True, echo=lines.append).run()
    assert any("resuming" in line for line in lines)


@pytest.mark.timeout(30)
def test_a_killed_runner_leaves_no_lock_behind(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from asyncroll.experiment.lock import OutputLock; "
            "OutputLock.acquire(Path(sys.argv[1])); print('locked', flush=True); time.sleep(60)",
            str(tmp_path),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        with pytest.raises(UsageError, match=f"being run by pid {holder.pid} "):
            OutputLock.acquire(tmp_path)
        holder.kill()  # SIGKILL: no cleanup runs; the kernel drops the lock
        holder.wait(10)
        OutputLock.acquire(tmp_path).release()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
        if holder.stdout is not None:
            holder.stdout.close()


# --- 3. managed client flags; 7. the seed ----------------------------------------------------------------


def test_extra_args_may_not_repeat_a_flag_the_plan_sets(tmp_path: Path) -> None:
    arms = [
        {"name": "fifo", "policy": "fifo"},
        {
            "name": "asyncroll",
            "policy": "asyncroll",
            "extra_args": ["--policy", "tool_first", "--seed", "99"],
        },
    ]
    with pytest.raises(
        UsageError, match=r"arms\.1\.extra_args: extra_args may not repeat .*: --policy, --seed"
    ):
        lean(tmp_path, arms=arms)
    with pytest.raises(UsageError, match=r"client\.extra_args: .*: --output"):
        lean(tmp_path, **{"client.extra_args": ["--output=/elsewhere"]})
    with pytest.raises(UsageError, match="--config"):
        lean(tmp_path, **{"client.extra_args": ["--config", "run.toml"]})
    assert lean(tmp_path, **{"client.extra_args": ["--nvtx"]}).client.extra_args == ["--nvtx"]


def test_the_managed_flags_cover_every_flag_the_plan_sets() -> None:
    """Every flag of every client command the plan can build, and each such option's other spellings
    (``--progress/--no-progress``), is refused in extra_args."""
    import typer.main

    from asyncroll.cli import app
    from asyncroll.experiment.config import GpuSpec

    smoke = load_experiment_config(ROOT / "experiments" / "serve_sim_smoke.json")
    full = smoke.model_copy(
        update={
            "gpu": GpuSpec(),
            "client": smoke.client.model_copy(update={"limit": 2, "dedicated_gpu": True, "replay": True}),
            "workload": smoke.workload.model_copy(update={"tool_root": ROOT / "examples"}),
        }
    )
    bare = smoke.model_copy(update={"server": smoke.server.model_copy(update={"metrics_path": None})})
    flags: set[str] = set()
    for cfg in (full, bare):
        for arm in build_plan(cfg):
            flags |= {t for t in client_command(cfg, arm, 8000, Path("run")) if t.startswith("--")}
    assert {"--nvml-device", "--no-telemetry", "--tool-root", "--limit", "--metrics-url"} <= flags
    assert flags <= MANAGED_CLIENT_FLAGS
    run = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    for param in run.params:
        spellings = set(param.opts) | set(param.secondary_opts)
        if spellings & MANAGED_CLIENT_FLAGS:
            assert spellings <= MANAGED_CLIENT_FLAGS, spellings


def test_a_negative_seed_is_refused_by_the_config_plan_and_report(tmp_path: Path) -> None:
    config = write_config(tmp_path, seed=-3)
    with pytest.raises(UsageError, match="seed: Input should be greater than or equal to 0"):
        load_experiment_config(config)
    done = invoke("experiment", "plan", "--config", config)
    assert done.exit_code == 2 and "seed: Input should be greater than or equal to 0" in done.stderr


def test_the_plan_refuses_a_wrong_workload_sha256_as_the_run_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plan is the documented dry run (PROTOCOL_LIVECODEBENCH.md, docs/SINGLE_GPU.md): a workload
    that does not match the declared SHA-256 is refused there, with the run's message, not first on
    the rented GPU. Both plan paths: ``experiment plan`` and the LiveCodeBench script's ``--plan``."""
    import hashlib
    import importlib.util

    wrong = "0" * 64
    config = write_config(tmp_path, **{"workload.sha256": wrong})
    run = invoke("experiment", "run", "--config", config, "--output", tmp_path / "out")
    plan = invoke("experiment", "plan", "--config", config)
    assert run.exit_code == plan.exit_code == 2, plan.output
    assert "is not the config's workload.sha256" in plan.stderr and plan.stderr == run.stderr
    assert not (tmp_path / "out").exists()
    smoke = hashlib.sha256((ROOT / "examples" / "smoke.jsonl").read_bytes()).hexdigest()
    matching = invoke("experiment", "plan", "--config", write_config(tmp_path, **{"workload.sha256": smoke}))
    assert matching.exit_code == 0 and f"expected sha256 {smoke}" in matching.stdout

    spec = importlib.util.spec_from_file_location(
        "lcb_script", ROOT / "scripts" / "run_lcb_bounded_single_gpu.py"
    )
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    workload = ROOT / "examples" / "livecodebench" / "workload.jsonl"
    args = [
        "--config",
        str(ROOT / "experiments" / "livecodebench_bounded_8x4.json"),
        "--model-path",
        "/models/m",
        "--workload",
        str(workload),
        "--output",
        str(tmp_path / "lcb"),
        "--plan",
    ]
    capsys.readouterr()
    assert script.main([*args, "--workload-sha256", wrong]) == 2
    refused = capsys.readouterr()
    assert refused.out == "" and "is not the config's workload.sha256 " + wrong in refused.err
    lcb = hashlib.sha256(workload.read_bytes()).hexdigest()
    assert script.main([*args, "--workload-sha256", lcb]) == 0
    assert f"expected sha256 {lcb}" in capsys.readouterr().out
    assert not (tmp_path / "lcb").exists()


def test_an_infinite_setting_is_refused_by_the_config(tmp_path: Path) -> None:
    """JSON allows Infinity; an arm's client would refuse it only after the server had started."""
    config = write_config(tmp_path, **{"client.tool_timeout": float("inf")})
    with pytest.raises(UsageError, match="tool_timeout: Input should be a finite number"):
        load_experiment_config(config)


# --- 5. signals during cleanup; 6. unexpected errors --------------------------------------------------


@pytest.mark.timeout(90)
def test_signals_during_cleanup_never_leave_the_server_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the client runs, then another Ctrl-C and a SIGTERM while it is being stopped: the
    further signals are ignored, the server is stopped all the same, the arm ends interrupted."""
    real_wait, real_stop = ManagedProcess.wait, ManagedProcess.stop
    waits: list[float] = []

    def wait(self: ManagedProcess, timeout: float) -> int | None:
        if is_client(self) and not waits:  # the runner's wait for the client, not stop()'s
            waits.append(timeout)
            os.kill(os.getpid(), signal.SIGINT)
        return real_wait(self, timeout)

    def stop(self: ManagedProcess, grace_s: float) -> dict[str, Any]:
        if is_client(self):
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)
        return real_stop(self, grace_s)

    monkeypatch.setattr(ManagedProcess, "wait", wait)
    monkeypatch.setattr(ManagedProcess, "stop", stop)
    out = tmp_path / "out"
    previous = signal.getsignal(signal.SIGINT)
    try:
        outcome = ExperimentRunner(lean(tmp_path), out, echo=lambda _: None).run()
        left_running = [p for p in recorded_processes(out) if alive(p)]  # before the test's own cleanup
    finally:
        kill_recorded(out)
    assert recorded_processes(out) and left_running == []
    arm = read(out / "arms" / "pair1-fifo" / "arm.json")
    assert arm["status"] == "interrupted" and arm["error"] == "interrupted while running_client"
    assert "stop" in arm["client"] and arm["server"]["stop"]["leftover"] == []
    assert signal.getsignal(signal.SIGINT) is previous  # the runner's handlers are gone
    assert outcome.exit_code == 130 and "2 more signal(s) ignored while stopping" in outcome.message
    assert read(out / "experiment.json")["status"] == "interrupted"


@pytest.mark.timeout(60)
def test_a_server_answering_non_json_fails_its_arm_at_starting_server(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "v1").mkdir(parents=True)
    (site / "health").write_text("ok")
    (site / "v1" / "models").write_text("not json")
    command = ["{python}", "-m", "http.server", "--bind", "{host}", "--directory", str(site), "{port}"]
    cfg = lean(tmp_path, server={"command": command, "kind": "generic", "port": 0, "startup_timeout_s": 20})
    out = tmp_path / "out"
    lines: list[str] = []
    try:
        outcome = ExperimentRunner(cfg, out, echo=lines.append).run()
    finally:
        kill_recorded(out)
    assert outcome.status == "complete" and outcome.exit_code == 1
    for arm_id in ("pair1-fifo", "pair1-asyncroll"):
        arm = read(out / "arms" / arm_id / "arm.json")
        assert arm["status"] == "failed" and arm["failed_step"] == "starting_server"
        assert arm["error"].startswith("/v1/models did not return JSON")
    assert any(line.startswith("[pair1-fifo] failed: /v1/models did not return JSON") for line in lines)
    assert not any(alive(p) for p in recorded_processes(out))


def test_an_unexpected_error_in_an_arm_fails_it_at_its_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(_spec: Any) -> dict[str, Any]:
        raise ValueError("a reading nobody planned for")

    monkeypatch.setattr(arms_module, "check_gpu", broken)
    out = tmp_path / "out"
    outcome = ExperimentRunner(lean(tmp_path), out, echo=lambda _: None).run()
    assert outcome.status == "complete" and outcome.exit_code == 1  # the runner moved on to the next arm
    for arm_id in ("pair1-fifo", "pair1-asyncroll"):
        arm = read(out / "arms" / arm_id / "arm.json")
        assert arm["status"] == "failed" and arm["failed_step"] == "checking_gpu"
        assert arm["error"] == "unexpected error while checking_gpu: ValueError: a reading nobody planned for"


def test_an_unexpected_error_outside_an_arm_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(runner_module, "run_arm", broken)
    out = tmp_path / "out"
    outcome = ExperimentRunner(lean(tmp_path), out, echo=lambda _: None).run()
    assert outcome.status == "failed" and outcome.exit_code == 1
    assert "unexpected error: RuntimeError: boom" in outcome.message
    exp = read(out / "experiment.json")
    assert exp["status"] == "failed" and exp["error"] == "unexpected error: RuntimeError: boom"
    assert "RuntimeError: boom" in exp["error_traceback"]
    assert exp["arms"]["pair1-fifo"]["status"] == "failed" and (out / "comparison.json").is_file()


@dataclass(frozen=True)
class Finished:
    cfg: ExperimentConfig
    out: Path
    said: str  # the runner's output
    exit_code: int
    marker: str  # the command line of the helper the server detaches
    left: list[int]  # those helpers still running after the experiment ended


def detached_helpers(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if " ".join(proc.info["cmdline"] or []) == marker:
                found.append(proc)
    return found


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Finished]:
    """A lean experiment run to its end, shared by the tests below (one experiment, three stories):
    started as ``nohup asyncroll experiment run … &`` and hung up while its first arm's client runs;
    its server detaches a helper (``setsid -f``) at start; the resume tests copy and damage its output."""
    if shutil.which("nohup") is None or shutil.which("setsid") is None:
        pytest.skip("needs nohup and setsid")
    from tests.test_experiment import SMOKE

    tmp = tmp_path_factory.mktemp("finished")
    marker = f"sleep 77{os.getpid() % 10}.5"
    serve = json.loads(SMOKE.read_text())["server"]["command"]
    server = ["bash", "-c", f'setsid -f {marker}; exec "$0" "$@"', *serve]
    config = write_config(tmp, stages={}, pairs=1, **{"server.command": server})
    out, log_path = tmp / "out", tmp / "runner.log"
    command = ["nohup", sys.executable, "-m", "asyncroll.cli", "experiment", "run"]
    with log_path.open("wb") as log:
        runner = subprocess.Popen(
            [*command, "--config", str(config), "--output", str(out)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:  # the hangup comes while the first arm's client runs
        wait_for_client(runner, out / "arms" / "pair1-fifo" / "arm.json", log_path)
        runner.send_signal(signal.SIGHUP)
        code = runner.wait(120)
        left = [p.pid for p in detached_helpers(marker) if p.status() != psutil.STATUS_ZOMBIE]
        yield Finished(load_experiment_config(config), out, log_path.read_text(), code, marker, left)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait(10)
        kill_recorded(out)
        for proc in detached_helpers(marker):
            with contextlib.suppress(psutil.Error):
                proc.kill()


@pytest.mark.timeout(150)
def test_a_runner_started_under_nohup_survives_the_hangup(finished: Finished) -> None:
    """``nohup asyncroll experiment run … &`` and log out: the hangup reached the runner, whose handler
    had replaced nohup's SIG_IGN, and interrupted the experiment overnight. It now stays ignored."""
    assert finished.exit_code == 0 and "interrupted" not in finished.said, finished.said
    exp = read(finished.out / "experiment.json")
    assert exp["status"] == "complete"
    assert {arm["status"] for arm in exp["arms"].values()} == {"complete"}


@pytest.mark.timeout(150)
def test_a_process_the_server_detaches_is_killed_and_reported(finished: Finished) -> None:
    """A server that detaches a helper (``setsid -f``): the runner adopts it, kills it when the arm's
    server stops, and arm.json names it in ``leftover`` and ``orphans``, never ``leftover: []``."""
    assert finished.exit_code == 0, finished.said
    assert finished.left == []
    for arm_id in ("pair1-fifo", "pair1-asyncroll"):
        stop = read(finished.out / "arms" / arm_id / "arm.json")["server"]["stop"]
        assert len(stop["orphans"]) == 1 and stop["orphans"][0]["command"] == finished.marker, stop
        assert stop["orphans"][0]["killed"] and stop["leftover"] == [stop["orphans"][0]["pid"]]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("damage", "error"),
    [
        # "unexpected error: ValidationError: … SummaryModel cpu_cost Field required", naming no file, and
        # "(not recorded …)" although experiment.json had recorded it
        ("field", "not a summary.json this asyncroll reads: cpu_cost: Field required"),
        # the arm's metrics all became "not measured", the experiment "complete" (exit 0), nothing said
        ("file", "not found, though the arm completed (its arm.json): restore the file"),
    ],
)
def test_a_resume_names_the_arms_summary_json_it_cannot_read(
    finished: Finished, tmp_path: Path, damage: str, error: str
) -> None:
    cfg, out = finished.cfg, tmp_path / "out"
    shutil.copytree(finished.out, out)
    summary = out / "arms" / "pair1-fifo" / "run" / "summary.json"
    if damage == "field":
        data = read(summary)
        del data["cpu_cost"]
        summary.write_text(json.dumps(data))
    else:
        summary.unlink()
    (out / "comparison.json").unlink()
    outcome = ExperimentRunner(cfg, out, resume=True, echo=lambda _: None).run()
    error = f"{summary}: {error}"
    assert outcome.status == "failed" and outcome.exit_code == 1
    assert outcome.message.startswith(f"experiment failed: {error} (comparison.json not written); see ")
    exp = read(out / "experiment.json")
    assert exp["status"] == "failed" and exp["error"] == error


# --- 4, 8, 11, 12: the report ---------------------------------------------------------------------------


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def comparison(
    rows: list[tuple[dict[str, Any], dict[str, Any]]],
    errors: dict[str, str] | None = None,
    stages: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """comparison.json of a two-arm experiment (a = fifo, the baseline; b = asyncroll), from each pair's
    (a, b) summary values given as dotted paths; ``errors`` fails the named arms; ``stages``: the
    experiment's stage records (gates and their verdicts)."""
    n = len(rows)
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
        "stages": stages or {},
        "plan": [
            {"id": f"pair{p + 1}-{a}", "stage": "comparison", "pair": p, "arm": a, "policy": a, "seed": p}
            for p in range(n)
            for a in ("a", "b")
        ],
        "arms": {
            f"pair{p + 1}-{a}": {"status": "failed", "error": (errors or {})[f"pair{p + 1}-{a}"]}
            if f"pair{p + 1}-{a}" in (errors or {})
            else {"status": "complete"}
            for p in range(n)
            for a in ("a", "b")
        },
    }
    base = {
        "counts.trajectories": 3,
        "counts.completed": 3,
        "accuracy.correct": 3,
        "accuracy.denominator": 3,
        "scheduler.reorders": 0,
        "scheduler.eligible_decisions": 0,
        "throughput.allocated_gpu_hours": 0.001,
        "cpu_cost.total_cpu_s": 0.3,
    }
    summaries = {}
    for p, (a, b) in enumerate(rows):
        summaries[f"pair{p + 1}-a"] = nest({**base, **a})
        summaries[f"pair{p + 1}-b"] = nest({**base, **b})
    return build_comparison(experiment, summaries)


STARVATION = "resources.sampled_starvation_fraction_of_coverage"


def test_a_zero_baseline_is_undefined_never_unknown_and_no_pair_is_dropped_silently() -> None:
    """The QA example: 0.10→0.05, 0.10→0.05, 0→0.50. Leaving pair 3 out showed a confident −50%."""
    rows: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({STARVATION: 0.1}, {STARVATION: 0.05}),
        ({STARVATION: 0.1}, {STARVATION: 0.05}),
    ]
    rows.append(({STARVATION: 0.0}, {STARVATION: 0.5}))
    for a, b in rows[:2]:
        a["makespan_s"], b["makespan_s"] = 2.0, 1.0
    rows[2][0]["makespan_s"], rows[2][1]["makespan_s"] = None, 1.0  # pair 3: not measured
    agg = aggregate(comparison(rows))
    d = agg["paired"]["b"]["sampled_starvation_fraction"]
    assert d["pair_notes"] == [None, None, "undefined (baseline 0, treatment 0.5)"]
    assert d["mean_percent_change_t95"]["mean"] is None
    assert d["mean_difference_t95"]["n"] == 3 and d["mean_difference_t95"]["mean"] == pytest.approx(0.4 / 3)
    m = agg["paired"]["b"]["makespan_s"]["mean_percent_change_t95"]
    assert m["n"] == 2 and m["note"] == "1 of 3 pairs left out (pair 3: a value not measured)"
    text = markdown(agg)
    paired = text[text.index("## Paired") :].splitlines()
    row = next(line for line in paired if line.startswith("| sampled model starvation (fraction"))
    assert "p1 0.5000, p2 0.5000, p3 undefined (baseline 0, treatment 0.5)" in row
    assert "undefined: baseline 0 in pair 3 (no ratio); see the mean difference" in row
    assert "+0.1333 [" in row and "(n=3)" in row and "unknown" not in row and "-50.00%" not in row
    makespan = next(line for line in paired if line.startswith("| makespan, s |"))
    assert "(n=2; 1 of 3 pairs left out (pair 3: a value not measured))" in makespan
    assert "| makespan, s | 2 | 1 |" in text.replace(" (n=2 of 3)", "")
    assert "2 (n=2 of 3)" in text  # the baseline's median rests on the 2 pairs that measured it


def write(tmp: Path, data: dict[str, Any], name: str = "comparison.json") -> Path:
    path = tmp / name
    path.write_text(json.dumps(data))
    return path


DAMAGE = {
    "bad_baseline": (lambda c: c.update(baseline="zzz"), "baseline: 'zzz' is not an arm"),
    "missing_arm": (lambda c: c["pairs"][0]["arms"].pop("b"), "pairs[0] (pair 1): no entry for arm(s) ['b']"),
    "no_counts": (
        lambda c: c["pairs"][0]["arms"]["a"].pop("counts"),
        "pairs[0].arms.a.counts: Field required",
    ),
    "neg_seed": (lambda c: c.update(seed=-3), "seed: Input should be greater than or equal to 0"),
    "schema99": (lambda c: c.update(schema_version=99), "schema_version: 99 is not supported"),
    "text_metric": (
        lambda c: c["pairs"][0]["arms"]["a"]["metrics"].update(makespan_s="fast"),
        "pairs[0].arms.a.metrics.makespan_s: Input should be a valid number",
    ),
    "complete_lies": (
        lambda c: c["pairs"][0].update(complete=False),
        "complete is False, but its arms' statuses",
    ),
    "kind": (lambda c: c.update(kind="asyncroll.run"), "kind: Input should be 'asyncroll.comparison'"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_comparison_is_refused_in_one_line(tmp_path: Path, damage: str) -> None:
    data = comparison([({}, {}), ({}, {})])
    load_comparison(write(tmp_path, data))  # the undamaged file is fine
    change, message = DAMAGE[damage]
    broken = copy.deepcopy(data)
    change(broken)
    path = write(tmp_path, broken, "broken.json")
    with pytest.raises(UsageError) as info:
        load_comparison(path)
    assert str(info.value).startswith(f"{path}: not a valid comparison.json: ") and "\n" not in str(
        info.value
    )
    assert message in str(info.value)
    if damage == "missing_arm":
        done = invoke("report", "--comparison", path, "--output", tmp_path / "r")
        assert done.exit_code == 2 and done.stderr.count("\n") == 1
        assert done.stderr.startswith("error: ") and not (tmp_path / "r").exists()


def test_pooled_rates_are_unknown_when_a_count_is_unknown_never_zero() -> None:
    rows: list[tuple[dict[str, Any], dict[str, Any]]] = [({}, {}), ({}, {})]
    rows[1][0].update({"counts.completed": None, "accuracy.correct": None, "scheduler.reorders": None})
    rows[1][1]["scheduler.eligible_decisions"] = 4
    rows[0][1]["scheduler.eligible_decisions"] = 4
    rows[1][1]["scheduler.reorders"] = 2
    data = comparison(rows)
    del data["pairs"][0]["arms"]["b"]["counts"]["total_cpu_s"]  # an older file without the count
    agg = aggregate(data)
    a, b = agg["pooled"]["a"], agg["pooled"]["b"]
    for rate in ("completion_rate", "completed_per_gpu_hour", "accuracy_exact", "activation_rate"):
        assert a[rate] is None, rate
    assert (
        a["cpu_s_per_completion"] is None
        and a["notes"]["completion_rate"] == "unknown (completed not measured)"
    )
    assert b["completion_rate"] == 1.0 and b["activation_rate"] == pytest.approx(2 / 8)
    assert b["cpu_s_per_completion"] is None and "total_cpu_s" not in b["totals"]  # never a partial sum
    assert b["notes"]["cpu_s_per_completion"] == "unknown (total_cpu_s not measured)"
    text = markdown(agg)
    assert "| a | unknown (correct not measured) (unknown / 6) |" in text
    assert "| a | unknown (completed not measured) | unknown (completed not measured) |" in text
    undefined = aggregate(comparison([({}, {})]))["pooled"]["a"]
    assert undefined["activation_rate"] is None
    assert undefined["notes"]["activation_rate"] == "undefined (eligible_decisions = 0)"


@pytest.mark.timeout(30)
def test_an_output_that_is_a_file_is_a_usage_error(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    done = invoke(
        "experiment", "run", "--config", write_config(tmp_path, stages={}, pairs=1), "--output", afile
    )
    assert done.exit_code == 2 and f"error: --output {afile} is a file, not a directory" in done.stderr
    path = write(tmp_path, comparison([({}, {})]))
    done = invoke("report", "--comparison", path, "--output", afile)
    assert done.exit_code == 2 and f"error: --output {afile} is a file, not a directory" in done.stderr
    done = invoke("report", "--comparison", path, "--output", afile / "sub")
    assert done.exit_code == 2 and "cannot create" in done.stderr
    assert afile.read_text() == ""


def test_a_failed_arms_cause_is_shown() -> None:
    tail = (
        "client exited with code 1; log tail:\n"
        "failed: 0/0 completed, 0 failed | policy fifo: 0 decisions\n"
        "outputs: /x/run\n"
        "error: run failed: warm-up request 1/1 failed: ConnectError: All connection attempts failed\n"
    )
    cause = "error: run failed: warm-up request 1/1 failed: ConnectError: All connection attempts failed"
    assert one_line(tail) == f"client exited with code 1: {cause}"
    traceback_tail = (
        "client exited with code 1; log tail:\nTraceback (most recent call last):\n  x\nKeyError: 'k'\n"
    )
    assert one_line(traceback_tail) == "client exited with code 1: KeyError: 'k'"
    assert one_line("server exited with code 3 before it was ready; log tail:\nboom\n\n") == (
        "server exited with code 3 before it was ready: boom"
    )
    assert one_line("client passed its deadline of 5s and was stopped") == (
        "client passed its deadline of 5s and was stopped"
    )
    assert one_line(None) == "unknown"
    text = markdown(aggregate(comparison([({}, {})], errors={"pair1-a": tail})))
    assert f"- `pair1-a`: client exited with code 1: {cause}" in text


def test_the_bootstrap_counts_distinct_resamples() -> None:
    for n in range(1, 6):
        multisets = sum(1 for _ in itertools.combinations_with_replacement(range(n), n))
        assert distinct_resamples(n) == multisets
    assert [distinct_resamples(n) for n in (2, 3, 4)] == [3, 10, 35]
    assert bootstrap_interval([1.0, 2.0], seed=0, resamples=200).note == "2 pairs: only 3 distinct resamples"
    assert (
        bootstrap_interval([1.0, 2.0, 4.0], seed=0, resamples=200).note
        == "3 pairs: only 10 distinct resamples"
    )
    assert bootstrap_interval([1.0, 2.0, 4.0, 5.0, 7.0], seed=0, resamples=100).note is None  # 126 ≥ 100


# --- 10. bench medians ----------------------------------------------------------------------------------


def test_bench_min_median_max_uses_the_true_median() -> None:
    from bench.common import quantiles
    from bench.paired import interval, spread

    assert quantiles([3.0, 1.0]) == (1.0, 2.0, 3.0)  # for 2 seeds the median was the max
    assert quantiles([5.0, 1.0, 3.0]) == (1.0, 3.0, 5.0)
    assert quantiles([4.0, 1.0, 3.0, 2.0]) == (1.0, 2.5, 4.0)
    assert spread([-0.330, 0.466], "{:+.1%}") == "-33.0% / +6.8% / +46.6%"
    assert spread([1.0, None, 3.0]) == "unknown"  # a run without the value: missing, never 0
    assert interval([0.1, 0.2, 0.3]).endswith("(n=3)")


@pytest.mark.timeout(30)
def test_a_figure_without_matplotlib_writes_no_part_of_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`report --figure` without the figures extra is refused before anything is written."""
    path = write(tmp_path, comparison([({}, {})]))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib → ImportError
    done = invoke("report", "--comparison", path, "--output", tmp_path / "r", "--figure")
    assert done.exit_code == 2 and "pip install 'asyncroll[figures]'" in done.stderr
    assert not (tmp_path / "r").exists()


def test_requests_cancelled_by_a_stop_are_not_model_failures() -> None:
    from asyncroll.experiment.comparison import arm_values

    summary = {"model": {"failed": {"transport": 2, "cancelled": 4}}}
    assert arm_values(summary)["counts"]["model_failures"] == 2.0
    assert arm_values(None)["counts"]["model_failures"] is None


def test_the_code_digest_counts_the_packages_sources_not_editor_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening a module in an editor mid-experiment (a swap or backup file) must not stop it; an edit
    to a module or to the package data must."""
    import asyncroll
    from asyncroll.experiment.fingerprint import source_digest

    package = tmp_path / "asyncroll"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "runner.py").write_text("x = 1\n")
    monkeypatch.setattr(asyncroll, "__file__", str(package / "__init__.py"))
    before = source_digest()
    (package / "sub" / ".runner.py.swp").write_bytes(b"\0vim")
    (package / "sub" / "runner.py~").write_text("x = 0\n")
    (package / "sub" / "__pycache__").mkdir()
    (package / "sub" / "__pycache__" / "runner.cpython-311.pyc").write_bytes(b"\0")
    assert source_digest() == before
    (package / "sub" / "page.html").write_text("<p>")
    with_page = source_digest()
    assert with_page != before
    (package / "sub" / "runner.py").write_text("x = 2\n")
    assert source_digest() not in (before, with_page)


def test_an_activation_rate_over_no_eligible_decision_is_undefined_in_every_table() -> None:
    """A FIFO arm makes no eligible decision: its activation rate (reorders ÷ eligible) is 0/0 —
    undefined, as the pooled table says, never "unknown (not measured)" in the medians or pairs."""
    fifo = {"scheduler.activation_rate": None, "scheduler.eligible_decisions": 0}
    mine = {"scheduler.activation_rate": 0.5, "scheduler.eligible_decisions": 4, "scheduler.reorders": 2}
    agg = aggregate(comparison([(fifo, mine), (fifo, mine)]))
    d = agg["paired"]["b"]["activation_rate"]
    assert d["pair_notes"] == ["undefined (eligible_decisions = 0)"] * 2
    assert d["mean_percent_change_t95"]["mean"] is None and d["mean_difference_t95"]["mean"] is None
    assert (
        d["mean_difference_t95"]["note"]
        == "undefined in every pair: a value undefined (eligible_decisions = 0)"
    )
    text = markdown(agg)
    rows = [line for line in text.splitlines() if line.startswith("| activation rate")]
    assert rows and all("unknown" not in row for row in rows), rows
    assert "| activation rate (reorders / eligible) | undefined (eligible_decisions = 0) | 0.5 |" in text
    # an arm whose summary lacks the counts stays unknown
    lost = {"scheduler.activation_rate": None, "scheduler.eligible_decisions": None}
    agg = aggregate(comparison([(lost, mine), (lost, mine)]))
    assert agg["paired"]["b"]["activation_rate"]["pair_notes"] == ["unknown (not measured)"] * 2


def test_ratios_of_an_arm_with_no_completion_are_undefined_not_unknown() -> None:
    """An arm that completed nothing has no CPU-s per completion and no accuracy: 0/0, "undefined"
    (as the pooled table said), not "unknown (not measured)"; a gate on them says the same."""
    from asyncroll.experiment.config import Gate
    from asyncroll.experiment.gates import evaluate_gates

    none: dict[str, Any] = {"cpu_cost.per_completion_s": None, "accuracy.exact": None}
    none |= {"counts.completed": 0, "accuracy.denominator": 0, "accuracy.correct": 0}
    some = {"cpu_cost.per_completion_s": 2.0, "accuracy.exact": 1.0}
    agg = aggregate(comparison([(none, some), (none, some)]))
    assert agg["paired"]["b"]["cpu_s_per_completion"]["pair_notes"] == ["undefined (completed = 0)"] * 2
    assert agg["paired"]["b"]["accuracy_exact"]["pair_notes"] == ["undefined (graded = 0)"] * 2
    assert agg["median_notes"]["a"]["accuracy_exact"] == "undefined (graded = 0)"
    gate = Gate(metric="accuracy.exact", op=">=", value=0)
    summary = {"accuracy": {"exact": None, "denominator": 0}}
    assert evaluate_gates([gate], ["a"], {"a": summary})[0]["note"] == "undefined (accuracy.denominator = 0)"
    lost = {"accuracy": {"exact": None}}  # no denominator recorded: not known to be 0
    assert evaluate_gates([gate], ["a"], {"a": lost})[0]["note"].startswith("unknown")


def test_pairs_with_an_undefined_value_are_left_out_and_named() -> None:
    fifo = {"scheduler.activation_rate": None, "scheduler.eligible_decisions": 0}
    one = {"scheduler.activation_rate": 0.5, "scheduler.eligible_decisions": 4}
    two = {"scheduler.activation_rate": 0.25, "scheduler.eligible_decisions": 4}
    agg = aggregate(comparison([(fifo, one), (one, two), (one, one)]))
    d = agg["paired"]["b"]["activation_rate"]
    assert d["pair_notes"] == ["undefined (eligible_decisions = 0)", None, None]
    t95 = d["mean_percent_change_t95"]
    assert t95["n"] == 2 and t95["mean"] == pytest.approx(-25.0)
    assert "1 of 3 pairs left out (pair 1: a value undefined (eligible_decisions = 0))" in t95["note"]


# --- QA round 4: interrupts while stopping, a dead server, SIGHUP, evidence, the stop's grace -----------


@pytest.mark.timeout(120)
def test_an_interrupt_while_the_server_stops_keeps_the_finished_arm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the server of an arm whose client finished is being stopped: the server is stopped
    all the same, the arm stays complete in arm.json and experiment.json, and --resume does not run it
    again, even when the runner died before experiment.json recorded it."""
    from asyncroll.experiment.server import InferenceServer

    real_stop = InferenceServer.stop
    calls: list[float] = []

    def stop(self: InferenceServer, grace_s: float) -> dict[str, Any]:
        calls.append(grace_s)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return real_stop(self, grace_s)

    monkeypatch.setattr(InferenceServer, "stop", stop)
    cfg, out = lean(tmp_path), tmp_path / "out"
    try:
        outcome = ExperimentRunner(cfg, out, echo=lambda _: None).run()
        left_running = [p for p in recorded_processes(out) if alive(p)]
    finally:
        kill_recorded(out)
    assert outcome.exit_code == 130 and len(calls) == 2 and left_running == []
    arm_json = out / "arms" / "pair1-fifo" / "arm.json"
    arm = read(arm_json)
    assert arm["status"] == "complete" and arm["error"] is None and arm["summary_status"] == "complete"
    assert arm["interrupted_while"] == "stopping_server" and arm["server"]["stop"]["leftover"] == []
    exp = read(out / "experiment.json")
    assert exp["status"] == "interrupted" and exp["arms"]["pair1-fifo"]["status"] == "complete"
    assert exp["arms"]["pair1-asyncroll"]["status"] == "pending"
    # a runner killed between the arm's end and its record in experiment.json
    exp["arms"]["pair1-fifo"]["status"] = "running"
    (out / "experiment.json").write_text(json.dumps(exp))
    monkeypatch.undo()
    lines: list[str] = []
    try:
        outcome = ExperimentRunner(cfg, out, resume=True, echo=lines.append).run()
    finally:
        kill_recorded(out)
    assert outcome.status == "complete" and outcome.exit_code == 0, lines
    assert not list(out.glob("arms/*.interrupted-*")) and read(arm_json) == arm  # not run again
    exp = read(out / "experiment.json")
    assert {a["status"] for a in exp["arms"].values()} == {"complete"}
    assert exp["resumes"][-1]["finished_arms_recorded"] == ["pair1-fifo"]


@pytest.mark.timeout(90)
def test_a_server_that_dies_while_the_client_runs_fails_the_arm_at_once(tmp_path: Path) -> None:
    """kill -9 of the server mid-arm: the client is stopped promptly and the arm's error names the
    server's death and its log, not a client deadline."""
    import threading
    import time

    from tests.test_experiment import SMOKE

    command = json.loads(SMOKE.read_text())["server"]["command"]
    command[command.index("--step-base-ms") + 1] = "150"  # a client that runs for a while
    # one arm: the qualification stage's, which fails and stops the experiment before the pairs (a
    # second arm, on this slowed server, only took time)
    one_arm = {"qualification": {"arms": ["fifo"], "gates": []}}
    cfg = lean(tmp_path, **{"server.command": command, "client.deadline_s": 45, "stages": one_arm})
    out = tmp_path / "out"
    arm_json = out / "arms" / "qualification-1-fifo" / "arm.json"
    killed: list[float] = []

    def kill_server() -> None:
        end = time.monotonic() + 40
        while time.monotonic() < end:
            try:
                data = read(arm_json)
            except (OSError, ValueError):
                data = {}
            if data.get("status") == "running_client":
                time.sleep(1.0)
                os.kill(data["server"]["process"]["pid"], signal.SIGKILL)
                killed.append(time.monotonic())
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=kill_server, daemon=True)
    watcher.start()
    try:
        outcome = ExperimentRunner(cfg, out, echo=lambda _: None).run()
    finally:
        watcher.join(5)
        kill_recorded(out)
    assert killed
    assert outcome.status == "stopped" and not (out / "arms" / "pair1-fifo").exists()
    arm = read(arm_json)
    assert arm["status"] == "failed" and arm["failed_step"] == "running_client"
    assert arm["error"].startswith("server was killed by SIGKILL (exit code -9) while the client ran")
    assert str(out / "arms" / "qualification-1-fifo" / "server.log") in arm["error"]
    assert arm["client"]["wall_s"] < 15  # not the client's 45 s deadline
    assert not any(alive(p) for p in recorded_processes(out))


@pytest.mark.timeout(60)
def test_sighup_is_handled_like_sigterm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A closed terminal or ssh session (SIGHUP) stops the arm's client and server and marks it
    interrupted; it never leaves experiment.json running."""

    class Unhandled(Exception):
        pass

    def unhandled(_signum: int, _frame: Any) -> None:
        raise Unhandled("SIGHUP reached the runner unhandled")

    real_wait = ManagedProcess.wait
    sent: list[bool] = []

    def wait(self: ManagedProcess, timeout: float) -> int | None:
        if is_client(self) and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGHUP)
        return real_wait(self, timeout)

    monkeypatch.setattr(ManagedProcess, "wait", wait)
    previous = signal.signal(signal.SIGHUP, unhandled)  # without the guard: an error, not a dead pytest
    out = tmp_path / "out"
    try:
        outcome = ExperimentRunner(lean(tmp_path), out, echo=lambda _: None).run()
        left_running = [p for p in recorded_processes(out) if alive(p)]
        assert signal.getsignal(signal.SIGHUP) is unhandled  # the runner's handler is gone
    finally:
        signal.signal(signal.SIGHUP, previous)
        kill_recorded(out)
    assert outcome.exit_code == 130 and "interrupted by SIGHUP" in outcome.message
    assert left_running == [] and recorded_processes(out)
    arm = read(out / "arms" / "pair1-fifo" / "arm.json")
    assert arm["status"] == "interrupted" and arm["error"] == "interrupted while running_client"
    assert read(out / "experiment.json")["status"] == "interrupted"


def test_startup_evidence_records_attention_backend_names_as_logged() -> None:
    from asyncroll.experiment.server import startup_evidence

    log = "\n".join(
        [
            "INFO [cuda.py:240] Using Flash Attention backend on V1 engine.",
            "INFO: Using sampling backend: flashinfer",
            "INFO [cuda.py:250] Using Triton MLA backend on V1 engine.",
            "INFO [selector.py:40] Using FLASH_ATTN attention backend out of potential backends: ['X']",
            "server_args=ServerArgs(attention_backend='fa3', sampling_backend='pytorch')",
        ]
    )
    ev = startup_evidence(log)
    assert ev["attention_backend"] == ["Flash Attention", "Triton MLA", "FLASH_ATTN", "fa3"]
    assert ev["sampling_backend"] == ["flashinfer", "pytorch"]


@pytest.mark.timeout(30)
def test_a_server_ignoring_sigterm_is_killed_after_one_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TERM → grace → KILL: the leader and its child both ignore TERM; KILL comes after stop_grace_s in
    total, not once for the leader and again for its tree."""
    import time

    import asyncroll.experiment.server as server_module
    from asyncroll.proctree import descendants

    sent: list[tuple[int, float]] = []

    def signal_tree(pid: int, sig: int, tree: list[Any]) -> None:
        sent.append((sig, time.monotonic()))
        real(pid, sig, tree)

    real = server_module.signal_tree
    monkeypatch.setattr(server_module, "signal_tree", signal_tree)
    process = ManagedProcess(["bash", "-c", "trap '' TERM; sleep 60 & wait"], tmp_path / "server.log")
    process.start()
    try:
        end = time.monotonic() + 10
        while not descendants(process.pid) and time.monotonic() < end:
            time.sleep(0.02)
        assert descendants(process.pid)
        stop = process.stop(2.0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert stop["how"] == "kill" and stop["leftover"] == []
    # one grace (2 s) between TERM and KILL, not two (4 s). Timed between the two signals only, not the
    # whole stop (the wait for the killed group and the adoption scan after it stretched on a loaded
    # machine: a whole-stop window of 2–3 s failed once); the margin below 4 s absorbs scheduling delays.
    [(term, term_at), (kill, kill_at)] = sent
    assert (term, kill) == (signal.SIGTERM, signal.SIGKILL)
    assert 2.0 <= kill_at - term_at < 3.8, sent


def test_the_gpu_slots_alias_is_a_managed_flag(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"client\.extra_args: .*: --gpu-slots"):
        lean(tmp_path, **{"client.extra_args": ["--gpu-slots", "2"]})
    with pytest.raises(UsageError, match="--gpu-slots"):
        lean(tmp_path, **{"client.extra_args": ["--gpu-slots=2"]})


def test_a_gate_on_a_metric_the_summary_has_not_is_refused_by_the_config(tmp_path: Path) -> None:
    """It used to be accepted by plan and run and to read as unknown only after its stage's arm ran."""
    gates = [{"metric": "counts.nonexistent", "op": ">=", "value": 1}]
    config = write_config(tmp_path, **{"stages.qualification.gates": gates})
    with pytest.raises(UsageError, match=r"summary\.json\.counts has no 'nonexistent'"):
        load_experiment_config(config)
    done = invoke("experiment", "plan", "--config", config)
    assert done.exit_code == 2 and "has no 'nonexistent'" in done.stderr
    for metric in ("latency.trajectory_s.p95", "rates.success_rate", "model.failed.transport"):
        ok = write_config(
            tmp_path, **{"stages.qualification.gates": [{"metric": metric, "op": ">", "value": 0}]}
        )
        load_experiment_config(ok)  # a distribution's field, a rate, an untyped section: accepted
    not_a_number = write_config(
        tmp_path, **{"stages.qualification.gates": [{"metric": "status", "op": ">", "value": 0}]}
    )
    with pytest.raises(UsageError, match=r"summary\.json\.status is not a number"):
        load_experiment_config(not_a_number)


# --- QA round 5: the experiment's deadline cuts, never fails; orphans are the client's or the server's ---


def ready_server(tmp: Path) -> dict[str, Any]:
    """``server`` settings of a fake server that is ready at once and serves the model ``sim``."""
    site = tmp / "site"
    (site / "v1").mkdir(parents=True)
    (site / "health").write_text("ok")
    (site / "v1" / "models").write_text(json.dumps({"data": [{"id": "sim"}]}))
    command = ["{python}", "-m", "http.server", "--bind", "{host}", "--directory", str(site), "{port}"]
    return {"command": command, "kind": "generic", "port": 0, "startup_timeout_s": 20, "stop_grace_s": 5}


def one_arm(cfg: ExperimentConfig, out: Path, **kwargs: Any) -> dict[str, Any]:
    """run_arm for the config's first arm in ``out/arms/ID``; its arm.json. Its processes are killed if
    the test fails midway."""
    from asyncroll.experiment.arms import Expected, run_arm

    plan = build_plan(cfg)[0]
    arm_dir = out / "arms" / plan.id
    try:
        receipt = run_arm(cfg, plan, arm_dir, Expected("0" * 64, {}, {}), cfg.client.deadline_s, **kwargs)
    finally:
        kill_recorded(out)
    arm = read(arm_dir / "arm.json")
    assert arm["status"] == receipt.status
    return arm


@pytest.fixture
def subreaper() -> Iterator[None]:
    """The test process adopts orphans while the test runs, as the runner does (ExperimentRunner.run)."""
    from asyncroll.proctree import is_subreaper, set_subreaper

    before = is_subreaper()
    set_subreaper(True)
    yield
    if not before:
        set_subreaper(False)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("cut", ["starting_server", "running_client", "client_deadline"])
def test_the_experiments_deadline_interrupts_the_arm_the_clients_own_deadline_fails_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: str
) -> None:
    """The experiment's deadline while the server starts or the client runs: both are stopped and the
    arm ends interrupted (by the deadline), not failed. The client's own deadline still fails it."""
    server = ready_server(tmp_path)
    if cut == "starting_server":
        server["command"] = [
            "sh",
            "-c",
            "sleep 30",
            "{port}",
        ]  # never ready: the cut comes while it starts, whatever the load
    cfg = lean(tmp_path, server=server, **{"client.deadline_s": 0.3 if cut == "client_deadline" else 60})
    monkeypatch.setattr(arms_module, "client_command", lambda *_args: ["sleep", "30"])
    out = tmp_path / "out"
    if cut == "client_deadline":
        arm = one_arm(cfg, out)
    else:  # the deadline passes once the step has begun: the cut is in that step, not before or after it
        begun = out / "arms" / "pair1-fifo" / ("server.log" if cut == "starting_server" else "client.log")
        after = 0.2 if cut == "starting_server" else -1.0
        arm = one_arm(cfg, out, time_left=lambda: after if begun.exists() else float("inf"))
    if cut == "client_deadline":
        assert arm["status"] == "failed" and arm["failed_step"] == "running_client"
        assert arm["error"] == "client passed its deadline of 0.3s and was stopped"
    else:
        assert arm["status"] == "interrupted" and arm["interrupted_by"] == "deadline", arm
        assert arm["cut_step"] == cut and "failed_step" not in arm
        assert arm["error"].startswith("the experiment's deadline came while the ")
    assert [t["status"] for t in arm["transitions"]][-2:] == ["stopping_server", arm["status"]]
    assert arm["server"]["stop"]["leftover"] == []
    if cut != "starting_server":
        assert arm["client"]["stop"]["how"] == "term" and arm["client"]["stop"]["leftover"] == []
    assert recorded_processes(out) and not any(alive(p) for p in recorded_processes(out))


def cut_arm(cut: set[str], calls: list[str]) -> Any:
    """A stand-in for run_arm that starts nothing: the arms named in ``cut`` are cut by the deadline."""

    def run_arm(cfg: Any, plan: Any, arm_dir: Path, *args: Any, **kwargs: Any) -> Any:
        calls.append(plan.id)
        left = kwargs["time_left"]()  # the runner hands the arm the time left until its deadline
        assert 0 < left <= cfg.deadline_s
        arm_dir.mkdir(parents=True)
        if plan.id in cut:
            error = "the experiment's deadline came while the client ran (after 5s)"
            data = {"error": error, "interrupted_by": "deadline", "cut_step": "running_client"}
            return SimpleNamespace(status="interrupted", data=data)
        return SimpleNamespace(status="complete", data={"error": None})

    return run_arm


def test_a_deadline_stop_is_recorded_as_such_and_resume_runs_the_cut_arm_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deadline cuts pair1-asyncroll: the experiment is stopped (not complete), its stop_reason names
    the deadline, the arm is interrupted (not a failed arm, in experiment.json, comparison.json and the
    report), and --resume, with a deadline of its own, runs it again and keeps the finished arm."""
    cfg = lean(tmp_path, deadline_s=30)
    out = tmp_path / "out"
    calls: list[str] = []
    monkeypatch.setattr(runner_module, "run_arm", cut_arm({"pair1-asyncroll"}, calls))
    outcome = ExperimentRunner(cfg, out, echo=lambda _: None).run()
    assert (outcome.status, outcome.exit_code) == ("stopped", 1) and "failed arms" not in outcome.message
    exp = read(out / "experiment.json")
    assert exp["status"] == "stopped" and exp["stages"]["comparison"]["status"] == "deadline"
    assert exp["stop_reason"] == (
        "the experiment's deadline (deadline_s 30s for this run) cut pair1-asyncroll while running client "
        "(interrupted); --resume runs the unfinished arms"
    )
    assert exp["arms"]["pair1-fifo"]["status"] == "complete"
    cut = exp["arms"]["pair1-asyncroll"]
    assert cut["status"] == "interrupted" and cut["interrupted_by"] == "deadline"
    comparison = read(out / "comparison.json")
    assert comparison["failed_arms"] == [] and comparison["experiment_status"] == "stopped"
    assert comparison["pairs"][0]["arms"]["asyncroll"]["status"] == "interrupted"
    text = markdown(aggregate(load_comparison(out / "comparison.json")))
    assert text[text.index("Failed arms (kept, never re-run):") :].splitlines()[2] == "- none"
    assert "- `pair1-asyncroll`: interrupted: the experiment's deadline came while the client ran" in text
    # a day later: the deadline counts from the resume, not from the experiment's creation
    exp["created_wall"] -= 86400
    (out / "experiment.json").write_text(json.dumps(exp))
    monkeypatch.setattr(runner_module, "run_arm", cut_arm(set(), calls))
    outcome = ExperimentRunner(cfg, out, resume=True, echo=lambda _: None).run()
    assert (outcome.status, outcome.exit_code) == ("complete", 0), outcome.message
    assert calls == ["pair1-fifo", "pair1-asyncroll", "pair1-asyncroll"]  # the finished arm is not re-run
    exp = read(out / "experiment.json")
    assert exp["stop_reason"] is None and {a["status"] for a in exp["arms"].values()} == {"complete"}
    attempts = exp["arms"]["pair1-asyncroll"]["attempts_interrupted"]
    assert len(attempts) == 1 and attempts[0]["interrupted_by"] == "deadline"
    assert Path(attempts[0]["dir"]).name == "pair1-asyncroll.interrupted-1"
    assert exp["resumes"][-1]["status_before"] == "stopped"
    assert exp["resumes"][-1]["stop_reason_before"].startswith("the experiment's deadline")
    assert (out / "arms" / "pair1-fifo").is_dir()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("ends", ["exits", "stopped"])
def test_what_the_client_detaches_is_recorded_as_the_clients_not_the_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, subreaper: None, ends: str
) -> None:
    """The client detaches a helper (setsid -f), then exits or is stopped at its deadline, while the
    helper lives on: the client's stop kills it and lists it, the server's stop lists only what the
    server left. A helper that cleared its environment cannot be attributed: killed, and listed apart."""
    import time

    import psutil

    mine, anonymous = (f"sleep {600 + os.getpid() % 1000}.{n}" for n in (25, 75))
    then = "exit 0" if ends == "exits" else "sleep 30"
    script = f"setsid -f {mine}; env -i setsid -f {anonymous}; {then}"
    monkeypatch.setattr(arms_module, "client_command", lambda *_args: ["bash", "-c", script])
    cfg = lean(
        tmp_path, server=ready_server(tmp_path), **{"client.deadline_s": 30 if ends == "exits" else 0.3}
    )

    def helpers() -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if " ".join(proc.info["cmdline"] or []) in (mine, anonymous):
                    found.append(proc)
        return found

    real_wait = ManagedProcess.wait

    def wait(self: ManagedProcess, timeout: float) -> int | None:
        """The runner waits for the client once both helpers run (they fork and exec on their own time)."""
        end = time.monotonic() + 10
        while self.role == "client" and len(helpers()) < 2 and time.monotonic() < end:
            time.sleep(0.02)
        return real_wait(self, timeout)

    monkeypatch.setattr(ManagedProcess, "wait", wait)
    try:
        arm = one_arm(cfg, tmp_path / "out")
        left = [p.pid for p in helpers() if p.status() != psutil.STATUS_ZOMBIE]
    finally:
        for proc in helpers():
            with contextlib.suppress(psutil.Error):
                proc.kill()
    assert left == []
    client_stop, server_stop = arm["client"]["stop"], arm["server"]["stop"]
    assert client_stop["how"] == ("exited" if ends == "exits" else "term")
    assert [o["command"] for o in client_stop.get("orphans", [])] == [mine], client_stop
    assert client_stop["orphans"][0]["killed"] and client_stop["orphans"][0]["origin"].startswith("client:")
    assert client_stop["leftover"] == [client_stop["orphans"][0]["pid"]]
    assert "orphans" not in server_stop and server_stop["leftover"] == [], server_stop
    assert [o["command"] for o in arm["unattributed_orphans"]] == [anonymous]
    assert arm["unattributed_orphans"][0]["killed"] and "origin" not in arm["unattributed_orphans"][0]


TRICKLING_HEALTH = """
import socket, sys, time
server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
while True:
    conn, _ = server.accept()
    conn.recv(65536)
    conn.sendall(b"HTTP/1.1 200 OK\\r\\ncontent-length: 1000000\\r\\n\\r\\n")
    try:
        while True:  # one byte at a time: every read of httpx's finishes within its per-phase timeout
            conn.sendall(b" ")
            time.sleep(0.5)
    except OSError:
        conn.close()
"""


@pytest.mark.timeout(60)
def test_a_server_that_trickles_its_readiness_answer_times_out_at_the_deadline(tmp_path: Path) -> None:
    """Readiness probes had only httpx's per-phase timeout, which each trickled byte resets: a server
    answering /health one byte at a time held the arm in ``starting_server`` for ever."""
    from asyncroll.experiment.server import PROBE_TIMEOUT_S, InferenceServer, ReadinessTimeout, free_port
    from asyncroll.http_read import request_deadline_s

    port = free_port("127.0.0.1")
    command = [sys.executable, "-c", TRICKLING_HEALTH, str(port)]
    server = InferenceServer(command, f"http://127.0.0.1:{port}", tmp_path / "server.log", {}, "m")
    server.start()
    try:
        began = time.monotonic()
        with pytest.raises(ReadinessTimeout, match="no complete answer within"):
            server.wait_ready(["/health"], 3.0)  # room for a slow start: ConnectError until it listens
        # each probe gets at most the time left, and its deadline is at most max(1 s, 10%) more
        assert time.monotonic() - began < 3.0 + request_deadline_s(PROBE_TIMEOUT_S) - PROBE_TIMEOUT_S + 2.0
    finally:
        server.stop(2.0)
