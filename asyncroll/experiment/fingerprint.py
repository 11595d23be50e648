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
from pathlib import Path
from typing import Any

from asyncroll.code_identity import code_version
from asyncroll.code_identity import source_digest as source_digest  # re-exported: the protocol check
from asyncroll.errors import UsageError
from asyncroll.experiment.config import ExperimentConfig
from asyncroll.outputs.receipt import file_sha256, versions


class FingerprintMismatch(UsageError):
    """A resume or a later stage found a different protocol than the one the experiment started with."""


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


#: In a refusal, a name the receipt does not hold at all (an older version's records fewer).
_UNRECORDED = "(not recorded)"


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
            # a name one side lacks (an older receipt recorded fewer) is "not recorded", not None
            diff = {
                k: (before.get(k, _UNRECORDED), after.get(k, _UNRECORDED)) for k in sorted({*before, *after})
            }
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
