"""An experiment's config and plan: refusals before anything starts (a workload's SHA-256, the field
named, a free port the server is never told), ``plan`` on the LiveCodeBench config without a GPU, pair
orders, and the startup evidence read from a vLLM log."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from asyncroll.experiment.config import load_experiment_config
from asyncroll.experiment.plan import build_plan, client_command, pair_order, server_command
from asyncroll.experiment.server import startup_evidence
from tests.conftest import invoke
from tests.experiments import ROOT, SMOKE, cli, write_config


@pytest.mark.timeout(30)
def test_workload_sha256_mismatch_refuses_before_anything_starts(tmp_path: Path) -> None:
    config = write_config(tmp_path, **{"workload.sha256": "0" * 64})
    done = invoke("experiment", "run", "--config", config, "--output", tmp_path / "out")
    assert done.exit_code == 2 and "is not the declared workload.sha256" in done.stderr
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


@pytest.mark.timeout(30)
def test_a_plan_whose_workload_is_not_here_notes_it_and_run_refuses_it(tmp_path: Path) -> None:
    """Without a declared SHA-256 the plan does not read the workload (it may be printed elsewhere), but a
    file missing here is noted with the other pre-flight problems, not passed over in silence."""
    missing = tmp_path / "absent.jsonl"
    config = write_config(tmp_path, **{"workload.path": str(missing), "workload.sha256": None})
    done = invoke("experiment", "plan", "--config", config)
    assert done.exit_code == 0, done.stderr
    notes = done.stdout.split("pre-flight on this machine, now (`run` refuses until fixed):\n")[1]
    assert f"{config}: workload.path {missing}: no such file" in notes
    done = invoke("experiment", "run", "--config", config, "--output", tmp_path / "out")
    assert done.exit_code == 2 and str(missing) in done.stderr
    assert not (tmp_path / "out").exists()
    here = write_config(tmp_path, **{"workload.sha256": None})  # the smoke workload is here: no note
    assert "workload.path" not in invoke("experiment", "plan", "--config", here).stdout


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


def test_every_client_command_is_accepted_by_run_without_server_telemetry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """server.metrics_path null and gpu null: the plan adds --no-telemetry, and with it
    --telemetry-interval (which run refuses beside --no-telemetry): every arm failed at once with exit 2."""
    import asyncroll.commands.run as run_command
    from asyncroll.config import RunConfig

    accepted: list[RunConfig] = []

    def accept(cfg: RunConfig, *_: object) -> int:  # what run would run, not run
        accepted.append(cfg)
        return 0

    monkeypatch.setattr(run_command, "_run", accept)
    cfg = load_experiment_config(write_config(tmp_path, **{"server.metrics_path": None}))
    for arm in build_plan(cfg):
        command = client_command(cfg, arm, 8000, tmp_path / "arms" / arm.id / "run")
        assert "--no-telemetry" in command
        done = invoke(*command[command.index("run") :])
        assert done.exit_code == 0, done.stderr
    assert accepted and not any(c.telemetry for c in accepted)


def test_a_transformers_server_gets_no_metrics_url_unless_one_is_given(tmp_path: Path) -> None:
    """``transformers serve`` serves no ``/metrics``: with the default path every arm's client scraped a
    404 and warned it unavailable. Its default is now none; a path given is still used."""
    unset = load_experiment_config(write_config(tmp_path, **{"server.kind": "transformers"}))
    assert unset.server.metrics_path is None
    for arm in build_plan(unset):
        assert "--metrics-url" not in client_command(unset, arm, 8000, tmp_path / "run")
    given = load_experiment_config(
        write_config(tmp_path, **{"server.kind": "transformers", "server.metrics_path": "/m"})
    )
    assert given.server.metrics_path == "/m"
    vllm = load_experiment_config(write_config(tmp_path, **{"server.kind": "vllm"}))
    assert "--metrics-url" in client_command(vllm, build_plan(vllm)[0], 8000, tmp_path / "run")


@pytest.mark.timeout(60)
def test_a_client_imports_the_runners_asyncroll_whatever_folder_the_experiment_runs_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An installed asyncroll's experiment run from a folder holding another ``asyncroll`` (a checkout of
    another commit, say): ``python -m asyncroll run`` put the working directory first on ``sys.path``, so
    every arm's client ran that folder's code while experiment.json's fingerprint named the runner's, and
    so did serve-sim as the arms' server (``{python} -m asyncroll.cli serve-sim``)."""
    import os
    import subprocess

    from asyncroll.experiment import preflight
    from asyncroll.experiment.plan import client_environment

    other = tmp_path / "asyncroll"
    other.mkdir()
    (other / "__init__.py").write_text("raise SystemExit('not the runner s asyncroll')\n", encoding="utf-8")
    (other / "__main__.py").write_text("", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    cfg = load_experiment_config(write_config(tmp_path))
    command = client_command(cfg, build_plan(cfg)[0], 8000, tmp_path / "run")
    python = command[: command.index("run")]
    env = {**os.environ, **client_environment()}  # as ManagedProcess starts the client
    done = subprocess.run([*python, "--version"], capture_output=True, text=True, timeout=30, env=env)
    assert done.returncode == 0 and done.stdout.startswith("asyncroll "), done.stderr
    assert "layers" in preflight.isolation_report()  # the runner's probe of the sandbox: {} (no verdict)
    server = server_command(cfg, 8000)  # serve-sim's: {python} -m asyncroll.cli serve-sim
    python = server[: server.index("serve-sim")]
    done = subprocess.run([*python, "--version"], capture_output=True, text=True, timeout=30, env=env)
    assert done.returncode == 0 and done.stdout.startswith("asyncroll "), done.stderr


def test_a_server_on_another_python_is_started_as_written(tmp_path: Path) -> None:
    """``server.vars`` naming another ``{python}`` (another environment's serve-sim): the runner knows
    nothing of that interpreter, so it gets neither ``-P`` (an error before Python 3.11) nor the runner's
    site-packages first on its ``PYTHONPATH`` (another version's compiled packages); only the runner's own
    interpreter is started as a client is."""
    from asyncroll.experiment.plan import serves_this_asyncroll

    other = "/opt/other-env/bin/python"
    cfg = load_experiment_config(write_config(tmp_path, **{"server.vars": {"python": other}}))
    command = server_command(cfg, 8000)
    assert command[:3] == [other, "-m", "asyncroll.cli"], command
    assert not serves_this_asyncroll(cfg)
    own = load_experiment_config(write_config(tmp_path))
    assert server_command(own, 8000)[:2] == [sys.executable, "-P"] and serves_this_asyncroll(own)


@pytest.mark.timeout(60)
def test_a_client_imports_the_packages_the_runner_imported_from_the_users_pythonpath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lab's ``PYTHONPATH`` (``module load``: numpy, scipy of the cluster's build) comes before the
    site-packages of an installed asyncroll in the runner, which records those versions in the
    fingerprint. The client's path put the runner's whole site-packages before that ``PYTHONPATH``, so
    each client imported (and recorded) the site-packages' numpy instead, and every arm failed on
    'software version numpy: ran …, the experiment pinned …'. The runner's asyncroll goes after them."""
    import os
    import subprocess
    import sysconfig

    from asyncroll.experiment import plan
    from asyncroll.experiment.plan import client_environment

    lab = tmp_path / "lab"
    (lab / "numpy-0.0.1.dist-info").mkdir(parents=True)
    (lab / "numpy-0.0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: numpy\nVersion: 0.0.1\n"
    )
    site = sysconfig.get_paths()["purelib"]  # where a wheel installs asyncroll, its numpy beside it
    monkeypatch.setattr(plan, "_PACKAGE_ROOT", site)
    monkeypatch.setenv("PYTHONPATH", str(lab))
    probe = "from importlib import metadata; print(metadata.version('numpy'))"
    runner = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
    assert runner.stdout.strip() == "0.0.1", runner.stderr  # what the runner records
    env = {**os.environ, **client_environment()}  # as ManagedProcess starts the client
    client = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, timeout=30, env=env
    )
    assert client.stdout.strip() == "0.0.1", client.stderr
    assert env["PYTHONPATH"].split(os.pathsep) == [str(lab), site]


def test_a_printed_plan_gives_each_asyncroll_it_starts_the_path_run_gives_it(tmp_path: Path) -> None:
    """``experiment plan`` prints the commands ``run`` starts; ``run`` starts the clients (and asyncroll's
    own serve-sim) with ``-P`` and the runner's asyncroll folder on ``PYTHONPATH``, which the printed
    lines left out: started by hand from a checkout that is not installed, they found no asyncroll."""
    import shlex

    import asyncroll
    from asyncroll.experiment.plan import render_plan

    root = str(Path(asyncroll.__file__).resolve().parents[1])
    cfg = load_experiment_config(write_config(tmp_path))  # serve-sim as the arms' server
    lines = render_plan(cfg, tmp_path / "out").splitlines()
    for prefix in ("  server: ", "  client: "):
        line = next(ln for ln in lines if ln.startswith(prefix))
        words = shlex.split(line.removeprefix(prefix))
        assert words[0] == "env" and "-P" in words, words
        paths = next(w for w in words if w.startswith("PYTHONPATH=")).removeprefix("PYTHONPATH=")
        assert root in paths.split(os.pathsep), (paths, root)


@pytest.mark.timeout(60)
def test_a_client_imports_the_runners_asyncroll_though_the_users_pythonpath_holds_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user's ``PYTHONPATH`` goes first on a client's, but not where an entry holds another
    ``asyncroll`` than the runner's (a lab's shared install, another checkout, while the runner ran
    ``python -m asyncroll`` in its own): each client imported that one instead of the runner's."""
    import os
    import subprocess

    import asyncroll
    from asyncroll.experiment.plan import client_environment

    other = tmp_path / "other"
    (other / "asyncroll").mkdir(parents=True)
    (other / "asyncroll" / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(other))
    env = {**os.environ, **client_environment()}  # as ManagedProcess starts the client
    probe = "import asyncroll; print(asyncroll.__file__)"
    client = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, timeout=30, env=env
    )
    assert client.stdout.strip() == asyncroll.__file__, client.stderr


def test_a_runner_that_ignored_pythonpath_gives_its_clients_none_of_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under ``python -E`` (or ``-I``) the runner ignored the user's ``PYTHONPATH`` and pinned the
    packages of its own path; its clients were given that ``PYTHONPATH`` all the same, imported a lab's
    numpy there and every arm failed on 'software version numpy: ran …, the experiment pinned …'."""
    import os
    import types

    from asyncroll.experiment import plan
    from asyncroll.experiment.plan import client_environment

    flags = {name: getattr(sys.flags, name) for name in dir(sys.flags) if not name.startswith(("_", "n_"))}
    monkeypatch.setattr(sys, "flags", types.SimpleNamespace(**{**flags, "ignore_environment": 1}))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(("/lab/lib", "/lab/other")))
    assert client_environment() == {"PYTHONPATH": plan._PACKAGE_ROOT}


def test_a_server_env_pythonpath_keeps_the_runners_asyncroll_for_its_own_server(tmp_path: Path) -> None:
    """``server.env`` setting ``PYTHONPATH`` for asyncroll's own serve-sim replaced the runner's asyncroll
    folder there: the server ran whatever asyncroll those entries held (or, from a checkout not installed,
    found none), with nothing to say so. The entries are kept, the runner's folder goes after them."""
    import asyncroll
    from asyncroll.experiment.plan import server_environment

    root = str(Path(asyncroll.__file__).resolve().parents[1])
    lab = tmp_path / "lab"
    lab.mkdir()
    cfg = load_experiment_config(write_config(tmp_path, **{"server.env": {"PYTHONPATH": str(lab), "X": "1"}}))
    env = server_environment(cfg)
    assert env["X"] == "1" and env["PYTHONPATH"].split(os.pathsep) == [str(lab), root], env


def test_a_child_runs_without_the_users_site_packages_where_its_parent_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runtime started with ``python -s`` (or ``-I``) never saw the user's own site-packages; its
    workers, an experiment's clients and its own server were started without ``-s`` and could import a
    package from there that it never saw (outside a venv, or in a ``--system-site-packages`` one)."""
    import types

    from asyncroll.workers.spawn import child_flags

    assert child_flags() == (["-P", "-s"] if sys.flags.no_user_site else ["-P"])
    monkeypatch.setattr(sys, "flags", types.SimpleNamespace(no_user_site=1, ignore_environment=0))
    assert child_flags() == ["-P", "-s"]
    cfg = load_experiment_config(write_config(tmp_path))
    assert client_command(cfg, build_plan(cfg)[0], 8000, tmp_path / "run")[1:3] == ["-P", "-s"]
    assert server_command(cfg, 8000)[1:3] == ["-P", "-s"]  # asyncroll's own serve-sim
