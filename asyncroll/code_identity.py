"""Which code is running: the package's version, a digest of its own source files and, where the package
sits in a git checkout that tracks it, that checkout's ``git describe --dirty`` and commit. The experiment's
fingerprint (:mod:`asyncroll.experiment.fingerprint`) pins it between arms; ``run.json`` records it."""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from pathlib import Path

import asyncroll

#: Git's variables that say which repository and work tree to read (of ``git rev-parse --local-env-vars``,
#: which git itself clears before working in another repository): a git hook exports ``GIT_DIR`` and
#: ``GIT_INDEX_FILE``, and with them git read that repository, not the one holding the package.
GIT_REPOSITORY_VARIABLES = (
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_DIR",
    "GIT_GRAFT_FILE",
    "GIT_IMPLICIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_INTERNAL_SUPER_PREFIX",
    "GIT_NO_REPLACE_OBJECTS",
    "GIT_OBJECT_DIRECTORY",
    "GIT_PREFIX",
    "GIT_REPLACE_REF_BASE",
    "GIT_SHALLOW_FILE",
    "GIT_WORK_TREE",
)

#: What the package is made of (its modules and its package data, ``timeline.html``): nothing else in its
#: folder — an editor's swap or backup file, a bytecode cache — is code a client runs.
SOURCE_SUFFIXES = (".py", ".html")


def source_digest() -> str:
    """SHA-256 over the asyncroll package's source files (relative path and content).

    ``git describe --dirty`` does not change when a checkout that is already dirty is edited again, and
    an installed package has no git at all; this does, for every edit the next client would import. Only
    the package's own kinds of file count (``SOURCE_SUFFIXES``, not hidden): opening a module in an editor
    (``.runner.py.swp``, ``runner.py~``) must not stop an experiment."""
    package = Path(asyncroll.__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*")):
        if (
            "__pycache__" in path.parts
            or path.suffix not in SOURCE_SUFFIXES
            or path.name.startswith(".")
            or not path.is_file()
        ):
            continue
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def code_version() -> dict[str, str | None]:
    """``git describe --always --tags`` (``-dirty`` after it where a tracked file changed, as ``--dirty``
    says) and the commit of the checkout holding the package, if any, and the digest of the package's
    files. Nothing is written to the checkout.

    Git is asked only when the package's own files are tracked by the checkout it finds: an installed
    package (``site-packages``) often sits inside an unrelated checkout (a project's ``.venv``), whose
    commit is not this code's and must not be recorded as if it were."""
    package = Path(asyncroll.__file__).resolve().parent
    root = package.parent
    out: dict[str, str | None] = {
        "package": asyncroll.__version__,
        "describe": None,
        "commit": None,
        "source_sha256": source_digest(),
    }
    if _git(root, "ls-files", "--error-unmatch", "--", f"{package.name}/__init__.py") is None:
        return out
    # ``git describe --dirty`` refreshes and rewrites the checkout's index (under .git/index.lock, whatever
    # GIT_OPTIONAL_LOCKS says): a run killed meanwhile left the user's repository locked. ``git status``
    # refreshes in memory only (GIT_OPTIONAL_LOCKS=0): the same "-dirty", nothing written.
    described = _git(root, "describe", "--always", "--tags")
    changes = _git(root, "status", "--porcelain", "--untracked-files=no")
    if described is not None and changes is not None:
        out["describe"] = f"{described}-dirty" if changes else described
    out["commit"] = _git(root, "rev-parse", "HEAD")
    return out


def _git(root: Path, *args: str) -> str | None:
    """``git -C root ARGS``'s output, or None when it fails or git cannot run.

    A checkout owned by another user (a lab's shared install, run by each of its users) is trusted as
    ``safe.directory``, which git otherwise refuses as of 'dubious ownership', recording no commit as if
    the package were an installed copy: it is trusted already, as this process imports its code. Only a
    checkout whose top is ``root`` is: an unrelated one above ``site-packages`` stays refused. Git finds
    the repository from ``root`` alone, whatever ``GIT_DIR`` and the like say
    (:data:`GIT_REPOSITORY_VARIABLES`)."""
    argv = ["git", "-c", f"safe.directory={root}", "-C", str(root), *args]
    env = {name: value for name, value in os.environ.items() if name not in GIT_REPOSITORY_VARIABLES}
    env["GIT_OPTIONAL_LOCKS"] = "0"  # read the checkout, never write it (status's index refresh)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@functools.cache
def code_version_once() -> dict[str, str | None]:
    """:func:`code_version` as this process first found it (run.json's ``code``: every run of a sweep's
    cell process reads the same files, and a run does not re-import its package)."""
    return code_version()
