"""Hostile inputs to `experiment plan|run --config` and `report --comparison`: each is a named error
(exit 2, the file, the field where there is one), never a traceback, and a refused report leaves no
partial output behind. Numbers the report writes are valid JSON (no NaN, no Infinity)."""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import asyncroll.experiment.report as report_module
from asyncroll.errors import OutputWriteError, UsageError
from asyncroll.experiment.comparison import MAX_MAGNITUDE, MIN_MAGNITUDE
from asyncroll.experiment.config import load_experiment_config
from asyncroll.experiment.report import load_comparison, write_report
from asyncroll.json_checks import LONE_SURROGATE
from tests.conftest import invoke
from tests.experiments import ROOT, write_config
from tests.fake_comparison import comparison as guarded_comparison


def refused(done: Any, *needles: str) -> None:
    """Exit 2 with a one-line error naming each of ``needles``, no traceback."""
    assert done.exit_code == 2, (done.exit_code, done.output, done.exception)
    assert isinstance(done.exception, SystemExit)
    assert "Traceback" not in done.output
    assert done.stderr.startswith("error: ")
    for needle in needles:
        assert needle in done.stderr, (needle, done.stderr)


# --- experiment config ---------------------------------------------------------------------------------


def config_text(tmp: Path) -> str:
    return write_config(tmp, stages={}, pairs=1).read_text(encoding="utf-8")


def test_a_config_that_is_not_utf8_is_a_named_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    raw = config_text(tmp_path).encode("utf-8")
    path.write_bytes(raw.replace(b'"description": "', b'"description": "\xff', 1))
    with pytest.raises(UsageError, match=r"bad\.json: not UTF-8 text \(invalid start byte at byte \d+\)"):
        load_experiment_config(path)
    refused(invoke("experiment", "plan", "--config", path), str(path), "not UTF-8")


def test_a_config_integer_past_the_digit_limit_is_a_named_error(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_text(config_text(tmp_path).replace('"pairs": 1', '"pairs": 1' + "0" * 4300, 1))
    with pytest.raises(
        UsageError, match=r"big\.json: invalid JSON: Exceeds the limit \(4300 digits\)"
    ) as info:
        load_experiment_config(path)
    assert "set_int_max_str_digits" not in str(info.value)
    refused(invoke("experiment", "plan", "--config", path), str(path), "4300 digits")


def test_a_config_nested_too_deeply_is_a_named_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"description": ' + "[" * 5000 + "]" * 5000 + "}")
    with pytest.raises(UsageError, match=r"deep\.json: invalid JSON: JSON nested deeper than 500 levels"):
        load_experiment_config(path)
    refused(invoke("experiment", "plan", "--config", path), str(path), "nested deeper")


def test_a_config_value_of_the_wrong_json_type_is_refused_not_converted(tmp_path: Path) -> None:
    """``"seed": true`` was read as 1, ``"dedicated_gpu": "no"`` as off and ``"max_tokens": 1e3`` as 1000,
    silently; each is now named. A JSON int where a float is taken stays fine."""
    path = write_config(
        tmp_path,
        stages={},
        pairs=1,
        seed=True,
        **{"client.dedicated_gpu": "no", "client.max_tokens": 1e3, "client.tool_timeout": 30},
    )
    with pytest.raises(UsageError) as info:
        load_experiment_config(path)
    said = str(info.value)
    for where, what in (("seed", "integer"), ("dedicated_gpu", "boolean"), ("max_tokens", "integer")):
        assert where in said and f"Input should be a valid {what}" in said, said
    assert "tool_timeout" not in said
    refused(invoke("experiment", "plan", "--config", path), "seed", "dedicated_gpu", "max_tokens")


def test_a_config_cut_short_says_where(tmp_path: Path) -> None:
    """It said "experiment.json:3: invalid JSON: Unterminated string starting at", the place left out."""
    path = tmp_path / "experiment.json"
    path.write_text('{\n  "name": "x",\n  "description": "cut sh')
    with pytest.raises(UsageError) as info:
        load_experiment_config(path)
    assert str(info.value) == f"{path}: invalid JSON: Unterminated string starting at (line 3, column 18)"


def test_a_section_that_is_no_object_is_named_without_a_python_class(tmp_path: Path) -> None:
    """pydantic said "Input should be a valid dictionary or instance of ModelSpec" (and ArmSpec, Stages):
    a class of the product's code, which the config's reader never sees."""
    path = write_config(
        tmp_path, model=None, stages=[], arms=[{"name": "fifo", "policy": "fifo"}, "asyncroll"]
    )
    with pytest.raises(UsageError) as info:
        load_experiment_config(path)
    assert str(info.value).splitlines() == [
        f"{path}: model: expected a JSON object, got null",
        f"{path}: arms.1: expected a JSON object, got a string",
        f"{path}: stages: expected a JSON object, got an array",
    ]


def test_a_gate_value_of_the_wrong_json_type_is_refused_not_converted(tmp_path: Path) -> None:
    """A gate's threshold was read laxly: ``"value": "3"`` as 3 and ``"value": true`` as 1, so a quoted or
    mistyped threshold judged a stage silently. It is a number, as every other number of the config."""
    for value in ("3", True):
        gates: list[dict[str, Any]] = [{"metric": "counts.completed", "op": ">=", "value": value}]
        path = write_config(tmp_path, stages={"qualification": {"arms": ["fifo"], "gates": gates}}, pairs=1)
        with pytest.raises(UsageError, match=r"stages\.qualification\.gates\.0\.value: Input should be"):
            load_experiment_config(path)
        refused(invoke("experiment", "plan", "--config", path), str(path), "gates.0.value")
    gates = [
        {"metric": "counts.completed", "op": ">=", "value": 3},
        {"metric": "accuracy.exact", "op": ">=", "value": 0.5},
    ]
    path = write_config(tmp_path, stages={"qualification": {"arms": ["fifo"], "gates": gates}}, pairs=1)
    stage = load_experiment_config(path).stages.qualification
    assert stage is not None and [g.value for g in stage.gates] == [3, 0.5]


def test_a_setting_in_the_wrong_section_or_misspelled_says_what_was_meant(tmp_path: Path) -> None:
    """``"cpu_workers"`` at the top level (it is ``client.cpu_workers``) or ``client.max_active`` were
    refused as "Extra inputs are not permitted", which says neither that the key is unknown nor where it
    belongs."""
    path = write_config(tmp_path, stages={}, pairs=1, cpu_workers=4, **{"client.max_active_trajectory": 4})
    with pytest.raises(UsageError) as info:
        load_experiment_config(path)
    said = str(info.value)
    assert f"{path}: cpu_workers: unknown setting (a setting of client: client.cpu_workers)" in said, said
    assert f"{path}: client.max_active_trajectory: unknown setting (did you mean " in said, said
    assert "'max_active_trajectories'?)" in said and "Extra inputs" not in said
    refused(invoke("experiment", "plan", "--config", path), "client.cpu_workers")
    # the policy is an arm's (it was "client.policy: unknown setting"), and a key of an arm is spelled
    # against an arm's settings (it was "arms.0.polcy: unknown setting")
    arms = [{"name": "a", "polcy": "fifo"}]
    path = write_config(tmp_path, stages={}, pairs=1, arms=arms, **{"client.policy": "fifo"})
    with pytest.raises(UsageError) as info:
        load_experiment_config(path)
    said = str(info.value)
    assert f"{path}: client.policy: unknown setting (a setting of arms[]: arms[].policy)" in said, said
    assert f"{path}: arms.0.polcy: unknown setting (did you mean 'policy'?)" in said, said
    # the same section's setting before another section's: ``gpu.name`` was hinted as arms[].name
    path = write_config(tmp_path, stages={}, pairs=1, gpu={"name": "H100"})
    with pytest.raises(UsageError) as info:
        load_experiment_config(path)
    said = str(info.value)
    assert f"{path}: gpu.name: unknown setting (did you mean 'name_contains'?)" in said, said


def test_a_config_key_given_twice_is_refused_not_last_wins(tmp_path: Path) -> None:
    path = tmp_path / "dup.json"
    path.write_text(config_text(tmp_path).replace('"pairs": 1', '"pairs": 2, "pairs": 7', 1))
    with pytest.raises(
        UsageError, match=r"dup\.json: invalid JSON: key 'pairs' is given twice in one object"
    ):
        load_experiment_config(path)
    refused(invoke("experiment", "plan", "--config", path), str(path), "'pairs' is given twice")
    refused(
        invoke("experiment", "run", "--config", path, "--output", tmp_path / "out"), "'pairs' is given twice"
    )
    assert not (tmp_path / "out").exists()


def test_a_config_string_that_is_not_unicode_is_refused_naming_its_field(tmp_path: Path) -> None:
    data = json.loads(config_text(tmp_path))
    data["server"]["command"].append("\ud800")  # json.dumps escapes it: "\ud800", valid JSON text
    path = tmp_path / "sur.json"
    path.write_text(json.dumps(data))
    where = f"server.command[{len(data['server']['command']) - 1}]"
    with pytest.raises(UsageError) as info:
        load_experiment_config(path)
    assert str(info.value) == f"{path}: {where}: {LONE_SURROGATE}"
    refused(invoke("experiment", "plan", "--config", path), str(path), where, "lone UTF-16 surrogate")
    data["server"]["command"].pop()
    data["server"]["env"] = {"\udc80": "x"}  # a key
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match=r"sur\.json: server\.env: not valid Unicode"):
        load_experiment_config(path)


def test_a_config_asking_for_more_bootstrap_resamples_than_the_report_can_draw_is_refused(
    tmp_path: Path,
) -> None:
    path = write_config(tmp_path, stages={}, pairs=1, bootstrap_resamples=10**10)
    with pytest.raises(
        UsageError, match="bootstrap_resamples: Input should be less than or equal to 1000000"
    ):
        load_experiment_config(path)
    assert load_experiment_config(write_config(tmp_path, stages={}, pairs=1, bootstrap_resamples=10**6))


def test_a_sound_config_still_loads(tmp_path: Path) -> None:
    data = json.loads(config_text(tmp_path))
    data["description"] = "emoji \U0001f600 and \u00e9"  # an escaped surrogate pair is valid Unicode
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(data))
    assert load_experiment_config(path).description == data["description"]


# --- report --comparison -------------------------------------------------------------------------------


def comparison(pairs: int = 2) -> dict[str, Any]:
    """A sound comparison.json of a two-arm experiment (a = fifo, the baseline; b = asyncroll), with one
    stage gate."""
    gate = {"metric": "counts.completed", "op": ">=", "value": 3.0, "arm": "a", "observed": 3.0}
    stages = {
        "qualification": {
            "status": "passed",
            "arms": ["qualification-1-a"],
            "gates": [{**gate, "passed": True, "note": None}],
            "failed_arms": [],
        }
    }

    def arm(p: int, later: bool) -> dict[str, Any]:
        return {"makespan_s": 10.0 + p + later, "throughput.completed_per_gpu_hour": 100.0 * (p + 1)}

    rows = [(arm(p, False), arm(p, True)) for p in range(pairs)]
    return guarded_comparison(rows, stages=stages)


def write(tmp: Path, data: dict[str, Any], name: str = "comparison.json") -> Path:
    path = tmp / name
    path.write_text(json.dumps(data))
    return path


def strict_json(path: Path) -> Any:
    def no_constant(name: str) -> Any:
        raise AssertionError(f"{path} holds {name}, which is not JSON")

    return json.loads(path.read_text(encoding="utf-8"), parse_constant=no_constant)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def report_refused(tmp_path: Path, path: Path, *needles: str) -> None:
    out = tmp_path / "r"
    refused(invoke("report", "--comparison", path, "--output", out), str(path), *needles)
    assert not out.exists(), "a refused comparison left part of a report"
    assert leftovers(tmp_path) == []


def metric(data: dict[str, Any], pair: int, arm: str, key: str, value: float) -> dict[str, Any]:
    data["pairs"][pair]["arms"][arm]["metrics"][key] = value
    return data


def test_a_sound_comparison_reports(tmp_path: Path) -> None:
    path = write(tmp_path, comparison())
    done = invoke("report", "--comparison", path, "--output", tmp_path / "r")
    assert done.exit_code == 0, done.output
    assert sorted(os.listdir(tmp_path / "r")) == ["REPORT.md", "aggregate.json"]
    assert strict_json(tmp_path / "r" / "aggregate.json")["fingerprint"] == "f" * 64
    assert leftovers(tmp_path) == []


CHANGES: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    # a TypeError when REPORT.md cut the fingerprint; aggregate.json was already written
    "fingerprint": (lambda c: c.update(fingerprint=1.5), "fingerprint: Input should be a valid string"),
    # a KeyError when REPORT.md named the gate's arm; aggregate.json was already written
    "gate_arm": (
        lambda c: c["stages"]["qualification"]["gates"][0].pop("arm"),
        "stages.qualification.gates[0].arm: Field required",
    ),
    "gate_observed": (
        lambda c: c["stages"]["qualification"]["gates"][0].pop("observed"),
        "stages.qualification.gates[0].observed: Field required",
    ),
    # -1e308 in one pair: statistics.stdev got -inf (AttributeError: 'float' has no 'numerator')
    "huge_negative": (
        lambda c: metric(c, 0, "b", "makespan_s", -1e308),
        "pairs[0].arms.b.metrics.makespan_s: -1e+308 is outside what the report computes with",
    ),
    # -1e308 as a baseline: rc 0, with -Infinity and Infinity written into aggregate.json
    "huge_baseline": (
        lambda c: metric(c, 1, "a", "completed_per_gpu_hour", -1e308),
        "pairs[1].arms.a.metrics.completed_per_gpu_hour: -1e+308 is outside",
    ),
    # a tiny baseline: the ratio 100 / 5e-324 overflows to inf
    "tiny_baseline": (
        lambda c: metric(c, 0, "a", "completed_per_gpu_hour", 5e-324),
        "pairs[0].arms.a.metrics.completed_per_gpu_hour: 5e-324 is outside",
    ),
    "huge_count": (
        lambda c: c["pairs"][0]["arms"]["a"]["counts"].update(completed=1e300),
        "pairs[0].arms.a.counts.completed: 1e+300 is outside",
    ),
    # REPORT.md is UTF-8: a lone surrogate in the experiment's name failed its write (UnicodeEncodeError)
    # 10^10 resamples: a MemoryError (149 GiB) in the bootstrap
    "resamples": (
        lambda c: c.update(bootstrap_resamples=10**10),
        "bootstrap_resamples: Input should be less than or equal to 1000000",
    ),
    "surrogate": (lambda c: c.update(experiment="x\ud800"), "experiment: not valid Unicode"),
    # a metric the file lists, left out of an arm (edited by hand): reported as "unknown (not measured)"
    "metric_left_out": (
        lambda c: c["pairs"][0]["arms"]["a"]["metrics"].pop("makespan_s"),
        "pairs[0] (pair 1).arms.a.metrics: no entry for ['makespan_s'] (null if not measured)",
    ),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_damaged_comparison_is_refused_and_writes_nothing(tmp_path: Path, change: str) -> None:
    data = comparison()
    damage, message = CHANGES[change]
    damage(data)
    path = write(tmp_path, data)
    with pytest.raises(UsageError, match=r"not a valid comparison\.json") as info:
        load_comparison(path)
    assert message in str(info.value)
    report_refused(tmp_path, path, message)


def test_a_comparison_of_an_experiment_in_a_folder_not_named_in_utf8_reports(tmp_path: Path) -> None:
    """An experiment whose --output is not UTF-8 (``exp-\\xe9``, or any non-ASCII name under ``LC_ALL=C``)
    records its runs' directories with the name's bytes as Python decodes them (``"exp-\\udce9"``): `report`
    refused the experiment's own comparison.json ("run_dir: not valid Unicode"). A failed arm's error that
    quotes such a path is written into REPORT.md (UTF-8) with its escape; ``"\\ud800"``, which no file
    name gives, stays refused."""
    folder = "exp-" + b"\xe9".decode("utf-8", "surrogateescape")
    data = comparison()
    for pair in data["pairs"]:
        for entry in pair["arms"].values():
            entry["run_dir"] = f"{folder}/arms/{entry['id']}/run"
    data["failed_arms"] = [{"id": "qualification-2-a", "error": f"no server: see {folder}/server.log"}]
    path = write(tmp_path, data)
    done = invoke("report", "--comparison", path, "--output", tmp_path / "r")
    assert done.exit_code == 0, done.output
    text = (tmp_path / "r" / "REPORT.md").read_bytes().decode("utf-8")
    assert "- `qualification-2-a`: no server: see exp-\\udce9/server.log" in text
    data["pairs"][0]["arms"]["a"]["run_dir"] = "exp-\ud800"
    (tmp_path / "bad").mkdir()
    report_refused(
        tmp_path / "bad", write(tmp_path / "bad", data), "pairs[0].arms.a.run_dir: not valid Unicode"
    )


def test_metric_values_at_the_bounds_give_finite_json(tmp_path: Path) -> None:
    """The extremes the report accepts: every statistic stays finite, aggregate.json is strict JSON."""
    data = comparison(pairs=3)
    for key in ("completed_per_gpu_hour", "makespan_s"):
        metric(data, 0, "a", key, MIN_MAGNITUDE)
        metric(data, 0, "b", key, MAX_MAGNITUDE)
        metric(data, 1, "a", key, MIN_MAGNITUDE)
        metric(data, 1, "b", key, -MAX_MAGNITUDE)
        metric(data, 2, "a", key, 0.0)
    data["pairs"][0]["arms"]["a"]["counts"].update(completed=MAX_MAGNITUDE, allocated_gpu_hours=MIN_MAGNITUDE)
    path = write(tmp_path, data)
    done = invoke("report", "--comparison", path, "--output", tmp_path / "r")
    assert done.exit_code == 0, done.output
    agg = strict_json(tmp_path / "r" / "aggregate.json")
    change = agg["paired"]["b"]["completed_per_gpu_hour"]["mean_difference_t95"]
    assert change["n"] == 3 and change["low"] is not None


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (
            "bigint",
            '{"schema_version": 1' + "0" * 4300 + "}",
            "invalid JSON: Exceeds the limit (4300 digits)",
        ),
        ("deep", '{"schema_version": ' + "[" * 5000 + "]" * 5000 + "}", "JSON nested deeper than 500 levels"),
        ("dup", '{"schema_version": 1, "schema_version": 1}', "key 'schema_version' is given twice"),
    ],
)
def test_a_comparison_json_past_the_parsers_limits_is_a_named_error(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    path = tmp_path / f"{name}.json"
    path.write_text(text)
    with pytest.raises(UsageError, match="invalid JSON") as info:
        load_comparison(path)
    assert message in str(info.value)
    report_refused(tmp_path, path, message)


def test_a_comparison_that_is_not_utf8_is_a_named_error(tmp_path: Path) -> None:
    path = tmp_path / "bin.json"
    path.write_bytes(b'{"kind": "\xff"}')
    report_refused(tmp_path, path, "not UTF-8 text")


def test_a_statistic_that_is_not_finite_is_refused_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aggregate.json is written with allow_nan=False: a non-finite number never reaches it."""
    real = report_module.aggregate

    def with_nan(data: dict[str, Any]) -> dict[str, Any]:
        agg = real(data)
        agg["medians"]["a"]["makespan_s"] = float("nan")
        return agg

    monkeypatch.setattr(report_module, "aggregate", with_nan)
    path = write(tmp_path, comparison())
    with pytest.raises(UsageError, match="not a finite number"):
        write_report(path, tmp_path / "r", figure=False)
    assert not (tmp_path / "r").exists() and leftovers(tmp_path) == []


def test_a_report_that_fails_midway_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The files are written into a temporary folder next to the output, renamed to it at the end."""

    def full_disk(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report_module, "markdown", lambda agg: "# report\n")
    monkeypatch.setattr(Path, "write_text", full_disk)
    path = tmp_path / "comparison.json"
    path.write_bytes(json.dumps(comparison()).encode())
    with pytest.raises(OutputWriteError, match="cannot write the report: No space left on device"):
        write_report(path, tmp_path / "r", figure=False)  # exit 1: not a usage error
    assert not (tmp_path / "r").exists() and leftovers(tmp_path) == []


def test_a_report_written_again_replaces_only_its_own_files(tmp_path: Path) -> None:
    path = write(tmp_path, comparison())
    out = tmp_path / "r"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "aggregate.json").write_text("old")
    (out / "figure.png").write_text("an old figure")
    written = write_report(path, out, figure=False)
    assert written == [out / "aggregate.json", out / "REPORT.md"]
    assert sorted(os.listdir(out)) == ["REPORT.md", "aggregate.json", "notes.txt"]
    assert (out / "notes.txt").read_text() == "mine"
    assert strict_json(out / "aggregate.json")["pairs_complete"] == 2
    broken = comparison()
    broken["fingerprint"] = 1.5
    with pytest.raises(UsageError, match="fingerprint"):
        write_report(write(tmp_path, broken, "broken.json"), out, figure=False)
    assert sorted(os.listdir(out)) == ["REPORT.md", "aggregate.json", "notes.txt"]  # untouched
    assert strict_json(out / "aggregate.json")["pairs_complete"] == 2


def test_a_report_into_a_folder_that_holds_no_report_never_replaces_files_of_the_same_names(
    tmp_path: Path,
) -> None:
    # `--output ~/paper` (a folder of one's own, never given to report before): its REPORT.md was
    # replaced and its figure.png deleted ("a figure an earlier call drew"; none had).
    path = write(tmp_path, comparison())
    out = tmp_path / "paper"
    out.mkdir()
    (out / "REPORT.md").write_text("my own report")
    (out / "figure.png").write_text("my own figure")
    with pytest.raises(UsageError, match=r"paper holds REPORT\.md, figure\.png but no aggregate\.json"):
        write_report(path, out, figure=False)
    assert sorted(os.listdir(out)) == ["REPORT.md", "figure.png"]
    assert (out / "REPORT.md").read_text() == "my own report"
    assert (out / "figure.png").read_text() == "my own figure"
    (out / "REPORT.md").unlink()
    (out / "figure.png").unlink()
    (out / "notes.txt").write_text("mine")  # a folder holding none of those names takes a report
    assert write_report(path, out, figure=False) == [out / "aggregate.json", out / "REPORT.md"]
    assert (out / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("section", ["model", "workload"])
def test_an_override_into_a_section_that_is_not_an_object_is_a_named_error(
    tmp_path: Path, section: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The LiveCodeBench script sets model.path and workload.path over the config's: a config whose
    ``model`` (or ``workload``) is not an object raised a TypeError traceback out of the script."""
    data = json.loads(config_text(tmp_path))
    data[section] = "qwen"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(
        UsageError, match=rf"bad\.json: {section}: an object is expected here \(to set {section}\.path\)"
    ):
        load_experiment_config(path, {f"{section}.path": "/models/m"})
    spec = importlib.util.spec_from_file_location(
        "lcb_script", ROOT / "scripts" / "run_lcb_bounded_single_gpu.py"
    )
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    smoke = ROOT / "examples" / "smoke.jsonl"
    args = [
        "--config",
        str(path),
        "--model-path",
        "/m",
        "--workload",
        str(smoke),
        "--output",
        str(tmp_path / "o"),
    ]
    capsys.readouterr()
    assert script.main([*args, "--plan"]) == 2  # it raised TypeError
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: {section}: an object is expected here"), err


def test_more_client_workers_than_run_takes_are_refused_before_any_server_starts(tmp_path: Path) -> None:
    """``client.cpu_workers`` 5000 passed `experiment plan`, and `experiment run` started each arm's
    server (a model load, with vLLM) only for the client to refuse it: `run` takes at most 1024."""
    path = write_config(tmp_path, stages={}, pairs=1, **{"client.cpu_workers": 5000})
    with pytest.raises(UsageError, match=r"client\.cpu_workers: Input should be less than or equal to 1024"):
        load_experiment_config(path)
    refused(invoke("experiment", "plan", "--config", path), "client.cpu_workers", "(got 5000)")
