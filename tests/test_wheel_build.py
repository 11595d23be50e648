"""The sdist and the wheel built from this checkout, and the CLI run from the wheel's files outside it.

Every other test imports the checkout (an editable install, ``pythonpath = ["."]``): a file the package
reads at run time that the wheel leaves out, a data file read from the repository (``examples/``,
``docs/``), or a module setuptools does not find passes them all and fails for a user who ran
``pip install asyncroll-*.whl`` in another folder. These build both as ``python -m build`` does (the
sdist from the committed files, the wheel from the unpacked sdist) with the build backend the dev extra
installs, offline, and run ``python -m asyncroll`` with nothing but the wheel's files on its path for
asyncroll, from an empty folder. By hand (2026-12-07): the wheel and the sdist, each installed
(non-editable) into a fresh venv, ran every README command from an empty folder.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import asyncroll

REPO = Path(__file__).resolve().parents[1]
VERSION = asyncroll.__version__


def _setuptools_floor() -> tuple[int, ...]:
    (requirement,) = (
        r
        for r in tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["build-system"][
            "requires"
        ]
        if r.startswith("setuptools>=")
    )
    return tuple(int(part) for part in requirement.split(">=")[1].split("."))


def _tracked_files() -> list[str]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the committed files are unknown")
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, timeout=30, check=False
    )
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.strip()}")
    return [name for name in listed.stdout.split("\0") if name and (REPO / name).is_file()]


def _build(hook: str, source: Path, out: Path) -> Path:
    built = subprocess.run(
        [sys.executable, "-c", f"from setuptools import build_meta; print(build_meta.{hook}({str(out)!r}))"],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    return out / built.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(sdist, wheel), the wheel built from the unpacked sdist."""
    try:
        installed = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("setuptools is not installed (the dev extra installs it)")
    if tuple(int(p) for p in installed.split(".")[:3] if p.isdigit()) < _setuptools_floor():
        pytest.skip(f"setuptools {installed} is older than build-system.requires asks")
    root = tmp_path_factory.mktemp("build")
    tree, out = root / "tree", root / "dist"
    for name in _tracked_files():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, tree / name)
    out.mkdir()
    sdist = _build("build_sdist", tree, out)
    with tarfile.open(sdist) as archive:
        if hasattr(tarfile, "data_filter"):  # 3.11.4 on; 3.12 and 3.13 warn without a filter
            archive.extractall(root / "unpacked", filter="data")
        else:  # pragma: no cover
            archive.extractall(root / "unpacked")
    wheel = _build("build_wheel", root / "unpacked" / f"asyncroll-{VERSION}", out)
    return sdist, wheel


def test_the_wheel_holds_every_committed_file_of_the_package_and_nothing_else(
    dists: tuple[Path, Path],
) -> None:
    """A template, a schema or a subpackage the build leaves out, or a test, a run folder or a venv it
    takes in. The sdist (the wheel's source) holds the same package files and no test suite."""
    sdist, wheel = dists
    package = sorted(name for name in _tracked_files() if name.startswith("asyncroll/"))
    assert any(not name.endswith(".py") for name in package), "the timeline template at least"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    info = f"asyncroll-{VERSION}.dist-info/"
    assert sorted(n for n in names if not n.startswith(info)) == package
    assert f"{info}licenses/LICENSE" in names
    with tarfile.open(sdist) as archive:
        members = [m.name.split("/", 1)[1] for m in archive.getmembers() if m.isfile() and "/" in m.name]
    assert sorted(n for n in members if n.startswith("asyncroll/")) == package
    assert not [n for n in members if n.startswith(("tests/", "runs/", ".venv", "build/", "examples/"))]
    assert {"pyproject.toml", "README.md", "LICENSE"} <= set(members)


def test_the_wheel_metadata_states_the_version_python_and_dependencies(dists: tuple[Path, Path]) -> None:
    """What pip reads: the version ``--version`` and run.json record, Python 3.11 or later (the children
    are started with ``-P``, new in 3.11), pyproject's dependencies, and the ``asyncroll`` command."""
    _, wheel = dists
    info = f"asyncroll-{VERSION}.dist-info/"
    with zipfile.ZipFile(wheel) as archive:
        metadata = Parser().parsestr(archive.read(f"{info}METADATA").decode("utf-8"))
        entry_points = archive.read(f"{info}entry_points.txt").decode("utf-8")
    assert metadata["Name"] == "asyncroll" and metadata["Version"] == VERSION
    assert metadata["Requires-Python"] == ">=3.11"
    declared = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    unconditional = [r for r in metadata.get_all("Requires-Dist") or [] if ";" not in r]
    assert len(unconditional) == len(declared), (unconditional, declared)
    assert "asyncroll = asyncroll.__main__:main" in entry_points.splitlines()


@pytest.mark.timeout(120)
def test_a_run_from_the_wheels_files_outside_the_checkout_writes_every_output(
    dists: tuple[Path, Path], tmp_path: Path
) -> None:
    """``python -m asyncroll run`` with the unpacked wheel ahead of the checkout's editable install, in an
    empty folder: the workers, the timeline template and the run's version all come from the wheel."""
    _, wheel = dists
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy2(REPO / "examples" / "smoke.jsonl", work / "smoke.jsonl")
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("PYTHONSAFEPATH", None)

    def asyncroll_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-P", "-m", "asyncroll", *args],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )

    where = subprocess.run(
        [sys.executable, "-P", "-c", "import asyncroll; print(asyncroll.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert Path(where.stdout.strip()).is_relative_to(site), where.stdout
    assert asyncroll_cli("--version").stdout.strip() == f"asyncroll {VERSION}"
    done = asyncroll_cli("run", "--workload", "smoke.jsonl", "--output", "out", "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    outputs = {p.name for p in (work / "out").iterdir()}
    assert {"run.json", "summary.json", "events.jsonl", "trace.json", "timeline.html"} <= outputs, outputs
    assert "<html" in (work / "out" / "timeline.html").read_text(encoding="utf-8").lower()
    run = json.loads((work / "out" / "run.json").read_text(encoding="utf-8"))
    assert run["versions"]["asyncroll"] == VERSION and run["code"]["package"] == VERSION
    assert run["code"]["commit"] is None, "the wheel's files are no checkout's"
    assert asyncroll_cli("timeline", "out").returncode == 0
