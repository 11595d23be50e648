"""SPEC §4.1: "all validation happens before anything starts and gives one clear message per problem".
Several problems at once are told at once, one a line: a setting's own error does not hide a check across
settings (``--model`` missing), and an output directory that exists does not hide the workload's errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncroll.config import build_config
from asyncroll.errors import OutputExistsError, UsageError, WorkloadError
from asyncroll.runtime.prepare import prepare
from tests.cli_runs import SMOKE, run_in_process
from tests.conftest import invoke


def _refusal(values: dict[str, object]) -> list[str]:
    with pytest.raises(UsageError) as caught:
        build_config({"workload": str(SMOKE), "output": "unused", **values})
    return str(caught.value).splitlines()


def test_a_settings_error_does_not_hide_the_checks_across_settings() -> None:
    lines = _refusal(
        {
            "cpu_workers": 0,
            "backend": "openai",
            "telemetry": False,
            "metrics_url": "http://127.0.0.1:1/metrics",
        }
    )
    assert lines == [
        "--cpu-workers: Input should be greater than or equal to 1 (got 0)",
        "--model is required with --backend openai",
        "--no-telemetry conflicts with --metrics-url",
    ]


def test_a_check_across_a_refused_setting_is_not_told_against_its_default() -> None:
    """--tool-timeout 0 is refused: the evaluator's cap would be judged on the default 60 s, not on what
    was given, so that check is left out; the others are still told."""
    lines = _refusal({"tool_timeout": 0, "test_timeout": 59, "backend": "vllm"})
    assert lines == [
        "--tool-timeout: Input should be greater than 0 (got 0)",
        "--model is required with --backend vllm",
    ]


def test_a_check_that_depends_on_a_refused_backend_is_not_told() -> None:
    """--backend vlm is refused: "--model only applies to HTTP backends" would judge --model against the
    default scripted backend, which nobody gave (the line names the backend in other words than a flag)."""
    assert _refusal({"backend": "vlm", "model": "m"}) == [
        "--backend: Input should be 'scripted', 'vllm' or 'openai'"
    ]


def test_a_refused_required_path_does_not_hide_the_checks_across_settings() -> None:
    """The re-validation without a refused --workload failed on its absence, before any check across
    settings ran: "--model is required" was told only on the next try."""
    with pytest.raises(UsageError) as caught:
        build_config({"workload": "", "output": "unused", "backend": "vllm"})
    assert str(caught.value).splitlines() == [
        "--workload: an empty path: give a file or folder",
        "--model is required with --backend vllm",
    ]


def test_checks_across_settings_are_one_line_each() -> None:
    lines = _refusal({"backend": "vllm", "telemetry": False, "nvml_device": 0})
    assert lines == ["--model is required with --backend vllm", "--no-telemetry conflicts with --nvml-device"]


def _bad_workload(tmp_path: Path) -> Path:
    workload = tmp_path / "bad.jsonl"
    workload.write_text(
        '{"id": 1, "prompt": "p", "script": [{"type": "final", "answer": "1"}]}\n'
        '{"id": 1, "prompt": "p", "script": [{"type": "final", "answer": "1"}]}\n'
    )
    return workload


def test_an_existing_output_does_not_hide_the_workloads_errors(tmp_path: Path) -> None:
    workload, output = _bad_workload(tmp_path), tmp_path / "taken"
    output.mkdir()
    with pytest.raises(WorkloadError) as caught:
        prepare(build_config({"workload": str(workload), "output": str(output)}))
    assert str(caught.value).splitlines() == [
        f"--output {output} already exists; asyncroll never overwrites a run (choose a new directory)",
        f"{workload}:2: id: duplicate id '1' (first on line 1)",
        f"{workload}: 1 error in 1 of 2 workload lines",
    ]
    assert sorted(p.name for p in output.iterdir()) == []  # nothing written in it


def test_an_output_that_cannot_be_used_does_not_hide_the_workloads_errors(tmp_path: Path) -> None:
    """An output under a regular file cannot name a directory: told, and the workload's errors with it."""
    workload = _bad_workload(tmp_path)
    (tmp_path / "file").write_text("")
    output = tmp_path / "file" / "run"
    with pytest.raises(UsageError) as caught:
        prepare(build_config({"workload": str(workload), "output": str(output)}))
    assert str(caught.value).splitlines() == [
        f"--output {output}: cannot be used: Not a directory",
        f"{workload}:2: id: duplicate id '1' (first on line 1)",
        f"{workload}: 1 error in 1 of 2 workload lines",
    ]


def test_an_existing_output_and_a_missing_tool_root_are_both_told(tmp_path: Path) -> None:
    output = tmp_path / "taken"
    output.mkdir()
    with pytest.raises(UsageError) as caught:
        prepare(
            build_config({"workload": str(SMOKE), "output": str(output), "tool_root": str(tmp_path / "no")})
        )
    assert str(caught.value).splitlines() == [
        f"--output {output} already exists; asyncroll never overwrites a run (choose a new directory)",
        f"--tool-root {tmp_path / 'no'}: does not exist",
    ]


def test_an_existing_output_alone_keeps_its_own_error(tmp_path: Path) -> None:
    with pytest.raises(OutputExistsError):
        prepare(build_config({"workload": str(SMOKE), "output": str(tmp_path)}))


def test_the_command_tells_every_problem_and_exits_2(tmp_path: Path) -> None:
    workload, output = _bad_workload(tmp_path), tmp_path / "taken"
    output.mkdir()
    result = invoke("run", "--workload", workload, "--output", output, "--no-progress")
    assert result.exit_code == 2, result.stderr
    assert "already exists" in result.stderr and "duplicate id '1'" in result.stderr
    assert list(output.iterdir()) == []


def test_a_settings_error_does_not_hide_a_taken_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, seen = run_in_process(
        monkeypatch, "--workload", SMOKE, "--output", tmp_path, "--cpu-workers", "0", "--backend", "vllm"
    )
    assert result.exit_code == 2 and not seen
    assert result.stderr.splitlines() == [
        "error: --cpu-workers: Input should be greater than or equal to 1 (got 0)",
        "--model is required with --backend vllm",
        f"--output {tmp_path} already exists; asyncroll never overwrites a run (choose a new directory)",
    ]


def test_a_config_files_taken_output_does_not_hide_the_workloads_errors(tmp_path: Path) -> None:
    """The output read from --config was refused alone, before the workload was read: its errors came
    only after a second try, as they never did for --output (both named where they were given)."""
    workload, output = _bad_workload(tmp_path), tmp_path / "taken"
    output.mkdir()
    config = tmp_path / "run.toml"
    config.write_text(f'workload = "{workload}"\noutput = "{output}"\n')
    result = invoke("run", "--config", config, "--no-progress")
    assert result.exit_code == 2, result.stderr
    assert result.stderr.splitlines()[-3:] == [
        f"error: --config {config}: setting 'output' ({output}) already exists; asyncroll never overwrites "
        "a run (choose a new directory)",
        f"{workload}:2: id: duplicate id '1' (first on line 1)",
        f"{workload}: 1 error in 1 of 2 workload lines",
    ]
    assert list(output.iterdir()) == []


def test_a_config_files_output_that_cannot_be_used_is_named_as_the_files_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Told with a settings error, or with the workload's, it was "--output X: cannot be used", a flag
    nobody typed."""
    (tmp_path / "file").write_text("")
    output = tmp_path / "file" / "run"
    config = tmp_path / "run.toml"
    config.write_text(f'workload = "{SMOKE}"\noutput = "{output}"\n')
    said = f"--config {config}: setting 'output' ({output}): cannot be used: Not a directory"
    result, seen = run_in_process(monkeypatch, "--config", config, "--cpu-workers", "0")
    assert result.exit_code == 2 and not seen
    assert result.stderr.splitlines()[-1] == said and "--output" not in result.stderr
    with pytest.raises(UsageError) as caught:
        prepare(
            build_config({"workload": str(SMOKE), "output": str(output)}),
            origins={"output": f"--config {config}: setting 'output'"},
        )
    assert str(caught.value) == said


def test_simulate_tells_a_taken_output_with_a_settings_error(tmp_path: Path) -> None:
    """As run does: simulate's settings error hid the taken output, told only on the next try."""
    taken = f"--output {tmp_path} already exists; asyncroll never overwrites a run (choose a new directory)"
    result = invoke(
        "simulate", "--workload", SMOKE, "--output", tmp_path, "--cpu-workers", "0", "--no-progress"
    )
    assert result.exit_code == 2, result.stderr
    assert result.stderr.splitlines() == [
        "error: --cpu-workers: Input should be greater than or equal to 1 (got 0)",
        taken,
    ]


def test_a_sweep_tells_a_taken_output_with_the_workloads_errors(tmp_path: Path) -> None:
    """As run and simulate do: a sweep told the workload's errors, and its taken output only on the next
    try."""
    workload, output = _bad_workload(tmp_path), tmp_path / "taken"
    output.mkdir()
    result = invoke("simulate", "--sweep", "--workload", workload, "--output", output, "--policies", "fifo")
    assert result.exit_code == 2, result.stderr
    assert result.stderr.splitlines()[-3:] == [
        f"error: --output {output} already exists; asyncroll never overwrites a run (choose a new directory)",
        f"{workload}:2: id: duplicate id '1' (first on line 1)",
        f"{workload}: 1 error in 1 of 2 workload lines",
    ]
