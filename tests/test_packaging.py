"""What ``pip install asyncroll`` (a wheel, no repository) gets, checked statically from pyproject.toml.

A user installs a wheel into an environment that may already hold older versions of the dependencies:
pip keeps any version that meets a floor, so a floor is a promise that the CLI runs on it. The package
data the wheel carries is what ``[tool.setuptools.package-data]`` names, not what the checkout holds.
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

import asyncroll

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "asyncroll"


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def _floors() -> dict[str, tuple[int, ...]]:
    floors: dict[str, tuple[int, ...]] = {}
    for requirement in _pyproject()["project"]["dependencies"]:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)(?:,<[0-9.]+)?", requirement)
        assert match, f"{requirement!r}: expected NAME>=VERSION"
        floors[match[1].lower()] = tuple(int(part) for part in match[2].split("."))
    return floors


def test_the_typer_and_pydantic_floors_are_versions_the_cli_runs_on() -> None:
    """Found by installing the wheel with every dependency at its floor (2026-12-03, Python 3.11):

    - typer 0.12.0-0.12.3 (the floor was ``typer>=0.12``): every command, ``--help`` included, died with
      ``RuntimeError: Type not yet supported: pathlib.Path | None``;
    - typer 0.12.4-0.15.3 with a current click (they do not cap it; 8.5.1 was installed): ``TypeError:
      Secondary flag is not valid for non-boolean flag`` or ``make_metavar() missing ... 'ctx'``;
    - typer 0.16-0.18: works, but imports rich on every start (``--help`` 0.9 s instead of 0.35 s;
      tests/test_cli_commands.py::test_help_imports_nothing_heavy fails);
    - pydantic 2.7-2.9 (the floor was ``pydantic>=2.7``): every command printed UserWarnings about the
      ``model_capacity`` and ``model_outstanding`` fields on stderr.

    With typer 0.19.0, pydantic 2.10.0 and every other dependency at its floor, the CLI's commands ran
    and the tests then in tests/test_cli.py, test_workload.py, test_summary.py, test_serve_sim.py,
    test_openai_backend.py, test_policies.py and test_convert.py passed (most of those files have since
    been split by job into several).

    Re-run 2026-12-04 (Python 3.11.7) with every dependency at its floor (anyio 4.4.0, httpx 0.27.0,
    pydantic 2.10.0, typer 0.19.0, psutil 5.9.0, orjson 3.9.0, prometheus-client 0.20.0, scikit-learn
    1.4.0, threadpoolctl 3.1.0, numpy 1.24.0, scipy 1.10.0, starlette 0.40.0, uvicorn 0.30.0, jsonschema
    4.20.0; click 8.2.0, the dev extra's): the whole suite, 1564 passed and 12 failed. Since fixed: every
    command failed on typer 0.19-0.25 (``typer._click``, below); a gate on ``model.failed.transport`` was
    refused under pydantic 2.10; serve-sim stopped at start-up logged uvicorn 0.30's lifespan traceback;
    and tests that read click 8.5's or scipy 1.15's wording or keywords now accept the floors' too.

    2026-12-07: pydantic 2.10.0 declares ``model_fields`` an instance property, so mypy read
    ``RunConfig.model_fields`` as the property's getter and ``mypy asyncroll`` failed at the floors (5
    errors where a class's fields are read) on code that ran; with 2.10.1 it is the class's dict of fields
    (mypy clean with every other dependency at its floor), and ``.ci/run`` now runs mypy at the floors too."""
    floors = _floors()
    assert floors["typer"] >= (0, 19), floors["typer"]
    assert floors["pydantic"] >= (2, 10, 1), floors["pydantic"]


def test_httpx_1_0_whose_api_the_http_backend_does_not_use_is_not_installed() -> None:
    """httpx 1.0 is another API: its pre-release 1.0.dev6 (2026-12-06) has no ``AsyncClient``,
    ``AsyncBaseTransport``, ``AsyncHTTPTransport`` nor ``HTTPError``. Under ``httpx>=0.27``,
    ``pip install --pre`` installed it (and pip will install 1.0 itself the day it ships), and every run
    against a server (``--backend vllm|openai``, experiment's clients) died at its start with
    ``AttributeError: module 'httpx' has no attribute 'AsyncBaseTransport'``. The requirement stops below
    1.0, pre-releases of it included (PEP 440: ``<1`` admits no 1.0 pre-release)."""
    from packaging.requirements import Requirement

    (httpx,) = (r for r in map(Requirement, _pyproject()["project"]["dependencies"]) if r.name == "httpx")
    assert not httpx.specifier.contains("1.0.dev6", prereleases=True), httpx
    assert not httpx.specifier.contains("1.0.0"), httpx
    assert httpx.specifier.contains("0.29.0") and httpx.specifier.contains("0.27.0"), httpx


def test_click_is_reached_only_through_the_module_that_finds_typers_copy() -> None:
    """typer 0.26 on carries its own click (``typer._click``), typer 0.19-0.25 (the floor allows them) runs
    on the ``click`` package. ``from typer._click.exceptions import NoSuchOption`` (2026-12-03) failed
    every command, ``--help`` included, with typer 0.19.0 installed (2026-12-04, Python 3.11): a
    ``ModuleNotFoundError`` before any output. :mod:`asyncroll.commands.click_errors` takes the classes
    from whichever click typer runs on; with typer 0.19.0 and click 8.2.0 every command then ran (only
    click's own wording of usage lines and suggestions differs)."""
    pattern = re.compile(r"^\s*(from|import)\s+(typer\._click|click)\b", re.MULTILINE)
    reaching = sorted(
        str(path.relative_to(REPO))
        for path in PACKAGE.rglob("*.py")
        if pattern.search(path.read_text(encoding="utf-8")) and path.name != "click_errors.py"
    )
    assert reaching == [], reaching


def test_the_tests_declare_the_click_their_runner_needs() -> None:
    """typer 0.19 (the floor) allows click 8.0.0, and the CLI runs on it: with typer 0.19.0 and click
    8.0.0 (2026-12-03, Python 3.11) an option of one value given twice is refused (exit 2, naming it) and
    tests/test_single_values.py and test_cli.py (since split into test_run_*.py and test_cli_commands.py)
    passed once their ``CliRunner`` was told to keep stderr apart. As written they did not: before click
    8.2 ``CliRunner()`` mixes stderr into stdout and ``result.stderr`` raises ``ValueError: stderr not
    separately captured``, which ~100 assertions read. So the runtime keeps typer's floor for click, and
    the dev extra (what runs the tests) asks for 8.2."""
    dev = _pyproject()["project"]["optional-dependencies"]["dev"]
    floors = [
        tuple(int(part) for part in match[1].split("."))
        for requirement in dev
        if (match := re.fullmatch(r"click>=([0-9.]+)", requirement))
    ]
    assert floors and floors[0] >= (8, 2), dev


def test_the_version_has_one_value() -> None:
    """The wheel's metadata (pyproject) and what run.json and experiment.json record (``__version__``)."""
    assert _pyproject()["project"]["version"] == asyncroll.__version__


def test_every_data_file_of_the_package_is_in_the_wheel() -> None:
    """A file the package reads at run time (a template, a schema) that package-data does not name is in
    the checkout, so every editable-install test passes, and missing from the wheel."""
    package_data: dict[str, list[str]] = _pyproject()["tool"]["setuptools"]["package-data"]
    data_files = [
        path
        for path in PACKAGE.rglob("*")
        if path.is_file()
        and path.suffix not in (".py", ".pyc")
        and "__pycache__" not in path.parts
        and not path.name.startswith(".")
    ]
    assert data_files, "the timeline template at least"
    for path in data_files:
        assert any(
            fnmatch.fnmatch(path.relative_to(REPO / key.replace(".", "/")).as_posix(), pattern)
            for key, patterns in package_data.items()
            if key not in ("", "*") and path.is_relative_to(REPO / key.replace(".", "/"))
            for pattern in patterns
        ), f"{path.relative_to(REPO)} is not named in [tool.setuptools.package-data]"


def test_the_license_is_an_spdx_expression_that_current_setuptools_builds() -> None:
    """``license = { text = ... }`` made every build with a current setuptools (84.2.1 here: the build
    backend is not pinned) warn "`project.license` as a TOML table is deprecated ... By 2027-Feb-18, you
    need to update your project": after that date a ``pip install`` from source stops building. The SPDX
    string form needs setuptools 77 or later (PEP 639), so the build requirement says so."""
    project = _pyproject()
    assert project["project"]["license"] == "Apache-2.0"
    floors = [
        tuple(int(part) for part in match[1].split("."))
        for requirement in project["build-system"]["requires"]
        if (match := re.fullmatch(r"setuptools>=([0-9.]+)", requirement))
    ]
    assert floors and floors[0] >= (77,), project["build-system"]["requires"]


def test_the_package_says_it_is_typed_and_the_wheel_carries_the_marker() -> None:
    """PEP 561: without ``py.typed`` in the installed package, a type checker of a project that imports
    asyncroll treats every name as ``Any`` (mypy: "missing library stubs or py.typed marker"), though
    every module is annotated and ``mypy asyncroll`` is clean. Built with setuptools 84.2.1 (2026-12-03),
    the wheel and the sdist held ``asyncroll/py.typed``."""
    assert (PACKAGE / "py.typed").is_file()
    package_data: dict[str, list[str]] = _pyproject()["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data.get("asyncroll", []), package_data


def test_the_license_text_is_in_the_repository_and_in_the_wheel_metadata() -> None:
    """``license = "Apache-2.0"`` names the license; its terms require its text to go with every copy.
    ``license-files`` (PEP 639, setuptools 77+) puts LICENSE into the wheel's ``.dist-info/licenses/``
    and the sdist (built with setuptools 84.2.1, 2026-12-03: ``License-File: LICENSE`` in METADATA)."""
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text
    assert _pyproject()["project"]["license-files"] == ["LICENSE"]


def test_ci_pins_every_dependency_at_the_floor_pyproject_declares(tmp_path: Path) -> None:
    """``.ci/run`` runs the suite and mypy again on ``scripts/dependency_floors.py``'s pins."""
    script = REPO / "scripts" / "dependency_floors.py"
    pins = subprocess.run(
        [sys.executable, script], cwd=REPO, capture_output=True, text=True, check=True, timeout=30
    ).stdout.split()
    expected = {name: ".".join(map(str, version)) for name, version in _floors().items()}
    assert {p.split("==")[0].lower(): p.split("==")[1] for p in pins if not p.startswith("click")} == expected
    assert any(p.startswith("click==8.") for p in pins)
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "dependency_floors.py" in ci
    assert ".venv-floors/bin/mypy asyncroll bench || exit 1" in ci  # the floors' types checked too
    loose = tmp_path / "pyproject.toml"
    loose.write_text('[project]\ndependencies = ["numpy"]\n[project.optional-dependencies]\ndev = []\n')
    refused = subprocess.run([sys.executable, script, loose], capture_output=True, text=True, timeout=30)
    assert refused.returncode == 1 and "'numpy' is not NAME>=VERSION" in refused.stderr


@pytest.mark.timeout(60)
def test_ci_stops_when_the_floors_cannot_be_listed_not_running_the_suite_on_the_newest(
    tmp_path: Path,
) -> None:
    """A requirement ``scripts/dependency_floors.py`` cannot pin (``numpy`` without a floor, a range)
    made it exit 1 inside ``$(...)``: pip then installed the newest versions and the "floors" suite ran,
    and passed, on them. The floors step of ``.ci/run`` is run here with pip and pytest stubbed."""
    lines = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    first = next(i for i, line in enumerate(lines) if "dependency_floors.py" in line and "#" not in line)
    last = next(i for i in range(first, len(lines)) if lines[i] == "fi")
    step = "\n".join(lines[first : last + 1])
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "dependency_floors.py").write_bytes(
        (REPO / "scripts" / "dependency_floors.py").read_bytes()
    )
    (tmp_path / "pyproject.toml").write_text(
        '[project]\ndependencies = ["numpy"]\n[project.optional-dependencies]\ndev = []\n'
    )
    bin_dir, venv = tmp_path / "bin", tmp_path / ".venv-floors" / "bin"
    bin_dir.mkdir()
    venv.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    for stub, where in (("python3", bin_dir), ("pip", venv), ("python", venv)):
        (where / stub).write_text(f'#!/bin/sh\necho "{stub} $*" >> "{tmp_path}/calls"\n')
        (where / stub).chmod(0o755)
    done = subprocess.run(
        ["bash", "-c", f"set -uo pipefail\n{step}\n"],
        cwd=tmp_path,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=50,
    )
    calls = (tmp_path / "calls").read_text() if (tmp_path / "calls").exists() else ""
    assert done.returncode != 0, (done.stderr, calls)
    assert "'numpy' is not NAME>=VERSION" in done.stderr
    assert "pytest" not in calls, calls


def test_the_sdist_ships_no_test_suite_it_cannot_run() -> None:
    """Built with setuptools 84.2.1 (``python -m build``, 2026-12-05), the sdist held the 177
    ``tests/test_*.py`` that setuptools adds by default but not ``conftest.py``, the helper modules and
    fixtures they import, nor the examples/, bench/ and scripts/ they read: ``pytest`` in the unpacked
    sdist failed to collect. MANIFEST.in leaves the tests out; the wheel's files are the same."""
    assert (REPO / "tests" / "conftest.py").is_file(), "the tests need files that are not test modules"
    manifest = (REPO / "MANIFEST.in").read_text(encoding="utf-8").splitlines()
    assert "prune tests" in [line.strip() for line in manifest if not line.lstrip().startswith("#")]
