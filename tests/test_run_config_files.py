"""``asyncroll run --config FILE``: a file's settings under the flags that override them, and every way a
file's settings are refused naming the file, the setting as the file spells it, and the flag."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli_runs import REPO, SMOKE, cli, load_run, run_in_process
from tests.conftest import invoke


def test_config_file_with_flag_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "run.toml"
    config.write_text(f'workload = "{SMOKE}"\npolicy = "tool_first"\ncpu-workers = 1\nmax_turns = 4\n')
    out = tmp_path / "run"
    result = cli("run", "--config", config, "--output", out, "--policy", "fifo")
    assert result.returncode == 0, result.stderr
    receipt, summary, _ = load_run(out)
    assert receipt["config"]["policy"] == "fifo" and receipt["config"]["cpu_workers"] == 1
    assert receipt["config"]["max_turns"] == 4 and summary["limits"]["cpu_workers"] == 1
    bad = tmp_path / "bad.json"
    bad.write_text('{"cpu_workers": 2, "turbo": true}')
    refused, seen = run_in_process(
        monkeypatch, "--config", bad, "--workload", SMOKE, "--output", tmp_path / "r2"
    )
    assert refused.exit_code == 2 and f"--config {bad}: setting 'turbo': unknown setting" in refused.stderr
    assert not seen


def test_config_file_errors_name_the_file_and_flags_name_the_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "run.toml"
    config.write_text('polcy = "asyncroll"\ncpu-workers = 0\nmax_turns = 0\n')
    result, seen = run_in_process(
        monkeypatch, "--config", config, "--workload", SMOKE, "--output", tmp_path / "r", "--max-turns", "-1"
    )
    assert result.exit_code == 2 and not seen
    assert f"--config {config}: setting 'polcy': unknown setting" in result.stderr
    assert f"--config {config}: setting 'cpu-workers': " in result.stderr  # as the file spells it
    assert "--max-turns: " in result.stderr
    assert "setting 'max_turns'" not in result.stderr  # the flag overrode the file's value


def test_a_config_file_value_of_the_wrong_json_type_is_refused_not_converted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pydantic's lax mode read ``"cpu_workers": true`` as one worker, ``"max_turns": "8"`` as 8 and
    ``"transcripts": "no"`` as off, silently; each is now named. A JSON int where a float is taken, and
    the flags' own values, are as before."""
    config = tmp_path / "run.json"
    bad = {"cpu_workers": True, "max_turns": "8", "transcripts": "no", "tool_timeout": "5", "limit": 2.0}
    config.write_text(json.dumps(bad))
    result, seen = run_in_process(
        monkeypatch, "--config", config, "--workload", SMOKE, "--output", tmp_path / "r"
    )
    assert result.exit_code == 2 and not seen
    for key, what in (
        ("cpu_workers", "integer"),
        ("max_turns", "integer"),
        ("transcripts", "boolean"),
        ("tool_timeout", "number"),
        ("limit", "integer"),
    ):
        assert f"--config {config}: setting '{key}': Input should be a valid {what}" in result.stderr
    assert not (tmp_path / "r").exists()
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"cpu_workers": 1, "tool_timeout": 5, "transcripts": True}))
    ok = cli("run", "--config", good, "--workload", SMOKE, "--output", tmp_path / "ok", "--max-turns", "4")
    assert ok.returncode == 0, ok.stderr
    receipt, _, _ = load_run(tmp_path / "ok")
    assert receipt["config"]["tool_timeout"] == 5.0 and receipt["config"]["transcripts"] is True


def test_a_check_across_settings_names_those_read_from_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cross-setting error named only flags, even for settings the user wrote in a config file."""
    config = tmp_path / "run.toml"
    config.write_text("tool-timeout = 5\ntest_timeout = 20\n")
    args = ("--config", config, "--workload", SMOKE)
    result, seen = run_in_process(monkeypatch, *args, "--output", tmp_path / "r")
    assert result.exit_code == 2 and not seen
    # the note follows the value, as spelled in the file; it split the flag from its value before
    assert f"--test-timeout 20 (--config {config}: setting 'test_timeout') does not fit " in result.stderr
    assert f"--tool-timeout 5 (--config {config}: setting 'tool-timeout'): an " in result.stderr
    flag, _ = run_in_process(monkeypatch, *args, "--output", tmp_path / "r2", "--tool-timeout", "4")
    assert "does not fit under --tool-timeout 4:" in flag.stderr  # given as a flag: named as one
    config.write_text('backend = "vllm"\n')
    http, _ = run_in_process(monkeypatch, *args, "--output", tmp_path / "r4")
    assert f"--model is required with --backend vllm (--config {config}: setting 'backend')" in http.stderr
    config.write_text('model = "qwen"\n')  # the word after the flag is no value of the setting's
    scripted, _ = run_in_process(monkeypatch, *args, "--output", tmp_path / "r5")
    assert f"--model (--config {config}: setting 'model') only applies to HTTP backends" in scripted.stderr
    config.write_text("cpu-workers = 2\ncpu_workers = 3\n")
    twice, seen = run_in_process(monkeypatch, *args, "--output", tmp_path / "r3")
    assert twice.exit_code == 2 and not seen
    assert f"--config {config}: settings 'cpu-workers' and 'cpu_workers' are the same setting" in twice.stderr


def test_a_switch_turned_off_in_a_config_file_is_named_as_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``telemetry = false`` in a config file and ``--metrics-url`` given: the refusal blamed a
    ``--no-telemetry`` the user never typed, and named --nvml-device, which nobody gave."""
    config = tmp_path / "run.toml"
    config.write_text("telemetry = false\n")
    args = ("--config", config, "--workload", SMOKE, "--metrics-url", "http://127.0.0.1:1/metrics")
    result, seen = run_in_process(monkeypatch, *args, "--output", tmp_path / "r")
    assert result.exit_code == 2 and not seen
    assert (
        f"--no-telemetry (--config {config}: setting 'telemetry') conflicts with --metrics-url"
        in result.stderr
    )
    assert "--nvml-device" not in result.stderr


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        (
            "twice.json",
            b'{"cpu_workers": 1, "cpu_workers": 2}',
            "not valid JSON: key 'cpu_workers' is given twice",
        ),
        (  # tomllib's message names no key: the line that repeats it is quoted
            "twice.toml",
            b"cpu_workers = 1\r\ncpu_workers = 2\r\n",
            "not valid TOML: Cannot overwrite a value (at line 2, column 16): 'cpu_workers = 2'",
        ),
        ("latin1.json", b'{"model": "caf\xe9"}', "not UTF-8 text (invalid continuation byte at byte 14)"),
        (  # the byte's place in the file: the codec counted from after a byte order mark (byte 14 here)
            "marked.json",
            b'\xef\xbb\xbf{"model": "caf\xe9"}',
            "not UTF-8 text (invalid continuation byte at byte 17)",
        ),
        ("deep.json", b"[" * 100_000 + b"]" * 100_000, "not valid JSON: "),
        (  # Python's own advice ("use sys.set_int_max_str_digits()") was shown to the user
            "digits.toml",
            b"seed = " + b"9" * 5000 + b"\n",
            "not valid TOML: Exceeds the limit (4300 digits) for integer string conversion: value has 5000 "
            "digits\n",
        ),
        ("list.json", b'[{"cpu_workers": 1}]', "must hold an object of settings"),
    ],
    ids=[
        "repeated-key",
        "repeated-toml-key",
        "not-utf8",
        "not-utf8-after-bom",
        "deep",
        "digits",
        "not-an-object",
    ],
)
def test_a_config_file_that_cannot_be_read_as_settings_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, content: bytes, message: str
) -> None:
    """A repeated key silently kept its last value; a file that is not UTF-8, or nested past the
    parser's limit, ended in a traceback."""
    config = tmp_path / name
    config.write_bytes(content)
    result, seen = run_in_process(
        monkeypatch, "--config", config, "--workload", SMOKE, "--output", tmp_path / "r"
    )
    assert result.exit_code == 2 and not seen
    assert f"--config {config}: {message}" in result.stderr


def test_a_config_file_that_is_a_folder_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result, seen = run_in_process(
        monkeypatch, "--config", tmp_path, "--workload", SMOKE, "--output", tmp_path / "r"
    )
    assert result.exit_code == 2 and not seen
    assert f"--config {tmp_path}: cannot read: Is a directory" in result.stderr


def test_a_config_file_with_a_byte_order_mark_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Notepad's UTF-8 (a byte order mark) and CRLF line ends, accepted in a workload, were refused in a
    settings file: "not valid JSON: Unexpected UTF-8 BOM (decode using utf-8-sig)" (and "not valid TOML:
    Invalid statement")."""
    for name, text in (("run.json", '{"cpu_workers": 3}\r\n'), ("run.toml", "cpu_workers = 3\r\n")):
        config = tmp_path / name
        config.write_bytes(b"\xef\xbb\xbf" + text.encode())
        result, seen = run_in_process(
            monkeypatch, "--config", config, "--workload", SMOKE, "--output", tmp_path / "r"
        )
        assert result.exit_code == 0, result.stderr
        assert seen[0].cpu_workers == 3


def test_a_lone_surrogate_in_a_config_file_is_refused_naming_file_and_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JSON lets ``"\\udc80"`` through: as a setting's name it was refused as "Input should be a valid
    string, unable to parse raw data as a unicode string" (no file, no setting), and as a ``model`` it
    was taken and written into run.json, which no UTF-8 reader accepts."""
    for text, where in (
        ('{"cpu_workers": 2, "x\\udc80": 1}', "a setting's name"),
        ('{"model": "m\\udc80"}', "setting 'model'"),
    ):
        config = tmp_path / "run.json"
        config.write_text(text)
        result, seen = run_in_process(
            monkeypatch, "--config", config, "--workload", SMOKE, "--output", tmp_path / "r"
        )
        assert result.exit_code == 2 and not seen
        assert f"--config {config}: {where}: not valid Unicode: a lone UTF-16 surrogate" in result.stderr


def test_a_nul_in_a_config_file_path_is_refused_naming_file_and_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JSON lets ``"\\u0000"`` through: an ``output`` or ``workload`` holding one ended ``run`` in a
    ``ValueError: embedded null byte`` traceback (a ``tool_root`` was "not found"); no file name holds one."""
    for setting in ("workload", "output", "tool_root"):
        settings = {"workload": str(SMOKE), "output": str(tmp_path / "r"), setting: "a\u0000b"}
        config = tmp_path / "run.json"
        config.write_text(json.dumps(settings))
        result, seen = run_in_process(monkeypatch, "--config", config)
        assert result.exit_code == 2 and not seen, result.stderr
        assert f"--config {config}: setting '{setting}': 'a\\x00b': a NUL character" in result.stderr
        assert not (tmp_path / "r").exists() and not (tmp_path / "a").exists()


def test_a_relative_path_of_a_config_file_that_is_not_there_names_the_file_and_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative ``workload`` or ``tool_root`` of a config file is taken from the current directory (as
    an experiment config's is not: it takes its file's folder). Written relative to the file, it was
    refused as ``error: ../w.jsonl: cannot read: No such file or directory``, naming neither the file,
    the setting nor where it was looked for."""
    (tmp_path / "w.jsonl").write_bytes(SMOKE.read_bytes())
    (tmp_path / "tools").mkdir()
    folder, elsewhere = tmp_path / "cfg", tmp_path / "a" / "b"
    folder.mkdir()
    elsewhere.mkdir(parents=True)
    config = folder / "run.toml"
    config.write_text('workload = "../w.jsonl"\ntool-root = "../tools"\n')
    monkeypatch.chdir(elsewhere)
    result, seen = run_in_process(monkeypatch, "--config", config, "--output", tmp_path / "r")
    assert result.exit_code == 2 and not seen
    for key in ("workload", "tool-root"):
        assert f"--config {config}: setting '{key}': '../" in result.stderr, result.stderr
    assert f"not found from the current directory {elsewhere}" in result.stderr
    assert "relative to the config file's folder" in result.stderr  # where it is: said so
    assert not (tmp_path / "r").exists()
    monkeypatch.chdir(folder)  # from the folder they were written for, they are found
    ok, seen = run_in_process(monkeypatch, "--config", config, "--output", tmp_path / "r")
    assert ok.exit_code == 0, ok.stderr
    assert seen[0].workload == Path("../w.jsonl")


def test_a_switch_a_config_file_turns_on_can_be_turned_off_by_a_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Flags override the file, but ``--transcripts``, ``--dedicated-gpu``, ``--nvtx``,
    ``--allow-weak-isolation`` and ``--replay`` had no ``--no-`` form: a file's ``true`` could not be
    overridden at all (click: "No such option: --no-transcripts")."""
    switches = ("transcripts", "dedicated_gpu", "nvtx", "allow_weak_isolation", "replay")
    config = tmp_path / "run.toml"
    config.write_text("".join(f"{name} = true\n" for name in switches))
    off = ["--no-" + name.replace("_", "-") for name in switches]
    args: tuple[str | Path, ...] = (
        "--config",
        config,
        "--workload",
        SMOKE,
        "--backend",
        "vllm",
        "--model",
        "m",
    )
    args += tuple(off)
    result, seen = run_in_process(monkeypatch, *args, "--output", tmp_path / "r")
    assert result.exit_code == 0, result.output
    assert [getattr(seen[0], name) for name in switches] == [False] * len(switches)
    config.write_text("transcripts = false\n")
    on, seen = run_in_process(
        monkeypatch, "--config", config, "--workload", SMOKE, "--output", tmp_path / "r", "--transcripts"
    )
    assert on.exit_code == 0, on.output
    assert seen[0].transcripts is True


def test_a_misspelled_or_grouped_setting_of_a_config_file_says_what_was_meant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``polcy``, ``gpu-slots`` (the deprecated flag's name) and a ``[run]`` table of settings were each
    refused as "unknown setting", nothing more: the run's settings are the file's top-level keys."""
    config = tmp_path / "run.toml"
    config.write_text('polcy = "fifo"\ngpu-slots = 2\nmax_active_trajectory = 4\n')
    args = ("--config", config, "--workload", SMOKE, "--output", tmp_path / "r")
    result, seen = run_in_process(monkeypatch, *args)
    assert result.exit_code == 2 and not seen
    for key, meant in (
        ("polcy", "policy"),
        ("gpu-slots", "max_inflight_model_requests"),
        ("max_active_trajectory", "max_active_trajectories"),
    ):
        assert f"setting {key!r}: unknown setting (did you mean {meant!r}?)" in result.stderr, result.stderr
    config.write_text('[run]\ncpu_workers = 2\npolicy = "fifo"\n')
    grouped, seen = run_in_process(monkeypatch, *args)
    assert grouped.exit_code == 2 and not seen
    assert f"--config {config}: setting 'run': " in grouped.stderr
    assert "settings are the file's top-level keys, in no section" in grouped.stderr


def test_an_existing_output_read_from_a_config_file_is_named_as_the_files_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``output`` from the config file that already existed was refused as "--output X already
    exists", a flag the user never typed; a flag's own output is still named as the flag."""
    existing = tmp_path / "done"
    existing.mkdir()
    config = tmp_path / "run.toml"
    config.write_text(f'workload = "{SMOKE}"\noutput = "{existing}"\n')
    refused = invoke("run", "--config", config, "--no-progress")  # told as the run prepares, with the rest
    assert refused.exit_code == 2 and list(existing.iterdir()) == []
    assert f"--config {config}: setting 'output' ({existing}) already exists" in refused.stderr
    assert "choose a new directory" in refused.stderr and "--output" not in refused.stderr
    result, seen = run_in_process(monkeypatch, "--config", config, "--output", tmp_path / "new")
    assert result.exit_code == 0 and seen[0].output == tmp_path / "new"


def test_more_worker_processes_than_the_cap_in_a_config_file_are_refused_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cap was checked after validation, against the flag: a file's ``cpu_workers`` was named as a
    ``--cpu-workers`` nobody typed."""
    config = tmp_path / "run.json"
    config.write_text('{"cpu_workers": 5000}')
    result, seen = run_in_process(
        monkeypatch, "--config", config, "--workload", SMOKE, "--output", tmp_path / "r"
    )
    assert result.exit_code == 2 and not seen and not (tmp_path / "r").exists()
    assert f"--config {config}: setting 'cpu_workers': 5000: at most 1024 worker processes" in result.stderr
    flag, seen = run_in_process(
        monkeypatch, "--workload", SMOKE, "--output", tmp_path / "r", "--cpu-workers", "1025"
    )
    assert flag.exit_code == 2 and not seen and "--cpu-workers: 1025: at most 1024" in flag.stderr


def test_a_config_file_past_its_size_cap_is_refused_before_it_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file was read whole: ``--config /dev/zero`` (or a model file given by mistake) filled memory
    and ended in a MemoryError traceback. At most 1 MiB is read."""
    config = tmp_path / "run.json"
    config.write_text("{}" + " " * (1 << 20))  # valid JSON, but no file of settings is this large
    result, seen = run_in_process(
        monkeypatch, "--config", config, "--workload", SMOKE, "--output", tmp_path / "r"
    )
    assert result.exit_code == 2 and not seen and not (tmp_path / "r").exists()
    assert f"--config {config}: larger than 1 MiB: not a file of settings" in result.stderr
    config.write_text("{}" + " " * ((1 << 20) - 2))  # exactly the cap
    result, seen = run_in_process(
        monkeypatch, "--config", config, "--workload", SMOKE, "--output", tmp_path / "r"
    )
    assert result.exit_code == 0 and len(seen) == 1, result.output


def test_a_path_setting_that_is_not_a_string_is_named_without_pydantics_class(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``"workload": 5`` was refused as "Input is not a valid path for <class 'pathlib.Path'>"."""
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"workload": ["w.jsonl"], "output": 5, "tool_root": None}))
    result, seen = run_in_process(monkeypatch, "--config", config)
    assert result.exit_code == 2 and not seen
    for key in ("workload", "output"):
        assert f"--config {config}: setting '{key}': Input should be a path, as a string" in result.stderr
    assert "class" not in result.stderr and "tool_root" not in result.stderr  # null: the default


def test_a_config_files_paths_not_found_are_told_with_its_other_settings_problems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad setting hid the file's paths that are not found (and one starting with ``~``): fixing it
    only brought the next refusal. Every problem is told at once, each once; a taken output too."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "taken").mkdir()
    config = tmp_path / "run.toml"
    config.write_text('workload = "w.jsonl"\ntool_root = "~/tools"\ncpu_workers = 0\noutput = "taken"\n')
    result, seen = run_in_process(monkeypatch, "--config", config)
    assert result.exit_code == 2 and not seen
    lines = result.stderr.removeprefix("error: ").splitlines()
    assert [line.split(": ")[1] for line in lines] == [
        "setting 'cpu_workers'",
        "setting 'tool_root'",
        "setting 'workload'",
        "setting 'output' (taken) already exists; asyncroll never overwrites a run (choose a new directory)",
    ]
    assert "'w.jsonl' not found from the current directory" in lines[2]
    config.write_text("workload = 7\ncpu_workers = 0\n")  # a refused path is told once, by its own error
    refused, _ = run_in_process(monkeypatch, "--config", config, "--output", tmp_path / "r")
    assert refused.exit_code == 2 and refused.stderr.count("setting 'workload'") == 1


def test_a_config_file_path_starting_with_a_tilde_is_refused_not_made_a_folder_named_tilde(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No shell expands a config file's ``"output": "~/runs/a"``: the run made ``./~/runs/a`` (which a
    later ``rm -rf ~`` to clean up would take for the home directory)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"workload": str(SMOKE), "output": "~/runs/a"}))
    result, seen = run_in_process(monkeypatch, "--config", config)
    assert result.exit_code == 2 and not seen and not (tmp_path / "~").exists()
    said = f"--config {config}: setting 'output': '~/runs/a': a config file's path is not expanded"
    assert said in result.stderr and f"write {tmp_path / 'home' / 'runs' / 'a'}" in result.stderr
    flag, seen = run_in_process(monkeypatch, "--config", config, "--output", tmp_path / "r")
    assert flag.exit_code == 0 and len(seen) == 1, flag.output  # a flag's path is the shell's business


def test_a_config_file_path_given_empty_is_refused_not_read_as_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``"tool_root": ""`` ran with the current directory as the tool root, silently (``Path("")`` is
    ``.``), and an experiment's ``workload.path: ""`` became the config's own folder."""
    from asyncroll.errors import UsageError
    from asyncroll.experiment.config import load_experiment_config

    monkeypatch.chdir(tmp_path)
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"workload": str(SMOKE), "output": "out", "tool_root": ""}))
    result, seen = run_in_process(monkeypatch, "--config", config)
    assert result.exit_code == 2 and not seen and not (tmp_path / "out").exists()
    assert f"--config {config}: setting 'tool_root': an empty path: give a file or folder" in result.stderr
    experiment = tmp_path / "experiment.json"
    experiment.write_text(json.dumps({"workload": {"path": "", "tool_root": ""}}))
    with pytest.raises(UsageError) as refused:
        load_experiment_config(experiment)
    for key in ("path", "tool_root"):
        assert f"{experiment}: workload.{key}: an empty path: give a file or folder" in str(refused.value)


def test_a_config_files_missing_tool_root_or_busy_metrics_port_is_blamed_on_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both were blamed on ``--tool-root`` / ``--metrics-port``, flags nobody typed."""
    import socket

    config = tmp_path / "run.json"
    config.write_text(
        json.dumps(
            {"workload": str(SMOKE), "output": str(tmp_path / "out"), "tool_root": str(tmp_path / "no")}
        )
    )
    refused = invoke("run", "--config", config, "--no-progress")  # told as the run prepares, with the rest
    assert refused.exit_code == 2 and not (tmp_path / "out").exists(), refused.stderr
    assert f"--config {config}: setting 'tool_root': {tmp_path / 'no'}: does not exist" in refused.stderr
    assert "--tool-root" not in refused.stderr
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        config.write_text(json.dumps({"workload": str(SMOKE), "output": "out", "metrics_port": port}))
        result, seen = run_in_process(monkeypatch, "--config", config)
    assert result.exit_code == 2 and not seen, result.output
    said = f"error: --config {config}: setting 'metrics_port': {port} on 127.0.0.1: cannot listen: "
    assert said in result.stderr, result.stderr


def test_a_runs_receipt_is_a_config_file_for_running_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--config RUN/run.json`` re-runs a run with its settings. It was refused ("setting 'limits': a group
    of settings"), and with the derived keys removed by hand every recorded default of a scripted run
    (``endpoint``, ``seed``, ``max_retries``…) was refused as an HTTP-only setting. Now: the derived keys
    and the output are left out, the workload is the file the run read and a relative tool root is taken
    from the run's directory, whatever the current directory; a flag still wins."""
    first = tmp_path / "first"
    done = cli(
        "run", "--workload", "examples/toolmath/workload.jsonl", "--tool-root", "examples/toolmath",
        "--output", first, "--policy", "asyncroll", "--cpu-workers", "1", "--max-turns", "5",
        "--aging-seconds", "12", "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    recorded = json.loads((first / "run.json").read_text())["config"]
    monkeypatch.chdir(tmp_path)  # not the directory the run's relative paths were given from
    again, seen = run_in_process(monkeypatch, "--config", first / "run.json", "--output", "second")
    assert again.exit_code == 0, again.stderr
    (cfg,) = seen
    assert cfg.workload == REPO / "examples" / "toolmath" / "workload.jsonl"
    assert cfg.tool_root == REPO / "examples" / "toolmath" and cfg.output == Path("second")
    changed = {k for k, v in cfg.model_dump(mode="json").items() if recorded[k] != v}
    assert changed == {"workload", "tool_root", "output"}
    flagged, seen = run_in_process(
        monkeypatch, "--config", first / "run.json", "--output", "third", "--policy", "fifo"
    )
    assert flagged.exit_code == 0 and seen[0].policy == "fifo" and seen[0].aging_seconds == 12
    unnamed, seen = run_in_process(monkeypatch, "--config", first / "run.json")
    assert unnamed.exit_code == 2 and not seen
    assert (
        f"missing required option(s): --output (--config {first / 'run.json'} gives none)" in unnamed.stderr
    )


@pytest.mark.parametrize("config", [[1], None, "missing"])
def test_a_run_json_whose_settings_are_damaged_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: Any
) -> None:
    """Read as a settings file, it was refused for its first object: "setting 'versions': a group of
    settings, not a value", which names neither the file's kind nor what is wrong with it."""
    receipt: dict[str, Any] = {"schema_version": 1, "status": "complete", "command": ["asyncroll", "run"]}
    receipt |= {"config": config} if config != "missing" else {}
    receipt["versions"] = {"asyncroll": "0"}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(receipt))
    result, seen = run_in_process(monkeypatch, "--config", path, "--output", tmp_path / "again")
    assert result.exit_code == 2 and not seen and not (tmp_path / "again").exists()
    held = {"[1]": "an array", "None": "null", "missing": "missing"}[str(config)]
    assert result.stderr == (
        f"error: --config {path}: a run's run.json whose 'config' is {held}, not an object of settings: "
        "nothing to run again\n"
    )


@pytest.mark.parametrize("version", [99, "1", True, None])
def test_a_run_json_of_another_schema_version_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: Any
) -> None:
    """A run.json another version of asyncroll wrote (its settings may be named or meant otherwise) ran
    silently as this version's settings; ``simulate --from-run`` and ``timeline`` refuse it."""
    receipt: dict[str, Any] = {"schema_version": version, "status": "complete", "command": ["asyncroll"]}
    receipt["config"] = {"workload": str(SMOKE), "policy": "fifo"}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(receipt))
    result, seen = run_in_process(monkeypatch, "--config", path, "--output", tmp_path / "again")
    assert result.exit_code == 2 and not seen and not (tmp_path / "again").exists()
    assert result.stderr == (
        f"error: --config {path}: a run's run.json of schema_version {version!r}; this asyncroll reads "
        "run.json version 1 only: give its settings in a file of settings, or as flags\n"
    )
    receipt["schema_version"] = 1
    path.write_text(json.dumps(receipt))
    result, seen = run_in_process(monkeypatch, "--config", path, "--output", tmp_path / "again")
    assert result.exit_code == 0 and seen[0].policy == "fifo", result.stderr


def test_a_default_spelled_out_in_a_config_file_is_no_setting_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file that spells a default out (a team's shared file run once with the scripted backend) had it
    refused as an HTTP-only setting given, or warned about as doing nothing
    (``"evaluation_timeout": null``). A default of the default's own type is now as if not written; one
    of another JSON type (``2.0`` workers, ``false`` retries) is refused as before."""
    config = tmp_path / "shared.json"
    config.write_text(
        json.dumps(
            {
                "endpoint": "http://localhost:8000",
                "seed": 0,
                "max_retries": 0,
                "evaluation_timeout": None,
                "telemetry_interval": 0.2,
                "metrics_host": "127.0.0.1",
                "cpu_workers": 1,
            }
        )
    )
    result, seen = run_in_process(
        monkeypatch, "--config", config, "--workload", SMOKE, "--output", tmp_path / "r"
    )
    assert result.exit_code == 0, result.stderr
    assert "warning" not in result.stderr and seen[0].cpu_workers == 1
    assert seen[0].model_fields_set >= {"cpu_workers"} and "endpoint" not in seen[0].model_fields_set
    for typed in ({"cpu_workers": 2.0}, {"max_retries": False}):
        config.write_text(json.dumps(typed))
        refused, seen = run_in_process(
            monkeypatch, "--config", config, "--workload", SMOKE, "--output", tmp_path / "r2"
        )
        assert refused.exit_code == 2 and not seen, typed


def test_a_simulations_run_json_is_run_for_real_and_said_to_be(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Simulate first, then run for real: a simulation's run.json re-runs its settings with real workers,
    and said nothing of its simulated server and virtual clock, which no setting of run carries."""
    sim, first = tmp_path / "sim", tmp_path / "first"
    # the runs to re-run are recorded in this process (each a new interpreter was seconds of the suite),
    # before run_in_process replaces the run with a recorder
    done = invoke("simulate", "--workload", SMOKE, "--output", sim, "--policy", "fifo")
    assert done.exit_code == 0, done.stderr
    assert invoke("run", "--workload", SMOKE, "--output", first, "--no-progress").exit_code == 0
    real, seen = run_in_process(monkeypatch, "--config", sim / "run.json", "--output", tmp_path / "real")
    assert real.exit_code == 0 and seen[0].policy == "fifo", real.stderr
    said = f"warning: --config {sim / 'run.json'}: the run.json of a simulation: this run is real"
    assert said in real.stderr
    again, _ = run_in_process(monkeypatch, "--config", first / "run.json", "--output", tmp_path / "again")
    assert again.exit_code == 0 and "simulation" not in again.stderr, again.stderr


def test_a_receipt_of_an_older_asyncroll_run_runs_the_rule_that_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--policy asyncroll`` names whichever pressure rule was the default when the run was recorded
    (run.json's ``policy_canonical`` since 9edd2cf, e.g. ``asyncroll_critical`` until 2026-12-03; before
    that commit it held the name as given, read from the events: the test below). Re-running such a run
    from its run.json ran today's rule under the same name, another policy than the run's, without a word;
    now it runs the rule that ran, by its own name (a flag still wins). A run of today's rule is unchanged."""
    from asyncroll.policies.registry import canonical_policy

    first = tmp_path / "first"  # the run, recorded in this process: the re-run from its run.json is tested
    done = invoke("run", "--workload", SMOKE, "--output", first, "--policy", "asyncroll", "--no-progress")
    assert done.exit_code == 0, done.stderr
    receipt = json.loads((first / "run.json").read_text())
    assert receipt["config"]["policy_canonical"] == canonical_policy("asyncroll") != "asyncroll_critical"
    today, seen = run_in_process(monkeypatch, "--config", first / "run.json", "--output", tmp_path / "b")
    assert today.exit_code == 0 and seen[0].policy == "asyncroll", today.stderr
    assert "policy_canonical" not in today.stderr
    receipt["config"]["policy_canonical"] = "asyncroll_critical"  # as a run of the critical rule recorded it
    older = tmp_path / "older.json"
    older.write_text(json.dumps(receipt))
    again, seen = run_in_process(monkeypatch, "--config", older, "--output", tmp_path / "c")
    assert again.exit_code == 0 and seen[0].policy == "asyncroll_critical", again.stderr
    assert (  # said, as simulate --from-run says it of a replay
        f"warning: --config {older}: the run's --policy asyncroll was the rule asyncroll_critical then "
        f"(policy_canonical); this run runs asyncroll_critical, not today's asyncroll "
        f"({canonical_policy('asyncroll')}); give --policy to choose"
    ) in again.stderr
    flag, seen = run_in_process(
        monkeypatch, "--config", older, "--output", tmp_path / "d", "--policy", "asyncroll"
    )
    assert flag.exit_code == 0 and seen[0].policy == "asyncroll", flag.stderr
    assert "policy_canonical" not in flag.stderr


def test_a_receipt_written_before_run_json_named_the_rule_runs_the_rule_its_events_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before 2026-12-03 run.json's ``policy_canonical`` held the name as given: ``asyncroll`` for a run of
    ``--policy asyncroll`` (the rule that ran is named by its ``cpu_selected`` events only, as
    ``simulate --from-run`` reads it). Re-running such a run ran today's rule and said 'the rule asyncroll
    then ... this run runs asyncroll, not today's asyncroll'; now it runs the rule its events name, and a
    run.json with no such events beside it says the rule is not recorded and today's runs."""
    from asyncroll.policies.registry import canonical_policy

    first = tmp_path / "first"  # the run, recorded in this process: the re-run from its run.json is tested
    done = invoke("run", "--workload", SMOKE, "--output", first, "--policy", "asyncroll", "--no-progress")
    assert done.exit_code == 0, done.stderr
    older = tmp_path / "older"  # as a run of 2026-12-02 (asyncroll_critical) wrote it
    older.mkdir()
    receipt = json.loads((first / "run.json").read_text())
    receipt["config"]["policy_canonical"] = "asyncroll"
    (older / "run.json").write_text(json.dumps(receipt))
    events = (first / "events.jsonl").read_text()
    assert f'"policy":"{canonical_policy("asyncroll")}"' in events
    events = events.replace(f'"policy":"{canonical_policy("asyncroll")}"', '"policy":"asyncroll_critical"')
    (older / "events.jsonl").write_text(events)
    again, seen = run_in_process(monkeypatch, "--config", older / "run.json", "--output", tmp_path / "b")
    assert again.exit_code == 0 and seen[0].policy == "asyncroll_critical", again.stderr
    assert (
        f"warning: --config {older / 'run.json'}: the run's --policy asyncroll was the rule "
        "asyncroll_critical then (its cpu_selected events); this run runs asyncroll_critical, not today's "
        f"asyncroll "
        f"({canonical_policy('asyncroll')}); give --policy to choose"
    ) in again.stderr
    alone = tmp_path / "alone.json"  # the run.json copied away from its events
    alone.write_text(json.dumps(receipt))
    today, seen = run_in_process(monkeypatch, "--config", alone, "--output", tmp_path / "c")
    assert today.exit_code == 0 and seen[0].policy == "asyncroll", today.stderr
    assert (
        f"warning: --config {alone}: the run's --policy asyncroll ran a pressure rule its run.json does not "
        "name (policy_canonical 'asyncroll', written before run.json named the rule), nor a cpu_selected "
        f"event beside it; this run runs today's asyncroll ({canonical_policy('asyncroll')}); give --policy "
        "to choose"
    ) in today.stderr
    assert "was the rule asyncroll then" not in today.stderr


def test_a_toml_integer_spelling_a_float_default_is_no_setting_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TOML writes a whole number of seconds without a point (``request_timeout = 120``): the float
    default 120.0 spelled so was kept as a setting given, and refused with the scripted backend as an
    HTTP-only one, while ``120.0`` was left out. An int of a float default's value is that default (a
    flag's ``--request-timeout 120`` is the float 120.0); a bool is not."""
    config = tmp_path / "shared.toml"
    config.write_text("request_timeout = 120\nserver_down_timeout = 120\ntool_timeout = 60\n")
    result, seen = run_in_process(
        monkeypatch, "--config", config, "--workload", SMOKE, "--output", tmp_path / "r"
    )
    assert result.exit_code == 0, result.stderr
    assert not seen[0].model_fields_set & {"request_timeout", "server_down_timeout", "tool_timeout"}
    config.write_text("request_timeout = 90\n")  # not the default: an HTTP-only setting given
    refused, seen = run_in_process(
        monkeypatch, "--config", config, "--workload", SMOKE, "--output", tmp_path / "r2"
    )
    assert refused.exit_code == 2 and not seen and "only applies to HTTP backends" in refused.stderr


def test_a_rerun_from_a_receipt_says_which_files_the_run_read_have_changed_since(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--config RUN/run.json`` reads the workload and tool files where the run read them, and ran
    whatever they hold now without a word: an edited workload (or tool) ran as 'the run again', where
    ``simulate --from-run`` refuses a workload whose SHA-256 is not the recorded one. Now each changed
    file is named with its recorded and present SHA-256 (a workload or tool root given by flag reads other
    files, as asked: nothing said)."""
    import shutil

    folder = tmp_path / "toolmath"
    shutil.copytree(REPO / "examples" / "toolmath", folder)
    first = tmp_path / "first"
    done = invoke(  # recorded in this process: the re-run from its run.json is tested
        "run", "--workload", folder / "workload.jsonl", "--output", first, "--limit", "1", "--no-progress"
    )  # fmt: skip
    assert done.exit_code == 0, done.stderr
    receipt = first / "run.json"
    same, seen = run_in_process(monkeypatch, "--config", receipt, "--output", tmp_path / "b")
    assert same.exit_code == 0 and seen and "changed since" not in same.stderr, same.stderr
    recorded = json.loads(receipt.read_text())
    tool = next(t for t in recorded["tools"].values() if t is not None)
    with open(tool["path"], "a") as file:
        file.write("\n# edited\n")
    workload = folder / "workload.jsonl"
    workload.write_text(workload.read_text().splitlines()[0] + "\n")
    again, seen = run_in_process(monkeypatch, "--config", receipt, "--output", tmp_path / "c")
    assert again.exit_code == 0 and seen, again.stderr
    said = f"warning: --config {receipt}: changed since that run read it: the workload {workload} (SHA-256 "
    assert said in again.stderr and f"'s file {tool['path']} (SHA-256 {tool['sha256'][:12]}" in again.stderr
    assert again.stderr.count("changed since") == 1
    assert "this run has its settings, not its input" in again.stderr
    other = tmp_path / "other"
    shutil.copytree(folder, other)  # its tools under another root: the files given, not the run's
    elsewhere, seen = run_in_process(
        monkeypatch, "--config", receipt, "--output", tmp_path / "d", "--workload", other / "workload.jsonl"
    )
    assert elsewhere.exit_code == 0 and seen and "changed since" not in elsewhere.stderr, elsewhere.stderr


def test_a_receipt_says_which_settings_were_given_and_which_are_defaults(tmp_path: Path) -> None:
    """run.json's ``config`` holds every setting, given or not; which were given was told only by the
    command line, where ``--config FILE`` names a file that may have changed or gone since. Now
    ``config_given`` names them: the flags and the file's values (one equal to its default is as if
    not written, docs/RUNNING.md), the rest being defaults another version may change."""
    config = tmp_path / "settings.toml"
    config.write_text("cpu_workers = 1\nmax_turns = 8\n")
    out = tmp_path / "r"
    # in this process (test_config_file_with_flag_override runs ``run --config`` in its own)
    done = invoke("run", "--config", config, "--workload", SMOKE, "--output", out, "--policy", "tool_first")
    assert done.exit_code == 0, done.stderr
    receipt, _, _ = load_run(out)
    assert receipt["config_given"] == ["cpu_workers", "output", "policy", "workload"]
    assert receipt["config"]["max_turns"] == 8 and receipt["config"]["cpu_workers"] == 1


def test_a_files_sha256_is_read_a_block_at_a_time(tmp_path: Path) -> None:
    """``file_sha256`` (a sweep's workload, ``simulate --from-run``'s check, a re-run's check of the files
    its run read) held the whole file in memory: a 2 GB workload took 2 GB more. It streams now."""
    import hashlib
    import tracemalloc

    from asyncroll.outputs.receipt import file_sha256

    path = tmp_path / "big.jsonl"
    block = b"x" * (1 << 20)
    with path.open("wb") as file:
        for _ in range(48):
            file.write(block)
    tracemalloc.start()
    try:
        digest = file_sha256(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert digest == hashlib.sha256(block * 48).hexdigest()
    assert peak < 8 << 20, peak


def test_run_json_body_says_the_runs_settings_code_workload_tools_and_isolation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """receipt_body on its own: the command, where it ran, which process, the settings (the canonical
    policy, the limits, the effective starvation threshold, which were given), whether simulated, the
    workload by its resolved path, each tool file with the digest the run checks, and the sandbox in force
    for untrusted code (none for a workload that runs none; 'not probed' where no isolation was probed)."""
    import dataclasses
    import os

    from asyncroll.code_identity import code_version_once
    from asyncroll.config import RunConfig
    from asyncroll.outputs.receipt import file_sha256
    from asyncroll.proctree import start_mark
    from asyncroll.runtime.prepare import prepare
    from asyncroll.runtime.receipt_body import receipt_body

    monkeypatch.chdir(REPO)
    workload = Path("examples/toolmath/workload.jsonl")
    cfg = RunConfig(workload=workload, output=tmp_path / "out", policy="asyncroll", limit=3, telemetry=False)
    prepared = prepare(cfg, ["asyncroll", "run", "--limit", "3"], output_ready=True)
    body = receipt_body(prepared, simulated=True, tool_sha256=lambda path: f"of {path.name}", extra={"x": 1})
    assert body["command"] == ["asyncroll", "run", "--limit", "3"] and body["cwd"] == str(REPO)
    assert body["pid"] == os.getpid() and body["pid_start"] == start_mark(os.getpid())
    assert body["config"]["policy_canonical"] == "asyncroll_repair" and body["config"]["limit"] == 3
    assert body["config"]["limits"] == cfg.limits.model_dump()
    assert body["config"]["starvation_threshold_effective"] == cfg.effective_starvation_threshold
    assert body["config_given"] == ["limit", "output", "policy", "telemetry", "workload"]
    assert body["simulated"] is True and body["code"] == code_version_once() and body["x"] == 1
    workload = REPO / workload
    assert body["workload"] == {"path": str(workload), "sha256": file_sha256(workload), "problems": 3}
    tools = body["tools"]
    assert tools and all(tool["sha256"] == f"of {Path(tool['path']).name}" for tool in tools.values())
    assert sorted(tools) == list(tools) and body["telemetry"]["requested"] is False
    assert body["isolation"]["untrusted_code"] is None
    assert receipt_body(prepared, simulated=False, tool_sha256=str, extra={})["simulated"] is False
    # a workload that runs untrusted code: the isolation probed, or a note that none was
    lcb = prepare(
        cfg.model_copy(update={"workload": REPO / "examples" / "livecodebench" / "workload.jsonl"}),
        output_ready=True,
    )
    untrusted = receipt_body(lcb, simulated=True, tool_sha256=str, extra={})["isolation"]["untrusted_code"]
    assert untrusted == {
        "note": "not probed: these workers do not run the code (simulated or virtual workers)"
    }
    probed = dataclasses.replace(lcb, isolation={"layers": ["a probed one"]})
    untrusted = receipt_body(probed, simulated=False, tool_sha256=str, extra={})["isolation"][
        "untrusted_code"
    ]
    assert untrusted == {"layers": ["a probed one"]}


def test_a_deprecated_policy_from_a_config_file_is_named_by_its_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warning named ``--policy gpu_first``, a flag nobody typed, for a config file's policy."""
    config = tmp_path / "run.json"
    config.write_text('{"policy": "gpu_first"}')
    args = ("--config", config, "--workload", SMOKE)
    result, seen = run_in_process(monkeypatch, *args, "--output", tmp_path / "r")
    assert result.exit_code == 0 and seen, result.stderr
    said = f"warning: --config {config}: setting 'policy': gpu_first is a deprecated alias of tool_first"
    assert said in result.stderr and "--policy gpu_first" not in result.stderr, result.stderr
    flagged, _ = run_in_process(monkeypatch, *args, "--output", tmp_path / "f", "--policy", "gpu_first")
    assert "warning: --policy gpu_first is a deprecated alias of tool_first" in flagged.stderr
