"""Experiment configs refused before anything runs: client flags the plan manages, a negative seed, a
wrong workload SHA-256, an infinite setting, a gate on a metric the summary has not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from asyncroll.errors import UsageError
from asyncroll.experiment.config import MANAGED_CLIENT_FLAGS, load_experiment_config
from asyncroll.experiment.plan import build_plan, client_command
from tests.conftest import invoke
from tests.experiments import ROOT, write_config
from tests.lean_experiment import lean


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
    assert "is not the declared workload.sha256" in plan.stderr and plan.stderr == run.stderr
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
    lcb = hashlib.sha256(workload.read_bytes()).hexdigest()
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
    # the workload and its hash came from the script's options: they are named, not the config's settings
    said = f"error: --workload {workload}: sha256 {lcb} is not the declared --workload-sha256 {wrong}; "
    assert refused.out == "" and refused.err.startswith(said), refused.err
    missing = tmp_path / "missing.jsonl"
    assert script.main([*args[:5], str(missing), *args[6:], "--workload-sha256", lcb]) == 2
    assert capsys.readouterr().err.startswith(f"error: --workload {missing}: cannot read"), missing
    # a refused value of the script's own options is blamed on the option, not the config file
    assert script.main([*args, "--workload-sha256", "abc"]) == 2
    assert capsys.readouterr().err == "error: --workload-sha256: sha256 must be 64 lowercase hex digits\n"
    assert script.main([*args[:3], "", *args[4:]]) == 2
    assert capsys.readouterr().err.startswith("error: --model-path: String should have at least 1 character")
    assert script.main([*args, "--workload-sha256", lcb]) == 0
    assert f"expected sha256 {lcb}" in capsys.readouterr().out
    assert not (tmp_path / "lcb").exists()


def test_an_infinite_setting_is_refused_by_the_config(tmp_path: Path) -> None:
    """JSON allows Infinity; an arm's client would refuse it only after the server had started."""
    config = write_config(tmp_path, **{"client.tool_timeout": float("inf")})
    with pytest.raises(UsageError, match="tool_timeout: Input should be a finite number"):
        load_experiment_config(config)


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


def _without_default_additional_properties(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            key: _without_default_additional_properties(value)
            for key, value in node.items()
            if not (key == "additionalProperties" and value is True)
        }
    return [_without_default_additional_properties(v) for v in node] if isinstance(node, list) else node


def test_a_gate_below_an_untyped_section_is_accepted_as_pydantic_before_2_11_writes_the_schema(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pydantic 2.10 (the floor) writes a ``dict[str, Any]`` section as ``{"type": "object"}``, leaving
    out ``additionalProperties: true`` (JSON Schema's default): a gate on ``model.failed.transport`` was
    refused with "summary.json.model has no 'failed'" (found with every dependency at its floor)."""
    from asyncroll.experiment.config import metric_problem
    from asyncroll.schemas import SummaryModel

    schema = _without_default_additional_properties(SummaryModel.model_json_schema())
    monkeypatch.setattr(SummaryModel, "model_json_schema", classmethod(lambda cls: schema))
    assert metric_problem("model.failed.transport") is None
    assert metric_problem("counts.completed") is None
    assert metric_problem("status.x") == "summary.json.status has no 'x'"
    assert str(metric_problem("counts.nonexistent")).startswith("summary.json.counts has no 'nonexistent'")


def test_an_experiment_config_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    """A config saved by Notepad (a UTF-8 byte order mark) was refused: "invalid JSON: Unexpected UTF-8
    BOM (decode using utf-8-sig)"; a workload with one is accepted."""
    config = write_config(tmp_path, seed=7)
    config.write_bytes(b"\xef\xbb\xbf" + config.read_bytes())
    assert load_experiment_config(config).seed == 7


def test_an_experiment_config_or_comparison_past_its_size_is_refused_unread(tmp_path: Path) -> None:
    """``--config /dev/zero`` (or a model file given by mistake) was read whole until memory ran out, as
    ``run --config`` was before its cap: a config is at most 1 MiB, a comparison.json at most 256 MiB."""
    config = write_config(tmp_path, seed=7)
    config.write_bytes(config.read_bytes() + b" " * (1 << 20))
    with pytest.raises(UsageError, match=r"\.json: larger than 1 MiB: not a file this command reads"):
        load_experiment_config(config)
    plan = invoke("experiment", "plan", "--config", "/dev/zero")
    assert (
        plan.exit_code == 2
        and plan.stderr == "error: /dev/zero: larger than 1 MiB: not a file this command reads\n"
    )
    report = invoke("report", "--comparison", "/dev/zero", "--output", tmp_path / "report")
    assert report.exit_code == 2 and "/dev/zero: larger than 256 MiB" in report.stderr
    assert not (tmp_path / "report").exists()


def test_an_experiment_setting_out_of_range_is_quoted_beside_its_bound(tmp_path: Path) -> None:
    """``run``'s flags and config files quote the value beside pydantic's bound (``(got 0)``); an
    experiment config said only ``client.max_turns: Input should be greater than or equal to 1``, and
    the arm's ``stop_grace_s`` or ``port`` its user had to find in the file."""
    with pytest.raises(UsageError) as refused:
        lean(tmp_path, **{"client.max_turns": 0, "server.port": 70000, "server.stop_grace_s": -0.5})
    said = str(refused.value)
    assert "client.max_turns: Input should be greater than or equal to 1 (got 0)" in said, said
    assert "server.port: Input should be less than or equal to 65535 (got 70000)" in said, said
    assert "server.stop_grace_s: Input should be greater than or equal to 0 (got -0.5)" in said, said


def test_a_workload_path_not_found_names_the_setting_in_the_plan_and_the_run(tmp_path: Path) -> None:
    """A relative ``workload.path`` is taken from the config's folder: one not found there is refused
    naming the setting (as ``run`` names ``--workload``), not only as a path the user never wrote."""
    config = write_config(tmp_path, **{"workload.path": "../examples/smoke.jsonl"})
    missing = f"{config}: workload.path {tmp_path / '..' / 'examples' / 'smoke.jsonl'}: cannot read"
    run = invoke("experiment", "run", "--config", config, "--output", tmp_path / "out")
    plan = invoke("experiment", "plan", "--config", config)
    assert run.exit_code == plan.exit_code == 2, plan.output
    assert missing in plan.stderr and missing in run.stderr, (plan.stderr, run.stderr)
    assert not (tmp_path / "out").exists()


def test_a_nul_in_a_path_or_argument_is_refused_naming_the_setting(tmp_path: Path) -> None:
    """JSON lets ``"\\u0000"`` through: a workload.path holding one ended ``experiment plan`` in a
    ``ValueError: embedded null byte`` traceback; no file name or argument can hold it."""
    for key, value in (("workload.path", "/tmp/w\x00.jsonl"), ("model.served_name", "m\x00")):
        config = write_config(tmp_path, **{key: value})
        with pytest.raises(UsageError, match=rf"{key}: .*a NUL character"):
            load_experiment_config(config)
        result = invoke("experiment", "plan", "--config", config)
        assert result.exit_code == 2 and "a NUL character" in result.stderr, result.stderr


def test_a_tool_root_or_workload_folder_that_is_a_symlink_loop_is_named(tmp_path: Path) -> None:
    """workload.tool_root (or the workload's folder) a symlink to itself ended ``experiment plan`` in a
    'RuntimeError: Symlink loop' traceback (Path.resolve on 3.11)."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for key, value, said in (
        ("workload.tool_root", str(loop), f"workload.tool_root {loop}: Too many levels of symbolic links"),
        ("workload.path", str(loop / "w.jsonl"), f"workload.path {loop / 'w.jsonl'}: cannot read: Too many"),
    ):
        config = write_config(tmp_path, **{key: value})
        result = invoke("experiment", "plan", "--config", config)
        assert result.exit_code == 2, result.exception
        assert f"{config}: {said}" in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("policy", "meant"), [("FIFO", "fifo"), ("asyncrol", "asyncroll"), ("tool-first", "tool_first")]
)
def test_an_unknown_arm_policy_names_the_known_ones_and_the_likely_one(
    tmp_path: Path, policy: str, meant: str
) -> None:
    """It said only "unknown policy 'FIFO'": run, simulate and bench list the names; a config did not."""
    arms = [{"name": "fifo", "policy": "fifo"}, {"name": "asyncroll", "policy": policy}]
    with pytest.raises(UsageError) as refused:
        lean(tmp_path, arms=arms)
    assert (
        f"arms[asyncroll].policy: unknown policy {policy!r} (did you mean {meant!r}?; known: sync, fifo, "
        in str(refused.value)
    )


def test_an_experiments_own_experiment_json_is_a_config_for_running_it_again(tmp_path: Path) -> None:
    """``experiment run --config RUN/experiment.json`` (as ``run --config RUN/run.json`` re-runs a run) was
    refused with a wall of 'unknown setting' lines, one per key of the receipt (``model: Field required``
    first), though the receipt holds the whole config. Now its ``config`` is read, the workload by the path
    it resolved; an arm.json or comparison.json is refused by its kind, in one line."""
    import json

    from asyncroll.experiment.receipts import ExperimentReceipt

    config = load_experiment_config(write_config(tmp_path))
    out = tmp_path / "done"
    out.mkdir()
    body = {"name": config.name, "config": config.model_dump(mode="json")}
    ExperimentReceipt.create(out / "experiment.json", body)
    again = load_experiment_config(out / "experiment.json")
    assert again == config
    plan = invoke("experiment", "plan", "--config", out / "experiment.json")
    assert plan.exit_code == 0, plan.output
    arm = tmp_path / "arm.json"
    arm.write_text(json.dumps({"schema_version": 1, "kind": "asyncroll.experiment.arm", "status": "done"}))
    with pytest.raises(UsageError) as refused:
        load_experiment_config(arm)
    assert str(refused.value) == (
        f"{arm}: a record of kind 'asyncroll.experiment.arm', not an experiment config: give the "
        "experiment's config file, or its experiment.json (whose 'config' is read)"
    )


def test_a_runs_run_json_given_as_an_experiment_config_is_refused_in_one_line(tmp_path: Path) -> None:
    """An arm's client run.json (``DIR/arms/.../run.json``) given to ``experiment plan --config`` was
    refused with one 'Field required' or 'unknown setting' line per key of the receipt (27 here), as an
    arm.json was before: it has no ``kind``. It is refused as what it is, in one line, naming the
    command that re-runs it."""
    from tests.cli_runs import SMOKE

    run = tmp_path / "run"
    done = invoke("run", "--workload", SMOKE, "--output", run, "--no-progress")
    assert done.exit_code == 0, done.output
    with pytest.raises(UsageError) as refused:
        load_experiment_config(run / "run.json")
    message = str(refused.value)
    assert message.startswith(f"{run / 'run.json'}: a run's run.json, not an experiment config"), message
    assert "asyncroll run --config" in message and "\n" not in message, message


def test_a_stop_grace_past_its_bound_is_refused_naming_file_and_field(tmp_path: Path) -> None:
    """The server's stop is cleanup, deaf to a further Ctrl-C: ``stop_grace_s`` 1e308 was accepted, and
    a server that ignored SIGTERM held the runner essentially forever."""
    from asyncroll.experiment.config import MAX_STOP_GRACE_S, ExperimentConfig

    config = write_config(tmp_path, **{"server.stop_grace_s": 1e308})
    with pytest.raises(UsageError) as refused:
        load_experiment_config(config)
    said = str(refused.value)
    assert f"{config}: server.stop_grace_s: Input should be less than or equal to 600" in said, said
    assert load_experiment_config(write_config(tmp_path, **{"server.stop_grace_s": MAX_STOP_GRACE_S}))
    schema = ExperimentConfig.model_json_schema()["$defs"]["ServerSpec"]["properties"]["stop_grace_s"]
    assert schema["maximum"] == MAX_STOP_GRACE_S
    protocol = " ".join((ROOT / "PROTOCOL.md").read_text(encoding="utf-8").split())
    assert f"`server.stop_grace_s`, is at most {MAX_STOP_GRACE_S:g} s" in protocol
