"""The protocol fingerprint: what must not change between the stages and resumes of one experiment.

Components: the config (canonical JSON), the workload's SHA-256, a hash of every trusted tool file it
names, the code (the package version and a digest of the package's own files) and the software
versions. Each is hashed separately so that a refusal names what changed. The checkout's ``git
describe`` and commit are recorded with the code, not hashed: they change with any tracked file (a README
edited, a notes commit made while an arm ran), which stopped the experiment and failed that arm though
no code the clients run had changed; a change to that code changes the digest. The runner computes it
afresh before and after every arm (every arm starts a fresh client, which reads the files as they are
then), not only at start-up.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import asyncroll
from asyncroll.errors import UsageError
from asyncroll.experiment.config import ExperimentConfig
from asyncroll.outputs.receipt import file_sha256, versions


class FingerprintMismatch(UsageError):
    """A resume or a later stage found a different protocol than the one the experiment started with."""


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
    """``git describe --always --dirty`` and the commit of the checkout holding the package, if any, and
    the digest of the package's files.

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
    out["describe"] = _git(root, "describe", "--always", "--dirty", "--tags")
    out["commit"] = _git(root, "rev-parse", "HEAD")
    return out


def _git(root: Path, *args: str) -> str | None:
    """``git -C root ARGS``'s output, or None when it fails or git cannot run."""
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


#: What of :func:`code_version` the fingerprint hashes; ``describe`` and ``commit`` are recorded only.
CODE_HASHED = ("package", "source_sha256")


def _sha(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def resolved_paths(cfg: ExperimentConfig) -> dict[str, str]:
    """Where the relative paths handed to the server as written lead from the folder the runner runs in:
    ``model.path`` when it names something here (otherwise it is a hub id) and a ``server.command``
    program given as a relative path. The config holds only their text, so a ``--resume`` from another
    folder could start another model or program under the same config hash."""
    out: dict[str, str] = {}
    model = Path(cfg.model.path)
    if not model.is_absolute() and model.exists():
        out["model.path"] = str(model.resolve())
    program = cfg.server.command[0]
    if "/" in program and not Path(program).is_absolute():
        out["server.command[0]"] = str(Path(program).resolve())
    return out


def _settings(data: Any, prefix: str = "") -> dict[str, str]:
    """A config's settings by dotted name (``client.max_turns``), each value as JSON text: what a refusal
    names when the config changed."""
    if not isinstance(data, dict) or not data:
        return {prefix: json.dumps(data, sort_keys=True)}
    out: dict[str, str] = {}
    for key, value in data.items():
        out.update(_settings(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def fingerprint(cfg: ExperimentConfig, workload_sha256: str, tools: dict[str, Path | None]) -> dict[str, Any]:
    """Every component with its own hash, and ``sha256`` over all of them."""
    tool_hashes = {key: None if path is None else file_sha256(path) for key, path in sorted(tools.items())}
    software = versions()
    code = code_version()
    paths = resolved_paths(cfg)
    config = cfg.model_dump(mode="json")
    components = {
        "config": _sha(config),
        "workload": workload_sha256,
        "tools": _sha(tool_hashes),
        "code": _sha({key: code[key] for key in CODE_HASHED}),
        "software": _sha(software),
        "paths": _sha(paths),
    }
    return {
        "sha256": _sha(components),
        "components": components,
        "detail": {
            "tools": tool_hashes,
            "code": code,
            "software": software,
            "paths": paths,
            "config": _settings(config),  # not hashed again: named in a refusal
        },
    }


def _short(value: Any) -> Any:
    """A hex digest cut to 12 digits (enough to tell two apart in a message); anything else as it is."""
    if isinstance(value, str) and len(value) >= 40 and all(c in "0123456789abcdef" for c in value):
        return value[:12]
    return value


def require_same(recorded: dict[str, Any], current: dict[str, Any], what: str) -> None:
    """Refuse (FingerprintMismatch naming each changed component) unless both fingerprints agree."""
    edited = _edited_detail(recorded, current)
    if recorded.get("sha256") == current.get("sha256") and not edited:
        return
    old, new = recorded.get("components", {}), current.get("components", {})
    changed = sorted({k for k in set(old) | set(new) if old.get(k) != new.get(k)} | set(edited))
    detail = []
    named = ["code", "software", "tools", "paths"]
    if "config" in recorded.get("detail", {}):  # an experiment started before it was recorded: hashes
        named.append("config")
    for key in changed:
        if key in named:
            before, after = recorded.get("detail", {}).get(key) or {}, current["detail"].get(key) or {}
            diff = {k: (before.get(k), after.get(k)) for k in sorted(set(before) | set(after))}
            parts = [f"{k} {_short(b)} → {_short(a)}" for k, (b, a) in diff.items() if b != a]
            detail.append(f"{key}: {', '.join(parts) or f'{_short(old.get(key))} → {_short(new.get(key))}'}")
        else:
            detail.append(f"{key}: {_short(old.get(key))} → {_short(new.get(key))}")
    raise FingerprintMismatch(
        f"{what}: the protocol changed since the experiment started ({'; '.join(detail)}); "
        "start a new experiment in a new output directory instead of mixing protocols"
    )


def _edited_detail(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Hashed components whose recorded detail differs from today's though the hashes agree: a receipt
    edited by hand (its versions are what each arm's client must show, so the arms would fail on it)."""
    before, after = recorded.get("detail", {}), current.get("detail", {})
    edited = []
    for key in ("tools", "software", "paths", "code"):
        if key not in before:  # an experiment started before it was recorded
            continue
        old, new = before[key] or {}, after.get(key) or {}
        if key == "code":
            old, new = ({k: d.get(k) for k in CODE_HASHED} for d in (old, new))
        if old != new:
            edited.append(key)
    return edited
