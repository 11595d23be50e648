"""What ``run.json`` says of a run before it starts: its command, settings (and which were given), the
code, versions, host and environment that ran it, its workload and tool files, the isolation of its
tools and untrusted code. :class:`~asyncroll.runtime.run.Run` writes it as the run's files open; the run
adds its backend, warm-up, telemetry and outcome as they happen."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asyncroll.code_identity import code_version_once
from asyncroll.outputs.receipt import environment, host, versions
from asyncroll.policies.registry import canonical_policy
from asyncroll.proctree import start_mark
from asyncroll.runtime.prepare import PreparedRun
from asyncroll.workload import EVALUATOR_TOOL


def receipt_body(
    prepared: PreparedRun,
    *,
    simulated: bool,
    tool_sha256: Callable[[Path], str],
    extra: dict[str, Any],
) -> dict[str, Any]:
    """run.json's first content. ``tool_sha256``: each tool file's digest, read once (what every worker
    checks); ``extra``: sections of the caller's own (a simulation's settings)."""
    cfg, scan = prepared.config, prepared.scan
    tools = {
        key: None if src.path is None else {"path": str(src.path), "sha256": tool_sha256(src.path)}
        for key, src in sorted(scan.tools.items())
    }
    return {
        "command": prepared.argv,
        "cwd": os.getcwd(),  # where relative paths in the command (and config) were resolved
        "pid": os.getpid(),  # while the status says running: is the run still going?
        "pid_start": start_mark(os.getpid()),  # which process that pid is, whatever the wall clock does
        "config": {
            **cfg.model_dump(mode="json"),
            "policy_canonical": canonical_policy(cfg.policy),  # the rule `asyncroll` named then
            "limits": cfg.limits.model_dump(),
            "starvation_threshold_effective": cfg.effective_starvation_threshold,
        },
        # which of them were given (a flag, a --config file's value other than its default), the rest
        # being defaults, which another version may change
        "config_given": sorted(cfg.model_fields_set),
        "simulated": simulated,
        "versions": versions(),
        "code": code_version_once(),  # which checkout or installed copy of asyncroll ran
        "host": host(),
        "environment": environment(),  # the variables that change what a run does, where set
        "workload": {
            "path": str(cfg.workload.resolve()),
            "sha256": scan.sha256,
            "problems": scan.count,
        },
        "tools": tools,
        "isolation": {
            "tool_workers": "one OS process per worker, each leading its own session and process group; "
            "workload tools are trusted code",
            "untrusted_code": _untrusted_code(prepared),
        },
        "telemetry": {
            "requested": cfg.telemetry,
            "sources": [],
            "note": "not probed yet (the probe runs after the model warm-up, before the clock)",
        },
        **extra,
    }


def _untrusted_code(prepared: PreparedRun) -> dict[str, Any] | None:
    """The sandbox in force for ``lcb_evaluate`` (None: the workload runs no untrusted code)."""
    if EVALUATOR_TOOL not in prepared.scan.tools:
        return None
    if prepared.isolation is not None:
        return prepared.isolation
    return {"note": "not probed: these workers do not run the code (simulated or virtual workers)"}
