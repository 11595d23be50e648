"""One runner per output directory: the lock refuses a second runner (or a resume inside an arm) and a
killed runner leaves none behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import asyncroll.experiment.runner as runner_module
from asyncroll.errors import UsageError
from asyncroll.experiment.lock import OutputLock
from asyncroll.experiment.runner import ExperimentRunner
from tests.children import end
from tests.experiments import ROOT
from tests.lean_experiment import fake_arm, lean


def test_one_runner_per_output_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    held = OutputLock.acquire(tmp_path)
    with pytest.raises(UsageError, match=f"being run by pid {os.getpid()} on "):
        OutputLock.acquire(tmp_path)
    held.release()
    OutputLock.acquire(tmp_path).release()
    # a resume started while the runner is inside an arm is refused, and touches nothing
    cfg = lean(tmp_path)
    out = tmp_path / "out"
    refusals: list[str] = []
    inner = fake_arm()

    def run_arm(cfg: Any, plan: Any, arm_dir: Path, *args: Any, **kwargs: Any) -> Any:
        result = inner(cfg, plan, arm_dir)
        try:
            ExperimentRunner(cfg, out, resume=True, echo=lambda _: None).run()
        except UsageError as exc:
            refusals.append(str(exc))
        return result

    monkeypatch.setattr(runner_module, "run_arm", run_arm)
    ExperimentRunner(cfg, out, echo=lambda _: None).run()
    assert len(refusals) == 2 and all(f"being run by pid {os.getpid()}" in r for r in refusals)
    assert sorted(p.name for p in (out / "arms").iterdir()) == ["pair1-asyncroll", "pair1-fifo"]
    # once the runner has returned, the directory is free again
    lines: list[str] = []
    ExperimentRunner(cfg, out, resume=True, echo=lines.append).run()
    assert any("resuming" in line for line in lines)


@pytest.mark.timeout(30)
def test_a_killed_runner_leaves_no_lock_behind(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from asyncroll.experiment.lock import OutputLock; "
            "OutputLock.acquire(Path(sys.argv[1])); print('locked', flush=True); time.sleep(60)",
            str(tmp_path),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        with pytest.raises(UsageError, match=f"being run by pid {holder.pid} "):
            OutputLock.acquire(tmp_path)
        holder.kill()  # SIGKILL: no cleanup runs; the kernel drops the lock
        holder.wait(10)
        OutputLock.acquire(tmp_path).release()
    finally:
        end(holder)


def test_a_runner_that_took_the_directory_during_the_checks_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runners started at once on one --output: the other took the lock and made ``arms`` while this
    one checked its workload (before experiment.json exists). This one names the runner, as the lock does,
    rather than calling the directory a foreign non-empty one (``exists and is not empty``)."""
    cfg = lean(tmp_path)
    out = tmp_path / "out"
    check = runner_module.check_workload
    held: list[OutputLock] = []

    def other_runner_arrives(*args: Any, **kwargs: Any) -> Any:
        out.mkdir()
        held.append(OutputLock.acquire(out))
        (out / "arms").mkdir()
        return check(*args, **kwargs)

    monkeypatch.setattr(runner_module, "check_workload", other_runner_arrives)
    monkeypatch.setattr(runner_module, "run_arm", fake_arm())
    try:
        with pytest.raises(UsageError, match=f"being run by pid {os.getpid()} on "):
            ExperimentRunner(cfg, out, echo=lambda _: None).run()
    finally:
        held[0].release()
    assert sorted(p.name for p in out.iterdir()) == ["arms", "experiment.lock"]


def test_a_lock_that_is_a_link_is_refused_and_what_it_names_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder holding only ``experiment.lock`` counts as empty, so another user could make one (in /tmp,
    or a folder both may write in) whose lock is a symbolic link: the runner truncated the file the link
    named and wrote its pid record there, anywhere this user may write."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "experiment.lock").symlink_to(victim)
    monkeypatch.setattr(runner_module, "run_arm", fake_arm())
    with pytest.raises(UsageError, match=r"experiment\.lock: cannot open the runner's lock: a symbolic link"):
        ExperimentRunner(lean(tmp_path), out, echo=lambda _: None).run()
    with pytest.raises(UsageError, match="cannot open the runner's lock"):
        OutputLock.acquire(out)
    OutputLock.refuse_if_held(out)  # a check that creates nothing: a link is no runner's lock
    assert victim.read_text() == "precious\n"
    assert sorted(p.name for p in out.iterdir()) == ["experiment.lock"]


def test_an_output_that_is_a_dangling_symbolic_link_is_named_so(tmp_path: Path) -> None:
    """--output a symbolic link to a folder not made yet: refused before anything starts, saying so, as the
    report says it (was ``--output OUT: File exists``); nothing is made at either end."""
    out = tmp_path / "out"
    out.symlink_to(tmp_path / "not-made")
    with pytest.raises(UsageError, match=r"is a symbolic link to .*not-made, which does not exist"):
        ExperimentRunner(lean(tmp_path), out, echo=lambda _: None).run()
    assert out.is_symlink() and not (tmp_path / "not-made").exists()
