"""What the converters share: the seeded selection, boxed answers, the atomic writer, and source rows read
again by offset."""

from __future__ import annotations

import hashlib
import os
import random
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from asyncroll.convert import MAX_REPORTED, raise_problems
from asyncroll.convert.boxed import BoxedError, last_boxed
from asyncroll.convert.selection import rank_key, select
from asyncroll.errors import UsageError
from tests.conftest import REPO, invoke
from tests.conversions import lcb_rows, write_jsonl

# --- selection and boxed answers (pure) --------------------------------------------------------------


def test_a_refusal_lists_the_first_problems_counts_the_rest_and_ends_with_the_hint() -> None:
    raise_problems([])  # none: nothing raised
    problems = [f"record [{i}]: bad" for i in range(MAX_REPORTED + 2)]
    with pytest.raises(UsageError) as refused:
        raise_problems(problems, "hint: see README")
    assert str(refused.value).split("\n") == [*problems[:MAX_REPORTED], "... and 2 more", "hint: see README"]
    with pytest.raises(UsageError) as exact:
        raise_problems(problems[:MAX_REPORTED])
    assert str(exact.value).split("\n") == problems[:MAX_REPORTED]


def test_rank_is_sha256_of_seed_and_key_and_selection_ignores_order() -> None:
    expected = hashlib.sha256(b'[3,"1873_A"]').hexdigest()
    assert rank_key(3, "1873_A") == expected
    keys = [f"k{i}" for i in range(50)]
    chosen = select(keys, key=str, seed=3, limit=10)
    shuffled = keys[:]
    random.Random(1).shuffle(shuffled)
    assert select(shuffled, key=str, seed=3, limit=10) == chosen
    assert select(keys, key=str, seed=3, limit=None)[:10] == chosen  # a limit takes a prefix
    assert select(keys, key=str, seed=4, limit=10) != chosen


@pytest.mark.parametrize(
    ("solution", "answer"),
    [
        ("so $x = \\boxed{5}$.", "5"),
        ("hence $\\boxed{\\frac{1}{2}}$", "\\frac{1}{2}"),
        ("$\\boxed{\\left(\\frac{3}{4}, \\sqrt{2}\\right)}$", "\\left(\\frac{3}{4}, \\sqrt{2}\\right)"),
        ("the set $\\boxed{\\{1, 2\\}}$", "\\{1, 2\\}"),
        ("first \\boxed{1}, then the answer \\boxed{ 2 }", "2"),
        ("\\fbox{-1004}", "-1004"),
        # MATH's last_boxed_only_string: the last \boxed, and \fbox only in a solution with no \boxed
        ("so \\boxed{3}; checked: \\fbox{4}", "3"),
        ("\\fbox{1} then \\fbox{2}", "2"),
        ("so $x = \\boxed 7$.", "7"),
        ("no box here", None),
        ("\\boxeds{3} is not a box", None),
    ],
)
def test_last_boxed_answer(solution: str, answer: str | None) -> None:
    assert last_boxed(solution) == answer


@pytest.mark.parametrize(
    ("solution", "message"),
    [("\\boxed{\\frac{1}{2}", "unbalanced"), ("\\boxed{}", "empty"), ("answer \\boxed", "no argument")],
)
def test_malformed_boxed_is_an_error(solution: str, message: str) -> None:
    with pytest.raises(BoxedError, match=message):
        last_boxed(solution)


# --- output and source plumbing ----------------------------------------------------------------------


def test_atomic_writer_never_clobbers_a_file_that_appears_meanwhile(tmp_path: Path) -> None:
    from asyncroll.convert.output import write_jsonl_atomic

    out = tmp_path / "w.jsonl"

    def objects() -> Any:
        yield {"id": 1}
        out.write_text("someone else's")  # appears after the checks, before the publish
        yield {"id": 2}

    with pytest.raises(UsageError, match="appeared while converting; not overwritten"):
        write_jsonl_atomic(out, objects())
    assert out.read_text() == "someone else's"
    assert [p.name for p in tmp_path.iterdir()] == ["w.jsonl"]  # the temporary file is gone
    fresh = tmp_path / "sub" / "fresh.jsonl"
    assert write_jsonl_atomic(fresh, [{"b": 1, "a": "é"}]) == 1
    assert fresh.read_bytes() == '{"b":1,"a":"é"}\n'.encode()


def test_what_a_killed_convert_left_staged_is_cleared_and_a_stale_own_name_is_no_obstacle(
    tmp_path: Path,
) -> None:
    """A convert killed mid-write left its hidden temporary file (a workload can be large) for good; the
    writer now stages under the shared per-process name and clears what dead writers left."""
    from asyncroll.convert.output import write_jsonl_atomic

    out = tmp_path / "w.jsonl"
    never = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # a pid no process can have
    dead = tmp_path / f".w.jsonl.{never}.tmp"
    own = tmp_path / f".w.jsonl.{os.getpid()}.tmp"  # as a dead process with this pid left it
    for left in (dead, own):
        left.write_text("half a workload")
    assert write_jsonl_atomic(out, [{"id": 1}]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.jsonl"]


def test_an_output_named_near_the_file_name_limit_is_written_and_its_staged_leftovers_cleared(
    tmp_path: Path,
) -> None:
    """A legal name of 243 to 255 bytes (``中`` is three) was refused, 'cannot write there: File name too
    long': the hidden staging name beside it adds a dot, the pid and .tmp. Past the limit it is shortened
    (a digest of the whole name kept), and what a dead writer left under it is cleared as before."""
    from asyncroll.convert.output import write_jsonl_atomic
    from asyncroll.outputs.lines import staging_path

    never = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    for name in ("中" * 85, "c" + "a" * 250, "a" * 239):
        out = tmp_path / name
        assert len(os.fsencode(staging_path(out).name)) <= 255
        assert staging_path(out).name.endswith(f".{os.getpid()}.tmp")
        dead = staging_path(out).with_name(staging_path(out).name.replace(str(os.getpid()), str(never)))
        dead.write_text("half a workload")
        assert write_jsonl_atomic(out, [{"id": "é"}]) == 1
        assert out.read_text(encoding="utf-8") == '{"id":"é"}\n'
        assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]
        out.unlink()
    assert staging_path(tmp_path / "w.jsonl").name == f".w.jsonl.{os.getpid()}.tmp"  # a short name as it was
    assert staging_path(tmp_path / ("a" * 240)) != staging_path(tmp_path / ("a" * 239 + "b"))


def test_a_source_or_output_that_is_a_symlink_loop_is_named(tmp_path: Path) -> None:
    """``--source LOOP`` or ``--output LOOP`` (a symlink to itself) ended both converters in 'RuntimeError:
    Symlink loop' tracebacks (Path.resolve on 3.11)."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    source = REPO / "examples" / "livecodebench" / "test.jsonl"
    cases: tuple[tuple[list[str | Path], str], ...] = (
        (["--source", loop, "--output", tmp_path / "o.jsonl"], f"{loop}: cannot read: Too many levels"),
        (["--source", source, "--output", loop], f"--output {loop} already exists"),
    )
    for args, said in cases:
        result = invoke("convert-livecodebench", *args)
        assert result.exit_code == 2 and said in result.stderr, result.stderr or result.exception
    functions = REPO / "examples" / "toolmath"
    toolmath = invoke(
        "convert-toolmath", "--source", loop, "--functions-dir", functions, "--output", tmp_path / "t"
    )
    assert toolmath.exit_code == 2, toolmath.exception
    assert f"{loop}: cannot read: Too many levels" in toolmath.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop"]


def test_an_output_through_a_folder_not_made_yet_that_names_an_existing_file_is_refused_first(
    tmp_path: Path,
) -> None:
    """``--output new/../taken.jsonl`` with ``new`` not there: the path could not be looked up, so it
    was taken as free; the write made ``new``, and the run ended with "appeared while converting" (a race
    it was not), leaving ``new`` behind. It is refused before any work, as any existing output is."""
    taken = tmp_path / "taken.jsonl"
    taken.write_text("kept\n")
    output = tmp_path / "new" / ".." / "taken.jsonl"
    source = REPO / "examples" / "livecodebench" / "test.jsonl"
    result = invoke("convert-livecodebench", "--source", source, "--output", output)
    assert result.exit_code == 2, result.stderr or result.exception
    assert f"--output {output} already exists" in result.stderr, result.stderr
    assert taken.read_text() == "kept\n" and not (tmp_path / "new").exists()
    fresh = invoke(
        "convert-livecodebench", "--source", source, "--output", tmp_path / "new2" / ".." / "a.jsonl"
    )
    assert fresh.exit_code == 0, fresh.stderr or fresh.exception  # a free name by the same way is written
    assert (tmp_path / "a.jsonl").is_file()


def test_an_output_that_names_a_folder_is_refused_not_written_as_a_file(tmp_path: Path) -> None:
    """``--output runs/lcb/`` (a folder, as ``run --output`` takes) wrote the workload to a file named
    ``runs/lcb``: the trailing slash was lost when the option became a Path."""
    source = REPO / "examples" / "livecodebench" / "test.jsonl"
    functions = REPO / "examples" / "toolmath"
    for given, example in (
        ("new/", "new/workload.jsonl"),
        ("new/.", "new/workload.jsonl"),
        (".", "workload.jsonl"),
    ):
        output = f"{tmp_path}/{given}"
        lcb = invoke("convert-livecodebench", "--source", source, "--output", output)
        tm = invoke(
            "convert-toolmath",
            "--source",
            functions / "ToolMATH.json",
            "--functions-dir",
            functions,
            "--output",
            output,
        )
        for result in (lcb, tm):
            assert result.exit_code == 2, result.stderr or result.exception
            said = f"error: --output {output} names a folder; give the workload's file name"
            assert f"{said} (e.g. {tmp_path}/{example})" in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []
    assert "--output is empty" in invoke("convert-livecodebench", "--source", source, "--output", "").stderr


def test_an_output_under_a_file_names_that_file(tmp_path: Path) -> None:
    """``--output rows.jsonl/w.jsonl`` said "cannot create its folder: File exists", naming no file."""
    source = REPO / "examples" / "livecodebench" / "test.jsonl"
    blocker = tmp_path / "rows.jsonl"
    blocker.write_text("kept\n")
    for output in (blocker / "w.jsonl", blocker / "sub" / "w.jsonl"):
        result = invoke("convert-livecodebench", "--source", source, "--output", output)
        assert result.exit_code == 2, result.stderr or result.exception
        assert f"error: --output {output}: {blocker} is a file, not a folder\n" == result.stderr
    assert blocker.read_text() == "kept\n" and sorted(tmp_path.iterdir()) == [blocker]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("umask", "mode"), [(0o077, 0o600), (0o022, 0o644), (0o002, 0o664)], ids=["077", "022", "002"]
)
def test_a_converted_workload_gets_the_mode_the_umask_gives_a_new_file(
    tmp_path: Path, umask: int, mode: int
) -> None:
    """A LiveCodeBench workload holds the hidden tests: under ``umask 077`` its owner's alone, like a
    run directory. The converter made every output 0644 (its temporary file's 0600 widened by hand),
    readable by every user of a shared machine whatever the umask said."""
    out = tmp_path / "lcb.jsonl"
    source = REPO / "examples" / "livecodebench" / "test.jsonl"
    convert = ["convert-livecodebench", "--source", str(source), "--output", str(out), "--limit", "1"]
    done = subprocess.run(
        ["sh", "-c", f'umask {umask:03o} && exec "$0" "$@"', sys.executable, "-m", "asyncroll.cli", *convert],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(out.stat().st_mode) == mode
    assert [p.name for p in tmp_path.iterdir()] == ["lcb.jsonl"]


def test_jsonl_rows_are_read_again_by_offset_and_a_changed_source_is_refused(tmp_path: Path) -> None:
    from asyncroll.convert.rows import RowSource

    rows = lcb_rows()
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    reader = RowSource(source)
    scanned = list(reader.scan())
    assert all(ref.row is None and ref.offset >= 0 for _, ref in scanned)  # JSONL rows are not kept
    assert reader.sha256 == hashlib.sha256(source.read_bytes()).hexdigest()
    assert [reader.load(ref) for _, ref in scanned] == rows
    changed = source.read_text().replace("A. Short Sort", "A. Short Sorz")
    source.write_text(changed)
    with pytest.raises(UsageError, match=r"rows.jsonl:1: the source changed while it was being converted"):
        reader.load(scanned[0][1])
