"""``lcb_evaluate``: run a model-written program against a problem's hidden tests, LiveCodeBench-style.

Contract with the runtime (SPEC §5, §8.2, §9). The model supplies only ``code`` (the tool's declared
input is ``{"code": "str"}``); the runtime adds the problem's hidden tests as *bound* arguments when it
calls the tool, so they never appear in a prompt, an event or a result:

* ``tests``: ``[{"input": str, "output": str, "testtype": "stdin" | "functional"}, ...]`` — exactly
  LiveCodeBench's test records (``testtype`` optional);
* ``func_name``: the LeetCode method name for functional problems (``metadata.func_name``), else absent;
  called as ``Solution().<func_name>`` when the code's text holds ``class Solution``, else as the
  module-level function ``<func_name>`` (LiveCodeBench's ``compile_code``);
* optional ``time_limit_s`` (per test, default 6 s as LiveCodeBench), ``total_time_limit_s`` (the
  budget for the whole evaluation, see below), ``tool_timeout_s`` (the caller's timeout for this call:
  the runtime passes its ``--tool-timeout``), ``memory_limit_mb`` (address space, MiB, default 768) and
  ``allow_weak_isolation`` (default false: refuse to run unless every isolation layer works).

The total budget, counted from the start of the call (the first call's isolation probe included), is
``total_time_limit_s`` when given (refused, with ``tool_timeout_s``, when it does not fit under the cap
below); otherwise LiveCodeBench's overall timeout, ``(time_limit_s + 1) × tests + 5`` s, capped so that
a verdict comes back before the caller kills the worker: at ``tool_timeout_s`` less a margin of
max(1 s, 10%) (but at least half of it), or at 50 s (below the runtime's default tool timeout of 60 s)
when no ``tool_timeout_s`` is given. The limits' defaults, bounds and this rule live in
:mod:`~asyncroll.evaluator.budget`; ``asyncroll run`` sets them with ``--test-timeout``,
``--evaluation-timeout`` and ``--test-memory-mb``. A program stopped by the budget gets
``time_limit_exceeded`` with an ``error`` that names the budget and what set it (``--tool-timeout`` for
the cap): problems with many slow tests need a larger ``--tool-timeout``. A stdin program's stdout is
capped at 8 MiB per test, raised for a test whose expected output is larger to twice its size plus
64 KiB (at most 128 MiB); a functional result's JSON, at twice that cap (``output_limit_exceeded`` past
it). A functional solution's stdout goes to ``/dev/null``: LiveCodeBench judges only its return value.

The evaluation runs test by test in a fresh temporary directory and stops at the first failing test.
The result is ``{"passed", "tests_run", "tests_total", "feedback", "timed_out"}``; ``feedback`` is
``None`` on a pass, otherwise the first failing case only — ``test`` (its index), ``verdict``
(``wrong_answer``, ``runtime_error``, ``time_limit_exceeded``, ``output_limit_exceeded``), ``input``,
``expected``, and ``got`` plus ``detail`` (wrong answer) or ``error`` — every text field cut to 1000
characters, which is what the one-repair protocol shows the model. Bad arguments raise ``ValueError``
naming the field.

Where this differs from LiveCodeBench's own harness (``lcb_runner/evaluation/testing_util.py``), and why:

* each test runs in a fresh sandboxed process (LiveCodeBench runs all tests in one process), so the
  wall deadline also covers interpreter start-up and the prelude imports (tens of milliseconds), and
  nothing carries over from one test to the next: LiveCodeBench calls one ``Solution()`` instance (one
  module) for all of a problem's tests, so state kept on it or on the class leaks between tests there.
  A functional solution's module-level code (a table it precomputes) runs once there, under a time
  limit of its own, and in every test here, inside that test's limit: a program whose set-up and call
  each fit the limit but together do not passes there and times out here;
* a stdin program runs as a script (``__main__``). LiveCodeBench moves its imports to the top and wraps
  every other statement in a function it calls, so there a ``global x`` in one of the program's functions
  names a module variable, not the program's top-level ``x`` (a ``NameError``), and an ``if __name__ ==
  "__main__":`` block runs only as the last statement and only so spelled (``'__main__' == __name__``
  never does; and ``globals()`` holds none of the program's top-level names); all three work normally
  here, and so does a ``from __future__`` import (a ``SyntaxError`` there, in both modes: LiveCodeBench
  puts its import header before the program's text). A stdin program whose text holds ``class Solution``
  anywhere (a comment included) also runs normally here; there it always fails, because its
  ``compile_code`` then instantiates a module-level ``Solution``, which the wrapped program does not have;
* stdin and stdout are real files, so ``sys.stdin.buffer``, ``open(0)``, ``sys.stdout.buffer`` and
  ``os.write(1, …)`` work, and so does a ``stdout`` imported from ``sys`` (LiveCodeBench patches
  ``sys.stdin`` with a ``StringIO``, on which ``.buffer`` fails, and captures output by swapping
  ``sys.stdout`` for one after the program's imports ran, so writes through an earlier-bound ``stdout`` or
  fd 1 are lost there; its ``open`` patch misses the ``open`` its header already bound, so
  ``open(0)`` reads its worker's empty stdin there; and a ``stdin`` bound before the program runs —
  ``from sys import stdin``, or the ``stdin`` its header's ``from sys import *`` binds — is that real stdin,
  whose ``readline``, ``readlines`` and ``read`` it patches to give a line without its newline,
  ``input.split("\\n")`` and the whole input, and which iterates as empty: ``stdin.readline()[:-1]`` and
  ``for line in stdin`` fail there);
* the sandbox, not a guard that disables functions, confines the program: ``quit()`` and
  ``os.getcwd()`` work here (LiveCodeBench's ``reliability_guard`` sets them, and other ``os``,
  ``shutil`` and ``subprocess`` functions, to ``None``, so calling them is a runtime error there);
* a program's process ends when its code does: a thread it started and did not join is killed, and only
  what was printed by then counts (LiveCodeBench's capture also ends when the code returns, so there such
  a thread's later output is lost too, depending on timing: the ``threading.Thread(target=main).start()``
  idiom passes there when the thread is done within moments, as one that reads and prints a number was in
  the reference run, and fails here unless the program joins the thread);
* a functional result is compared after a JSON round trip, made in the program's process inside the test's
  time limit (LiveCodeBench compares after its per-test alarm is off: a result of very many elements,
  ``Fraction`` or ``Decimal`` ones above all, spends time of the limit here that it does not there). A
  top-level tuple counts as a list (as in LiveCodeBench) and a subclass of ``int``, ``float``, ``str``,
  ``list`` or ``dict`` (``IntEnum``, a ``str`` ``Enum``, ``defaultdict``, ``Counter``, ``OrderedDict``; dict
  keys included, at any depth) as its plain content, which is what its ``==`` compares, and so is a
  ``UserList``, ``UserDict`` or ``UserString``; a ``Fraction``, ``Decimal``, ``complex`` or numpy number
  counts as the int or float it equals exactly (``Fraction(1, 2)`` as ``0.5``; ``Fraction(1, 3)`` equals
  none), a numpy ``float32`` or ``float16`` too, though numpy 2's ``==`` rounds the expected float to its
  precision first (``np.float32(0.1) == 0.1`` there, with numpy 2.4; not here). Any other value that is not
  plain JSON data is judged wrong — exact for nested tuples, sets, non-string dict keys and objects, which
  never equal a JSON value under ``==`` (a numpy ``bool_`` or 0-d array counts as the number it equals),
  but a one-element array that LiveCodeBench's ``==`` accepts by broadcasting (``3 == np.array([3])``;
  numpy 2.4 converts no such array to a number) is also judged wrong (and so is a subclass, or a registered
  ``numbers.Number``, whose own ``__eq__`` would accept a different value);
* a functional test's blank input lines (a trailing newline, say) are skipped, each other line being one
  argument; LiveCodeBench reads every line as JSON, a blank one included, so there a problem with such a
  test fails whatever the program (its grader errs before running any test), and here it is judged;
* the total budget is capped below the caller's tool timeout (above); LiveCodeBench's is not capped;
  nor is its stdout: a program that writes megabytes of spaces before its answer passes there;
* memory: 768 MiB of address space per process by default plus a cgroup cap on the whole tree
  (LiveCodeBench's ``run_test`` calls its guard without a memory limit);
* the program runs on the sandbox's interpreter (the virtualenv's base Python, or a system one the
  unprivileged user can run: ``isolation.py``) in isolated mode (``-I``): it imports the standard
  library and what that interpreter has installed, never the run's virtualenv packages, whereas
  LiveCodeBench's program runs in its own environment, numpy included.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

from asyncroll.evaluator.budget import (
    DEFAULT_MEMORY_LIMIT_MB,
    DEFAULT_TIME_LIMIT_S,
    MAX_MEMORY_LIMIT_MB,
    MAX_TIME_LIMIT_S,
    MIN_MEMORY_LIMIT_MB,
    tool_timeout_cap,
    total_budget,
)
from asyncroll.evaluator.cases import Case, check_tests
from asyncroll.evaluator.compare import compare_stdout, compare_value
from asyncroll.evaluator.execution import Execution
from asyncroll.evaluator.isolation import PROBE_PREFIX, IsolationReport, require
from asyncroll.evaluator.lcb_json import lcb_dumps_head
from asyncroll.evaluator.sandbox import Limits, MiB, Sandbox
from asyncroll.workers.results import without_addresses

FIELD_LIMIT = 1000
OUTPUT_SLACK_BYTES = 64 * 1024
MAX_OUTPUT_BYTES = 128 * MiB
"""The most stdout a test may write, however large its expected output."""
_CUT = "…[cut]"
SCRATCH_PREFIX = "asyncroll-eval-"

_sandboxes: dict[int, Sandbox] = {}


def cut(text: str, keep_tail: bool = False) -> str:
    """``text`` cut to :data:`FIELD_LIMIT` characters (the end kept for tracebacks, else the start), a lone
    surrogate written as its escape: a program's own text (its exception's message, its result's
    ``repr``) can hold one, and the repair message that carries this field must encode as UTF-8."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= FIELD_LIMIT:
        return text
    room = FIELD_LIMIT - len(_CUT)
    return _CUT + text[-room:] if keep_tail else text[:room] + _CUT


def _validate(
    code: Any,
    tests: Any,
    func_name: Any,
    time_limit_s: Any,
    total: Any,
    memory_limit_mb: Any,
    tool_timeout_s: Any = None,
) -> list[Case]:
    if not isinstance(code, str):
        raise ValueError(f"code must be a string, got {type(code).__name__}")
    if func_name is not None and (not isinstance(func_name, str) or not func_name.isidentifier()):
        raise ValueError(f"func_name must be a Python identifier or None, got {func_name!r}")
    for name, value in (("time_limit_s", time_limit_s), ("total_time_limit_s", total)):
        if value is None and name == "total_time_limit_s":
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < MAX_TIME_LIMIT_S:
            raise ValueError(
                f"{name} must be a number of seconds in (0, {MAX_TIME_LIMIT_S:g}), got {value!r}"
            )
    bad_timeout = isinstance(tool_timeout_s, bool) or not isinstance(tool_timeout_s, int | float)
    if tool_timeout_s is not None and (bad_timeout or not 0 < tool_timeout_s < math.inf):
        raise ValueError(f"tool_timeout_s must be a positive number of seconds, got {tool_timeout_s!r}")
    if total is not None and tool_timeout_s is not None and total > tool_timeout_cap(tool_timeout_s):
        # An explicit budget is not capped: past the cap, the caller would kill the worker before the
        # verdict came back.
        raise ValueError(
            f"total_time_limit_s {total:g} does not fit under tool_timeout_s {tool_timeout_s:g}: at most "
            f"{tool_timeout_cap(tool_timeout_s):g}s (the tool timeout less a margin of max(1 s, 10%))"
        )
    bad_memory = isinstance(memory_limit_mb, bool) or not isinstance(memory_limit_mb, int)
    if bad_memory or not MIN_MEMORY_LIMIT_MB <= memory_limit_mb <= MAX_MEMORY_LIMIT_MB:
        raise ValueError(
            f"memory_limit_mb must be an integer in [{MIN_MEMORY_LIMIT_MB}, {MAX_MEMORY_LIMIT_MB}], "
            f"got {memory_limit_mb!r}"
        )
    return check_tests(tests, func_name)


def _sandbox(report: IsolationReport) -> Sandbox:
    sandbox = _sandboxes.get(id(report))
    if sandbox is None:
        remove_stale_scratch()
        sandbox = _sandboxes[id(report)] = Sandbox(report.config)
    return sandbox


def scratch_prefix(pid: int | None = None) -> str:
    """The name prefix of an evaluation's temporary directory: it names the worker that owns it."""
    return f"{SCRATCH_PREFIX}{os.getpid() if pid is None else pid}-"


def remove_stale_scratch(base: Path | None = None) -> None:
    """Remove evaluation directories whose worker is dead (a worker killed mid-evaluation by the
    runtime's tool timeout cannot remove its own), and isolation-probe directories whose process is."""
    base = Path(tempfile.gettempdir()) if base is None else base
    for prefix in (SCRATCH_PREFIX, PROBE_PREFIX):
        for path in base.glob(f"{prefix}*-*"):
            owner = path.name[len(prefix) :].split("-", 1)[0]
            if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                remove_tree(path)


def remove_tree(path: Path) -> None:
    """Remove an evaluation's directory, whatever modes the program gave what it made there: without the
    uid switch (weak isolation as a non-root user) the program owns its work directory, and a subdirectory
    it made unreadable (``chmod 000``) kept ``shutil.rmtree`` out, so the directory, the program and the
    hidden test inputs beside it stayed behind. Every directory of the tree gets its owner's ``rwx`` back
    (a symbolic link is never followed) and removal is tried again."""
    shutil.rmtree(path, ignore_errors=True)
    if not os.path.lexists(path):
        return
    pending = [str(path)]
    while pending:
        directory = pending.pop()
        try:
            if not stat.S_ISDIR(os.lstat(directory).st_mode):
                continue
            with contextlib.suppress(OSError):  # another user's: perhaps readable all the same
                os.chmod(directory, 0o700)
            with os.scandir(directory) as entries:
                pending += [entry.path for entry in entries if entry.is_dir(follow_symlinks=False)]
        except OSError:  # not ours, or gone: rmtree says nothing either way
            continue
    shutil.rmtree(path, ignore_errors=True)


def remove_dead_workers_leftovers() -> None:
    """What workers killed mid-evaluation left behind — their evaluation directories (the program and a
    hidden test input in them) and their empty per-test cgroups. A replacement worker removes them when
    it starts its first evaluation; the runtime calls this when a run's pool has closed, for the last
    ones."""
    from asyncroll.evaluator.cgroups import remove_stale_groups
    from asyncroll.evaluator.cgroups_v2 import group_roots

    remove_stale_scratch()
    remove_stale_groups(group_roots())


def lcb_evaluate(
    code: str,
    tests: list[dict[str, Any]],
    func_name: str | None = None,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    total_time_limit_s: float | None = None,
    memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB,
    allow_weak_isolation: bool = False,
    tool_timeout_s: float | None = None,
    called_at: float | None = None,
) -> dict[str, Any]:
    """Evaluate ``code`` on ``tests``; see the module docstring for the contract, the total budget and
    the result. ``called_at`` is the caller's ``time.monotonic()`` as it began the call (the runtime's,
    the same clock on Linux): the budget counts from it, so the time the tests took to reach this worker
    (a million tests: seconds) comes out of the budget, not out of the margin left before the caller's
    tool timeout kills the worker."""
    started = time.monotonic()
    if called_at is not None:
        bad = isinstance(called_at, bool) or not isinstance(called_at, int | float)
        if bad or not math.isfinite(called_at):
            raise ValueError(f"called_at must be a time.monotonic() reading, got {called_at!r}")
        started = min(started, float(called_at))
    cases = _validate(
        code, tests, func_name, time_limit_s, total_time_limit_s, memory_limit_mb, tool_timeout_s
    )
    if total_time_limit_s is None:
        budget, why = total_budget(float(time_limit_s), len(cases), tool_timeout_s)
        budget_text = f"the evaluation's total time budget of {budget:g}s ({why})"
    else:
        budget = float(total_time_limit_s)
        budget_text = (
            f"the evaluation's total time budget of {budget:g}s (total_time_limit_s: asyncroll run's "
            "--evaluation-timeout)"
        )
    budget_deadline = started + budget
    report = require(allow_weak_isolation)
    sandbox = _sandbox(report)
    limits = Limits(time_limit_s=float(time_limit_s), address_space_bytes=memory_limit_mb * MiB)
    scratch = Path(tempfile.mkdtemp(prefix=scratch_prefix()))
    tests_run, feedback, timed_out = 0, None, False
    try:
        if not report.config.private_root and report.config.uid is not None:
            scratch.chmod(0o711)  # the per-test work directories inside belong to the sandbox uid
        code_path = scratch / "solution.py"
        # 0600: the harness reads it before dropping root. A lone surrogate ("\ud800", valid in a JSON
        # string) passes through to the program's compile(), which fails on it as Python's own does: a
        # runtime_error verdict, not an exception out of the evaluation.
        code_path.write_text(code, encoding="utf-8", errors="surrogatepass")
        for index, case in enumerate(cases):
            remaining = budget_deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                feedback = _feedback(index, case, "time_limit_exceeded")
                feedback["error"] = f"{budget_text} was used up"
                break
            wall = min(limits.time_limit_s, remaining)
            stdin = case.input.encode("utf-8")
            case_limits = _case_limits(limits, case)
            execution = sandbox.run(
                code_path, stdin, scratch, func_name=func_name, wall_s=wall, limits=case_limits
            )
            tests_run += 1
            cut_short = budget_text if wall < limits.time_limit_s else None
            feedback = _judge(index, case, execution, func_name, case_limits, cut_short)
            if feedback is not None:
                timed_out = feedback["verdict"] == "time_limit_exceeded"
                break
    finally:
        remove_tree(scratch)
    return {
        "passed": feedback is None,
        "tests_run": tests_run,
        "tests_total": len(cases),
        "feedback": feedback,
        "timed_out": timed_out,
    }


def _case_limits(limits: Limits, case: Case) -> Limits:
    """``limits`` with the stdout cap raised, for a test whose expected output does not fit it, to twice
    that output plus :data:`OUTPUT_SLACK_BYTES` (at most :data:`MAX_OUTPUT_BYTES`). In functional mode
    the cap bounds the result record too."""
    needed = 2 * len(case.output.encode("utf-8")) + OUTPUT_SLACK_BYTES
    if needed <= limits.output_bytes:
        return limits
    return dataclasses.replace(limits, output_bytes=max(limits.output_bytes, min(needed, MAX_OUTPUT_BYTES)))


def _feedback(index: int, case: Case, verdict: str) -> dict[str, Any]:
    return {"test": index, "verdict": verdict, "input": cut(case.input), "expected": cut(case.output)}


def _judge(
    index: int,
    case: Case,
    execution: Execution,
    func_name: str | None,
    limits: Limits,
    budget_text: str | None,
) -> dict[str, Any] | None:
    """``None`` when the test passed; otherwise its feedback record. ``budget_text`` describes the total
    budget when it, not the per-test limit, set this test's deadline."""
    functional = func_name is not None

    def fail(verdict: str, **fields: str) -> dict[str, Any]:
        out = _feedback(index, case, verdict)
        for key, value in fields.items():
            out[key] = cut(value, keep_tail=key == "error")
        return out

    got_text = execution.stdout.decode("utf-8", "replace")
    if execution.output_exceeded:
        return fail(
            "output_limit_exceeded",
            got=got_text,
            error=f"the program wrote more than {limits.output_bytes} bytes to stdout",
        )
    if execution.timed_out:
        limit = budget_text or f"{limits.time_limit_s:g}s"
        return fail("time_limit_exceeded", error=f"the program ran past {limit} (wall clock) and was killed")
    done = execution.done
    memory = " (memory limit exceeded)" if execution.memory_limit_hit else ""
    if done is None:
        stderr = execution.stderr.strip()
        detail = f"\n{stderr}" if stderr else ""
        how = execution.describe_exit()
        if functional and execution.record_exceeded:  # the result's JSON is past the cap the record has
            return fail(
                "output_limit_exceeded",
                error=f"the returned value took more than {2 * limits.output_bytes} bytes as JSON",
            )
        if execution.status_garbled:  # a value nested past the parser's limit, or the program wrote there
            return fail(
                "runtime_error",
                error=f"the program's report could not be read back (the program {how}){memory}{detail}",
            )
        return fail("runtime_error", error=f"the program {how} before finishing normally{memory}{detail}")
    if not done.get("ok"):
        return fail("runtime_error", error=f"{done.get('error', '')}".rstrip() + memory)
    if functional:
        if done.get("too_large"):  # as a record past the cap: the value is too large to be written
            return fail(
                "output_limit_exceeded",
                error="the returned value could not be written as JSON within the test's memory limit",
            )
        if "unrepresentable" in done:
            return fail(
                "wrong_answer",
                got=without_addresses(str(done["unrepresentable"])),  # an object's: the same every run
                detail="the returned value can never equal a JSON value under == "
                "(a nested tuple, set, non-string dict key, object or an int too long for JSON)",
            )
        got_value = done.get("result")
        why = compare_value(got_value, case.expected_value)
        return (
            None
            if why is None
            else fail("wrong_answer", got=lcb_dumps_head(got_value, FIELD_LIMIT), detail=why)
        )
    why = compare_stdout(got_text, case.output)
    return None if why is None else fail("wrong_answer", got=got_text, detail=why)
