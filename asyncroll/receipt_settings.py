"""A finished run's settings, read back from its ``run.json`` for ``asyncroll run --config RUN/run.json``.

``run.json`` records the merged settings under ``config`` with three values the run derived from them
(``policy_canonical``, ``limits``, ``starvation_threshold_effective``), the workload by its resolved path,
and the directory relative paths were taken from (``cwd``). Re-running a run reads them back as a config
file's settings: the derived values are left out (they are derived again), as is ``output`` (the run's own
directory exists, and is never overwritten: the new run's ``--output`` is given by flag), the workload is
the file the run read (its absolute path, whatever the current directory), a relative ``tool_root`` is
taken from the run's ``cwd``, a ``--policy asyncroll`` recorded when that name meant another pressure rule
(``policy_canonical``) runs that rule by its own name; a value equal to its default is left out, as from
any config file (:func:`asyncroll.config.load_config_file`), so that the run's recorded defaults
(``endpoint`` of a scripted run) are not taken for settings given against its backend."""

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


def rule_then(data: Mapping[str, Any]) -> tuple[str, str] | None:
    """The pressure rule a recorded ``--policy asyncroll`` ran, and today's, where they differ."""
    from asyncroll.policies.registry import canonical_policy

    config = data["config"]
    rule, today = config.get("policy_canonical"), canonical_policy("asyncroll")
    if config.get("policy") == "asyncroll" and isinstance(rule, str) and rule != today:
        return rule, today
    return None


def receipt_settings(data: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of the run whose ``run.json`` is ``data``, as above."""
    config: dict[str, Any] = dict(data["config"])
    changed = rule_then(data)
    if changed is not None:
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


def policy_note(path: Path) -> str | None:
    """What a re-run from the receipt at ``path`` must say when it runs another rule than today's
    ``asyncroll`` (None for a file of settings, or a run of any other policy)."""
    from asyncroll.json_depth import json_loads

    try:
        data = json_loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError, RecursionError):
        return None  # the file was read once already: a file that changed since says nothing here
    changed = rule_then(data) if isinstance(data, dict) and is_receipt(data) else None
    if changed is None:
        return None
    return (
        f"--config {path}: the run's --policy asyncroll was the rule {changed[0]} then (policy_canonical); "
        f"this run runs {changed[0]}, not today's asyncroll ({changed[1]}); give --policy to choose"
    )
