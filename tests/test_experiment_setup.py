"""Pre-flight: a setup that would fail every arm in turn (a server program that cannot be started, a fixed
port another process holds) is refused once, before any arm starts, naming the config field (exit 2),
and named by ``experiment plan``; a resume checks the port once the dead runner's leftovers are killed."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import asyncroll.experiment.runner as runner_module
from asyncroll.errors import UsageError
from asyncroll.experiment import preflight
from asyncroll.experiment.runner import ExperimentRunner
from asyncroll.experiment.server import free_port
from tests.conftest import invoke
from tests.experiments import read, write_config
from tests.lean_experiment import lean


def program(tmp: Path, name: str = "fake-serve", *, executable: bool = True) -> Path:
    """A server program in ``tmp/bin`` (it is never run here)."""
    path = tmp / "bin" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755 if executable else 0o644)
    return path


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port another process (here: a listening socket) holds for the test's length."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


CASES = {
    "missing path": (lambda tmp: "/nonexistent/asyncroll-test/vllm", "does not exist"),
    "not on PATH": (lambda tmp: "asyncroll-no-such-server", "is not found on PATH"),
    "not executable": (lambda tmp: str(program(tmp, executable=False)), "is not executable"),
    "a directory": (lambda tmp: str(tmp), "is a directory, not a program"),
    # Path.exists() passes over ELOOP: the loop was said to be a program that "does not exist"
    "a symlink loop": (lambda tmp: str(_loop(tmp)), "cannot be looked up: Too many levels of symbolic links"),
}


def _loop(tmp: Path) -> Path:
    (tmp / "vllm").symlink_to(tmp / "vllm")
    return tmp / "vllm"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_server_program_that_cannot_start_is_refused_before_any_arm(tmp_path: Path, case: str) -> None:
    """It used to fail every arm in turn at starting_server and use up the output directory."""
    make, problem = CASES[case]
    name = make(tmp_path)
    config = write_config(tmp_path, stages={}, pairs=1, **{"server.command": [name, "serve", "{port}"]})
    out = tmp_path / "out"
    done = invoke("experiment", "run", "--config", config, "--output", out)
    line = f"{config}: server.command[0]: {name!r} {problem}"
    assert done.exit_code == 2 and done.stderr.startswith(
        "error: pre-flight check failed; no arm was started:"
    )
    assert any(ln.startswith(line) for ln in done.stderr.splitlines()), done.stderr
    assert not out.exists()
    # the plan may be printed on another machine: it names the problem and still prints every command
    plan = invoke("experiment", "plan", "--config", config)
    assert (
        plan.exit_code == 0 and "pre-flight on this machine, now (`run` refuses until fixed):" in plan.stdout
    )
    assert any(ln.startswith(f"  server.command[0]: {name!r} {problem}") for ln in plan.stdout.splitlines())
    assert sum(line.startswith("  server: ") for line in plan.stdout.splitlines()) == 2


def test_the_program_is_looked_up_as_the_server_will_be_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the PATH the server gets (server.env included), or as a path relative to the runner's folder;
    a port chosen for each arm (0) is never checked."""
    program(tmp_path)
    bare = lean(tmp_path, **{"server.command": ["fake-serve", "{port}"]})
    assert preflight.problems(bare) == [
        "server.command[0]: 'fake-serve' is not found on PATH (the server's "
        "PATH, server.env included); install it, or give the program's path"
    ]
    with_path = lean(
        tmp_path,
        **{"server.command": ["fake-serve", "{port}"], "server.env": {"PATH": str(tmp_path / "bin")}},
    )
    assert preflight.problems(with_path) == []
    monkeypatch.chdir(tmp_path)
    assert preflight.problems(lean(tmp_path, **{"server.command": ["bin/fake-serve", "{port}"]})) == []
    smoke = lean(tmp_path)  # {python} -m asyncroll.cli serve-sim on port 0
    assert smoke.server.port == 0 and preflight.problems(smoke) == []
    plan = invoke("experiment", "plan", "--config", write_config(tmp_path))
    assert plan.exit_code == 0 and "pre-flight" not in plan.stdout


@pytest.mark.timeout(30)
def test_a_busy_fixed_port_is_refused_before_any_arm_and_checked_again_by_each_arm(
    tmp_path: Path, busy_port: int
) -> None:
    """A stale server on the fixed port would have failed every arm; each arm still checks the port it
    is about to use (it may be taken after the pre-flight), and never measures a stale server."""
    from asyncroll.experiment.arms import run_arm
    from asyncroll.experiment.client_check import Expected
    from asyncroll.experiment.config import load_experiment_config
    from asyncroll.experiment.plan import build_plan

    config = write_config(tmp_path, **{"server.port": busy_port, "stages": {}, "pairs": 1})
    out = tmp_path / "out"
    done = invoke("experiment", "run", "--config", config, "--output", out)
    assert done.exit_code == 2 and not out.exists(), done.output
    assert (
        f"{config}: server.port: 127.0.0.1:{busy_port} is in use by another process (a server still "
        "running?); stop it, or set server.port to 0 to pick a free port for each arm"
    ) in done.stderr
    plan = invoke("experiment", "plan", "--config", config)
    assert plan.exit_code == 0 and f"  server.port: 127.0.0.1:{busy_port} is in use" in plan.stdout
    cfg = load_experiment_config(config)
    arm = build_plan(cfg)[0]
    receipt = run_arm(cfg, arm, out / "arms" / arm.id, Expected("0" * 64, {}, {}), 10.0)
    # another process's port is not the arm's failure: it is cut, and a resume runs it once it is free
    assert (receipt.status, receipt.data["interrupted_by"]) == ("interrupted", "port_busy")
    assert receipt.data["cut_step"] == "starting_server" and receipt.data["error"].startswith(
        f"server.port: 127.0.0.1:{busy_port} is held by pid {os.getpid()} ("
    )
    assert "process" not in receipt.data.get("server", {})  # no server was started


@pytest.mark.timeout(120)
def test_a_port_a_neighbour_binds_before_an_arm_stops_the_experiment_and_a_resume_runs_the_arm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A neighbour's server (vLLM reserves its port before it loads its model, and listens only then) bound
    the fixed port after the pre-flight: nothing accepted connections, so the arm started its server, which
    died on 'address already in use', and the arm failed, never to be run again, though nothing had been
    measured. Now the arm is not run (interrupted by ``port_busy``, before its server starts), the
    experiment stops with the reason (exit 1), and ``--resume`` runs it once the port is free."""
    port = free_port("127.0.0.1")
    cfg = lean(tmp_path, **{"server.port": port})
    out = tmp_path / "out"
    holder = socket.socket()  # bound, not listening: a connection to it is refused
    real_run_arm = runner_module.run_arm

    def neighbour_binds(*args: Any, **kwargs: Any) -> Any:
        if holder.getsockname()[1] == 0:
            holder.bind(("127.0.0.1", port))
        return real_run_arm(*args, **kwargs)

    monkeypatch.setattr(runner_module, "run_arm", neighbour_binds)
    try:
        outcome = ExperimentRunner(cfg, out, echo=lambda _: None).run()
    finally:
        holder.close()
    assert (outcome.status, outcome.exit_code) == ("stopped", 1), outcome.message
    assert (
        f"server.port: 127.0.0.1:{port} is held by a socket that is bound but does not listen (a server "
        "reserving it, such as a vLLM still loading its model); pair1-fifo was not run (interrupted, not "
        "failed): --resume runs it once the port is free"
    ) in outcome.message
    exp = read(out / "experiment.json")
    first = exp["arms"]["pair1-fifo"]
    assert (first["status"], first["interrupted_by"], first["cut_step"]) == (
        "interrupted",
        "port_busy",
        "starting_server",
    )
    assert exp["stages"]["comparison"]["status"] == "port_busy"
    assert "server" not in read(out / "arms" / "pair1-fifo" / "arm.json")  # no server was started
    monkeypatch.setattr(runner_module, "run_arm", real_run_arm)  # the neighbour has gone: the port is free
    resumed = ExperimentRunner(cfg, out, resume=True, echo=lambda _: None).run()
    assert (resumed.status, resumed.exit_code) == ("complete", 0), resumed.message
    exp = read(out / "experiment.json")
    assert {k: v["status"] for k, v in exp["arms"].items()} == {
        "pair1-fifo": "complete",
        "pair1-asyncroll": "complete",
    }
    assert exp["arms"]["pair1-fifo"]["attempts_interrupted"][0]["interrupted_by"] == "port_busy"


@pytest.mark.timeout(30)
def test_a_host_no_interface_has_is_refused_before_any_arm_with_a_free_port_too(tmp_path: Path) -> None:
    """With ``server.port`` 0 the pre-flight skipped the bind check: a ``server.host`` no local interface
    has created the output, failed the first arm ("unexpected error while checking_gpu: OSError") and
    stopped the experiment with exit 1, where a fixed port was refused with exit 2 and nothing made."""
    host = "192.0.2.1"  # TEST-NET-1 (RFC 5737): never a local address, refused at once, no name lookup
    config = write_config(tmp_path, **{"server.host": host, "stages": {}, "pairs": 1})
    out = tmp_path / "out"
    done = invoke("experiment", "run", "--config", config, "--output", out)
    assert done.exit_code == 2 and not out.exists(), done.output
    assert f"{config}: server.host/server.port: cannot bind {host}:0: " in done.stderr
    plan = invoke("experiment", "plan", "--config", config)
    assert plan.exit_code == 0 and f"  server.host/server.port: cannot bind {host}:0: " in plan.stdout


@pytest.mark.timeout(30)
def test_a_second_run_on_a_live_experiment_is_told_so_not_to_stop_its_server(
    tmp_path: Path, busy_port: int
) -> None:
    """The same command started twice (a second tmux pane): the live runner's arm holds the fixed port,
    and the second ``run`` was refused by the pre-flight for that port, with the advice to stop the
    server there, which is the live experiment's. It is now refused for the live runner, as ``--resume``
    is, touching nothing."""
    from asyncroll.experiment.lock import OutputLock

    config = write_config(tmp_path, **{"server.port": busy_port, "stages": {}, "pairs": 1})
    out = tmp_path / "out"
    out.mkdir()
    live = OutputLock.acquire(out)  # the live runner (another open file: flock refuses this process too)
    try:
        for resume in ([], ["--resume"]):
            done = invoke("experiment", "run", "--config", config, "--output", out, *resume)
            assert done.exit_code == 2, done.output
            assert f"the experiment is being run by pid {os.getpid()} " in done.stderr, done.stderr
            assert "pre-flight" not in done.stderr
    finally:
        live.release()
    assert [p.name for p in out.iterdir()] == ["experiment.lock"]


def fake_arms(calls: list[str]) -> Any:
    def run_arm(cfg: Any, plan: Any, arm_dir: Path, *args: Any, **kwargs: Any) -> Any:
        calls.append(plan.id)
        arm_dir.mkdir(parents=True)
        return SimpleNamespace(status="complete", data={"error": None})

    return run_arm


def test_a_resume_checks_the_setup_and_records_a_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The program is checked before the resume touches anything; the port once the dead runner's
    leftovers (which may hold it) are killed, and a refusal then is recorded, not left as running."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    serve = program(tmp_path)
    cfg = lean(tmp_path, **{"server.command": [str(serve)], "server.port": port})
    out = tmp_path / "out"
    calls: list[str] = []
    monkeypatch.setattr(runner_module, "run_arm", fake_arms(calls))
    assert ExperimentRunner(cfg, out, echo=lambda _: None).run().exit_code == 0
    before = (out / "experiment.json").read_bytes()
    serve.chmod(0o644)
    with pytest.raises(UsageError, match=r"server\.command\[0\]: .* is not executable"):
        ExperimentRunner(cfg, out, resume=True, echo=lambda _: None).run()
    assert (out / "experiment.json").read_bytes() == before  # refused before anything was touched
    serve.chmod(0o755)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        with pytest.raises(UsageError, match=f"server.port: 127.0.0.1:{port} is in use"):
            ExperimentRunner(cfg, out, resume=True, echo=lambda _: None).run()
    exp = read(out / "experiment.json")
    assert exp["status"] == "stopped" and exp["stop_reason"].startswith(
        f"--resume refused by the pre-flight check: server.port: 127.0.0.1:{port} is in use"
    )
    assert exp["resumes"][-1]["refused"] == exp["stop_reason"]
    assert read(out / "comparison.json")["experiment_status"] == "stopped"
    outcome = ExperimentRunner(cfg, out, resume=True, echo=lambda _: None).run()
    assert outcome.exit_code == 0 and read(out / "experiment.json")["stop_reason"] is None
    assert calls == ["pair1-fifo", "pair1-asyncroll"]  # nothing ran twice
    assert json.loads(before)["status"] == "complete"


@pytest.mark.timeout(30)
def test_a_resume_is_not_refused_for_the_port_its_dead_runners_server_still_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The killed runner's server, left running on the fixed port, is what the resume kills first: the
    port is checked after that, so the resume goes on instead of refusing because of its own leftover."""
    import contextlib
    import os
    import signal
    import sys
    import time

    from asyncroll.experiment.arms import ExperimentInterrupted
    from asyncroll.experiment.server import ManagedProcess, port_in_use

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    cfg = lean(tmp_path, **{"server.port": port})
    out = tmp_path / "out"
    listen = (
        "import socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        f"s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(60)"
    )
    stale = ManagedProcess([sys.executable, "-c", listen], tmp_path / "stale.log")

    def killed_runner(cfg: Any, plan: Any, arm_dir: Path, *args: Any, **kwargs: Any) -> Any:
        """The arm's server starts, then the runner is gone without stopping it (as after SIGKILL)."""
        arm_dir.mkdir(parents=True)
        stale.start()
        end = time.monotonic() + 10
        while not port_in_use("127.0.0.1", port):
            assert stale.poll() is None and time.monotonic() < end, stale.log.read_text()
            time.sleep(0.02)
        arm = {"status": "running_client", "server": {"process": stale.record()}}
        (arm_dir / "arm.json").write_text(json.dumps(arm))
        raise ExperimentInterrupted("SIGKILL")

    calls: list[str] = []
    try:
        monkeypatch.setattr(runner_module, "run_arm", killed_runner)
        assert ExperimentRunner(cfg, out, echo=lambda _: None).run().status == "interrupted"
        assert port_in_use("127.0.0.1", port)  # the leftover still holds the port
        monkeypatch.setattr(runner_module, "run_arm", fake_arms(calls))
        outcome = ExperimentRunner(cfg, out, resume=True, echo=lambda _: None).run()
    finally:
        if stale.popen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(stale.pid, signal.SIGKILL)
            stale.wait(10)  # the sweep reaped it already (psutil); this tells the Popen
    assert outcome.status == "complete" and calls == ["pair1-fifo", "pair1-asyncroll"], outcome.message
    attempt = read(out / "experiment.json")["arms"]["pair1-fifo"]["attempts_interrupted"][0]
    assert attempt["orphans"]["server"] == "killed"


# --- the declared GPU: read through nvidia-smi (a real subprocess) or NVML (the GPU edge, faked) ------


def fake_smi(tmp: Path) -> Path:
    """A directory holding an ``nvidia-smi`` that answers the GPU query with ``$GPU`` and the
    compute-apps query with ``$APPS``, as the real one prints them (``csv,noheader,nounits``)."""
    folder = tmp / "bin"
    folder.mkdir()
    smi = folder / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in --query-compute-apps*) printf "%s" "$APPS";; *) printf "%s\\n" "$GPU";; esac\n'
    )
    smi.chmod(0o755)
    return folder


def smi_only(tmp: Path, monkeypatch: pytest.MonkeyPatch, gpu_line: str, apps: str) -> None:
    """The GPU read through the fake ``nvidia-smi`` only (NVML fails), answering ``gpu_line`` and ``apps``
    (change them later with ``monkeypatch.setenv("GPU" | "APPS", …)``)."""
    from asyncroll.experiment import gpu

    def no_nvml(index: int) -> dict[str, Any]:
        raise RuntimeError("no NVML in this test")

    monkeypatch.setattr(gpu, "_read_nvml", no_nvml)
    monkeypatch.setenv("PATH", f"{fake_smi(tmp)}:{os.environ['PATH']}")
    monkeypatch.setenv("GPU", gpu_line)
    monkeypatch.setenv("APPS", apps)


@pytest.mark.timeout(30)
def test_a_gpu_that_does_not_report_utilisation_is_checked_for_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A MIG-partitioned GPU reports utilisation as ``[N/A]``: the arm failed as "unreadable" at
    ``checking_gpu`` whatever its state. Now that check is skipped and named; the others still hold."""
    from asyncroll.experiment import gpu
    from asyncroll.experiment.config import GpuSpec

    smi_only(tmp_path, monkeypatch, "NVIDIA H200 MIG 1g.18gb, GPU-abc, 12, 143771, [N/A], 570.1", "")
    record = gpu.check_gpu(GpuSpec(name_contains="H200", idle_wait_s=0))
    assert record["checked"] and record["utilization_pct"] is None and record["memory_used_mib"] == 12
    assert record["not_checked"] == ["utilisation (not reported by this GPU)"]
    monkeypatch.setenv("APPS", "4242\n")  # a compute process still running: busy, reported as such
    with pytest.raises(gpu.GpuCheckError, match=r"compute processes already running: \[4242\]"):
        gpu.check_gpu(GpuSpec(idle_wait_s=0))
    monkeypatch.setenv("APPS", "")
    monkeypatch.setenv("GPU", "NVIDIA H200, GPU-abc, 12, 143771, busy, 570.1")  # not [N/A]: unreadable
    with pytest.raises(gpu.GpuCheckError, match="declared but unreadable"):
        gpu.check_gpu(GpuSpec(idle_wait_s=0))


def test_nvml_not_supported_utilisation_is_missing_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    from types import ModuleType

    from asyncroll.experiment import gpu

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            self.value = value

    fake = ModuleType("pynvml")
    values: dict[str, Any] = {
        "NVMLError": NVMLError,
        "NVML_ERROR_NOT_SUPPORTED": 3,
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetHandleByIndex": lambda index: index,
        "nvmlDeviceGetName": lambda handle: b"NVIDIA H200",
        "nvmlDeviceGetUUID": lambda handle: "GPU-abc",
        "nvmlDeviceGetMemoryInfo": lambda handle: SimpleNamespace(used=2**30, total=2**37),
        "nvmlDeviceGetComputeRunningProcesses": lambda handle: [],
        "nvmlSystemGetDriverVersion": lambda: "570.1",
    }

    def not_supported(handle: int) -> None:
        raise NVMLError(3)

    values["nvmlDeviceGetUtilizationRates"] = not_supported
    for name, value in values.items():
        setattr(fake, name, value)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    reading = gpu.read_gpu(0)
    assert reading["source"] == "nvml" and reading["utilization_pct"] is None
    assert reading["memory_used_mib"] == 1024 and reading["name"] == "NVIDIA H200"

    def other_error(handle: int) -> None:
        raise NVMLError(999)

    def no_smi(index: int) -> dict[str, Any]:
        raise gpu.GpuCheckError("nvidia-smi not found")

    fake.nvmlDeviceGetUtilizationRates = other_error  # type: ignore[attr-defined]
    monkeypatch.setattr(gpu, "_read_smi", no_smi)
    with pytest.raises(gpu.GpuCheckError, match="NVML: NVMLError"):
        gpu.read_gpu(0)


@pytest.mark.timeout(60)
def test_a_gpu_another_job_keeps_busy_stops_the_experiment_and_a_resume_runs_the_arm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU still busy after ``idle_wait_s`` failed the first arm, which stopped the experiment; a failed
    arm is never run again, so the output directory was spent, though nothing had been measured. Now the
    arm is not run (interrupted by ``gpu_busy``, before any server starts), the experiment stops with the
    reason (exit 1), and ``--resume`` runs it once the GPU is idle."""
    smi_only(tmp_path, monkeypatch, "NVIDIA H200, GPU-abc, 30000, 143771, 95, 570.1", "4242\n")
    cfg = lean(tmp_path, gpu={"name_contains": "H200", "idle_wait_s": 0})
    out = tmp_path / "out"
    said: list[str] = []
    outcome = ExperimentRunner(cfg, out, echo=said.append).run()
    assert (outcome.status, outcome.exit_code) == ("stopped", 1)
    assert "GPU 0 not idle after 0s: 30000 MiB in use" in outcome.message
    assert "pair1-fifo was not run (interrupted, not failed): --resume runs it once the GPU is idle" in (
        outcome.message
    )
    exp = read(out / "experiment.json")
    first = exp["arms"]["pair1-fifo"]
    assert (first["status"], first["interrupted_by"], first["cut_step"]) == (
        "interrupted",
        "gpu_busy",
        "checking_gpu",
    )
    arm = read(out / "arms" / "pair1-fifo" / "arm.json")
    assert arm["status"] == "interrupted" and "server" not in arm  # no server was started
    assert exp["arms"]["pair1-asyncroll"]["status"] == "pending"
    # the wrong GPU is the setup's fault, not another job's: the arm fails, as before
    monkeypatch.setenv("GPU", "NVIDIA A100, GPU-abc, 12, 81920, 0, 570.1")
    (tmp_path / "w").mkdir()
    other = lean(tmp_path / "w", gpu={"name_contains": "H200", "idle_wait_s": 0})
    wrong = ExperimentRunner(other, tmp_path / "wrong", echo=said.append).run()
    failed = read(tmp_path / "wrong" / "experiment.json")["arms"]["pair1-fifo"]
    assert failed["status"] == "failed" and "does not contain 'H200'" in failed["error"], wrong.message
    calls: list[str] = []
    monkeypatch.setattr(runner_module, "run_arm", fake_arms(calls))
    monkeypatch.setenv("GPU", "NVIDIA H200, GPU-abc, 12, 143771, 0, 570.1")
    monkeypatch.setenv("APPS", "")
    resumed = ExperimentRunner(cfg, out, resume=True, echo=said.append).run()
    assert resumed.exit_code == 0, resumed.message
    assert calls == ["pair1-fifo", "pair1-asyncroll"]
    assert {k: v["status"] for k, v in read(out / "experiment.json")["arms"].items()} == {
        "pair1-fifo": "complete",
        "pair1-asyncroll": "complete",
    }


@pytest.mark.timeout(60)
def test_the_plan_prints_the_servers_environment_and_the_arm_records_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``server.env`` (CUDA_VISIBLE_DEVICES, an attention backend) reaches the server, but the plan's
    "server:" line left it out: the server started by hand from the printed plan (docs/SINGLE_GPU.md,
    step 4) was not the one ``run`` starts, and arm.json did not say it either. Now the line starts with
    ``env NAME=VALUE`` and is, word for word, what the arm ran; the arm records the environment."""
    import shlex

    import asyncroll.experiment.arms as arms_module
    from asyncroll.experiment.server import free_port
    from tests.lean_experiment import one_arm, ready_server

    server = ready_server(tmp_path)
    # the wrapper prints what the server's environment holds, then runs the server
    server["command"] = ["sh", "-c", 'echo "mark=$QA_MARK"; exec "$@"', "sh", *server["command"]]
    server.update(port=free_port("127.0.0.1"), env={"QA_MARK": "two words"})
    config = write_config(tmp_path, stages={}, pairs=1, server=server)
    plan = invoke("experiment", "plan", "--config", config)
    assert plan.exit_code == 0, plan.stderr
    line = next(ln for ln in plan.stdout.splitlines() if ln.startswith("  server: "))
    assert line.startswith("  server: env 'QA_MARK=two words' sh -c ")
    monkeypatch.setattr(arms_module, "client_command", lambda *_args: ["true"])
    arm = one_arm(lean(tmp_path, server=server), tmp_path / "out")
    assert arm["server"]["env"] == {"QA_MARK": "two words"}
    assert line == "  server: " + shlex.join(["env", "QA_MARK=two words", *arm["server"]["command"]])
    assert "mark=two words" in (tmp_path / "out" / "arms" / "pair1-fifo" / "server.log").read_text()


LCB_EXAMPLE = str(Path(__file__).resolve().parents[1] / "examples" / "livecodebench" / "workload.jsonl")


def test_a_code_workload_this_machines_sandbox_cannot_isolate_is_refused_before_any_arm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As an ordinary user each arm's client refused to run untrusted code (exit 2) only once its server
    was up, a model loaded for minutes, and the first stage then failed its gate as if that were a
    result, using up the output directory."""
    monkeypatch.setattr(runner_module.cgroups_v2, "prepare_for_children", lambda: None)  # this process stays
    monkeypatch.setattr(preflight, "isolation_report", lambda: {"weak": True, "missing": ["pid_namespace"]})
    calls: list[str] = []
    monkeypatch.setattr(runner_module, "run_arm", fake_arms(calls))
    code = {"workload.path": LCB_EXAMPLE, "workload.sha256": None}
    out = tmp_path / "out"
    with pytest.raises(UsageError) as refused:
        ExperimentRunner(lean(tmp_path, **code), out, echo=lambda _: None, warn=lambda _: None).run()
    assert "no arm was started" in str(refused.value) and "sandbox lacks pid_namespace" in str(refused.value)
    assert "clients of fifo, asyncroll would refuse" in str(refused.value)
    assert '"--allow-weak-isolation" to client.extra_args' in str(refused.value)
    assert not out.exists() and calls == []
    # allowed in every arm (the client's own flags, or each arm's), nothing is refused
    allowed = lean(tmp_path, **code, **{"client.extra_args": ["--allow-weak-isolation"]})
    assert ExperimentRunner(allowed, out, echo=lambda _: None, warn=lambda _: None).run().exit_code == 0
    assert calls == ["pair1-fifo", "pair1-asyncroll"]
    # one arm that does not allow it is refused, by name
    arms = [{"name": "fifo", "policy": "fifo"}, {"name": "asyncroll", "policy": "asyncroll"}]
    arms[0]["extra_args"] = ["--allow-weak-isolation"]  # type: ignore[assignment]
    mixed = lean(tmp_path, **code, **{"arms": arms})
    with pytest.raises(UsageError, match="clients of asyncroll would refuse"):
        ExperimentRunner(mixed, tmp_path / "mixed", echo=lambda _: None, warn=lambda _: None).run()


def test_a_code_workload_with_no_usable_temporary_folder_is_refused_before_any_arm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only /tmp and a TMPDIR missing: each client refused only once its server was up (its
    isolation probe could make no scratch folder), and the pre-flight probe's own failure read as 'no
    verdict', so every arm was started anyway, even with weak isolation allowed."""
    monkeypatch.setattr(runner_module.cgroups_v2, "prepare_for_children", lambda: None)
    monkeypatch.setattr(preflight, "isolation_report", lambda: {})  # the probe's process failed
    missing = tmp_path / "missing"
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setattr(tempfile, "_candidate_tempdir_list", lambda: [str(missing)])
    calls: list[str] = []
    monkeypatch.setattr(runner_module, "run_arm", fake_arms(calls))
    code = {"workload.path": LCB_EXAMPLE, "workload.sha256": None}
    allowed = lean(tmp_path, **code, **{"client.extra_args": ["--allow-weak-isolation"]})
    out = tmp_path / "out"
    with pytest.raises(UsageError) as refused:
        ExperimentRunner(allowed, out, echo=lambda _: None, warn=lambda _: None).run()
    assert "no arm was started" in str(refused.value)
    assert "(lcb_evaluate), and untrusted code needs a folder for its scratch files: No usable" in str(
        refused.value
    )
    assert "set TMPDIR to a folder this user may write in" in str(refused.value)
    assert not out.exists() and calls == []


@pytest.mark.timeout(120)
def test_the_pre_flight_isolation_probe_is_the_clients() -> None:
    from tests.evaluations import ISOLATED

    report = preflight.isolation_report()
    assert report["weak"] is not ISOLATED and report["allowed_weak"] is False


@contextlib.contextmanager
def _reserved_as_vllm_reserves() -> Iterator[int]:
    """A loopback port bound with SO_REUSEADDR and SO_REUSEPORT, not listening (a loading vLLM's)."""
    with socket.socket() as reserved:
        reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "SO_REUSEPORT"):
            reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        reserved.bind(("127.0.0.1", 0))
        yield reserved.getsockname()[1]


def test_a_port_reserved_as_vllm_reserves_it_is_held_and_a_time_wait_is_not() -> None:
    """vLLM reserves its port with SO_REUSEADDR and SO_REUSEPORT before it loads its model, and listens only
    then. The probe binds with SO_REUSEADDR (an earlier arm's connection in TIME_WAIT must not count), which
    Linux lets it do beside such a socket: the port read as free, and the arm's server started on it beside
    the neighbour's. A port whose only other socket is a connection in TIME_WAIT stays free."""
    from asyncroll.experiment.port_busy import BOUND_ONLY, port_busy

    with _reserved_as_vllm_reserves() as port:
        assert port_busy("127.0.0.1", port) == f"server.port: 127.0.0.1:{port} is held by {BOUND_ONLY}"
    assert port_busy("127.0.0.1", port) is None

    with socket.socket() as server:  # the server closes first: its side of the connection is in TIME_WAIT
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            accepted, _ = server.accept()
            accepted.close()
            client.recv(1)  # the server's FIN
    assert port_busy("127.0.0.1", port) is None


def test_the_preflight_refuses_a_fixed_port_reserved_as_vllm_reserves_it() -> None:
    """The pre-flight binds with SO_REUSEADDR too: a port a loading vLLM had reserved (SO_REUSEADDR and
    SO_REUSEPORT, not listening yet) passed it, and each arm then met it."""
    from asyncroll.experiment.port_busy import BOUND_ONLY

    with _reserved_as_vllm_reserves() as port:
        cfg = SimpleNamespace(server=SimpleNamespace(host="127.0.0.1", port=port))
        assert preflight.port_problem(cfg) == (  # type: ignore[arg-type]
            f"server.port: 127.0.0.1:{port} is held by {BOUND_ONLY}; stop it, or set server.port to 0 to "
            "pick a free port for each arm"
        )
    assert preflight.port_problem(cfg) is None  # type: ignore[arg-type]


CLIENT_FLAG_CASES = {
    "out of range": (["--aging-weight", "-1"], "--aging-weight: Input should be greater than or equal to 0"),
    "not a number": (["--starvation-threshold", "x"], "Invalid value for '--starvation-threshold'"),
    "unknown flag": (["--aging-wieght", "0.1"], "No such option: --aging-wieght"),
    "help": (["--help"], "--help among them: the client would run nothing"),
    # client.extra_args gives it too: the client refuses an option given twice
    "given twice": (
        ["--no-allow-weak-isolation"],
        "Option '--allow-weak-isolation/--no-allow-weak-isolation' given 2 times",
    ),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", sorted(CLIENT_FLAG_CASES))
def test_an_arm_whose_client_would_refuse_its_flags_is_refused_before_any_arm(
    tmp_path: Path, case: str
) -> None:
    """An arm's extra_args its client refuses (exit 2) were found only when that arm's server had started,
    after the stages before it had run on the GPU: the activation gate failed as if that were a result."""
    extra, problem = CLIENT_FLAG_CASES[case]
    arms = [
        {"name": "fifo", "policy": "fifo"},
        {"name": "asyncroll", "policy": "asyncroll", "extra_args": extra},
    ]
    config = write_config(tmp_path, arms=arms, **{"client.extra_args": ["--allow-weak-isolation"]})
    out = tmp_path / "out"
    done = invoke("experiment", "run", "--config", config, "--output", out)
    assert done.exit_code == 2, done.stderr
    assert done.stderr.startswith("error: pre-flight check failed; no arm was started:")
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith(f"{config}: arms[asyncroll]: ")]
    assert len(lines) == 1 and problem in lines[0], done.stderr
    assert not out.exists()
    plan = invoke("experiment", "plan", "--config", config)
    assert plan.exit_code == 0 and "pre-flight on this machine, now" in plan.stdout
    assert "  arms[asyncroll]: " in plan.stdout and problem in plan.stdout and "arms[fifo]" not in plan.stdout


def test_the_shipped_experiments_clients_accept_their_flags() -> None:
    from asyncroll.experiment.config import load_experiment_config

    for path in sorted((Path(__file__).parents[1] / "experiments").glob("*.json")):
        assert preflight.client_flag_problems(load_experiment_config(path)) == [], path


def test_a_client_flag_every_arm_shares_is_named_once_with_its_arms(tmp_path: Path) -> None:
    from asyncroll.experiment.config import load_experiment_config

    config = write_config(tmp_path, **{"client.extra_args": ["--aging-weight", "-1"]})
    assert preflight.client_flag_problems(load_experiment_config(config)) == [
        "arms[fifo], arms[asyncroll]: the client's flags (client.extra_args and the arm's extra_args), as "
        "asyncroll run reads them: --aging-weight: Input should be greater than or equal to 0 (got -1)"
    ]


def test_an_arm_under_the_deprecated_alias_is_warned_about_by_the_runner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/RUNNING.md: gpu_first is a deprecated alias of tool_first, with a warning; an arm's warning
    went only to
    its client's log, which nobody reads when the arm completes."""
    monkeypatch.setattr(runner_module, "run_arm", fake_arms([]))
    arms = [{"name": "fifo", "policy": "fifo"}, {"name": "old", "policy": "gpu_first"}]
    warned: list[str] = []
    cfg = lean(tmp_path, arms=arms)
    assert (
        ExperimentRunner(cfg, tmp_path / "out", echo=lambda _: None, warn=warned.append).run().exit_code == 0
    )
    assert "warning: arms[old].policy: gpu_first is a deprecated alias of tool_first" in warned


def test_the_plan_warns_about_an_arm_under_the_deprecated_alias_as_the_run_does(tmp_path: Path) -> None:
    arms = [{"name": "fifo", "policy": "fifo"}, {"name": "old", "policy": "gpu_first"}]
    config = write_config(tmp_path, arms=arms, stages={}, baseline="fifo")
    plan = invoke("experiment", "plan", "--config", config)
    assert plan.exit_code == 0, plan.output
    assert "warning: arms[old].policy: gpu_first is a deprecated alias of tool_first" in plan.stderr
    assert "deprecated" not in plan.stdout  # the plan itself stays the commands
