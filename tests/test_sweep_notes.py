"""What a sweep says beside its numbers, as a single ``simulate`` of a cell says it: ``sync``'s rows at an
active limit it does not use."""

from __future__ import annotations

from pathlib import Path

from tests.cli_runs import SMOKE
from tests.simulations import simulate_here

SWEEP = ("--sweep", "--seeds", "1", "--jobs", "1", "--no-progress")


def test_sync_rows_at_an_active_limit_above_one_say_they_ran_one_trajectory(tmp_path: Path) -> None:
    """``sync`` runs one trajectory at a time whatever ``--active`` says: its rows at 2 and 8 are one
    simulation under two labels. A single ``simulate --policy sync --max-active-trajectories 8`` warns;
    the sweep labelled its rows "active 8" without a word, in sweep.md or on stderr."""
    out = tmp_path / "s"
    swept = simulate_here(
        "--workload", SMOKE, "--output", out, *SWEEP, "--policies", "fifo,sync", "--active", "1,2,8"
    )
    assert swept.exit_code == 0, swept.output
    note = "sync runs one trajectory at a time: its rows at active 2, 8 ran with 1 active trajectory"
    assert note in (out / "sweep.md").read_text()
    warning = (
        "warning: --policies sync runs one trajectory at a time: --active 2, 8 has no effect on its rows"
    )
    assert warning in swept.stderr
    plain = simulate_here(
        "--workload", SMOKE, "--output", tmp_path / "t", *SWEEP, "--policies", "fifo,sync", "--active", "1"
    )
    assert plain.exit_code == 0, plain.output
    assert "one trajectory at a time" not in plain.stderr + (tmp_path / "t" / "sweep.md").read_text()
