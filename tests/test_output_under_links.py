"""``--output`` under a symbolic link to nothing: the output itself does not exist, so "already exists"
(what the parent's failed mkdir used to be told as) sent the user looking for a directory that is not
there. The refusal names the link; nothing is created, the link's target included."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import invoke
from tests.test_output_paths import EVERY_OUTPUT_COMMAND


@pytest.mark.timeout(60)
@EVERY_OUTPUT_COMMAND
def test_an_output_under_a_link_to_nothing_names_the_link_not_a_taken_output(
    command: list[str | Path], tmp_path: Path
) -> None:
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    result = invoke(*command, "--output", link / "deeper" / "run")
    assert result.exit_code == 2, result.output
    assert "already exists" not in result.stderr
    said = f"cannot be used: {link} is a symbolic link to {tmp_path / 'nowhere'}, which does not exist"
    assert f"error: --output {link / 'deeper' / 'run'}: {said}" in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link"]  # the link was not followed
