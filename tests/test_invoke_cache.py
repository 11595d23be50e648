"""The in-process ``invoke`` of conftest builds typer's click command once per set of registered commands:
a test that registers a command, or replaces one's function in place, gets a command built for that."""

from __future__ import annotations

import pytest
import typer
from typer.models import CommandInfo

from asyncroll.cli import app
from asyncroll.commands.single_values import SingleValueCommand
from tests.conftest import invoke


def _saying(text: str) -> CommandInfo:
    def say_it() -> None:
        typer.echo(text)

    return CommandInfo(name="say-it", callback=say_it, cls=SingleValueCommand)


def test_a_command_registered_for_one_test_is_invoked_and_then_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(app, "registered_commands", [*app.registered_commands, _saying("first")])
        assert invoke("say-it").output == "first\n"
    assert invoke("say-it").exit_code == 2  # no such command once the test's patch is undone


def test_a_commands_function_replaced_in_place_is_the_one_invoked(monkeypatch: pytest.MonkeyPatch) -> None:
    # The cache's key held the registered commands' ids only: a CommandInfo whose callback a test replaced
    # (or a new one that took a freed one's id) was answered with the command built for the old function.
    info = _saying("before")
    monkeypatch.setattr(app, "registered_commands", [*app.registered_commands, info])
    assert invoke("say-it").output == "before\n"
    monkeypatch.setattr(info, "callback", _saying("after").callback)
    assert invoke("say-it").output == "after\n"
