"""REPORT.md states the machine and settings its numbers came from (the standard: every figure states its
machine and settings): comparison.json records each comparison arm's client machine and code (its
run.json) and GPU (its arm.json), grouped, and the experiment's settings; arms that ran on different
machines or code are named as such; a comparison.json written before they were recorded says so."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from asyncroll.experiment.comparison import validate_comparison
from asyncroll.experiment.machines import arm_machine, machine_lines
from asyncroll.experiment.report import aggregate
from asyncroll.experiment.report_markdown import markdown
from tests.fake_comparison import comparison

ROWS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"makespan_s": 2.0}, {"makespan_s": 1.0}),
    ({"makespan_s": 4.0}, {"makespan_s": 3.0}),
]
HOST = {
    "hostname": "box",
    "platform": "Linux-6.1-x86_64",
    "cpu_model": "AMD EPYC",
    "cpu_count": 16,
    "usable_cpus": 8,
    "cpu_quota": None,
    "memory_bytes": 128 * 2**30,
    "python_executable": "/opt/py/bin/python3",
}


def _arm(root: Path, arm_id: str, describe: str = "abc1234", gpu: dict[str, Any] | None = None) -> Path:
    arm = root / arm_id
    (arm / "run").mkdir(parents=True)
    run = {"host": HOST, "versions": {"python": "3.11.7"}, "code": {"package": "0.1.0", "describe": describe}}
    (arm / "run" / "run.json").write_text(json.dumps(run))
    record = (
        {"declared": False, "checked": False} if gpu is None else {"declared": True, "checked": True, **gpu}
    )
    (arm / "arm.json").write_text(json.dumps({"gpu": record}))
    return arm


def _machines(tmp_path: Path, describes: dict[str, str]) -> dict[str, Any]:
    data = comparison(ROWS)
    from asyncroll.experiment.comparison import build_comparison  # rebuilt with the machines

    ids = [e["id"] for pair in data["pairs"] for e in pair["arms"].values()]
    machines = {i: arm_machine(_arm(tmp_path, i, describes.get(i, "abc1234"))) for i in ids}
    experiment = _experiment_of(data)
    return build_comparison(experiment, _summaries_of(data), None, machines)


def _experiment_of(data: dict[str, Any]) -> dict[str, Any]:
    """experiment.json's data behind :func:`tests.fake_comparison.comparison` (the same two arms)."""
    from tests.fake_comparison import two_arms

    config = {
        **two_arms(),
        "model": {"served_name": "qwen", "path": "Qwen/Qwen2.5-7B", "revision": "r1"},
        "workload": {"path": "/data/w.jsonl", "sha256": "a" * 64, "description": "eight problems"},
        "server": {"kind": "vllm"},
        "client": {"max_active_trajectories": 8, "replay": True, "extra_args": [], "deadline_s": 60.0},
        "gpu": None,
    }
    config["arms"][1]["extra_args"] = ["--starvation-threshold", "2"]
    plan = [
        {"id": e["id"], "stage": "comparison", "pair": p["pair"] - 1, "arm": arm, "policy": arm, "seed": 0}
        for p in data["pairs"]
        for arm, e in p["arms"].items()
    ]
    return {
        "config": config,
        "status": "complete",
        "fingerprint": {"sha256": "f" * 64},
        "stages": {},
        "plan": plan,
        "arms": {step["id"]: {"status": "complete"} for step in plan},
    }


def _summaries_of(data: dict[str, Any]) -> dict[str, Any]:
    return {
        e["id"]: {"makespan_s": e["metrics"]["makespan_s"], "counts": {"completed": 3}}
        for p in data["pairs"]
        for e in p["arms"].values()
    }


def test_one_machine_and_the_settings_are_stated_once(tmp_path: Path) -> None:
    data = _machines(tmp_path, {})
    validate_comparison(copy.deepcopy(data))
    assert [len(group["arms"]) for group in data["machines"]] == [4]
    assert data["machines"][0]["client"] == {
        "cpu_model": "AMD EPYC",
        "cpu_count": 16,
        "usable_cpus": 8,
        "memory_bytes": 128 * 2**30,
        "platform": "Linux-6.1-x86_64",
        "python": "3.11.7",
        "asyncroll": "abc1234",
    }  # not the host's name nor the interpreter's path; no quota (null) is none to state
    text = markdown(aggregate(data))
    section = text[text.index("## Machine and settings") : text.index("## Stages")]
    assert (
        "Every comparison arm that left a run.json (4) ran its client on one machine and code: AMD EPYC, "
        "16 logical CPUs (8 usable), 128.0 GiB memory, Linux-6.1-x86_64, Python 3.11.7, asyncroll abc1234. "
        "GPU: none declared."
    ) in section
    assert "Model `qwen` (Qwen/Qwen2.5-7B, revision r1), server kind vllm" in section
    assert f"workload SHA-256 `{'a' * 64}` (eight problems)" in section
    assert "max_active_trajectories 8; replay true." in section  # JSON's spelling; no deadline, no empty args
    assert "An arm's own flags: b: --starvation-threshold 2." in section
    assert "/data/w.jsonl" not in section  # a path is the machine's, the SHA-256 the workload's


def test_arms_on_other_code_are_named(tmp_path: Path) -> None:
    data = _machines(tmp_path, {"pair2-b": "abc1234-dirty"})
    assert [group["arms"] for group in data["machines"]] == [["pair1-a", "pair1-b", "pair2-a"], ["pair2-b"]]
    section = markdown(aggregate(data)).split("## Machine and settings")[1]
    assert "**The comparison arms did not all run on the same machine, code or GPU:**" in section
    assert "- pair2-b: AMD EPYC, 16 logical CPUs (8 usable), 128.0 GiB memory, Linux-6.1-x86_64, " in section
    assert "asyncroll abc1234-dirty; GPU: none declared" in section


def test_a_declared_gpu_is_named_and_a_damaged_value_left_out(tmp_path: Path) -> None:
    arm = _arm(tmp_path, "x", gpu={"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-1", "driver": "550.54"})
    run = json.loads((arm / "run" / "run.json").read_text())
    run["host"]["cpu_count"] = "lots"  # hand-edited: not a number, left out as a missing value is
    (arm / "run" / "run.json").write_text(json.dumps(run))
    machine = arm_machine(arm)
    assert machine is not None and "cpu_count" not in machine["client"]
    assert machine["gpu"] == {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-1", "driver": "550.54"}
    lines = machine_lines([{**machine, "arms": ["x"]}], {})
    assert "CPUs unknown (8 usable)" in lines[2]
    assert "GPU: NVIDIA H100 80GB HBM3 (uuid GPU-1, driver 550.54)." in lines[2]
    assert arm_machine(tmp_path / "never-started") is None


def test_a_comparison_written_before_them_says_they_were_not_recorded() -> None:
    data = comparison(ROWS)
    del data["machines"], data["settings"]
    validate_comparison(copy.deepcopy(data))
    section = markdown(aggregate(data)).split("## Machine and settings")[1]
    assert section.split("\n\n")[1].startswith("Not recorded in this comparison.json")


def test_arms_that_left_no_run_json_make_the_machine_unknown() -> None:
    data = comparison(ROWS)  # built without machines: no arm's run.json was read
    assert data["machines"] == []
    text = markdown(aggregate(data))
    assert "Machine unknown: no comparison arm left a run.json (none ran its client)." in text


def test_an_arm_that_never_ran_its_client_is_no_other_machine(tmp_path: Path) -> None:
    """An interrupted experiment's pending arm (no run.json; or an arm.json alone, its server never up)
    was grouped as a machine of its own: the report said the arms ran on different machines."""
    from asyncroll.experiment.comparison import build_comparison

    data = comparison(ROWS)
    machines: dict[str, Any] = {i: arm_machine(_arm(tmp_path, i)) for i in ("pair1-a", "pair1-b", "pair2-a")}
    (tmp_path / "pair2-b").mkdir()
    (tmp_path / "pair2-b" / "arm.json").write_text(json.dumps({"gpu": {"declared": False}}))
    machines["pair2-b"] = arm_machine(tmp_path / "pair2-b")
    assert machines["pair2-b"] == {"client": None, "gpu": None}
    built = build_comparison(_experiment_of(data), _summaries_of(data), None, machines)
    assert [group["arms"] for group in built["machines"]] == [["pair1-a", "pair1-b", "pair2-a"]]
    text = markdown(aggregate(built))
    assert "Every comparison arm that left a run.json (3) ran its client on one machine and code: " in text


def test_the_figure_names_its_machine_in_one_line(tmp_path: Path) -> None:
    from asyncroll.experiment.machines import machine_caption

    one = _machines(tmp_path / "one", {})["machines"]
    assert machine_caption(one) == (
        "client: AMD EPYC, 8 usable CPUs, Python 3.11.7, asyncroll abc1234; GPU: none declared"
    )
    two = _machines(tmp_path / "two", {"pair1-a": "def5678"})["machines"]
    assert machine_caption(two) == "the arms ran on 2 different machines, code or GPUs: REPORT.md names them"
    assert machine_caption(None) == "machine not recorded (each arm's run.json has it)"
    assert machine_caption(comparison(ROWS)["machines"]) == "machine unknown (no arm left a run.json)"
