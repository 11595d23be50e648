"""A paired experiment end to end on CPU, set up once for the module: serve-sim per arm, stages, a runner
SIGKILLed mid-arm and resumed; the clients' runs checked against the plan; the report and its figure."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import asyncroll
from asyncroll.experiment.config import load_experiment_config
from asyncroll.experiment.plan import ArmPlan, build_plan
from asyncroll.experiment.report import aggregate
from tests.children import end
from tests.conftest import invoke
from tests.experiments import (
    CLI,
    ROOT,
    SMOKE,
    alive,
    cli,
    kill_recorded,
    read,
    recorded_processes,
    wait_for_client,
)


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
        # The orphaned client's three problems could finish on their own before the resume (seconds to start
        # on a loaded machine) looks for it, which then found it 'gone', not 'killed'. Stopped, it is still
        # running when the resume comes, as a longer workload's would be (its SIGTERM waits; SIGKILL ends it).
        client = read(out / "arms" / "opportunity-1-fifo" / "arm.json")["client"]["process"]
        os.kill(client["pid"], signal.SIGSTOP)
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
    # ISO 8601 in UTC like every other *_at of the receipt (they were epoch seconds beside ISO strings)
    assert all(datetime.fromisoformat(at).utcoffset() == timedelta(0) for at in started.values())
    assert all(datetime.fromisoformat(a["finished_at"]) for a in exp["arms"].values() if "finished_at" in a)
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
        assert arm["server"]["listener"]["verified"] is True  # the socket that answered is its own
        assert arm["server"]["listener"]["pid"] == arm["server"]["process"]["pid"]
        assert arm["server"]["stop"]["how"] == "term" and arm["server"]["stop"]["leftover"] == []
        assert arm["client"]["exit_code"] == 0
        ports.add(arm["server"]["url"])
    assert len(ports) == len(order)  # one fresh server per arm
    assert not any(alive(p) for p in recorded_processes(out))
    comparison = read(out / "comparison.json")
    assert [p["complete"] for p in comparison["pairs"]] == [True, True]
    assert comparison["failed_arms"] == []
    # the engine's version each arm's client recorded (serve-sim answers GET /version as vLLM does)
    assert comparison["server_versions"]["GET /version"] == [f"asyncroll serve-sim {asyncroll.__version__}"]
    for pair in comparison["pairs"]:
        for arm in pair["arms"].values():
            assert arm["counts"]["completed"] == 3
            assert arm["metrics"]["completed_per_gpu_hour"] > 0


def test_the_clients_run_must_match_the_plan(experiment: dict[str, Any], tmp_path: Path) -> None:
    """After each arm, the client's run.json must show the plan's policy and seed and the experiment's
    pinned tool hashes, software versions and code, not only its workload (extra_args could once override)."""
    from asyncroll.experiment.client_check import ArmFailed, Expected, check_client

    out: Path = experiment["out"]
    exp = read(out / "experiment.json")
    plan = next(a for a in build_plan(load_experiment_config(SMOKE)) if a.id == "pair1-fifo")
    expected = Expected.from_fingerprint(exp["fingerprint"])

    gone = object()  # a run_changes value: the key is removed

    def check(
        run_changes: dict[str, Any],
        summary_changes: dict[str, Any],
        arm: ArmPlan = plan,
        code: int | None = 0,
        written: tuple[str, ...] = ("run.json", "summary.json"),
    ) -> str:
        run_dir = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        run_dir.mkdir()
        run, summary = (read(out / "arms" / "pair1-fifo" / "run" / n) for n in ("run.json", "summary.json"))
        for key, value in run_changes.items():
            node = run
            *parents, leaf = key.split(".")
            for part in parents:
                node = node[part]
            if value is gone:
                del node[leaf]
            else:
                node[leaf] = value
        summary.update(summary_changes)
        for name, data in (("run.json", run), ("summary.json", summary)):
            if name in written:
                (run_dir / name).write_text(json.dumps(data))
        return check_client(run_dir, code, tmp_path / "client.log", arm, expected).status

    assert check({}, {}) == "complete"
    with pytest.raises(ArmFailed, match=r"seed 99, not the plan's 20260927"):
        check({"config.seed": 99}, {})
    with pytest.raises(
        ArmFailed, match=r"policy 'tool_first' \(summary: 'tool_first'\), not the plan's 'fifo'"
    ):
        check({"config.policy": "tool_first"}, {"policy": "tool_first"})
    with pytest.raises(ArmFailed, match=r"tool file add: ran 0{64}, the experiment pinned None"):
        check({"tools.add": {"path": "/elsewhere/add.py", "sha256": "0" * 64}}, {})
    # a built-in tool the experiment pinned (None: no file) that the client's run lacks: not the same
    with pytest.raises(ArmFailed, match=r"tool file add: ran \(not recorded\), the experiment pinned None"):
        check({"tools.add": gone}, {})
    with pytest.raises(ArmFailed, match=r"software version httpx: ran 0\.0, the experiment pinned"):
        check({"versions.httpx": "0.0"}, {})
    # the client imported another asyncroll (another folder's copy): its source digest is not the runner's
    with pytest.raises(ArmFailed, match=r"code source_sha256: ran 0{64}, the experiment pinned [0-9a-f]{64}"):
        check({"code.source_sha256": "0" * 64}, {})
    with pytest.raises(ArmFailed, match=r"code package: ran None, the experiment pinned"):
        check({"code": None}, {})
    with pytest.raises(ArmFailed, match=r"workload sha256 0{64}, not the experiment's [0-9a-f]{64}"):
        check({"workload.sha256": "0" * 64}, {})
    # a package the experiment pinned that the client's run lacks, and one it ran that was not pinned
    with pytest.raises(
        ArmFailed, match=r"software version numpy: ran \(not recorded\), the experiment pinned \d"
    ):
        check({"versions.numpy": gone}, {})
    with pytest.raises(
        ArmFailed, match=r"software version torch: ran 2\.5, the experiment pinned \(not recorded\)"
    ):
        check({"versions.torch": "2.5"}, {})
    # the policy in run.json's config alone, or in the summary alone, is not the plan's
    with pytest.raises(ArmFailed, match=r"policy 'tool_first' \(summary: 'fifo'\), not the plan's 'fifo'"):
        check({"config.policy": "tool_first"}, {})
    with pytest.raises(ArmFailed, match=r"policy 'fifo' \(summary: 'tool_first'\), not the plan's 'fifo'"):
        check({}, {"policy": "tool_first"})
    # an arm of the deprecated alias: its summary names the policy it stands for
    old_name = dataclasses.replace(plan, policy="gpu_first")
    assert check({"config.policy": "gpu_first"}, {"policy": "tool_first"}, old_name) == "complete"
    # only the pinned parts of the code count (the describe and commit are not pinned)
    assert check({"code.describe": "elsewhere", "code.commit": "0" * 40}, {}) == "complete"
    with pytest.raises(ArmFailed, match=r"^client run ended failed$"):
        check({}, {"status": "failed"})
    with pytest.raises(
        ArmFailed, match=r"^client was killed by SIGKILL \(exit code -9\); log tail:\n\(empty log\)$"
    ):
        check({}, {}, code=-9)
    with pytest.raises(ArmFailed, match=r"client outputs unreadable: .*summary\.json"):
        check({}, {}, written=("run.json",))


@pytest.mark.timeout(180)
def test_report_and_figure(experiment: dict[str, Any], tmp_path: Path) -> None:
    out: Path = experiment["out"]
    # in this process (the module entry point below, and other modules, run ``report`` in its own)
    done = invoke("report", "--comparison", out / "comparison.json", "--output", tmp_path / "r", "--figure")
    assert done.exit_code == 0, done.stderr
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
    # the machine and settings, from the arms' run.json and the config (tests/test_report_machines.py)
    assert "Every comparison arm that left a run.json (4) ran its client on one machine and code: " in text
    assert "GPU: none declared." in text and "Client settings of every arm: " in text
    comparison = read(out / "comparison.json")
    for pair in comparison["pairs"]:
        del pair["arms"]["asyncroll"]["policy_rule"]  # as written before the field: the name alone
    (tmp_path / "old.json").write_text(json.dumps(comparison))
    old = invoke("report", "--comparison", tmp_path / "old.json", "--output", tmp_path / "old")
    assert old.exit_code == 0, old.stderr
    old_text = (tmp_path / "old" / "REPORT.md").read_text()  # the rule is said to be unrecorded
    assert "| metric | fifo (fifo) | asyncroll (asyncroll = rule not recorded) |" in old_text
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
    # drawn again: the same bytes, the PDF too (it held its /CreationDate, another at each draw)
    again = draw(comparison, aggregate(comparison), tmp_path / "again")
    assert [a.read_bytes() for a in again] == [p.read_bytes() for p in paths]
    assert b"/CreationDate" not in paths[1].read_bytes()  # the same second would hold the same date
