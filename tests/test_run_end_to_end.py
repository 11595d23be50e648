"""``asyncroll run`` as a user meets it, end to end in a real subprocess with real worker processes: the
files a run writes under every policy, an output or workload it refuses before anything exists, and a
long tool result cut before the model sees it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from asyncroll.config import build_config
from asyncroll.errors import UsageError
from tests.cli_runs import SMOKE, assert_gone, cli, load_run, worker_pids
from tests.conftest import invoke, tool_problem, write_workload

OUTPUT_FILES = {"run.json", "events.jsonl", "results.jsonl", "summary.json", "trace.json", "timeline.html"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("policy", ["fifo", "sync", "tool_first"])
def test_smoke_run_under_every_policy(tmp_path: Path, policy: str) -> None:
    out = tmp_path / "run"
    result = cli("run", "--workload", SMOKE, "--output", out, "--policy", policy)
    assert result.returncode == 0, result.stderr
    assert {p.name for p in out.iterdir()} >= OUTPUT_FILES
    receipt, summary, events = load_run(out)
    assert receipt["status"] == "complete" and receipt["error"] is None
    assert receipt["workload"]["sha256"] and receipt["config"]["policy"] == policy
    # every library whose code decides a result is named with its version (the predictor's fit: NumPy
    # and SciPy under scikit-learn: a result can only be reproduced with the same libraries)
    for library in ("scikit-learn", "numpy", "scipy", "threadpoolctl", "pydantic"):
        assert receipt["versions"][library], library
    # and every one that writes its outputs (orjson: each line's bytes, a float's digits) or carries its
    # requests (httpcore, h11 under httpx), parses its flags (click) or serves serve-sim (starlette, uvicorn)
    for library in ("orjson", "httpcore", "h11", "click", "starlette", "uvicorn"):
        assert receipt["versions"][library], library
    assert "nvidia-ml-py" in receipt["versions"]  # null where not installed: GPU telemetry
    assert summary["counts"]["completed"] == 3
    assert summary["tools"]["calls"] == 2
    assert summary["accuracy"]["exact"] == 1.0 and summary["accuracy"]["denominator"] == 3
    assert summary["policy"] == policy
    assert "completed" in result.stdout and "exact accuracy 1.000" in result.stdout
    assert "deprecated" not in result.stderr
    kinds = [e.event for e in events]
    assert kinds.index("measurement_started") < kinds.index("trajectory_started")
    assert kinds[-1] == "measurement_finished"
    assert len((out / "results.jsonl").read_text().splitlines()) == 3
    assert 0 < summary["bounds"]["lower_bound_s"] <= summary["makespan_s"]
    # the window ends with the last trajectory, as its events say: not later, at whatever the event loop
    # ran after it (a timed-out worker's kill made a run's makespan 2-7 ms longer than its work)
    assert summary["makespan_s"] == max(e.t for e in events if e.event == "trajectory_finished")
    # known (no worker replaced); CPU clocks tick at 10 ms, so a 60 ms run may honestly read 0
    assert summary["cpu_cost"]["total_cpu_s"] is not None and summary["cpu_cost"]["per_completion_s"] >= 0
    json.loads((out / "trace.json").read_text())
    assert_gone(worker_pids(events))


@pytest.mark.timeout(60)
def test_a_receipt_names_the_code_cpu_and_environment_that_change_a_result(tmp_path: Path) -> None:
    """run.json named asyncroll by its version alone (0.1.0 in every checkout, dirty or not), the machine
    without its CPU model and none of the environment that changes what a run does: docs/RUNNING.md's
    advice to
    set OMP_NUM_THREADS=1 for CPU-bound tools, PYTHONHASHSEED, TZ, a proxy. Now ``code`` is the package
    as an experiment's fingerprint names it (describe and commit of this checkout), ``host.cpu_model`` the
    CPU, and ``environment`` those variables where set, a proxy's password masked, nothing else (no key)."""
    import os
    import subprocess
    import sys

    from asyncroll.code_identity import code_version
    from asyncroll.outputs.receipt import cpu_model
    from tests.cli_runs import REPO

    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env |= {"OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "7", "TZ": "Europe/Paris", "SECRET_KEY": "sk-12345"}
    env |= {"https_proxy": "http://me:hunter2@proxy.example:3128", "no_proxy": "localhost"}
    done = subprocess.run(
        [sys.executable, "-m", "asyncroll.cli", "run", "--workload", SMOKE, "--output", out, "--no-progress"],
        capture_output=True, text=True, timeout=50, cwd=REPO, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    receipt, _, _ = load_run(out)
    assert receipt["code"] == code_version() and len(receipt["code"]["source_sha256"]) == 64
    assert receipt["code"]["commit"] is not None or not (REPO / ".git").exists()
    assert receipt["host"]["cpu_model"] == cpu_model()
    recorded = receipt["environment"]
    assert recorded["OMP_NUM_THREADS"] == "1" and recorded["TZ"] == "Europe/Paris"
    assert recorded["PYTHONHASHSEED"] == "7" and recorded["no_proxy"] == "localhost"
    assert recorded["https_proxy"] == "http://me:***@proxy.example:3128"
    text = (out / "run.json").read_text()
    assert "hunter2" not in text and "sk-12345" not in text and "SECRET_KEY" not in text


def test_existing_output_is_refused_and_untouched(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = cli("run", "--workload", SMOKE, "--output", out)
    assert result.returncode == 2
    assert "already exists" in result.stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"


def test_malformed_workload_names_file_line_field_and_creates_nothing(tmp_path: Path) -> None:
    workload = tmp_path / "bad.jsonl"
    workload.write_text(
        SMOKE.read_text() + '{"id": "x", "prompt": "p", "tools": [{"name": "nope"}], "script": []}\n'
    )
    out = tmp_path / "run"
    result = cli("run", "--workload", workload, "--output", out)
    assert result.returncode == 2
    assert f"{workload}:4: tools[0].name: unknown tool 'nope'" in result.stderr
    assert f"{workload}:4: script: must hold at least one action" in result.stderr
    assert not out.exists()
    validate = cli("validate", workload)
    assert validate.returncode == 2 and "2 errors in 1 of 4 workload lines" in validate.stderr
    ok = invoke("validate", SMOKE)
    sha = hashlib.sha256(SMOKE.read_bytes()).hexdigest()
    assert (ok.exit_code, ok.stdout) == (0, f"{SMOKE}: ok, 3 problems, 2 distinct tools, sha256 {sha}\n")
    one = write_workload(tmp_path / "one.jsonl", [tool_problem("p", model_ms=1, cpu_ms=1)])
    said = invoke("validate", one).stdout  # "1 problems, 1 distinct tools" before
    assert said.startswith(f"{one}: ok, 1 problem, 1 distinct tool, sha256 ")
    # validate refuses the options run refuses
    bogus = invoke("validate", SMOKE, "--backend", "bogus")
    assert bogus.exit_code == 2 and "choose from scripted, vllm, openai" in bogus.stderr
    nowhere = invoke("validate", SMOKE, "--tool-root", tmp_path / "missing")
    assert nowhere.exit_code == 2 and "missing: does not exist" in nowhere.stderr
    not_dir = invoke("validate", SMOKE, "--tool-root", SMOKE)
    assert not_dir.exit_code == 2 and f"--tool-root {SMOKE}: not a directory" in not_dir.stderr


def test_a_tool_root_that_is_a_symlink_loop_is_named_as_one(tmp_path: Path) -> None:
    """``--tool-root LOOP`` (a symlink to itself) ended run and simulate in 'RuntimeError: Symlink loop'
    tracebacks (Path.resolve on 3.11), and validate called it "does not exist"."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for args in (
        ("run", "--workload", SMOKE, "--output", tmp_path / "r", "--tool-root", loop),
        ("simulate", "--workload", SMOKE, "--output", tmp_path / "r", "--tool-root", loop),
        ("validate", SMOKE, "--tool-root", loop),
    ):
        result = invoke(*args)
        assert result.exit_code == 2, result.stderr or result.exception
        assert f"--tool-root {loop}: Too many levels of symbolic links" in result.stderr
        assert not (tmp_path / "r").exists()
    inside = invoke("validate", loop / "w.jsonl")  # a workload in it (its folder the tool root): a traceback
    assert inside.exit_code == 2 and f"{loop / 'w.jsonl'}: cannot read: Too many levels" in inside.stderr


def test_a_workload_in_a_missing_folder_is_named_not_the_default_tool_root(tmp_path: Path) -> None:
    from asyncroll.runtime.run import prepare

    workload = tmp_path / "missing" / "w.jsonl"
    cfg = build_config({"workload": workload, "output": tmp_path / "run"})
    with pytest.raises(UsageError, match=f"{workload}: cannot read"):
        prepare(cfg, ["test"])
    assert not (tmp_path / "run").exists()


def test_a_long_tool_result_is_cut_before_the_model_sees_it_and_counted(tmp_path: Path) -> None:
    """A tool's 50 MB result went back to the model whole, on every later turn; it is now cut to
    --max-observation-chars with a note, and summary.json counts the cut results."""
    from asyncroll.runtime.trajectory import cut_observation

    assert cut_observation("abcd", 6) == "abcd\n[tool result cut: the first 4 of 6 characters]"
    (tmp_path / "echo.py").write_text("def echo(n):\n    return 'x' * n\n")
    tool = {"name": "echo", "inputs": {"n": "int"}, "implementation": "echo.py"}
    problems = [
        {
            "id": f"n{n}",
            "prompt": "p",
            "tools": [tool],
            "script": [
                {"type": "tool", "name": "echo", "arguments": {"n": n}},
                {"type": "final", "answer": "ok"},
            ],
        }
        for n in (50, 500)
    ]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    out = tmp_path / "run"
    result = cli("run", "--workload", workload, "--output", out, "--max-observation-chars", "100")
    assert result.returncode == 0, result.stderr
    receipt, summary, events = load_run(out)
    assert receipt["config"]["max_observation_chars"] == 100
    assert summary["tools"]["observations_cut"] == 1
    cut = {e.id: e.observations_cut for e in events if e.event == "trajectory_finished"}
    assert cut == {"n50": 0, "n500": 1}
