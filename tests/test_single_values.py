"""An option of one value given twice is refused by every command (click would keep the last silently);
options meant to repeat still repeat."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from asyncroll.commands.single_values import SingleValueCommand
from tests.conftest import REPO, invoke

SMOKE = REPO / "examples" / "smoke.jsonl"


def _usage_error(result: Any, option: str, times: int = 2) -> None:
    assert result.exit_code == 2, result.output
    assert f"Error: Option '{option}' given {times} times: it takes one value" in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("flag", "first", "second"),
    [
        ("--workload", str(SMOKE), str(REPO / "examples" / "missing.jsonl")),
        ("--output", "a", "b"),
        ("--policy", "fifo", "sync"),
        ("--cpu-workers", "1", "2"),
    ],
)
def test_run_refuses_an_option_of_one_value_given_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: str, first: str, second: str
) -> None:
    monkeypatch.chdir(tmp_path)  # --output a --output b: relative to here
    base = {"--workload": str(SMOKE), "--output": str(tmp_path / "run")}
    base.pop(flag, None)
    args = [part for pair in base.items() for part in pair]
    result = invoke("run", *args, flag, first, flag, second)
    _usage_error(result, flag)
    assert not (tmp_path / "run").exists() and not list(tmp_path.iterdir())


def test_simulate_refuses_a_repeated_option_and_a_flag_given_both_ways(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    _usage_error(
        invoke("simulate", "--workload", SMOKE, "--output", out, "--policy", "fifo", "--policy", "sync"),
        "--policy",
    )
    _usage_error(
        invoke("simulate", "--workload", SMOKE, "--output", out, "--sweep", "--seeds", "1", "--seeds", "2"),
        "--seeds",
    )
    _usage_error(
        invoke("simulate", "--workload", SMOKE, "--output", out, "--sweep", "--progress", "--no-progress"),
        "--progress/--no-progress",
    )
    _usage_error(
        invoke("simulate", "--workload", SMOKE, "--workload", SMOKE, "--workload", SMOKE, "--output", out),
        "--workload",
        times=3,
    )
    assert not out.exists()


def test_experiment_commands_refuse_a_repeated_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "c.json"
    _usage_error(invoke("experiment", "run", "--config", config, "--config", config), "--config")
    _usage_error(
        invoke("experiment", "plan", "--config", config, "--output", "a", "--output", "b"), "--output"
    )
    _usage_error(
        invoke("report", "--comparison", config, "--output", "a", "--figure", "--figure"), "--figure"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def leaves(group: Any, path: str = "") -> list[tuple[str, Any]]:
    """Every command of the assembled app under ``group``, by its full name (``experiment run``)."""
    found: list[tuple[str, Any]] = []
    for name, command in group.commands.items():
        sub = f"{path} {name}".strip()
        found += leaves(command, sub) if hasattr(command, "commands") else [(sub, command)]
    return found


def test_every_command_of_the_app_refuses_repeated_single_values() -> None:
    """Checked on the assembled app, so a command added later cannot miss it."""
    from asyncroll.cli import app

    commands = leaves(typer.main.get_command(app))
    assert {"run", "simulate", "optimum", "experiment run", "experiment plan", "report"} <= {
        name for name, _ in commands
    }
    for name, command in commands:
        assert isinstance(command, SingleValueCommand), name


def test_options_meant_to_repeat_still_repeat() -> None:
    """A list option (``multiple=True``) and a counter collect every occurrence; a single one does not."""
    app = typer.Typer(rich_markup_mode=None)
    seen: dict[str, Any] = {}

    @app.command(cls=SingleValueCommand)
    def go(
        tag: Annotated[list[str] | None, typer.Option("--tag")] = None,
        verbose: Annotated[int, typer.Option("-v", count=True)] = 0,
        name: Annotated[str, typer.Option("--name")] = "x",
    ) -> None:
        seen.update(tag=tag, verbose=verbose, name=name)

    runner = CliRunner()
    result = runner.invoke(app, ["--tag", "a", "--tag", "b", "-v", "-v", "-v", "--name", "n"])
    assert result.exit_code == 0, result.output
    assert seen == {"tag": ["a", "b"], "verbose": 3, "name": "n"}
    result = runner.invoke(app, ["--tag", "a", "--name", "n", "--name", "m"])
    _usage_error(result, "--name")
    assert runner.invoke(app, ["--help", "--help"]).exit_code == 0


def test_every_path_of_every_command_given_empty_is_refused_naming_it() -> None:
    """``Path("")`` is the current directory: ``--tool-root "$ROOT"`` with ``ROOT`` unset ran with the
    current directory as the tool root, silently, and ``--output ""`` said "--output . already exists"."""
    import inspect
    from typing import get_type_hints

    from asyncroll.cli import app
    from asyncroll.commands.single_values import _is_path

    checked = []
    for name, command in leaves(typer.main.get_command(app)):
        hints = get_type_hints(inspect.unwrap(command.callback))
        for param in command.params:
            if not _is_path(hints.get(param.name)):
                continue
            option = param.param_type_name == "option"
            result = invoke(*name.split(), *([param.opts[0]] if option else []), "")
            shown = (
                f"Option '{param.opts[0]}'" if option else f"Argument '{param.metavar or param.name.upper()}'"
            )
            assert result.exit_code == 2, (name, param.name, result.output)
            assert f"Error: {shown} is an empty path (an unset shell variable?)" in result.stderr, (
                result.stderr
            )
            checked.append(f"{name} {shown}")
    assert {"run Option '--tool-root'", "timeline Argument 'RUN_DIR'", "report Option '--output'"} <= set(
        checked
    )
    assert len(checked) >= 20, checked
    # a string option given empty is not a path: its own check answers
    assert "empty path" not in invoke("run", "--workload", str(SMOKE), "--policy", "").stderr
