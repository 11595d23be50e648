"""Every bench that reports figures states the machine it ran on first (docs/BENCHMARKS.md)."""

from __future__ import annotations

import sys

import pytest


@pytest.mark.timeout(60)
def test_the_draws_bench_states_its_machine(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench.draws printed its workload line first and no machine: a simulation's figures do not depend
    on the machine, but its timing in RESULTS.md ("a few minutes on the 2-CPU VM") and the project's rule
    (every figure states its machine and settings) do."""
    from bench import draws
    from bench.common import machine

    monkeypatch.setattr(sys, "argv", ["draws", "--seeds", "2", "--n", "2", "--points", "2/1/1"])
    draws.main()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"machine: {machine()}"
    assert lines[1].startswith("workload: bench.synthetic n=2 ")
