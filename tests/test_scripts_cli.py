"""The scripts in scripts/: ``--help`` prints their usage and does nothing else; a bad path is a named
error. Two of them read ``sys.argv`` by hand and took ``--help`` for a workload file (a traceback) or for
the directory to write a model into."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.name for p in (REPO / "scripts").glob("*.py"))


def run_script(name: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / name), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_every_script_is_found() -> None:
    assert {"grammar_check.py", "make_tiny_llama.py", "serving_ablation.py"} <= set(SCRIPTS)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_prints_usage_for_help_and_writes_nothing(name: str, tmp_path: Path) -> None:
    done = run_script(name, ["--help"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower() and "Traceback" not in done.stderr, done.stdout[:300]
    assert list(tmp_path.iterdir()) == []  # not a model directory named "--help"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", ["run_lcb_bounded_single_gpu.py", "serving_ablation.py"])
def test_the_example_command_in_a_scripts_help_keeps_its_line_continuations(
    name: str, tmp_path: Path
) -> None:
    """The usage example in the help of these two scripts is a shell command over several lines ending in
    ``\\``; in a plain docstring a backslash before the newline joins the lines, so ``--help`` printed one
    line with runs of spaces in it (``…8x4.json         --model-path …``), not the command the docs show."""
    done = run_script(name, ["--help"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    # after the usage block: Python 3.13's argparse wraps usage before an option, indenting each "--"
    described = done.stdout.split("\n\n", 1)[1]
    assert " \\\n" in described, done.stdout[:600]
    assert "         --" not in described, done.stdout[:600]


@pytest.mark.timeout(90)
def test_grammar_check_names_a_workload_that_is_not_there(tmp_path: Path) -> None:
    done = run_script("grammar_check.py", ["nowhere.jsonl"], tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "nowhere.jsonl" in done.stderr, done.stderr


@pytest.mark.timeout(90)
def test_grammar_check_names_the_line_of_a_workload_that_is_not_valid(tmp_path: Path) -> None:
    """A workload line that is not JSON ended the check on a WorkloadError traceback (with an engine
    installed; without one it said only that no engine is installed)."""
    (tmp_path / "bad.jsonl").write_text('{"id": "a", "prompt": "p"}\nnope\n')
    done = run_script("grammar_check.py", ["bad.jsonl"], tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "bad.jsonl:2: line: not valid JSON" in done.stderr, done.stderr


@pytest.mark.timeout(90)
def test_make_tiny_llama_refuses_an_option_for_its_directory(tmp_path: Path) -> None:
    done = run_script("make_tiny_llama.py", ["--out"], tmp_path)
    assert done.returncode == 2 and "usage:" in done.stderr and list(tmp_path.iterdir()) == []


@pytest.mark.timeout(90)
@pytest.mark.parametrize("what", ["a_model", "a_file"])
def test_make_tiny_llama_never_writes_over_what_is_there(what: str, tmp_path: Path) -> None:
    """OUT_DIR was created with exist_ok and saved into: an existing model's config.json, weights and
    tokenizer were replaced by the random one's."""
    target = tmp_path / "model"
    if what == "a_model":
        target.mkdir()
        (target / "config.json").write_text('{"model_type": "qwen2"}\n')
    else:
        target.write_text("a file\n")
    done = run_script("make_tiny_llama.py", [str(target)], tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"{target} already exists" in done.stderr
    assert (target / "config.json" if what == "a_model" else target).read_text() in (
        '{"model_type": "qwen2"}\n',
        "a file\n",
    )


@pytest.mark.timeout(90)
def test_make_tiny_llama_says_what_it_needs_without_the_engine_packages(tmp_path: Path) -> None:
    """Without torch it was a ModuleNotFoundError traceback, and bench.transformers_serve, which runs it
    with captured output, said nothing at all."""
    import importlib.util  # the script runs with this interpreter

    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here: the script would build a model")
    done = run_script("make_tiny_llama.py", [str(tmp_path / "model")], tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "needs torch, transformers and tokenizers" in done.stderr
    assert list(tmp_path.iterdir()) == []
