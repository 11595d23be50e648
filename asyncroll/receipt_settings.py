"""A finished run's settings, read back from its ``run.json`` for ``asyncroll run --config RUN/run.json``.

``run.json`` records the merged settings under ``config`` with three values the run derived from them
(``policy_canonical``, ``limits``, ``starvation_threshold_effective``), the workload by its resolved path,
and the directory relative paths were taken from (``cwd``). Re-running a run reads them back as a config
file's settings: the derived values are left out (they are derived again), as is ``output`` (the run's own
directory exists, and is never overwritten: the new run's ``--output`` is given by flag), the workload is
the file the run read (its absolute path, whatever the current directory), a relative ``tool_root`` is
taken from the run's ``cwd``, a ``--policy asyncroll`` recorded when that name meant another pressure rule
(``policy_canonical``; in a run.json written before 2026-12-03, which held the name there, the
``cpu_selected`` events beside it) runs that rule by its own name; a value equal to its default is left
out, as from any config file (:func:`asyncroll.config_file.load_config_file`), so that the run's recorded
defaults (``endpoint`` of a scripted run) are not taken for settings given against its backend."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: The keys of run.json's ``config`` that the run derived, not settings (runtime/run.py writes them).
DERIVED = ("policy_canonical", "limits", "starvation_threshold_effective")


def is_receipt(data: Mapping[str, Any]) -> bool:
    """Whether a ``--config`` file's object is a run's ``run.json`` (not a file of settings)."""
    return isinstance(data.get("config"), dict) and "schema_version" in data and "command" in data


def other_version(data: Mapping[str, Any]) -> str | None:
    """Why a run.json another schema version wrote is not read (its settings may be named or meant
    otherwise: ``simulate --from-run`` and ``timeline`` refuse it too), else None."""
    from asyncroll.outputs.receipt import RECEIPT_SCHEMA_VERSION

    version = data.get("schema_version")
    if version == RECEIPT_SCHEMA_VERSION and not isinstance(version, bool):
        return None
    return (
        f"a run's run.json of schema_version {repr(version)[:40]}; this asyncroll reads run.json version "
        f"{RECEIPT_SCHEMA_VERSION} only: give its settings in a file of settings, or as flags"
    )


def rule_then(data: Mapping[str, Any], path: Path) -> tuple[str | None, str, str] | None:
    """The pressure rule a recorded ``--policy asyncroll`` ran (None: not recorded), today's, and where
    the first was read, where they differ. A run.json written before 2026-12-03 holds the name as given in
    ``policy_canonical`` (``asyncroll``): the rule is read from the ``cpu_selected`` events beside it."""
    from asyncroll.policies.registry import PRESSURE_POLICIES, canonical_policy

    config = data["config"]
    rule, today = config.get("policy_canonical"), canonical_policy("asyncroll")
    if config.get("policy") != "asyncroll" or not isinstance(rule, str):
        return None
    if rule != "asyncroll":
        return None if rule == today else (rule, today, "policy_canonical")
    rules = _rules_in_events(path.parent / "events.jsonl")
    if len(rules) == 1 and rules <= set(PRESSURE_POLICIES):
        (ran,) = rules
        return None if ran == today else (ran, today, "its cpu_selected events")
    return None, today, "policy_canonical 'asyncroll', written before run.json named the rule"


def _rules_in_events(events: Path) -> set[str]:
    """The policies the ``cpu_selected`` events in ``events`` name (none where it cannot be read)."""
    from asyncroll.json_depth import json_loads

    rules: set[str] = set()
    try:
        with events.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                if '"cpu_selected"' not in line:
                    continue
                try:
                    row = json_loads(line)
                except (ValueError, RecursionError):
                    continue
                if (
                    isinstance(row, dict)
                    and row.get("event") == "cpu_selected"
                    and isinstance(row.get("policy"), str)
                ):
                    rules.add(row["policy"])
    except OSError:
        return set()
    return rules


def receipt_settings(data: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """The settings of the run whose ``run.json`` (at ``path``) is ``data``, as above."""
    config: dict[str, Any] = dict(data["config"])
    changed = rule_then(data, path)
    if changed is not None and changed[0] is not None:
        config["policy"] = changed[0]  # the pressure rule `asyncroll` named when the run was recorded
    for key in (*DERIVED, "output"):
        config.pop(key, None)
    workload = data.get("workload")
    if isinstance(workload, dict) and isinstance(workload.get("path"), str):
        config["workload"] = workload["path"]  # resolved when the run started
    cwd, root = data.get("cwd"), config.get("tool_root")
    if isinstance(cwd, str) and isinstance(root, str) and not os.path.isabs(root):
        config["tool_root"] = os.path.join(cwd, root)
    return config


def changed_files(data: Mapping[str, Any], workload: Path, tool_root: Path | None) -> list[str]:
    """The files the run read that are no longer as it read them: its workload, where ``workload`` (the
    new run's) is the recorded file, and each file tool, where the new run's ``tool_root`` (None: the
    workload's folder) is the recorded run's. Each is named with the SHA-256 recorded and what it is now."""
    from asyncroll.outputs.receipt import file_sha256

    def change(what: str, path: Path, sha: object) -> list[str]:
        if not isinstance(sha, str):
            return []
        try:
            now = file_sha256(path)
        except OSError as error:
            state = f"now unreadable: {error.strerror or error}"
        else:
            if now == sha:
                return []
            state = f"SHA-256 {now[:12]}… now"
        return [f"{what} {path} (SHA-256 {sha[:12]}… when the run read it, {state})"]

    changed: list[str] = []
    recorded = data.get("workload")
    if not (isinstance(recorded, dict) and isinstance(recorded.get("path"), str)):
        return changed
    if os.path.abspath(workload) == os.path.abspath(recorded["path"]):
        changed += change("the workload", Path(recorded["path"]), recorded.get("sha256"))
    recorded_root, cwd = data["config"].get("tool_root"), data.get("cwd")
    if recorded_root is None:
        recorded_root = os.path.dirname(recorded["path"])
    elif isinstance(recorded_root, str) and isinstance(cwd, str):
        recorded_root = os.path.join(cwd, recorded_root)
    root = tool_root if tool_root is not None else workload.parent
    tools = data.get("tools")
    if not isinstance(tools, dict) or not isinstance(recorded_root, str):
        return changed
    if os.path.abspath(root) != os.path.abspath(recorded_root):
        return changed  # another tool root given: other files, as asked
    for name, tool in sorted(tools.items()):
        if isinstance(tool, dict) and isinstance(tool.get("path"), str):
            changed += change(f"tool {name}'s file", Path(tool["path"]), tool.get("sha256"))
    return changed


def receipt_notes(
    path: Path, policy_given: bool, workload: Path | None = None, tool_root: Path | None = None
) -> list[str]:
    """What a re-run from the receipt at ``path`` must say (nothing for a file of settings): that it runs
    another rule than today's ``asyncroll`` (unless ``--policy`` chose one), that a simulation's
    receipt is run for real (its server model and virtual clock are no settings of ``run``), and that a
    file the run read (its workload, a tool's file) has changed since, where the new run reads the same
    (``workload``, ``tool_root``: the new run's): the same settings, another run."""
    from asyncroll.json_depth import read_json_object

    data = read_json_object(path)  # None: the file was read once already; one changed since says nothing here
    if not (data is not None and is_receipt(data)):
        return []
    notes = []
    files = [] if workload is None else changed_files(data, workload, tool_root)
    if files:
        notes.append(
            f"--config {path}: changed since that run read it: {'; '.join(files)}: this run has its "
            "settings, not its input"
        )
    if data.get("simulated") is True:
        notes.append(
            f"--config {path}: the run.json of a simulation: this run is real (its simulated server "
            "and virtual clock are no settings of run; asyncroll simulate --workload ... re-simulates)"
        )
    changed = None if policy_given else rule_then(data, path)
    if changed is None:
        return notes
    rule, today, where = changed
    if rule is None:
        notes.append(
            f"--config {path}: the run's --policy asyncroll ran a pressure rule its run.json does not name "
            f"({where}), nor a cpu_selected event beside it; this run runs today's asyncroll ({today}); "
            "give --policy to choose"
        )
    else:
        notes.append(
            f"--config {path}: the run's --policy asyncroll was the rule {rule} then ({where}); "
            f"this run runs {rule}, not today's asyncroll ({today}); give --policy to choose"
        )
    return notes
