"""The protocol fingerprint's code component: the code the clients run, not the state of the checkout."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import asyncroll
import asyncroll.experiment.fingerprint as fingerprint_module
import asyncroll.experiment.runner as runner_module
from asyncroll.experiment.arms import PROTOCOL_STEP
from asyncroll.experiment.runner import ExperimentRunner
from tests.experiments import read
from tests.lean_experiment import lean


def test_a_checkout_made_dirty_by_a_doc_edit_does_not_stop_the_experiment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``git describe --dirty`` turns ``-dirty`` when any tracked file changes: a README edited in the
    checkout while an arm ran failed that arm (the check after it) and stopped the experiment, though
    the package the clients run was the same. describe and commit are recorded, not hashed; an edit to
    the package's code still stops it."""
    state = {"describe": "v1-3-gabc", "commit": "abc", "source_sha256": "1" * 64}

    def code_version() -> dict[str, str | None]:
        return {"package": "0.1", **state}

    monkeypatch.setattr(fingerprint_module, "code_version", code_version)
    ran: list[str] = []

    def run_arm(cfg: Any, plan: Any, arm_dir: Path, *args: Any, **kwargs: Any) -> Any:
        """Starts nothing; the protocol is checked when its "client" exits, as run_arm checks it."""
        ran.append(plan.id)
        arm_dir.mkdir(parents=True)
        if plan.id == "pair1-fifo":  # a doc edited, then committed, while the first arm runs
            state.update(describe="v1-4-gdef-dirty", commit="def")
        elif plan.id == "pair2-asyncroll":  # the package's code edited
            state.update(source_sha256="2" * 64)
        problem = kwargs["protocol_check"]()
        if problem is not None:
            return SimpleNamespace(status="failed", data={"error": problem, "failed_step": PROTOCOL_STEP})
        return SimpleNamespace(status="complete", data={"error": None})

    monkeypatch.setattr(runner_module, "run_arm", run_arm)
    out = tmp_path / "out"
    outcome = ExperimentRunner(lean(tmp_path, pairs=2), out, echo=lambda _: None).run()
    assert ran == ["pair1-fifo", "pair1-asyncroll", "pair2-asyncroll"], outcome.message
    exp = read(out / "experiment.json")
    assert exp["fingerprint"]["detail"]["code"]["describe"] == "v1-3-gabc"  # recorded as it started
    assert [exp["arms"][a]["status"] for a in ran] == ["complete", "complete", "failed"]
    assert outcome.status == "stopped"
    assert exp["stop_reason"].startswith("after pair2-asyncroll ran: the protocol changed"), exp[
        "stop_reason"
    ]
    assert "source_sha256 111111111111 → 222222222222" in exp["stop_reason"], exp["stop_reason"]


def test_a_resume_from_another_folder_with_relative_model_and_server_paths_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``model.path`` and ``server.command`` reach the server as written: relative, they lead somewhere
    else from another folder, and the config's hash (its text) did not change, so a ``--resume`` started
    from another folder ran another model or program under the same fingerprint. Where they lead is now
    a component of it; a hub id (nothing of that name here) and absolute paths do not depend on it."""
    from asyncroll.experiment.fingerprint import FingerprintMismatch, fingerprint, require_same

    for home in ("a", "b"):
        (tmp_path / home / "models" / "tiny").mkdir(parents=True)
    command = ["./serve.sh", "{model_path}", "--port", "{port}"]
    cfg = lean(tmp_path, **{"model.path": "models/tiny", "server.command": command})
    monkeypatch.chdir(tmp_path / "a")
    there = fingerprint(cfg, "0" * 64, {})
    assert there["detail"]["paths"] == {
        "model.path": str(tmp_path / "a" / "models" / "tiny"),
        "server.command[0]": str(tmp_path / "a" / "serve.sh"),
    }
    require_same(there, fingerprint(cfg, "0" * 64, {}), "resume")  # the same folder: the same
    monkeypatch.chdir(tmp_path / "b")
    with pytest.raises(FingerprintMismatch) as refused:
        require_same(there, fingerprint(cfg, "0" * 64, {}), "resume")
    said = str(refused.value)
    assert f"model.path {tmp_path / 'a' / 'models' / 'tiny'} → {tmp_path / 'b' / 'models' / 'tiny'}" in said
    assert "server.command[0]" in said
    hub = lean(tmp_path, **{"model.path": "Qwen/Qwen2.5-7B-Instruct"})  # no such folder: a hub id
    monkeypatch.chdir(tmp_path / "a")
    from_a = fingerprint(hub, "0" * 64, {})
    monkeypatch.chdir(tmp_path / "b")
    require_same(from_a, fingerprint(hub, "0" * 64, {}), "resume")
    assert from_a["detail"]["paths"] == {}


def test_a_resume_with_an_edited_config_is_refused_naming_the_settings_that_changed(tmp_path: Path) -> None:
    """A config edited between the start and a ``--resume`` was refused as ``config: 1a2b3c4d5e6f →
    9f8e7d6c5b4a``: two hashes, and nothing to say which of its settings to put back."""
    from asyncroll.experiment.fingerprint import FingerprintMismatch, fingerprint, require_same

    started = fingerprint(lean(tmp_path), "0" * 64, {})
    edited = lean(tmp_path, **{"client.max_turns": 6, "pairs": 2, "description": "edited"})
    with pytest.raises(FingerprintMismatch) as refused:
        require_same(started, fingerprint(edited, "0" * 64, {}), "resume")
    said = str(refused.value)
    assert "config: client.max_turns 4 → 6, description " in said, said
    assert "pairs 1 → 2" in said, said
    old = {**started, "detail": {k: v for k, v in started["detail"].items() if k != "config"}}
    with pytest.raises(FingerprintMismatch, match=r"config: [0-9a-f]{12} → [0-9a-f]{12}"):
        require_same(old, fingerprint(edited, "0" * 64, {}), "resume")  # a receipt without it: the hashes


def test_a_resume_under_a_hand_edited_recorded_version_is_refused_not_run_into_failed_arms(
    tmp_path: Path,
) -> None:
    """experiment.json's recorded asyncroll version edited (its hashes left alone): the resume compared
    only the hashes and went on, and each arm it ran then failed (its client "ran 0.1.0, the experiment
    pinned 0.0.9"), a failed arm that no resume may run again. The recorded versions are compared too."""
    import copy

    from asyncroll.experiment.fingerprint import FingerprintMismatch, fingerprint, require_same

    cfg = lean(tmp_path)
    started = fingerprint(cfg, "0" * 64, {})
    require_same(copy.deepcopy(started), fingerprint(cfg, "0" * 64, {}), "resume")  # untouched: the same
    edited = copy.deepcopy(started)
    edited["detail"]["software"]["asyncroll"] = "0.0.9"
    edited["detail"]["code"]["package"] = "0.0.9"
    with pytest.raises(FingerprintMismatch) as refused:
        require_same(edited, fingerprint(cfg, "0" * 64, {}), "resume")
    said = str(refused.value)
    version = started["detail"]["software"]["asyncroll"]
    assert f"software: asyncroll 0.0.9 → {version}" in said and f"package 0.0.9 → {version}" in said, said
    edited["detail"]["code"] = {**started["detail"]["code"], "describe": "v0-dirty", "commit": "0" * 40}
    edited["detail"]["software"] = started["detail"]["software"]
    require_same(edited, fingerprint(cfg, "0" * 64, {}), "resume")  # describe and commit: not hashed


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.email=qa@example.invalid", "-c", "user.name=qa", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.strip()


def _package_in(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``asyncroll`` look imported from ``folder/asyncroll`` (one module: its digest stays cheap)."""
    package = folder / "asyncroll"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "0.1.0"\n', encoding="utf-8")
    monkeypatch.setattr(asyncroll, "__file__", str(package / "__init__.py"))


@pytest.mark.timeout(60)
def test_an_installed_package_inside_another_checkout_records_no_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pip install asyncroll`` into a project's ``.venv``: git found the project's checkout above
    site-packages, and experiment.json recorded the project's commit and describe as the code's."""
    project = _one_file_repository(tmp_path / "project", ".gitignore", ".venv/\n")
    _package_in(project / ".venv" / "lib" / "python3.11" / "site-packages", monkeypatch)
    code = fingerprint_module.code_version()
    assert code["commit"] is None and code["describe"] is None, code
    assert code["package"] == asyncroll.__version__ and len(code["source_sha256"] or "") == 64


def _one_file_repository(folder: Path, name: str, text: str) -> Path:
    """A git repository at ``folder`` (made) whose one commit holds one file, not asyncroll."""
    folder.mkdir()
    _git(folder, "init", "-q")
    (folder / name).write_text(text, encoding="utf-8")
    _git(folder, "add", name)
    _git(folder, "commit", "-q", "-m", "a repository that is not asyncroll")
    return folder


def _committed_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A git checkout whose one commit holds the package that :func:`_package_in` puts there."""
    checkout = tmp_path / "asyncroll-checkout"
    checkout.mkdir()
    _git(checkout, "init", "-q")
    _package_in(checkout, monkeypatch)
    _git(checkout, "add", "asyncroll/__init__.py")
    _git(checkout, "commit", "-q", "-m", "the package")
    return checkout


@pytest.mark.timeout(60)
def test_a_checkout_that_tracks_the_package_records_its_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkout = _committed_checkout(tmp_path, monkeypatch)
    code = fingerprint_module.code_version()
    assert code["commit"] == _git(checkout, "rev-parse", "HEAD")
    assert code["describe"] == _git(checkout, "rev-parse", "--short", "HEAD")
    # a lightweight tag names it (--tags), and an edit to the package marks it dirty (--dirty)
    _git(checkout, "tag", "v0.1")
    assert fingerprint_module.code_version()["describe"] == "v0.1"
    (checkout / "asyncroll" / "__init__.py").write_text('__version__ = "0.1.1"\n', encoding="utf-8")
    assert fingerprint_module.code_version()["describe"] == "v0.1-dirty"


@pytest.mark.timeout(60)
def test_recording_the_code_writes_nothing_to_the_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``git describe --dirty`` refreshed and rewrote the checkout's index under ``.git/index.lock``: a
    run killed meanwhile (a 10 s git timeout, SIGKILL) left the user's repository locked, and their next
    commit failed. A file touched but unchanged is no change; an edited one is, and nothing is written."""
    checkout = _committed_checkout(tmp_path, monkeypatch)
    index = checkout / ".git" / "index"
    module = checkout / "asyncroll" / "__init__.py"
    stat = module.stat()
    os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))  # touched: index is stale
    before = (index.read_bytes(), index.stat().st_mtime_ns)
    assert fingerprint_module.code_version()["describe"] == _git(checkout, "rev-parse", "--short", "HEAD")
    assert (index.read_bytes(), index.stat().st_mtime_ns) == before
    module.write_text('__version__ = "0.1.1"\n', encoding="utf-8")
    assert fingerprint_module.code_version()["describe"].endswith("-dirty")  # type: ignore[union-attr]
    assert (index.read_bytes(), index.stat().st_mtime_ns) == before


@pytest.mark.timeout(60)
def test_a_package_imported_through_a_symlink_records_its_checkouts_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An environment whose ``asyncroll`` is a symlink to a checkout's package folder runs that
    checkout's code: its commit is recorded, not none as for the folder the link sits in."""
    checkout = _committed_checkout(tmp_path, monkeypatch)
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "site-packages" / "asyncroll").symlink_to(checkout / "asyncroll")
    monkeypatch.setattr(asyncroll, "__file__", str(tmp_path / "site-packages" / "asyncroll" / "__init__.py"))
    assert fingerprint_module.code_version()["commit"] == _git(checkout, "rev-parse", "HEAD")


@pytest.mark.timeout(60)
def test_git_variables_in_the_environment_do_not_name_another_checkout_as_the_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run from a git hook (which exports ``GIT_DIR``, ``GIT_INDEX_FILE``…) or a shell that set them: git
    read the repository they name instead of the one holding the package, so an installed copy recorded
    an asyncroll checkout's commit as its own (``-dirty``: site-packages taken for its work tree), and a
    checkout run with another repository's ``GIT_DIR`` recorded none."""
    checkout = _committed_checkout(tmp_path, monkeypatch)
    commit = _git(checkout, "rev-parse", "HEAD")
    other = tmp_path / "other"
    other.mkdir()
    _git(other, "init", "-q")
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(other))
    monkeypatch.setenv("GIT_INDEX_FILE", str(other / ".git" / "index"))
    assert fingerprint_module.code_version()["commit"] == commit
    # an installed copy, with the asyncroll checkout's repository named
    _package_in(tmp_path / "venv" / "site-packages", monkeypatch)
    monkeypatch.setenv("GIT_DIR", str(checkout / ".git"))
    monkeypatch.delenv("GIT_WORK_TREE")
    monkeypatch.setenv("GIT_INDEX_FILE", str(checkout / ".git" / "index"))
    code = fingerprint_module.code_version()
    assert code["commit"] is None and code["describe"] is None, code


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "name",
    [
        "GIT_COMMON_DIR",
        "GIT_DIR",
        "GIT_INDEX_FILE",
        "GIT_INTERNAL_SUPER_PREFIX",
        "GIT_OBJECT_DIRECTORY",
        "GIT_WORK_TREE",
    ],
)
def test_each_git_variable_alone_leaves_the_code_recorded_as_without_it(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each of these, set alone to another repository's value, changed what git read: no commit, no
    describe, or a describe ``-dirty`` of the other work tree (GIT_WORK_TREE)."""
    _committed_checkout(tmp_path, monkeypatch)
    without = fingerprint_module.code_version()
    other = _one_file_repository(tmp_path / "other", "file", "x")
    values: dict[str, Path | str] = {"GIT_WORK_TREE": other, "GIT_INDEX_FILE": other / ".git" / "index"}
    values |= {"GIT_OBJECT_DIRECTORY": other / ".git" / "objects", "GIT_INTERNAL_SUPER_PREFIX": "sub/"}
    monkeypatch.setenv(name, str(values.get(name, other / ".git")))
    assert fingerprint_module.code_version() == without


@pytest.mark.timeout(60)
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown a checkout")
def test_a_checkout_owned_by_another_user_records_its_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shared checkout (a lab's ``/opt/asyncroll``, installed editable by its admin) run by another user:
    git refused it as of 'dubious ownership' (safe.directory), and run.json's ``code`` recorded no
    commit and no describe, as for an installed copy, though the package imported is that checkout's."""
    checkout = tmp_path / "shared-checkout"
    checkout.mkdir()
    _git(checkout, "init", "-q")
    _package_in(checkout, monkeypatch)
    _git(checkout, "add", "asyncroll/__init__.py")
    _git(checkout, "commit", "-q", "-m", "the package")
    commit, short = _git(checkout, "rev-parse", "HEAD"), _git(checkout, "rev-parse", "--short", "HEAD")
    for path in [checkout, *checkout.rglob("*")]:
        os.chown(path, 65534, 65534, follow_symlinks=False)  # nobody's
    argv = ["git", "-C", str(checkout), "rev-parse", "HEAD"]
    refused = subprocess.run(argv, capture_output=True, check=False, timeout=30)
    assert refused.returncode != 0  # git's own refusal, which asyncroll's record must not take for none
    code = fingerprint_module.code_version()
    assert code["commit"] == commit and code["describe"] == short, code


def test_a_resume_of_an_older_experiment_says_a_version_it_did_not_record_was_not_recorded(
    tmp_path: Path,
) -> None:
    """An experiment 175efe0 started recorded no click, orjson, uvicorn… versions: its refused resume said
    ``click None → 8.5.1``, as it says ``nvidia-ml-py 13.6 → None`` for a package not installed now, so the
    older experiment read as if it had run without click. A name the receipt lacks is "not recorded"."""
    import copy

    from asyncroll.experiment.fingerprint import FingerprintMismatch, fingerprint, require_same

    cfg = lean(tmp_path)
    now = fingerprint(cfg, "0" * 64, {})
    older = copy.deepcopy(now)
    del older["detail"]["software"]["click"]
    older["detail"]["software"]["orjson"] = None
    older["components"]["software"] = "0" * 64
    with pytest.raises(FingerprintMismatch) as refused:
        require_same(older, now, "resume")
    said = str(refused.value)
    assert f"click (not recorded) → {now['detail']['software']['click']}" in said, said
    assert f"orjson None → {now['detail']['software']['orjson']}" in said, said
