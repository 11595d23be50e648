"""The command line around its commands: ``schema``, ``--version``, the help text (plain, and printed
without importing anything heavy), and the report module's own entry point."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cli_runs import cli
from tests.conftest import REPO, invoke


def test_schema_command_prints_every_schema() -> None:
    result = cli("schema")
    assert result.returncode == 0
    schemas = json.loads(result.stdout)
    assert set(schemas) == {"workload", "events", "run", "summary", "config"}
    assert "cpu_selected" in json.dumps(schemas["events"])


def test_the_run_schema_declares_every_key_a_run_writes(tmp_path: Path) -> None:
    """MEASUREMENT.md lists run.json's keys as ``asyncroll schema run`` does; pid_start was written
    (and documented there) but left out of the schema."""
    out = tmp_path / "run"
    done = invoke("simulate", "--workload", REPO / "examples" / "smoke.jsonl", "--output", out)
    assert done.exit_code == 0, done.output
    written = set(json.loads((out / "run.json").read_text()))
    declared = set(json.loads(cli("schema", "run").stdout)["properties"])
    assert written - declared == set()


def test_the_run_schema_declares_the_key_timeline_adds(tmp_path: Path) -> None:
    """`asyncroll timeline RUN_DIR` adds exports_regenerated to run.json (MEASUREMENT.md lists it among
    run.json's keys, which `asyncroll schema run` describes); the schema left it out."""
    out = tmp_path / "run"
    done = invoke("simulate", "--workload", REPO / "examples" / "smoke.jsonl", "--output", out)
    assert done.exit_code == 0, done.output
    again = invoke("timeline", out)
    assert again.exit_code == 0, again.output
    written = set(json.loads((out / "run.json").read_text()))
    assert "exports_regenerated" in written
    declared = set(json.loads(cli("schema", "run").stdout)["properties"])
    assert written - declared == set()


def test_version_prints_the_installed_package_version() -> None:
    from importlib.metadata import version

    result = cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"asyncroll {version('asyncroll')}\n"


def test_version_of_a_checkout_never_installed_is_the_package_own(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    import asyncroll

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    result = invoke("--version")
    assert result.exit_code == 0 and result.stdout == f"asyncroll {asyncroll.__version__}\n"


def test_version_is_the_running_codes_not_stale_installed_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    """An editable install's metadata keeps the version it was installed at (a wheel in the environment
    while ``python -m asyncroll`` runs a checkout: that wheel's): ``--version`` printed it, while run.json
    recorded the running code's ``__version__``. It prints the code's, and says the metadata differs."""
    import importlib.metadata

    import asyncroll

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.0.1")
    result = invoke("--version")
    assert result.exit_code == 0 and result.stdout == f"asyncroll {asyncroll.__version__}\n"
    assert "metadata says 0.0.1" in result.stderr and "pip install it again" in result.stderr


def test_no_help_text_shows_rst_markup() -> None:
    """The help is plain text (``rich_markup_mode=None``): a docstring's RST double backticks would be
    printed as they are; every command writes code as `this`, in single backticks."""
    import typer.main

    from asyncroll.cli import app

    def commands(group: Any, path: tuple[str, ...]) -> list[tuple[str, ...]]:
        found: list[tuple[str, ...]] = [path]
        for name, command in group.commands.items():  # a group (typer's own click) has commands
            found += commands(command, (*path, name)) if hasattr(command, "commands") else [(*path, name)]
        return found

    root = typer.main.get_command(app)
    paths = commands(root, ())
    assert ("simulate",) in paths and ("optimum",) in paths and ("experiment", "run") in paths
    for path in paths:
        result = invoke(*path, "--help")
        assert result.exit_code == 0, (path, result.output)
        assert "``" not in result.stdout, (path, result.stdout)


def test_help_imports_nothing_heavy() -> None:
    code = (
        "import sys, asyncroll.cli; heavy = ('pydantic', 'sklearn', 'httpx', 'psutil', 'numpy', 'asyncio');"
        "print(','.join(m for m in heavy if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert result.stdout.strip() == ""
    assert cli("--help").returncode == 0
    # printing help does not load rich either (its markdown renderer alone took ~0.2 s of start-up)
    for args in (["--help"], ["run", "--help"], ["experiment", "--help"]):
        shown = (
            f"import sys\nfrom asyncroll.cli import app\ntry:\n    app({args!r})\nexcept SystemExit:\n"
            "    pass\nprint('rich' in sys.modules, file=sys.stderr)"
        )
        result = subprocess.run([sys.executable, "-c", shown], capture_output=True, text=True, timeout=30)
        assert "Usage: " in result.stdout and result.stderr.strip() == "False", (args, result.stderr)


def test_the_report_module_entry_point_shows_its_own_usage() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "asyncroll.report", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )
    assert result.returncode == 0 and result.stdout.startswith("Usage: python -m asyncroll.report [OPTIONS]")
    assert "--comparison" in result.stdout


def test_the_report_module_entry_point_is_the_same_command_as_asyncroll_report(tmp_path: Path) -> None:
    # ARCHITECTURE and its docstring call it the same as `asyncroll report`; it took the last of two
    # --comparison silently, and a --help to a stdout that fails ended in an OSError traceback.
    def report_module(*args: str, stdout: int = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "asyncroll.report", *args],
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            timeout=30,
            cwd=REPO,
        )

    twice = report_module("--comparison", "a.json", "--comparison", "b.json", "--output", str(tmp_path / "r"))
    assert twice.returncode == 2, twice.stderr
    assert "Option '--comparison' given 2 times" in twice.stderr
    read_end, write_end = os.pipe()
    os.close(read_end)  # `| head -0` once head has exited: a write fails with EPIPE
    try:
        lost = report_module("--help", stdout=write_end)
    finally:
        os.close(write_end)
    assert (lost.returncode, lost.stderr) == (1, "")


@pytest.mark.parametrize(
    ("command", "name"), [("timeline", "RUN_DIR"), ("optimum", "RUN_DIR"), ("validate", "WORKLOAD")]
)
def test_a_missing_argument_is_named_as_the_docs_name_it(command: str, name: str) -> None:
    """typer named them by their Python parameters ('run_dir', '{workload}'), not as README does."""
    done = invoke(command)
    assert done.exit_code == 2 and f"Missing argument '{name}'" in done.stderr
    # click 8.5 braces a required argument's metavar in the usage line, click 8.2 (the dev floor) does not
    assert re.search(rf"asyncroll {command} \[OPTIONS\] \{{?{name}\}}?\n", done.stderr), done.stderr


def test_run_help_names_every_defaulted_choice() -> None:
    """A choice flag's help says which value it takes when not given (--backend said nothing)."""
    from typer.testing import CliRunner

    from asyncroll.cli import app

    shown = " ".join(CliRunner().invoke(app, ["run", "--help"], terminal_width=200).stdout.split())
    assert "scripted (the default) | vllm | openai" in shown
    assert "fifo (the default)" in shown


def test_every_default_run_help_states_is_the_configs() -> None:
    """``run --help`` states defaults as literals (``(default 16)``, ``(60)``): each must be RunConfig's."""
    import re

    import typer.main

    from asyncroll.cli import app
    from asyncroll.config import RunConfig

    run = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    said, held = {}, {}
    for param in run.params:
        field = RunConfig.model_fields.get(param.name)
        default = None if field is None else field.default
        stated = re.search(r"\((?:default )?(\d[\d.]*)[;,)]", param.help or "")
        if stated is None or not isinstance(default, int | float) or isinstance(default, bool):
            continue
        said[param.name], held[param.name] = float(stated.group(1).rstrip(".")), float(default)
    assert len(said) >= 10, said  # the help states a dozen of them
    assert said == held


def test_the_policy_help_names_every_policy_the_default_and_the_rule_asyncroll_runs() -> None:
    """``--policy``'s help is a literal (the registry stays unimported for ``--help``): it must name every
    policy a config accepts, the config's default, and the rule ``asyncroll`` stands for."""
    import re
    from typing import get_args

    from asyncroll.commands.common import POLICY_HELP
    from asyncroll.config import PolicyName, RunConfig
    from asyncroll.policies.registry import DEFAULT_PRESSURE

    assert set(re.findall(r"\b(?:sync|fifo|\w+_first|asyncroll\w*)\b", POLICY_HELP)) == set(
        get_args(PolicyName)
    )
    assert f"{RunConfig.model_fields['policy'].default} (the default)" in POLICY_HELP
    assert f"asyncroll (the pressure-aware policy: {DEFAULT_PRESSURE})" in POLICY_HELP
