"""Workload lines (pydantic models) and a streaming loader whose errors say ``FILE:LINE: field: message``.

A workload is JSONL, one problem per line. :func:`scan_workload` reads the whole file once, line by line,
and collects *every* problem it finds (so ``asyncroll validate`` can report them all) while keeping only
what a run needs in memory: the ids seen, the tools to preload, the file's SHA-256 and its identity.
:func:`iter_problems` streams validated problems for admission, so a 100k-line workload never sits in
memory; given the scan's identity it refuses to read a file that changed since it was validated.

Because a workload is read twice, it must be a regular file: a pipe would be drained by the scan.
Trusted tool files are checked by parsing them (never by running them): each must compile and bind the
tool's name at top level; where the name is a plain ``def``, it must not be ``async`` or a generator, and
its parameters must take exactly the declared inputs by keyword (:mod:`asyncroll.tool_files`).
See docs/TOOLS.md.
"""

from asyncroll.workload.models import (
    BUILTIN_TOOLS,
    DEFAULT_REPAIR_INSTRUCTION,
    EVALUATOR_TOOL,
    MAX_DURATION_MS,
    MAX_OUTPUT_TOKENS,
    MAX_REPORTED_PROBLEMS,
    Action,
    ErrorStep,
    FinalAction,
    OneRepair,
    Problem,
    ScriptStep,
    SubmitAction,
    Tool,
    ToolAction,
)
from asyncroll.workload.scan import (
    FileIdentity,
    ToolSource,
    WorkloadScan,
    iter_problems,
    problem_id,
    scan_workload,
)

__all__ = [
    "BUILTIN_TOOLS",
    "DEFAULT_REPAIR_INSTRUCTION",
    "EVALUATOR_TOOL",
    "MAX_DURATION_MS",
    "MAX_OUTPUT_TOKENS",
    "MAX_REPORTED_PROBLEMS",
    "Action",
    "ErrorStep",
    "FileIdentity",
    "FinalAction",
    "OneRepair",
    "Problem",
    "ScriptStep",
    "SubmitAction",
    "Tool",
    "ToolAction",
    "ToolSource",
    "WorkloadScan",
    "iter_problems",
    "problem_id",
    "scan_workload",
]
