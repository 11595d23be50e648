"""bench.synthetic's command line: parameters outside their documented range are refused, and it never
overwrites another tools file or an existing workload."""

from __future__ import annotations

from pathlib import Path

import pytest

# --- bench.synthetic ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--n", "-5"], "--n: must be an integer >= 1"),
        (["--n", "0"], "--n: must be an integer >= 1"),
        (["--model-ms", "-1"], "--model-ms: must be a finite number >= 0"),
        (["--cpu-ms", "0"], "--cpu-ms: must be a finite number > 0"),
        (["--cpu-ms", "inf"], "--cpu-ms: must be a finite number"),
        (["--repair-fraction", "2"], "--repair-fraction: must be a finite number >= 0 and <= 1"),
        (["--repair-fraction", "-1"], "--repair-fraction: must be a finite number >= 0 and <= 1"),
        (["--cpu-sigma", "-1"], "--cpu-sigma: must be a finite number >= 0"),
        (["--noise", "-0.5"], "--noise: must be a finite number >= 0"),
        (["--noise", "nan"], "--noise: must be a finite number"),
        (["--model-ms", "80000000"], "over a workload's one-day limit"),
    ],
)
def test_synthetic_refuses_parameters_outside_their_documented_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    from bench import synthetic

    with pytest.raises(SystemExit) as exit_info:
        synthetic.main([*args, "--output", str(tmp_path / "w.jsonl")])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("under", ["a-file/w.jsonl", "a-file/sub/w.jsonl"])
def test_synthetic_says_why_it_cannot_make_the_outputs_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], under: str
) -> None:
    """An --output under a path that is a file (a typo): a usage error naming it, not a
    NotADirectoryError traceback."""
    from bench import synthetic

    (tmp_path / "a-file").write_text("")
    with pytest.raises(SystemExit) as exit_info:
        synthetic.main(["--n", "1", "--output", str(tmp_path / under)])
    assert exit_info.value.code == 2
    assert f"cannot write --output {tmp_path / under}:" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_synthetic_never_overwrites_another_tools_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench import synthetic

    synthetic.main(["--n", "3", "--output", str(tmp_path / "a.jsonl")])
    synthetic.main(["--n", "3", "--output", str(tmp_path / "b.jsonl")])  # the same tools file: fine
    assert (tmp_path / synthetic.TOOLS_FILE).read_text() == synthetic.TOOLS_SOURCE
    mine = "def crunch(data):\n    return 0\n"
    (tmp_path / synthetic.TOOLS_FILE).write_text(mine)
    with pytest.raises(SystemExit) as exit_info:
        synthetic.main(["--n", "3", "--output", str(tmp_path / "c.jsonl")])
    assert exit_info.value.code == 2 and "is not this generator's tools file" in capsys.readouterr().err
    assert (tmp_path / synthetic.TOOLS_FILE).read_text() == mine and not (tmp_path / "c.jsonl").exists()
    before = (tmp_path / "a.jsonl").read_bytes()
    with pytest.raises(SystemExit) as exit_info:  # nor an existing workload
        synthetic.main(["--n", "4", "--output", str(tmp_path / "a.jsonl")])
    assert exit_info.value.code == 2 and "already exists" in capsys.readouterr().err
    assert (tmp_path / "a.jsonl").read_bytes() == before


def test_synthetic_interrupted_while_writing_leaves_no_partial_workload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C while a large workload was written left the lines written so far as the workload (and
    the tools file beside it): cut at a line's end it read as a smaller valid workload, and the next
    run refused the path as existing. Now nothing is left: the workload appears whole or not at all."""
    from bench import synthetic

    dumps = synthetic.json.dumps
    calls = []

    def interrupted(obj: object) -> str:
        calls.append(obj)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return dumps(obj)

    monkeypatch.setattr(synthetic.json, "dumps", interrupted)
    with pytest.raises(KeyboardInterrupt):
        synthetic.write(tmp_path / "w.jsonl", 5, 40.0, 25.0, 1)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / synthetic.TOOLS_FILE).write_text(synthetic.TOOLS_SOURCE)  # one that was there stays
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        synthetic.write(tmp_path / "w.jsonl", 5, 40.0, 25.0, 1)
    assert [p.name for p in tmp_path.iterdir()] == [synthetic.TOOLS_FILE]


def test_a_stopped_bench_says_what_the_stop_leaves_and_puts_the_handlers_back(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``bench.common.run_main``: exit 130 and one line naming the signal and what is left (bench.synthetic:
    no workload, as it writes one whole or not at all); the caller's handlers are back after."""
    import signal

    from bench.common import run_main

    before = signal.getsignal(signal.SIGTERM)

    def main() -> None:
        signal.raise_signal(signal.SIGTERM)

    with pytest.raises(SystemExit) as exit_info:
        run_main("bench.synthetic", main, "no workload written")
    assert exit_info.value.code == 130
    assert capsys.readouterr().err == "bench.synthetic: interrupted by SIGTERM; no workload written\n"
    assert signal.getsignal(signal.SIGTERM) == before
