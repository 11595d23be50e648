"""The sandboxed ``lcb_evaluate`` evaluator with real programs: verdicts, LiveCodeBench comparison,
isolation layers, a hostile set, and a real worker that survives a hostile program.

Every test that runs a program checks afterwards that nothing it started is left: no process of the
sandbox uid started since the test began, no descendant of this process, no per-test cgroup.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import psutil
import pytest

from asyncroll.errors import WorkerTimeout
from asyncroll.evaluator import cgroups, compare, isolation
from asyncroll.evaluator.cgroups import PREFIX
from asyncroll.evaluator.cgroups_v2 import group_roots
from asyncroll.evaluator.compare import compare_stdout, stripped_lines
from asyncroll.evaluator.evaluate import FIELD_LIMIT, cut, lcb_evaluate, remove_stale_scratch, scratch_prefix
from asyncroll.evaluator.isolation import IsolationError, IsolationReport, Layer
from asyncroll.evaluator.sandbox import Layers, Limits, Sandbox
from asyncroll.workers import JobRequest, ProcessWorker, ToolSpec

FIXTURES = Path(__file__).parent / "fixtures"
ROW_1873_A = FIXTURES / "livecodebench_code_generation_lite_1873_A.jsonl"
FRAGMENT_3708 = FIXTURES / "livecodebench_functional_fragment_3708.json"
ADD = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]
ADD_PROGRAM = "a, b = map(int, input().split())\nprint(a + b)\n"
SLACK_S = 3.0
HOST_ROOT_LINKS = [
    d for d in ("bin", "sbin", "lib", "lib32", "lib64", "libx32") if os.path.lexists(f"/{d}")
]  # start-up, kill and clean-up on a loaded 2-core machine

requires_isolation = pytest.mark.skipif(
    os.geteuid() != 0, reason="full isolation needs root (uid switch, namespaces, cgroups)"
)
real_process = pytest.mark.timeout(60)


class _RefuseGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing global {module}.{name}")


def real_1873_a() -> tuple[list[dict[str, str]], str]:
    """The real Codeforces row's public + private tests, decoded safely, and its statement."""
    row = json.loads(ROW_1873_A.read_text().splitlines()[0])
    private = _RefuseGlobals(io.BytesIO(zlib.decompress(base64.b64decode(row["private_test_cases"])))).load()
    return json.loads(row["public_test_cases"]) + json.loads(private), row["question_content"]


def fragment_3708() -> tuple[list[dict[str, str]], str]:
    fragment = json.loads(FRAGMENT_3708.read_text())
    return json.loads(fragment["public_test_cases"]), json.loads(fragment["metadata"])["func_name"]


SHORT_SORT = """
t = int(input())
for _ in range(t):
    s = input().strip()
    wrong = sum(1 for x, y in zip(s, "abc") if x != y)
    print("YES" if wrong in (0, 2) else "NO")
"""
ZIGZAG = """
class Solution:
    def zigzagTraversal(self, grid: List[List[int]]) -> List[int]:
        cells = []
        for i, row in enumerate(grid):
            cells.extend(row if i % 2 == 0 else reversed(row))
        return cells[::2]
"""


# --- leftovers ---------------------------------------------------------------------------------------


def _orphaned(proc: psutil.Process, uid: int) -> bool:
    """True when the first ancestor of ``proc`` not running as ``uid`` is init or this process: a
    sandboxed process that outlived its launcher. (A live sandbox of another session on this machine
    has that session's ``unshare`` or worker as its first privileged ancestor.)"""
    current = proc
    while True:
        parent = current.parent()
        if parent is None or parent.pid == 1:
            return True
        if parent.uids().real != uid:
            return parent.pid == os.getpid()
        current = parent


def leftovers(since: float, *owners: int) -> list[str]:
    """What an evaluation that started at ``since`` (``time.time()``) left behind: orphaned processes of
    the sandbox uid, descendants of this process, per-test cgroups of this process or of ``owners``
    (workers)."""
    uid = isolation.detect().config.uid
    found = []
    for proc in psutil.process_iter(["pid", "uids", "create_time", "cmdline", "status"]):
        info = proc.info
        if uid is None or not info["uids"] or info["uids"].real != uid or info["create_time"] < since - 1:
            continue
        with contextlib.suppress(psutil.Error):
            if _orphaned(proc, uid):
                found.append(f"pid {info['pid']} ({info['status']}): {(info['cmdline'] or [''])[:3]}")
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.create_time() >= since - 1:
                found.append(f"descendant {child.pid}: {child.cmdline()[:3]}")
    for root in group_roots():  # v1 memory and pids, or the v2 domain (its process leaves don't count)
        if root.exists():
            prefixes = tuple(f"{PREFIX}{pid}-" for pid in (os.getpid(), *owners))
            mine = [d.name for d in root.iterdir() if d.name.startswith(prefixes)]
            found += [f"cgroup {root}/{name}" for name in mine]
    return found


def evaluate(
    code: str, tests: list[dict[str, Any]] | None = None, **kwargs: Any
) -> tuple[dict[str, Any], float]:
    """Run ``lcb_evaluate`` and assert it left nothing behind; return its result and wall seconds."""
    since = time.time()
    began = time.monotonic()
    result = lcb_evaluate(code, ADD if tests is None else tests, **kwargs)
    elapsed = time.monotonic() - began
    assert leftovers(since) == []
    assert set(result) == {"passed", "tests_run", "tests_total", "feedback", "timed_out"}
    return result, elapsed


def verdict(result: dict[str, Any]) -> str | None:
    return None if result["feedback"] is None else result["feedback"]["verdict"]


# --- comparison and arguments (no process) -----------------------------------------------------------


def test_stdout_comparison_follows_livecodebench() -> None:
    assert stripped_lines("  a \r\n b\n\n") == ["a", "b"]
    assert compare_stdout("YES\nNO\n", "YES\nNO") is None
    assert compare_stdout("  1.50  2e0 \n", "1.5 2\n") is None  # numeric fallback on tokens
    assert compare_stdout("1000\n", "1e3") is None
    assert compare_stdout("0.333", "0.3333") is not None  # Decimal equality: no tolerance
    assert compare_stdout("1 2", "1 2 3") is not None
    assert compare_stdout("YES\nNO", "YES") == "mismatched output length: got 2 lines, expected 1"
    assert compare_stdout("yes", "YES") == "line 1: 'yes' != 'YES'"
    assert compare_stdout("sNaN", "sNaN") is None  # identical text matches before any number parsing
    assert compare_stdout("sNaN 1", "sNaN  1") is not None  # a signalling NaN refuses comparison


def test_lines_with_different_token_counts_differ_without_parsing_a_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Token lists of different lengths never compare equal: an 8 MiB line of numbers against a one-token
    answer once cost the worker seconds and hundreds of MiB parsing every token as a Decimal."""
    monkeypatch.setattr(compare, "_decimals", lambda tokens: pytest.fail("parsed numbers"))
    line = ("1 " * 100_000).strip()
    assert compare_stdout(line, "3") == f"line 1: {line[:200]!r} != '3'"


@pytest.mark.parametrize(
    ("failcnt", "oom_control", "hit"),
    [
        ("0", "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n", True),
        ("2", None, True),
        ("0", "oom_kill 0\n", False),
    ],
)
def test_a_memory_limit_hit_is_seen_by_the_fail_count_or_the_oom_kill_count(
    tmp_path: Path, failcnt: str, oom_control: str | None, hit: bool
) -> None:
    """Some kernels leave ``memory.failcnt`` at 0 while the group's out-of-memory killer fires: the
    verdict said only "killed by SIGKILL", never "(memory limit exceeded)"."""
    (tmp_path / "memory.failcnt").write_text(failcnt)
    if oom_control is not None:
        (tmp_path / "memory.oom_control").write_text(oom_control)
    assert cgroups.TestGroup((tmp_path,)).memory_limit_hit() is hit


def test_feedback_fields_are_cut_to_1000_characters() -> None:
    assert cut("x" * FIELD_LIMIT) == "x" * FIELD_LIMIT
    head = cut("a" * 600 + "b" * 600)
    tail = cut("a" * 600 + "b" * 600, keep_tail=True)
    assert len(head) == len(tail) == FIELD_LIMIT
    assert head.startswith("a") and tail.endswith("b")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"code": 3}, "code must be a string"),
        ({"tests": []}, "tests must be a non-empty list"),
        ({"tests": [{"input": "1"}]}, "tests[0].output must be a string"),
        ({"tests": [{"input": "1", "output": "2", "testtype": "x"}]}, "tests[0].testtype must be"),
        ({"tests": [{"input": "1", "output": "2", "testtype": "functional"}]}, "no func_name was given"),
        ({"func_name": "not an id"}, "func_name must be a Python identifier"),
        ({"func_name": "f", "tests": [{"input": "[1]\nnope", "output": "1"}]}, "tests[0].input line 2"),
        ({"func_name": "f", "tests": [{"input": "[1]", "output": "{"}]}, "tests[0].output is not a JSON"),
        ({"time_limit_s": 0}, "time_limit_s must be a number"),
        ({"total_time_limit_s": -1}, "total_time_limit_s must be a number"),
        ({"memory_limit_mb": 8}, "memory_limit_mb must be an integer in [64, 1048576]"),
        ({"memory_limit_mb": 2**21}, "memory_limit_mb must be an integer in [64, 1048576]"),
        ({"tool_timeout_s": 0}, "tool_timeout_s must be a positive number"),
        ({"tool_timeout_s": float("inf")}, "tool_timeout_s must be a positive number"),
        (  # an explicit budget is not capped: past the cap the worker would be killed before the verdict
            {"total_time_limit_s": 55, "tool_timeout_s": 60},
            "total_time_limit_s 55 does not fit under tool_timeout_s 60: at most 54s",
        ),
    ],
)
def test_bad_arguments_raise_errors_naming_the_field(kwargs: dict[str, Any], message: str) -> None:
    arguments: dict[str, Any] = {"code": ADD_PROGRAM, "tests": [{"input": "1 2", "output": "3"}], **kwargs}
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        lcb_evaluate(**arguments)


def test_the_default_total_budget_scales_like_livecodebench_below_the_tool_timeout() -> None:
    from asyncroll.evaluator.evaluate import tool_timeout_cap, total_budget

    assert tool_timeout_cap(60) == 54 and tool_timeout_cap(180) == 162  # a 10% margin
    assert tool_timeout_cap(3) == 2 and tool_timeout_cap(1) == 0.5  # at least 1 s, at most half
    budget, why = total_budget(6.0, 12, 180.0)
    assert budget == (6 + 1) * 12 + 5 and "as LiveCodeBench" in why  # QA's 12 slow tests fit
    budget, why = total_budget(6.0, 12, 60.0)
    assert budget == 54 and "--tool-timeout of 60s" in why
    assert total_budget(6.0, 12, None)[0] == 50  # a call that names no tool timeout: the old cap
    assert total_budget(6.0, 1, None)[0] == total_budget(6.0, 1, 60.0)[0] == 12


def test_missing_layers_are_refused_unless_weak_isolation_is_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    layers = tuple(Layer(name, name != "cgroup_pids", "probe said so") for name in isolation.REQUIRED)
    weak = IsolationReport(layers, Layers(python="/usr/bin/python3"), root=True)
    monkeypatch.setattr(isolation, "detect", lambda: weak)
    with pytest.raises(IsolationError, match="cgroup_pids: probe said so") as caught:
        isolation.require()
    assert "allow_weak_isolation=True" in str(caught.value)
    assert isolation.require(allow_weak=True) is weak
    recorded = isolation.isolation_report(allow_weak=True)
    assert recorded["weak"] is True and recorded["missing"] == ["cgroup_pids"] and recorded["allowed_weak"]


# --- isolation on this machine -----------------------------------------------------------------------


@requires_isolation
@real_process
def test_the_isolation_report_prints_from_the_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "asyncroll.evaluator.isolation"], capture_output=True, text=True, timeout=50
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["missing"] == []


@requires_isolation
@real_process
def test_every_layer_is_detected_and_the_report_is_json() -> None:
    report = isolation.isolation_report()
    assert json.loads(json.dumps(report)) == report
    assert report["weak"] is False and report["missing"] == []
    for name in isolation.REQUIRED:
        assert report["layers"][name]["active"], (name, report["layers"][name])
    assert report["uid"] not in (None, 0)
    assert "bubblewrap" in report["layers"]
    assert report["layers"]["kernel_keys_denied"]["active"], report["layers"]["kernel_keys_denied"]
    # verdicts can depend on the sandbox's interpreter (its recursion limits): the receipt says which
    version = subprocess.run(
        [report["python"], "-I", "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert report["python_version"] == version


@requires_isolation
@real_process
def test_the_program_sees_an_unprivileged_empty_world() -> None:
    probe = """
import json, os, socket
print(json.dumps([os.getuid(), os.getpid(), os.getppid(), sorted(os.environ), os.listdir("/tmp"),
                  [name for _, name in socket.if_nameindex()],
                  sorted(int(p) for p in os.listdir("/proc") if p.isdigit()), sorted(os.listdir("/"))]))
"""
    result, _ = evaluate(probe, [{"input": "", "output": "?"}])
    seen = json.loads(result["feedback"]["got"])
    assert seen[0] == isolation.detect().config.uid
    assert seen[1:3] == [2, 1]  # the program's process is PID 2 under the harness as PID 1
    assert seen[3] == ["HOME", "LANG", "LC_ALL", "PATH", "TMPDIR"]
    assert seen[4] == ["work"] and seen[5] == ["lo"]
    assert seen[7] == sorted(["dev", "proc", "tmp", "usr", "var", *HOST_ROOT_LINKS])
    assert seen[6] == [1, 2]  # /proc shows the namespace only: no host process, no secret to read


# --- verdicts with real programs ---------------------------------------------------------------------


@real_process
def test_a_correct_program_passes_the_real_codeforces_tests() -> None:
    tests, statement = real_1873_a()
    assert len(tests) == 5 and "abc" in statement
    result, _ = evaluate(SHORT_SORT, tests)
    assert result == {"passed": True, "tests_run": 5, "tests_total": 5, "feedback": None, "timed_out": False}


@real_process
def test_a_wrong_answer_stops_at_the_first_failing_test_with_its_feedback() -> None:
    tests, _ = real_1873_a()
    wrong = SHORT_SORT.replace("(0, 2)", "(0,)")
    result, _ = evaluate(wrong, tests)
    assert not result["passed"] and result["tests_run"] == 1 and result["tests_total"] == 5
    feedback = result["feedback"]
    assert feedback["verdict"] == "wrong_answer" and feedback["test"] == 0
    assert feedback["input"] == tests[0]["input"] and feedback["expected"] == tests[0]["output"]
    assert feedback["got"].split() == ["YES", "NO", "NO", "NO", "NO", "NO"]
    assert feedback["detail"] == "line 2: 'NO' != 'YES'"


@real_process
def test_a_runtime_error_reports_the_programs_traceback_only() -> None:
    result, _ = evaluate("def f(x):\n    return 1 // x\nprint(f(0))\n")
    assert verdict(result) == "runtime_error" and result["tests_run"] == 1
    error = result["feedback"]["error"]
    assert 'File "solution.py", line 2, in f' in error
    assert error.splitlines()[-1].startswith("ZeroDivisionError: integer division")
    assert "<string>" not in error  # no harness frames


@real_process
def test_lone_surrogates_in_the_code_or_the_programs_own_text_give_a_verdict_that_encodes() -> None:
    """A lone surrogate (``"\\ud800"`` is valid in a JSON string) in the code fails its compile() as
    Python's own does, and one in the program's exception message or result ``repr`` reaches the repair
    message escaped: the request that carries that message must encode as UTF-8."""
    from asyncroll.runtime.trajectory import format_feedback

    result, _ = evaluate("print(3)  # \ud800\n")
    assert verdict(result) == "runtime_error", result
    assert "surrogates not allowed" in result["feedback"]["error"]
    raises = "raise ValueError('\\ud800 boom')\n"
    odd = "class R:\n    def __repr__(self):\n        return '\\udcff'\n\n"
    functional = odd + "class Solution:\n    def f(self):\n        return R()\n"
    one = [{"input": "", "output": "1", "testtype": "functional"}]
    for code, tests, func_name in ((raises, None, None), (functional, one, "f")):
        result, _ = evaluate(code, tests, func_name=func_name)
        feedback = result["feedback"]
        assert verdict(result) in ("runtime_error", "wrong_answer"), result
        format_feedback(feedback).encode("utf-8")  # raised UnicodeEncodeError
        text = feedback.get("error") or feedback["got"]
        assert "\\ud800 boom" in text or "\\udcff" in text, text


@real_process
def test_a_runaway_recursion_is_a_runtime_error_with_its_innermost_frames() -> None:
    """~50,000 frames deep: only the innermost few are formatted (formatting them all took seconds and
    could turn the verdict into a time-out), with the program's own source lines."""
    result, _ = evaluate("def f(n):\n    return f(n + 1)\nf(0)\n")
    assert verdict(result) == "runtime_error"
    error = result["feedback"]["error"]
    assert error.splitlines()[-1] == "RecursionError: maximum recursion depth exceeded"
    assert "    return f(n + 1)" in error  # the line itself: the source is known inside the sandbox
    shown = error.count('File "solution.py"')
    repeated = re.search(r"Previous line repeated (\d+) more times", error)
    assert repeated is not None and shown + int(repeated.group(1)) <= 64


@real_process
def test_long_feedback_fields_are_cut() -> None:
    result, _ = evaluate("print('y' * 5000)", [{"input": "z" * 3000, "output": "x" * 3000}])
    feedback = result["feedback"]
    assert all(len(feedback[key]) == FIELD_LIMIT for key in ("input", "expected", "got"))


@real_process
def test_numbers_compare_as_decimals_like_livecodebench() -> None:
    tests = [{"input": "", "output": "1.5 2\n1000\n"}]
    assert evaluate("print('1.50', '2.0')\nprint('1e3')", tests)[0]["passed"]
    result, _ = evaluate("print(1.5, 2)\nprint(999.9999999)", tests)
    assert verdict(result) == "wrong_answer" and result["feedback"]["detail"].startswith("line 2")


@real_process
def test_exit_codes_are_not_trusted() -> None:
    # sys.exit(256) is status 0, and LiveCodeBench swallows SystemExit: the printed answer counts.
    assert evaluate("print(3)\nimport sys\nsys.exit(256)")[0]["passed"]
    assert evaluate("print(3)\nraise SystemExit(1)")[0]["passed"]
    # os._exit(0) skips the flush: status 0, yet the program never finished normally.
    result, _ = evaluate("print(3)\nimport os\nos._exit(0)")
    assert verdict(result) == "runtime_error"
    assert "exited with status 0 before finishing normally" in result["feedback"]["error"]


@real_process
def test_the_runtimes_environment_cannot_change_a_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    program = "print(3)\nimport os\nos._exit(0)"  # passes only if stdout is unbuffered
    before, _ = evaluate(program)
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")
    after, _ = evaluate(program)
    assert verdict(before) == verdict(after) == "runtime_error"


@real_process
def test_a_time_limit_kills_the_program_within_its_deadline() -> None:
    result, elapsed = evaluate("while True:\n    pass\n", time_limit_s=1.0)
    assert verdict(result) == "time_limit_exceeded" and result["timed_out"] is True
    assert 1.0 <= elapsed < 1.0 + SLACK_S


@real_process
def test_the_total_budget_bounds_the_whole_evaluation() -> None:
    isolation.detect()  # the budget counts from the call's start: probe now, not in the first call
    tests = [{"input": "", "output": "1"}] * 4
    result, elapsed = evaluate(
        "import time\ntime.sleep(0.6)\nprint(1)", tests, time_limit_s=1.0, total_time_limit_s=1.5
    )
    # 0.6 s per test plus start-up: the budget runs out during the 3rd test or just before it starts
    assert result["timed_out"] is True and result["tests_run"] in (2, 3) and not result["passed"]
    assert "total time budget of 1.5s" in result["feedback"]["error"]
    assert elapsed < 1.5 + SLACK_S


@real_process
def test_the_tool_timeout_caps_the_default_budget_with_a_verdict_that_names_it() -> None:
    """LiveCodeBench's scaled budget, (1 + 1) × 16 + 5 = 37 s, would let all 16 tests of about 0.3 s
    run; a 4 s tool timeout caps it at 3 s, so the verdict comes back before the worker would be killed."""
    isolation.detect()
    tests = ADD * 16
    program = "import time\ntime.sleep(0.2)\n" + ADD_PROGRAM
    result, elapsed = evaluate(program, tests, time_limit_s=1.0, tool_timeout_s=4.0)
    assert verdict(result) == "time_limit_exceeded" and result["timed_out"] is True
    assert 1 <= result["tests_run"] < 16 and elapsed < 4.0
    error = result["feedback"]["error"]
    assert "the evaluation's total time budget of 3s" in error and "--tool-timeout of 4s" in error
    passed, _ = evaluate(program, tests[:4], time_limit_s=1.0, tool_timeout_s=4.0)
    assert passed["passed"] and passed["tests_run"] == 4


@real_process
def test_an_expected_output_larger_than_the_default_stdout_cap_fits() -> None:
    n = 2_200_000  # "YES\n" × n is 8.8 MB, past the 8 MiB default cap
    program = "import sys\nn = int(sys.stdin.read())\nsys.stdout.write('YES\\n' * n)\n"
    big = [{"input": f"{n}\n", "output": "YES\n" * n}]
    result, _ = evaluate(program, big)
    assert result["passed"], result["feedback"]
    flood, _ = evaluate("while True:\n    print('x' * 4096)\n", big)  # still bounded: 2 × 8.8 MB + 64 KiB
    assert verdict(flood) == "output_limit_exceeded"
    assert f"more than {2 * 4 * n + 64 * 1024} bytes" in flood["feedback"]["error"]


@real_process
def test_a_functional_problem_calls_solution_with_json_arguments() -> None:
    tests, func_name = fragment_3708()
    assert func_name == "zigzagTraversal" and len(tests) == 2
    result, _ = evaluate(ZIGZAG, tests, func_name=func_name)
    assert result == {"passed": True, "tests_run": 2, "tests_total": 2, "feedback": None, "timed_out": False}
    wrong, _ = evaluate(ZIGZAG.replace("[::2]", "[1::2]"), tests, func_name=func_name)
    assert verdict(wrong) == "wrong_answer" and wrong["feedback"]["got"] == "[2, 3]"
    assert wrong["feedback"]["input"] == "[[1, 2], [3, 4]]" and wrong["feedback"]["expected"] == "[1, 4]"


@real_process
def test_functional_results_compare_like_livecodebench() -> None:
    tests = [{"input": "2\n3", "output": "[2, 3]", "testtype": "functional"}]
    program = "class Solution:\n    def pair(self, a, b):\n        return {}\n"
    assert evaluate(program.format("(a, b)"), tests, func_name="pair")[0]["passed"]  # top-level tuple
    assert evaluate(program.format("[a, b]"), tests, func_name="pair")[0]["passed"]
    nested = [{"input": "2\n3", "output": "[[2, 3]]", "testtype": "functional"}]
    result, _ = evaluate(program.format("[(a, b)]"), nested, func_name="pair")
    assert verdict(result) == "wrong_answer" and result["feedback"]["got"] == "[(2, 3)]"
    result, _ = evaluate("class Nope:\n    pass\n", tests, func_name="pair")
    assert verdict(result) == "runtime_error" and "no class Solution" in result["feedback"]["error"]


@real_process
@pytest.mark.parametrize("returned", ["10 ** 5000", "[1, {'k': 10 ** 5000}]"])
def test_an_int_too_long_for_json_is_a_wrong_answer_not_a_lost_report(returned: str) -> None:
    """Python refuses to write an int of more than 4,300 digits as text (and so as JSON): the expected
    value, read as JSON, cannot hold one, so LiveCodeBench's ``==`` is false. It was a runtime_error
    'exited with status 0 before finishing normally': the report failed to encode and was lost."""
    tests = [{"input": "", "output": "1", "testtype": "functional"}]
    program = f"class Solution:\n    def f(self):\n        return {returned}\n"
    result, _ = evaluate(program, tests, func_name="f")
    assert verdict(result) == "wrong_answer", result
    assert "an int too long for JSON" in result["feedback"]["detail"]
    assert "cannot be shown" in result["feedback"]["got"]


@real_process
def test_a_functional_result_past_the_record_cap_is_an_output_limit_verdict() -> None:
    """The done record of a functional test is capped at twice the stdout cap (16 MiB by default): a
    larger result was a runtime_error 'the program's report could not be read back'."""
    tests = [{"input": "", "output": '"x"', "testtype": "functional"}]
    program = "class Solution:\n    def f(self):\n        return 'x' * (20 * 1024 * 1024)\n"
    result, _ = evaluate(program, tests, func_name="f")
    assert verdict(result) == "output_limit_exceeded", result
    assert f"more than {16 * 1024 * 1024} bytes as JSON" in result["feedback"]["error"]
    junk = STATUS_FD + "os.write(fd, b'x' * (17 * 1024 * 1024))\nprint(3)\n"  # stdin mode: no result
    result, _ = evaluate(junk)
    assert verdict(result) != "output_limit_exceeded", result


@real_process
def test_a_functional_program_without_class_solution_is_called_as_its_module_function() -> None:
    """LiveCodeBench's ``compile_code`` calls ``Solution().<func_name>`` only when the program's text
    holds ``class Solution``; any other program's module-level ``<func_name>`` is called."""
    tests = [{"input": "2\n3", "output": "[2, 3]", "testtype": "functional"}]
    result, _ = evaluate("def pair(a, b):\n    return [a, b]\n", tests, func_name="pair")
    assert result["passed"], result["feedback"]
    # the text decides, as in LiveCodeBench: a 'class SolutionHelper' makes it look for class Solution
    helper = "class SolutionHelper:\n    pass\n\ndef pair(a, b):\n    return [a, b]\n"
    result, _ = evaluate(helper, tests, func_name="pair")
    assert verdict(result) == "runtime_error" and "no class Solution" in result["feedback"]["error"]
    result, _ = evaluate("def other(a, b):\n    return [a, b]\n", tests, func_name="pair")
    assert verdict(result) == "runtime_error" and "no function pair" in result["feedback"]["error"]


MAIN_BLOCKS = {
    "unittest": ZIGZAG
    + """
import unittest
class T(unittest.TestCase):
    def test(self):
        self.assertEqual(Solution().zigzagTraversal([[1, 2], [3, 4]]), [1, 4])
if __name__ == "__main__":
    unittest.main()
""",
    "input": ZIGZAG + '\nif __name__ == "__main__":\n    print(Solution().zigzagTraversal(eval(input())))\n',
}


@real_process
@pytest.mark.parametrize("block", sorted(MAIN_BLOCKS))
def test_a_functional_solution_runs_as_a_module_not_as_main(block: str) -> None:
    """LiveCodeBench execs a call-based solution in a ``tmp_sol`` module: a main block does not run."""
    tests, func_name = fragment_3708()
    result, _ = evaluate(MAIN_BLOCKS[block], tests, func_name=func_name)
    assert result["passed"], result["feedback"]
    name = [{"input": "", "output": '"tmp_sol"', "testtype": "functional"}]
    result, _ = evaluate("class Solution:\n    def f(self):\n        return __name__\n", name, func_name="f")
    assert result["passed"], result["feedback"]
    script = 'if __name__ == "__main__":\n' + "".join(f"    {line}\n" for line in ADD_PROGRAM.splitlines())
    assert evaluate(script)[0]["passed"]  # a stdin program still runs as a script


@real_process
@pytest.mark.parametrize(
    ("returned", "output", "passes"),
    [
        ("defaultdict(int, {'a': 1})", '{"a": 1}', True),
        ("Counter('aab')", '{"b": 1, "a": 2}', True),
        ("OrderedDict([('b', [1]), ('a', [2])])", '{"a": [2], "b": [1]}', True),
        ("L([1, 4])", "[1, 4]", True),
        ("[defaultdict(list, {'x': L([2])})]", '[{"x": [2]}]', True),
        ("[{S('k'): S('v')}, S('w')]", '[{"k": "v"}, "w"]', True),
        ("L([1, 5])", "[1, 4]", False),
        ("defaultdict(int, {1: 1})", '{"1": 1}', False),
    ],
)
def test_list_and_dict_subclasses_compare_as_their_plain_content(
    returned: str, output: str, passes: bool
) -> None:
    """Under LiveCodeBench's ``==`` a ``defaultdict``, ``Counter``, ``OrderedDict``, list or str
    subclass equals the plain JSON value with the same content."""
    program = (
        "class L(list):\n    pass\n\nclass S(str):\n    pass\n\n"
        f"class Solution:\n    def f(self):\n        return {returned}\n"
    )
    tests = [{"input": "", "output": output, "testtype": "functional"}]
    result, _ = evaluate(program, tests, func_name="f")
    assert result["passed"] is passes, result["feedback"]
    if not passes:
        assert verdict(result) == "wrong_answer"
        never = "can never equal" in result["feedback"]["detail"]
        assert never is returned.startswith("defaultdict")  # only the int key is unrepresentable


def test_subclass_results_are_sent_as_the_content_their_eq_compares() -> None:
    """The harness sends a subclass of a JSON type as the plain value its ``==`` compares (its base
    type's own content, whatever it overrides), and a value no JSON value can equal as unrepresentable."""
    import enum

    from asyncroll.evaluator.harness import _plain

    class S(str):
        def __str__(self) -> str:
            return "overridden"

    class I(int):  # noqa: E742 - a one-letter class, as in a solution
        def __int__(self) -> int:
            return 99

    class F(float):
        def __float__(self) -> float:
            return 9.5

    class Colour(enum.StrEnum):
        RED = "red"

    class Apart(str):  # two keys with one content: only their own __eq__/__hash__ keep them apart
        __hash__ = object.__hash__

        def __eq__(self, other: object) -> bool:
            return self is other

    cases: list[tuple[Any, Any]] = [
        (S("abc"), "abc"),
        (Colour.RED, "red"),
        (I(5), 5),
        (F(1.5), 1.5),
        ({S("k"): [S("v")]}, {"k": ["v"]}),
        ([{"a": {S("b"): I(2)}}], [{"a": {"b": 2}}]),
    ]
    for value, plain in cases:
        sent = _plain(value)
        assert sent == plain and value == plain, (value, sent)
        assert json.loads(json.dumps(sent)) == plain and type(sent) is type(plain), (value, sent)
        if isinstance(sent, dict):
            assert all(type(k) is str for k in sent), sent
    for never in ({Apart("a"): 1, Apart("a"): 2}, {S("a"): {1: 1}}, [S("a"), (1,)]):
        with pytest.raises(TypeError):
            _plain(never)


# --- hostile programs --------------------------------------------------------------------------------

FORK_BOMB = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""
SETSID_ESCAPE = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(1000)
    os._exit(0)
print(3)
"""
IGNORES_SIGTERM = """
import signal
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
while True:
    pass
"""
HOLDS_STDOUT = """
import subprocess
subprocess.Popen(["sleep", "1000"], start_new_session=True)  # inherits stdout and never exits
print(3)
"""
AGGREGATE_MEMORY = """
import os, time
children = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        block = bytearray(150 * 1024 * 1024)  # each process stays under its address-space limit
        time.sleep(3)  # held until all four have allocated, however slowly a loaded machine forks
        os._exit(0)
    children.append(pid)
killed = sum(os.WIFSIGNALED(os.waitpid(pid, 0)[1]) for pid in children)
print(3 if killed == 0 else f"{killed} killed")
"""


@real_process
@pytest.mark.parametrize(
    ("name", "program", "expected"),
    [
        ("infinite loop", "while True:\n    pass\n", "time_limit_exceeded"),
        ("fork bomb", FORK_BOMB, "time_limit_exceeded"),
        ("ignores SIGTERM", IGNORES_SIGTERM, "time_limit_exceeded"),
        ("memory bomb", "x = bytearray(4 * 1024**3)\nprint(3)\n", "runtime_error"),
        ("stdout flood", "while True:\n    print('x' * 4096)\n", "output_limit_exceeded"),
        (
            "sleeps after answering",
            "print(3, flush=True)\nimport time\ntime.sleep(1000)\n",
            "time_limit_exceeded",
        ),
    ],
    ids=["loop", "fork-bomb", "ignores-sigterm", "memory-bomb", "stdout-flood", "sleeps"],
)
def test_hostile_programs_end_with_a_verdict_and_leave_nothing(
    name: str, program: str, expected: str
) -> None:
    result, elapsed = evaluate(program, time_limit_s=1.0)
    assert verdict(result) == expected, (name, result)
    assert elapsed < 1.0 + SLACK_S, name
    if expected == "runtime_error":
        assert "MemoryError" in result["feedback"]["error"]


@requires_isolation
@real_process
@pytest.mark.parametrize(
    ("name", "program"),
    [("setsid escape", SETSID_ESCAPE), ("holds stdout open", HOLDS_STDOUT)],
    ids=["setsid", "stdout-holder"],
)
def test_descendants_that_escape_the_process_group_are_killed(name: str, program: str) -> None:
    result, elapsed = evaluate(program, time_limit_s=2.0)
    assert result["passed"], (name, result)  # the answer counts; the escaped descendant dies with the test
    assert elapsed < 2.0, name  # no waiting for an end of file the descendant withholds


@requires_isolation
@real_process
def test_the_memory_cgroup_caps_a_tree_of_processes() -> None:
    # 4 x 150 MiB under a 256 MiB address space: no single process hits RLIMIT_AS, the tree hits the
    # cgroup (256 + 64 tmpfs + 64 MiB) and the kernel kills some children.
    result, _ = evaluate(AGGREGATE_MEMORY, time_limit_s=10.0, memory_limit_mb=256)
    assert verdict(result) == "wrong_answer", result
    assert result["feedback"]["got"].strip().endswith("killed")


# The status fd's number, read from the harness's command line (its one JSON argument).
STATUS_FD = """
import json, os
config = open(f"/proc/{os.getppid()}/cmdline").read().split("\\0")[4]
fd = json.loads(config)["status_fd"]
"""
GARBLED_REPORT = STATUS_FD + 'os.write(fd, b"[" * 100000 + b"\\n")\nprint(3)\n'
FORGED_EXIT = (
    STATUS_FD
    + """
os.write(fd, b'{"kind": "exit", "status": 99999999999999999999}\\n[')
os._exit(3)
"""
)
FLOODS_STATUS = (
    STATUS_FD
    + """
os.write(fd, b'{"kind": "done", "ok": true}\\n')
print(3, flush=True)
for _ in range(256):
    os.write(fd, b"{}\\n" * 32768)
"""
)
NESTED_RESULT = """
class Solution:
    def f(self, a):
        x = []
        for _ in range(5000):
            x = [x]
        return x
"""
UNREADABLE = "the program's report could not be read back"


@real_process
@pytest.mark.parametrize(
    ("program", "func_name", "expected"),
    [
        (GARBLED_REPORT, None, f"{UNREADABLE} (the program exited with status 0)"),
        (FORGED_EXIT, None, f"{UNREADABLE} (the program exited with status 3)"),
        (NESTED_RESULT, "f", f"{UNREADABLE} (the program exited with status 0)"),
        (FLOODS_STATUS, None, None),
    ],
    ids=["garbled-report", "forged-exit", "nested-result", "status-flood"],
)
def test_what_a_program_writes_on_the_status_fd_cannot_break_or_forge_the_verdict(
    program: str, func_name: str | None, expected: str | None
) -> None:
    """The program inherits the status fd (its done record goes there): a line nested past the parser's
    limit, a forged exit record with an absurd status, or megabytes after its first line once raised in
    the worker (the trajectory failed and left the pass rates) or took it seconds and hundreds of MiB.
    Now: a verdict, the real exit status (the harness's exit record has an fd the program never holds),
    and only the first line of the status pipe is kept."""
    tests = [{"input": "1\n", "output": "3\n"}] if func_name is None else [{"input": "1", "output": "3"}]
    result, elapsed = evaluate(program, tests, func_name=func_name, time_limit_s=6.0)
    if expected is None:
        assert result["passed"], result
    elif program is NESTED_RESULT and sys.version_info >= (3, 13) and verdict(result) == "wrong_answer":
        pass  # 3.13's JSON reader takes 5,000 levels (a C-stack limit): the value is read, and is wrong
    else:
        assert verdict(result) == "runtime_error", result
        assert expected in result["feedback"]["error"], result
    assert elapsed < 6.0, elapsed


def test_the_status_pipe_keeps_its_first_line_found_in_the_bytes_just_read() -> None:
    """Only the bytes of the last read are searched for the end of the first line (a large done record
    arrives in many reads: searching the whole buffer after each was quadratic, within the test's time)."""
    from asyncroll.evaluator.sandbox import _first_line_only

    status, caps = bytearray(b'{"kind": "done", "result": "' + b"x" * 100), {3: 1000}
    _first_line_only(status, caps, 3, 0)
    assert caps[3] == 1000 and len(status) == 128  # no line yet
    before = len(status)
    status += b'"}\n{"kind": "exit"}\n'
    _first_line_only(status, caps, 3, before)
    assert bytes(status).endswith(b'x"}\n') and caps[3] == len(status) == 131


IPC_AND_KEYS = """
import ctypes, errno, os, platform
libc = ctypes.CDLL(None, use_errno=True)
libc.shmget.restype = ctypes.c_int
key, size = 0x5A5A17, 1 << 20
shm = libc.shmget(key, size if MODE == "leave" else 0, (0o1000 | 0o600) if MODE == "leave" else 0)
add_key = {"x86_64": 248, "aarch64": 217}[platform.machine()]
libc.syscall.restype = ctypes.c_long
keyed = libc.syscall(add_key, b"user", b"asyncroll-test", b"secret", 6, -4)  # KEY_SPEC_USER_KEYRING
print(MODE, shm >= 0, keyed >= 0 or errno.errorcode[ctypes.get_errno()])
"""


@requires_isolation
@real_process
def test_ipc_objects_and_kernel_keys_do_not_outlive_a_test() -> None:
    """Without an IPC namespace a program's System V shared memory outlived its test (pinning host
    memory no test cgroup bounds, readable by the next program), and ``nobody``'s kernel keyring still
    does: the harness's seccomp filter refuses the keyring calls."""
    leave, _ = evaluate("MODE = 'leave'\n" + IPC_AND_KEYS, [{"input": "", "output": "leave True EPERM"}])
    assert leave["passed"], leave  # the segment was made, inside the test's own namespace
    with open("/proc/sysvipc/shm") as host:
        assert not [line for line in host.read().splitlines()[1:] if int(line.split()[0]) == 0x5A5A17]
    find, _ = evaluate("MODE = 'find'\n" + IPC_AND_KEYS, [{"input": "", "output": "find False EPERM"}])
    assert find["passed"], find  # the next test's namespace does not have it


@requires_isolation
@real_process
def test_the_runtimes_secrets_are_out_of_reach(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither the runtime's environment nor files with hidden tests (this repository's fixtures, a
    workload) can be read by the program."""
    monkeypatch.setenv("ASYNCROLL_TEST_SECRET", "s3cr3t-token")
    program = f"""
import glob, os
leaks = [k for k, v in os.environ.items() if "s3cr3t" in v]
for path in [{str(ROW_1873_A)!r}, {str(Path(__file__).resolve())!r}, "/proc/1/root/{ROW_1873_A.name}"]:
    try:
        open(path).read()
        leaks.append(path)
    except OSError:
        pass
for path in glob.glob("/proc/*/environ"):
    try:
        if b"s3cr3t" in open(path, "rb").read():
            leaks.append(path)
    except OSError:
        pass
try:
    leaks += ["parent"] if b"s3cr3t" in open(f"/proc/{{os.getppid()}}/environ", "rb").read() else []
except OSError:
    pass
print(leaks)
"""
    result, _ = evaluate(program, [{"input": "", "output": "[]"}])
    assert result["passed"], result


@requires_isolation
@real_process
def test_writes_outside_the_private_directory_fail_or_vanish(tmp_path: Path) -> None:
    target = tmp_path / "escape.txt"
    shared_tmp = Path("/tmp") / f"asyncroll-escape-{os.getpid()}"
    repo_file = Path(__file__).parent / "escape.txt"
    program = f"""
results = []
for path in [{str(target)!r}, {str(repo_file)!r}, {str(shared_tmp)!r}, "../../escape.txt", "scratch.txt"]:
    try:
        with open(path, "w") as f:
            f.write("x")
        results.append("wrote")
    except OSError as exc:
        results.append(type(exc).__name__)
print(results)
"""
    result, _ = evaluate(program, [{"input": "", "output": "?"}])
    seen = json.loads(result["feedback"]["got"].replace("'", '"'))
    # Host paths do not exist in the program's private root; "/" is read-only to it; its /tmp is its own.
    assert seen == ["FileNotFoundError", "FileNotFoundError", "wrote", "PermissionError", "wrote"]
    assert not target.exists() and not repo_file.exists() and not shared_tmp.exists()


# --- through a real worker ---------------------------------------------------------------------------


@real_process
def test_a_worker_survives_a_hostile_program_and_keeps_evaluating() -> None:
    tests, func_name = fragment_3708()

    async def main(worker_pids: list[int]) -> None:
        worker = ProcessWorker(0, (ToolSpec("lcb_evaluate"),), startup_timeout=20)
        await worker.start()
        try:
            pid = worker.pid
            assert pid is not None
            worker_pids.append(pid)
            hostile = {"code": FORK_BOMB, "tests": ADD, "time_limit_s": 1.0}
            bomb = (await worker.call(JobRequest(1, "lcb_evaluate", hostile), timeout=30)).reply
            assert bomb.ok, bomb.error
            assert bomb.value["feedback"]["verdict"] == "time_limit_exceeded"
            good = {"code": ZIGZAG, "tests": tests, "func_name": func_name}
            after = (await worker.call(JobRequest(2, "lcb_evaluate", good), timeout=30)).reply
            assert after.ok and after.value["passed"] and after.value["tests_run"] == 2
            bad = (
                await worker.call(JobRequest(3, "lcb_evaluate", {"code": "x", "tests": []}), timeout=30)
            ).reply
            assert not bad.ok and "tests must be a non-empty list" in (bad.error or "")
            assert worker.alive and worker.pid == pid
            assert psutil.Process(pid).children(recursive=True) == []
        finally:
            await worker.aclose()

    since = time.time()
    worker_pids: list[int] = []
    asyncio.run(asyncio.wait_for(main(worker_pids), 50))
    assert leftovers(since, *worker_pids) == []


@requires_isolation
@real_process
def test_killing_a_worker_mid_evaluation_leaves_nothing_after_the_next_start() -> None:
    """The runtime's tool timeout kills the worker's tree; the sandbox dies with it, and the next
    sandbox to start removes the dead worker's empty per-test cgroups."""
    isolation.detect()  # probe now: a probe's own start-up would remove the stale groups checked below
    worker_pids: list[int] = []

    async def main() -> None:
        worker = ProcessWorker(0, (ToolSpec("lcb_evaluate"),), startup_timeout=20)
        await worker.start()
        assert worker.pid is not None
        worker_pids.append(worker.pid)
        warm = {"code": ADD_PROGRAM, "tests": ADD}  # the first call runs the isolation probe
        assert (await worker.call(JobRequest(1, "lcb_evaluate", warm), timeout=30)).reply.value["passed"]
        forever = {"code": "while True:\n    pass\n", "tests": ADD, "time_limit_s": 30.0}
        try:
            with pytest.raises(WorkerTimeout):
                await worker.call(JobRequest(2, "lcb_evaluate", forever), timeout=3.0)
        finally:
            await worker.kill()

    since = time.time()
    asyncio.run(asyncio.wait_for(main(), 40))
    deadline = time.monotonic() + 10
    while [x for x in leftovers(since) if not x.startswith("cgroup")] and time.monotonic() < deadline:
        time.sleep(0.05)  # the kernel tears the namespace down asynchronously after the kill
    assert [x for x in leftovers(since) if not x.startswith("cgroup")] == []
    stale = leftovers(since, *worker_pids)
    assert stale and all(x.startswith("cgroup") for x in stale)  # the killed worker could not clean up
    Sandbox(isolation.detect().config)  # a sandbox starting removes stale groups (cgroup v1 or v2)
    assert leftovers(since, *worker_pids) == []
    scratch = list(Path(tempfile.gettempdir()).glob(f"{scratch_prefix(worker_pids[0])}*"))
    assert len(scratch) == 1  # the killed worker's evaluation directory, with the program in it
    remove_stale_scratch()
    assert not scratch[0].exists()


@requires_isolation
@real_process
@pytest.mark.parametrize("program", [SETSID_ESCAPE, HOLDS_STDOUT], ids=["setsid", "stdout-holder"])
def test_without_namespaces_or_cgroups_the_subreaper_sweep_still_kills_escapees(
    program: str, tmp_path: Path
) -> None:
    """The last-resort layer alone (uid switch, rlimits, worker as child subreaper, psutil sweep): an
    escaped descendant is re-parented to this process and killed, and the read does not hang."""
    full = isolation.detect().config
    weak = Layers(python=full.python, uid=full.uid, gid=full.gid)
    scratch = tmp_path / "eval"
    scratch.mkdir(mode=0o711)
    code = scratch / "solution.py"
    code.write_text(program)
    since = time.time()
    began = time.monotonic()
    execution = Sandbox(weak).run(code, b"", scratch, wall_s=2.0)
    assert time.monotonic() - began < 2.0
    assert execution.done == {"kind": "done", "ok": True} and execution.stdout == b"3\n"
    assert leftovers(since) == []


@requires_isolation
@pytest.mark.timeout(150)
def test_a_run_passes_its_tool_timeout_so_a_slow_program_gets_a_verdict_not_a_killed_worker(
    tmp_path: Path,
) -> None:
    """``--tool-timeout 5`` caps the evaluator's total budget at 4 s: a program that would run its 6 s
    per-test limit gets a time-limit verdict and its repair turn; no worker is killed, nothing is left.
    (The 1 s margin is the design's; a loaded machine's sandbox overheads stay well inside it.)"""
    from tests.test_cli import cli

    problem = {
        "id": "spins",
        "prompt": "write a program",
        "tools": [{"name": "lcb_evaluate"}],
        "script": [
            {"type": "submit", "code": "while True:\n    pass\n", "latency_ms": 5},
            {"type": "submit", "code": ADD_PROGRAM, "latency_ms": 5},
        ],
        "metadata": {
            "reference_tests": ADD,
            "prompt_metadata": {"protocol": "one_repair", "max_generations": 2},
        },
    }
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps(problem) + "\n")
    out = tmp_path / "run"
    since = time.time()
    result = cli("run", "--workload", workload, "--output", out, "--tool-timeout", "5", timeout=120)
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert [e for e in events if e["event"] == "worker_restarting"] == []
    evaluations = [e for e in events if e["event"] == "cpu_finished" and e["kind"] == "evaluate"]
    assert [e["ok"] for e in evaluations] == [True, True] and evaluations[0]["roundtrip_s"] < 5.0
    (line,) = (out / "results.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert record["status"] == "completed", record
    assert record["passed"] is True and record["repair_attempted"] is True and record["generations"] == 2
    workers = [e["pid"] for e in events if e["event"] == "worker_ready"]
    deadline = time.monotonic() + 10
    while leftovers(since, *workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leftovers(since, *workers) == []


READS_EARLIER_INPUTS = """
found = 0
for run in range(1, 20000):
    try:
        with open(f"../input-{run}", "rb") as f:
            found += f.read().startswith(b"hidden-earlier-test")
    except OSError:
        pass
print(found)
"""


@requires_isolation
@real_process
def test_without_a_private_root_the_sandbox_uid_cannot_read_the_hidden_inputs_in_scratch() -> None:
    """Without the private root the work directory lies inside the evaluation's scratch directory (0711
    so the sandbox uid reaches it): every test's input file there was 0644, so a program read the
    hidden inputs of the earlier tests by name. The worker opens a test's stdin itself: they are 0600."""
    full = isolation.detect().config
    weak = Layers(python=full.python, uid=full.uid, gid=full.gid)
    scratch = Path(tempfile.mkdtemp(prefix="qa-scratch-"))
    try:
        scratch.chmod(0o711)
        code = scratch / "solution.py"
        sandbox = Sandbox(weak)
        code.write_text("print(input())\n")
        first = sandbox.run(code, b"hidden-earlier-test\n", scratch, wall_s=5.0)
        assert first.stdout == b"hidden-earlier-test\n"  # the program's own stdin still works
        code.write_text(READS_EARLIER_INPUTS)
        since = time.time()
        second = sandbox.run(code, b"", scratch, wall_s=10.0)
        assert second.done == {"kind": "done", "ok": True}, second
        assert second.stdout == b"0\n"
        assert leftovers(since) == []
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


SPENDS_CPU_THEN_FLOODS = """
import sys, time
while time.process_time() < 0.3:
    pass
sys.stdout.write("x" * 65536)
sys.stdout.flush()
time.sleep(1000)
"""


@requires_isolation
@real_process
def test_a_killed_programs_cpu_time_reaches_the_workers_account(tmp_path: Path) -> None:
    """A program still running when its test ends is killed before its harness: the init of a PID
    namespace reaps what still runs when it exits without adding that CPU time to its own, so a killed
    program's CPU time was missing from the worker's (the job's ``cpu_s``) in about 3 runs of 4. Here the
    program provably spends 0.3 s of CPU, then floods stdout past the cap and is killed alive."""
    scratch = tmp_path / "eval"
    scratch.mkdir(mode=0o700)
    code = scratch / "solution.py"
    code.write_text(SPENDS_CPU_THEN_FLOODS)
    sandbox = Sandbox(isolation.detect().config)
    since = time.time()
    for _ in range(5):
        before = os.times()
        execution = sandbox.run(code, b"", scratch, wall_s=30.0, limits=Limits(output_bytes=1024))
        after = os.times()
        assert execution.output_exceeded, execution
        counted = after.children_user + after.children_system - before.children_user - before.children_system
        assert counted >= 0.3, counted
    assert leftovers(since) == []


LEAVES_A_SPINNER = """
import os, time
r, w = os.pipe()
if os.fork() == 0:
    while time.process_time() < 0.3:
        pass
    os.write(w, b"spent")
    while True:
        pass
os.read(r, 5)
print(3)
"""


@requires_isolation
@real_process
def test_the_cpu_time_of_what_a_finished_program_left_running_reaches_the_workers_account(
    tmp_path: Path,
) -> None:
    """The program answers and exits, leaving a child that has spent 0.3 s of CPU still spinning: the
    harness kills and reaps it before it exits. (Left to the kernel's clean-up of the namespace, its CPU
    time was never counted.)"""
    scratch = tmp_path / "eval"
    scratch.mkdir(mode=0o700)
    code = scratch / "solution.py"
    code.write_text(LEAVES_A_SPINNER)
    sandbox = Sandbox(isolation.detect().config)
    since = time.time()
    for _ in range(3):  # the first run of a process was sometimes counted even so
        before = os.times()
        execution = sandbox.run(code, b"", scratch, wall_s=30.0)
        after = os.times()
        assert execution.done == {"kind": "done", "ok": True} and execution.stdout == b"3\n", execution
        counted = after.children_user + after.children_system - before.children_user - before.children_system
        assert counted >= 0.3, counted
    assert leftovers(since) == []


def test_stale_scratch_of_dead_processes_is_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    """An isolation probe's directory was named without its process (``asyncroll-probe-XXXX``), so one a
    kill left behind was never removed; it is named like an evaluation's now and removed the same way."""
    from asyncroll.evaluator.evaluate import SCRATCH_PREFIX
    from asyncroll.evaluator.isolation import PROBE_PREFIX

    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, timeout=30
    )
    dead = int(done.stdout)
    assert not Path(f"/proc/{dead}").exists()
    made = {
        name: tmp_path / name
        for prefix in (SCRATCH_PREFIX, PROBE_PREFIX)
        for name in (f"{prefix}{dead}-abc", f"{prefix}{os.getpid()}-abc")
    }
    for path in made.values():
        path.mkdir()
        (path / "solution.py").write_text("print(1)\n")
    remove_stale_scratch(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for n in made if str(os.getpid()) in n)
