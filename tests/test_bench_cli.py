"""The bench scripts' command lines: bad arguments are refused (exit 2) before anything runs."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("module", "args", "message"),
    [
        ("simspeed", ["--sizes", "0"], "--sizes: must be an integer >= 1"),
        ("simspeed", ["--sizes", "5,,6"], "an empty item"),
        ("simspeed", ["--repeats", "0"], "--repeats: must be an integer >= 1"),
        ("paired", ["--seeds", "0"], "--seeds: must be an integer >= 1"),
        ("paired", ["--cpu-ms", "0"], "--cpu-ms: must be a finite number > 0"),
        ("decision", ["--repeats", "0"], "--repeats: must be an integer >= 1"),
    ],
)
def test_bench_arguments_are_checked_before_anything_runs(
    capsys: pytest.CaptureFixture[str], module: str, args: list[str], message: str
) -> None:
    import importlib
    import sys

    bench = importlib.import_module(f"bench.{module}")
    saved = sys.argv
    sys.argv = [module, *args]
    try:
        with pytest.raises(SystemExit) as exit_info:
            bench.main()
    finally:
        sys.argv = saved
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_the_benches_shared_run_helper_runs_a_scripted_workload() -> None:
    """bench.limits, paired, scaling and calibrate all run through ``run_once`` (scripted backend)."""
    from bench.common import run_once, tool_chain

    outcome, run_dir, _ = run_once(tool_chain(3, 1, 5.0), virtual=True)
    assert outcome.status == "complete" and (run_dir / "events.jsonl").exists()
    assert outcome.summary is not None and outcome.summary["counts"]["completed"] == 3
