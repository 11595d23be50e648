"""asyncroll under a locale whose file-name encoding is not UTF-8 (``LC_ALL=C`` with ``PYTHONUTF8=0``:
ASCII). A name given as a flag always works (Python keeps its bytes); a name read from a file (a settings
file, an experiment config, run.json) that such a locale cannot encode is refused with its field, before
anything is created, instead of a ``UnicodeEncodeError`` traceback or a failure at each arm's start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, invoke
from tests.experiments import write_config

SMOKE = REPO / "examples" / "smoke.jsonl"
ASCII = "this locale's file-name encoding (ascii); run under a UTF-8 locale"


def ascii_python(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` under the C locale with Python's UTF-8 mode off."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "PYTHONIOENCODING", "PYTHONUTF8"))}
    env.update(LC_ALL="C", LANG="C", PYTHONUTF8="0", PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-X", "utf8=0", *map(str, args)],
        capture_output=True,
        encoding="utf-8",
        errors="replace",
        timeout=60,
        cwd=cwd,
        env=env,
        check=False,
    )


def ascii_cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return ascii_python("-m", "asyncroll.cli", *args, cwd=cwd)


def _refused(proc: subprocess.CompletedProcess[str], where: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert where in proc.stderr and ASCII in proc.stderr, proc.stderr


def test_the_child_really_runs_under_an_ascii_locale(tmp_path: Path) -> None:
    proc = ascii_python("-c", "import sys; print(sys.getfilesystemencoding())", cwd=tmp_path)
    assert proc.stdout.strip() == "ascii", proc.stdout + proc.stderr


def test_a_settings_file_path_the_locale_cannot_spell_is_refused_naming_the_setting(tmp_path: Path) -> None:
    """``"workload": "数据/w.jsonl"`` in a --config file ended ``run`` in a UnicodeEncodeError traceback
    (as did such an ``output`` or ``tool_root``)."""
    folder = tmp_path / "数据"
    folder.mkdir()
    (folder / "w.jsonl").write_bytes(SMOKE.read_bytes())
    for setting, value in (("workload", "数据/w.jsonl"), ("output", "运行"), ("tool_root", "数据")):
        settings = {"workload": "w.jsonl", "output": "out", setting: value}
        (tmp_path / "w.jsonl").write_bytes(SMOKE.read_bytes())
        config = tmp_path / "settings.json"
        config.write_text(json.dumps(settings), encoding="utf-8")
        proc = ascii_cli("run", "--config", config, cwd=tmp_path)
        _refused(proc, f"--config {config}: setting '{setting}': {value!r}")
        assert not (tmp_path / "out").exists() and not (tmp_path / "运行").exists()


def test_an_experiment_whose_names_the_locale_cannot_spell_is_refused_up_front(
    tmp_path: Path,
) -> None:
    """A workload.path in a non-ASCII folder ended ``experiment plan`` and ``run`` in a traceback; a
    non-ASCII model.served_name (passed to the server and the client as an argument) failed every arm at
    its start with "unexpected error while starting_server: UnicodeEncodeError"."""
    folder = tmp_path / "数据"
    folder.mkdir()
    (folder / "smoke.jsonl").write_bytes(SMOKE.read_bytes())
    config = write_config(tmp_path, **{"workload.path": str(folder / "smoke.jsonl")})
    _refused(ascii_cli("experiment", "plan", "--config", config, cwd=tmp_path), f"{config}: workload.path: ")
    out = tmp_path / "exp"
    _refused(
        ascii_cli("experiment", "run", "--config", config, "--output", out, cwd=tmp_path), "workload.path"
    )
    assert not out.exists()
    config = write_config(tmp_path, **{"model.served_name": "模型"})
    _refused(
        ascii_cli("experiment", "run", "--config", config, "--output", out, cwd=tmp_path),
        f"{config}: model.served_name: '模型'",
    )
    assert not out.exists()


def test_a_replay_of_a_run_whose_workload_the_locale_cannot_spell_says_so(tmp_path: Path) -> None:
    """A run recorded under a UTF-8 locale from a folder ``数据`` and replayed under the C locale was
    refused as "its workload ... no longer exists", though it was there."""
    folder = tmp_path / "数据"
    folder.mkdir()
    (folder / "w.jsonl").write_bytes(SMOKE.read_bytes())
    run = tmp_path / "run"
    # recorded in this process, whose file-name encoding spells 数据 (it made the folder): a new interpreter
    # under a UTF-8 locale was seconds of the suite; the replay under the C locale is the one tested
    assert sys.getfilesystemencoding() == "utf-8"
    recorded = invoke("simulate", "--workload", folder / "w.jsonl", "--output", run)
    assert recorded.exit_code == 0, recorded.output
    proc = ascii_cli("simulate", "--from-run", run, "--output", tmp_path / "replay", cwd=tmp_path)
    _refused(proc, "its workload (run.json's workload.path) ")
    assert "no longer exists" not in proc.stderr and "pass --workload with a copy" in proc.stderr
    assert not (tmp_path / "replay").exists()


def test_help_and_optimum_write_their_own_non_ascii_text_under_an_ascii_locale(tmp_path: Path) -> None:
    """Under the ASCII locale ``run --help`` (its ×), ``validate --help`` (—), ``experiment --help`` (→),
    ``convert-toolmath --help`` (…) and ``optimum RUN`` (÷) ended in a UnicodeEncodeError traceback,
    exit 1: stdout was encoded strictly in the locale's encoding. It is written as click writes to an
    ASCII stdout, in UTF-8."""
    for command in ("run", "simulate", "validate", "experiment", "convert-toolmath"):
        proc = ascii_cli(command, "--help", cwd=tmp_path)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert "Usage: " in proc.stdout
    run = tmp_path / "run"  # recorded in this process: ``optimum`` is the command under the C locale here
    assert invoke("simulate", "--workload", SMOKE, "--output", run).exit_code == 0
    proc = ascii_cli("optimum", run, cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "makespan ÷ proven bound" in proc.stdout


def test_a_path_with_a_non_utf8_byte_is_written_as_its_bytes_on_a_strict_stdout(tmp_path: Path) -> None:
    """Under a UTF-8 locale such as en_US.UTF-8 Python's stdout is strict (only C, POSIX and UTF-8 mode
    get ``surrogateescape``): ``validate`` of a file in a folder named with a Latin-1 byte ended in
    'surrogates not allowed', exit 1, and ``run`` did so after its run. The name is written as its bytes."""
    folder = tmp_path / os.fsdecode(b"caf\xe9")
    folder.mkdir()
    workload = folder / "w.jsonl"
    workload.write_bytes(SMOKE.read_bytes())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "PYTHONIOENCODING", "PYTHONUTF8"))}
    env.update(LC_ALL="C.UTF-8", PYTHONIOENCODING="utf-8:strict", PYTHONPATH=str(REPO))
    for args in (["validate", workload], ["simulate", "--workload", workload, "--output", folder / "sim"]):
        proc = subprocess.run(
            [sys.executable, "-m", "asyncroll.cli", *map(str, args)],
            capture_output=True,
            timeout=60,
            cwd=tmp_path,
            env=env,
            check=False,
        )
        assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr.decode(errors="replace")
        assert b"caf\xe9" in proc.stdout, proc.stdout


def test_an_error_names_a_non_ascii_path_as_it_was_given_on_stderr(tmp_path: Path) -> None:
    """An error on stderr names the path as typed, as stdout does (the path's own bytes): under ``LC_ALL=C``
    with UTF-8 mode off, ``validate 数据/nope.jsonl`` said '??????/nope.jsonl: cannot read' (click replaced
    each byte with '?'), and under a UTF-8 locale a Latin-1 byte was written as the escape ``\\udce9``."""
    proc = ascii_cli("validate", "数据/nope.jsonl", cwd=tmp_path)
    assert proc.returncode == 2 and "数据/nope.jsonl: cannot read" in proc.stderr, proc.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "PYTHONIOENCODING", "PYTHONUTF8"))}
    env.update(LC_ALL="C.UTF-8", PYTHONPATH=str(REPO))
    latin = subprocess.run(
        [sys.executable, "-m", "asyncroll.cli", "validate", os.fsdecode(b"caf\xe9/nope.jsonl")],
        capture_output=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert latin.returncode == 2 and b"caf\xe9/nope.jsonl: cannot read" in latin.stderr, latin.stderr
