"""Checks of one problem that pydantic cannot express: its tools against the built-ins and the trusted
tool files (parsed, never run: :mod:`asyncroll.tool_files`), its script's arguments against the declared
inputs, and the one-repair protocol's metadata. Each check returns ``(field, message)`` pairs."""

from __future__ import annotations

import posixpath
import unicodedata
from pathlib import Path
from typing import Any

from asyncroll.coerce import argument_errors, bound_errors
from asyncroll.floats import shown
from asyncroll.tool_files import ToolFile, ToolFunction
from asyncroll.workers.protocol import MAX_FRAME
from asyncroll.workload.models import (
    _EVALUATOR_ONLY_BY_SUBMIT,
    BUILTIN_TOOLS,
    DEFAULT_REPAIR_INSTRUCTION,
    EVALUATOR_TOOL,
    MAX_DURATION_MS,
    PENDING_BUILTINS,
    ErrorStep,
    FinalAction,
    Problem,
    ScriptStep,
    SubmitAction,
    Tool,
    ToolAction,
)


def check_problem(
    problem: Problem,
    tool_root: Path,
    scripted: bool,
    tool_files: dict[Path, ToolFile] | None = None,
) -> list[tuple[str, str]]:
    """Cross-field checks pydantic cannot express; returns (field, message) pairs.

    ``tool_files`` caches what each trusted tool file's syntax tree says, across the problems of a scan."""
    tool_files = {} if tool_files is None else tool_files
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for i, tool in enumerate(problem.tools):
        where = f"tools[{i}]"
        if tool.name in seen:
            out.append((f"{where}.name", f"duplicate tool name {tool.name!r}"))
        seen.add(tool.name)
        if tool.implementation is None:
            if tool.name in PENDING_BUILTINS:
                out.append(
                    (
                        f"{where}.name",
                        f"built-in {tool.name!r} is not available yet: {PENDING_BUILTINS[tool.name]}",
                    )
                )
            elif tool.name not in BUILTIN_TOOLS:
                out.append(
                    (
                        f"{where}.name",
                        f"unknown tool {tool.name!r}: not a built-in "
                        f"({', '.join(sorted(BUILTIN_TOOLS))}) and no implementation given",
                    )
                )
            elif tool.inputs and tool.inputs != BUILTIN_TOOLS[tool.name]:
                out.append((f"{where}.inputs", f"built-in {tool.name!r} takes {BUILTIN_TOOLS[tool.name]}"))
            elif tool.name == EVALUATOR_TOOL and problem.protocol != "one_repair":
                out.append((f"{where}.name", _EVALUATOR_ONLY_BY_SUBMIT))
        else:
            problem_msg, function = _check_implementation(
                tool.implementation, tool.name, tool_root, tool_files
            )
            if problem_msg:
                out.append((f"{where}.implementation", problem_msg))
            if function is not None:
                out.extend(_check_function(tool.implementation, tool, function, where))
        unknown_bound = set(tool.bound_arguments) - set(tool.declared_inputs)
        if unknown_bound:
            out.append((f"{where}.bound_arguments", f"not declared in inputs: {sorted(unknown_bound)}"))
        for exc in bound_errors(tool.bound_arguments, tool.declared_inputs):
            out.append((f"{where}.bound_arguments{exc.path}", exc.message))
    if problem.protocol == "one_repair":  # scripted or not: a model server's run evaluates the same tests
        out.extend(_check_one_repair(problem))
    if problem.script is None:
        if scripted:
            hint = "a workload for a model server: --backend vllm or openai"
            out.append(("script", f"required by the scripted backend ({hint})"))
        return out
    if not problem.script:
        out.append(("script", "must hold at least one action"))
    for i, action in enumerate(problem.script):
        where = f"script[{i}]"
        if isinstance(action, ToolAction):
            declared = problem.tool(action.name)
            if declared is None:
                out.append(
                    (
                        f"{where}.name",
                        f"unknown tool {action.name!r}; this problem declares "
                        f"{[t.name for t in problem.tools]}",
                    )
                )
                continue
            if declared.name == EVALUATOR_TOOL and declared.implementation is None:
                out.append((f"{where}.name", _EVALUATOR_ONLY_BY_SUBMIT))
                continue
            errors = argument_errors(action.arguments, declared.declared_inputs, declared.bound_arguments)
            for exc in errors:
                out.append((f"{where}.arguments{exc.path}", exc.message))
            if not errors and declared.implementation is None and declared.name in _TIMED_BUILTINS:
                out.extend(_duration_problems(where, action.arguments))
        elif isinstance(action, ErrorStep):
            if i != len(problem.script) - 1:
                out.append(
                    (
                        f"{where}.type",
                        f"an 'error' step fails its request, which ends the trajectory: it must be the "
                        f"script's last step, not {i + 1} of {len(problem.script)}",
                    )
                )
        elif isinstance(action, SubmitAction) and problem.protocol != "one_repair":
            out.append((f"{where}.type", "'submit' needs metadata.prompt_metadata.protocol == 'one_repair'"))
        elif isinstance(action, FinalAction) and problem.protocol == "one_repair":
            out.append(
                (
                    f"{where}.type",
                    "a one-repair problem is answered by 'submit' (its code is run on the tests); "
                    "a 'final' answer would never be tested",
                )
            )
    out.extend(_unreachable_steps(problem, problem.script))
    return out


def _unreachable_steps(problem: Problem, script: list[ScriptStep]) -> list[tuple[str, str]]:
    """The steps after the one that surely ends the trajectory, which can never run: a 'final' answer, or
    a one-repair problem's ``max_generations``-th submit (the protocol ends it whatever the verdict). As an
    'error' step that is not the last, such a script cannot be followed as written."""
    generations = None
    if problem.protocol == "one_repair":
        generations = problem.metadata["prompt_metadata"].get("max_generations", 2)
        if isinstance(generations, bool) or not isinstance(generations, int):  # refused on its own
            generations = None
    submits = 0
    for i, action in enumerate(script[:-1]):
        if isinstance(action, FinalAction) and problem.protocol != "one_repair":
            why = f"script[{i}] is a 'final' answer, which ends the trajectory: remove the"
        elif isinstance(action, SubmitAction) and problem.protocol == "one_repair":
            submits += 1
            if submits != generations:
                continue
            why = (
                f"the one-repair protocol ends the trajectory at its submit {submits} (script[{i}]; "
                f"max_generations {generations}), whatever that program's verdict: remove the"
            )
        else:
            continue
        rest = f"{len(script) - i - 1} step(s) after it"
        if isinstance(action, SubmitAction):
            rest += ", or raise max_generations"
        return [(f"script[{i + 1}]", f"never runs: {why} {rest}")]
    return []


#: Built-ins whose argument is a duration, taken as the job's cost by a simulation.
_TIMED_BUILTINS = ("sleep_ms", "spin_ms")


def _duration_problems(where: str, arguments: dict[str, Any]) -> list[tuple[str, str]]:
    """A scripted ``milliseconds`` past :data:`MAX_DURATION_MS`, like a ``latency_ms`` past it, is a typo:
    an integer past a float's range (``1`` and 400 zeros) passed validation, then ended a simulation
    with "run failed: OverflowError" (it is the simulated job's duration)."""
    value = arguments.get("milliseconds")
    if isinstance(value, int | float) and not isinstance(value, bool) and value > MAX_DURATION_MS:
        if isinstance(value, int) and value >= 10**300:
            what = "an integer of 301+ digits"
        else:  # in full where a rounding would read as the bound itself (86400001 as 8.64e+07)
            what = str(value) if isinstance(value, int) and value < 10**16 else shown(float(value))
        return [
            (
                f"{where}.arguments.milliseconds",
                f"{what} is past one day ({MAX_DURATION_MS} ms): a typo would stall the run",
            )
        ]
    return []


def _check_function(
    implementation: str, tool: Tool, function: ToolFunction, where: str
) -> list[tuple[str, str]]:
    """What the tool's ``def`` says against how a worker will call it: ``function(**arguments)``."""
    at = f"({implementation}:{function.line})"
    out: list[tuple[str, str]] = []
    refusal = function.refusal()
    if refusal is not None:
        out.append((f"{where}.implementation", f"{tool.name!r} {at} {refusal}"))
    for name, message in function.call_problems(tool.inputs):
        out.append((f"{where}.inputs" if name is None else f"{where}.inputs.{name}", f"{message} {at}"))
    return out


MAX_TESTS_BYTES = MAX_FRAME // 2
"""The most bytes a one-repair problem's tests may hold: every evaluation sends them, with the program, to a
worker in one message of at most :data:`~asyncroll.workers.protocol.MAX_FRAME`; a problem past that failed
the whole run at its first evaluation."""


def _utf8_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _check_one_repair(problem: Problem) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    evaluator = problem.tool(EVALUATOR_TOOL)
    if evaluator is None or evaluator.implementation is not None:
        out.append(("tools", f"the one-repair protocol needs the built-in tool {EVALUATOR_TOOL!r}"))
    meta = problem.metadata
    func_name = meta.get("func_name")
    if func_name is not None and not (isinstance(func_name, str) and func_name.isidentifier()):
        out.append(("metadata.func_name", "must be a Python identifier (the Solution method to call)"))
        func_name = None
    tests = meta.get("reference_tests")
    if not isinstance(tests, list) or not tests:
        out.append(("metadata.reference_tests", "the one-repair protocol needs a non-empty list of tests"))
    else:
        from asyncroll.evaluator.cases import check_test  # the evaluator's own checks

        for i, test in enumerate(tests):
            try:
                check_test(i, test, func_name)
            except ValueError as exc:  # "tests[i].field message" → field, message
                field, _, message = str(exc).partition(" ")
                out.append((f"metadata.reference_{field}", message))
        if not out:
            size = sum(_utf8_size(test.get(key, "")) for test in tests for key in ("input", "output"))
            if size > MAX_TESTS_BYTES:
                out.append(
                    (
                        "metadata.reference_tests",
                        f"{size:,} bytes of test inputs and outputs (UTF-8): at most {MAX_TESTS_BYTES:,}, "
                        "half of the largest message a worker takes (each evaluation sends them to its "
                        "worker with the program)",
                    )
                )
    prompt_meta = meta["prompt_metadata"]
    generations = prompt_meta.get("max_generations", 2)
    if not isinstance(generations, int) or isinstance(generations, bool) or not 1 <= generations <= 10:
        out.append(("metadata.prompt_metadata.max_generations", "must be an integer from 1 to 10"))
    instruction = prompt_meta.get("repair_instruction", DEFAULT_REPAIR_INSTRUCTION)
    if not isinstance(instruction, str):
        out.append(("metadata.prompt_metadata.repair_instruction", "must be a string"))
    return out


SYMLINK_LOOP = "a symbolic link that leads back to itself (a loop)"


def _check_implementation(
    implementation: str, name: str, tool_root: Path, tool_files: dict[Path, ToolFile]
) -> tuple[str | None, ToolFunction | None]:
    """Why the file cannot serve the tool (or None), and the tool's ``def`` when its source shows it."""
    rel = Path(implementation)
    if rel.is_absolute():
        return f"must be relative to the tool root {tool_root}", None
    try:
        resolved = (tool_root / rel).resolve()
        if not resolved.is_relative_to(tool_root):
            return f"{implementation!r} escapes the tool root {tool_root}", None
        if ".." in rel.parts and (tool_root / posixpath.normpath(rel)).resolve() != resolved:
            return (
                f"{implementation!r} goes up ('..') out of a symbolic link, to {resolved}, not to the file "
                f"its text names, {posixpath.normpath(rel)!r}: spell the path without '..'"
            ), None
        if resolved.suffix != ".py":
            return f"{implementation!r} is not a .py file", None
        if not resolved.is_file():
            if resolved.exists():
                return f"{implementation!r} is not a regular file (a directory, a pipe...)", None
            if resolved.is_symlink():  # a loop: Python 3.13 resolves it to a link, where 3.11 raises
                return f"{implementation!r} cannot be resolved: {SYMLINK_LOOP}", None
            return f"{implementation!r} does not exist under the tool root {tool_root}", None
    except RuntimeError:  # Python 3.11 and 3.12 on a symlink loop
        return f"{implementation!r} cannot be resolved: {SYMLINK_LOOP}", None
    except (OSError, ValueError) as exc:  # a NUL, a name too long
        return f"{implementation!r} cannot be resolved: {exc}", None
    parsed = tool_files.get(resolved)
    if parsed is None:
        parsed = tool_files[resolved] = ToolFile.parse(resolved)
    if parsed.error is not None:
        return f"{implementation!r} {parsed.error}", None
    if not parsed.binds(name):
        # Python reads identifiers NFKC-normalised: ``def ﬁnd`` binds ``find``, whatever the file shows
        binds = unicodedata.normalize("NFKC", name)
        if binds != name and parsed.binds(binds):
            return (
                f"{implementation!r} defines no top-level {name!r}: Python reads the names in a file "
                f"NFKC-normalised, and the file binds {binds!r}, that name normalised; "
                f"name the tool {binds!r}"
            ), None
        if name in parsed.main_only:
            return (
                f'{implementation!r} binds {name!r} only inside `if __name__ == "__main__":`, which never '
                "runs in a worker (it imports the file as a module of another name): define it outside"
            ), None
        near = sorted(bound for bound in parsed.names if _loose(bound) == _loose(name))
        return (
            f"{implementation!r} defines no top-level {name!r} "
            "(no def, class, assignment or import at module level binds that name"
            + (f"; it binds {', '.join(map(repr, near))}: names are exact" if near else "")
            + ")"
        ), None
    if name in parsed.literals:
        line, kind = parsed.literals[name]
        return (
            f"{implementation!r} binds {name!r} to {kind} at line {line}, which cannot be called: "
            "a tool must be a function (a def) that a worker calls with the arguments"
        ), None
    return None, parsed.function(name)


def _loose(name: str) -> str:
    """A name as one might mistype it: ``Lookup``, ``look_up`` and ``lookUp`` are all ``lookup``."""
    return name.casefold().replace("_", "")
