"""Verdicts of stdin programs, with real programs and LiveCodeBench's comparison: passes, wrong answers,
runtime errors, exit codes, time limits and budgets, output caps."""

from __future__ import annotations

import re
import time

import pytest

from asyncroll.evaluator import compare, isolation
from asyncroll.evaluator.compare import compare_stdout, stripped_lines
from asyncroll.evaluator.evaluate import FIELD_LIMIT
from tests.evaluations import ADD, ADD_PROGRAM, SLACK_S, evaluate, real_1873_a, real_process, verdict

SHORT_SORT = """
t = int(input())
for _ in range(t):
    s = input().strip()
    wrong = sum(1 for x, y in zip(s, "abc") if x != y)
    print("YES" if wrong in (0, 2) else "NO")
"""


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


#: (program's stdout, expected output, LiveCodeBench's verdict), each run through nvidia-livecodebench 26.3's
#: ``check_correctness`` (``grade_stdio``: stripped lines, then ``Decimal`` tokens; no tolerance).
LCB_STDOUT_VERDICTS = [
    ("1 2   \n3\n\n\n", "1 2\n3\n", True),
    ("1\n2\n", "1\r\n2\r\n", True),
    ("1\r\n2\r\n", "1\n2", True),
    ("1\n", "1\n\n\n\n", True),
    ("1\n2\n", "1\n\n2\n", False),  # a blank line inside counts
    ("1\r2\n", "1\n2\n", False),  # a lone CR ends no line
    ("1.0\n", "1\n", True),
    ("0.3333333333333333\n", "0.333333333\n", False),
    ("", "", True),
    ("", "\n \n", True),
    ("", "0\n", False),
    ("a  b\n", "a b\n", False),  # words: the line must match as text
    ("1  2\n", "1 2\n", True),  # numbers: token by token
    ("1\t2\n", "1 2\n", True),
    ("NaN\n", "nan\n", False),
    ("inf\n", "Infinity\n", True),
    ("-0\n", "0\n", True),
    ("1_000\n", "1000\n", True),
    ("n? 5\n", "5\n", False),  # input()'s prompt goes to stdout in both
]


@pytest.mark.parametrize(("got", "expected", "passes"), LCB_STDOUT_VERDICTS)
def test_stdout_verdicts_match_livecodebench_run_on_the_same_texts(
    got: str, expected: str, passes: bool
) -> None:
    assert (compare_stdout(got, expected) is None) is passes


def test_lines_with_different_token_counts_differ_without_parsing_a_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Token lists of different lengths never compare equal: an 8 MiB line of numbers against a one-token
    answer once cost the worker seconds and hundreds of MiB parsing every token as a Decimal."""
    monkeypatch.setattr(compare, "_decimals", lambda tokens: pytest.fail("parsed numbers"))
    line = ("1 " * 100_000).strip()
    assert compare_stdout(line, "3") == f"line 1: {line[:200]!r} != '3'"


def test_a_mismatched_line_is_quoted_to_200_characters_on_each_side() -> None:
    """The reason for a wrong line quotes at most 200 characters of the program's line and of the expected
    one, whichever way it differs (token count or token values): feedback stays short whatever the test."""
    got, want = "a" * 300, "b" * 300
    assert compare_stdout(got, want) == f"line 1: {got[:200]!r} != {want[:200]!r}"  # same token count
    assert compare_stdout("1", f"2 {want}") == f"line 1: '1' != {f'2 {want}'[:200]!r}"  # different counts


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
    run; a 4 s tool timeout caps it at 3 s, so the verdict comes back before the worker would be killed.
    (The verdict names the budget: what ended the evaluation. Its wall time is bounded as any other
    evaluation's past its limit, by SLACK_S: 4 s, the sandbox's kill and clean-up in 1 s, failed under
    load, and 4 tests of ~0.45 s at a load of 5 leave little of the 3 s for a slower machine.)"""
    isolation.detect()
    tests = ADD * 16
    program = "import time\ntime.sleep(0.2)\n" + ADD_PROGRAM
    result, elapsed = evaluate(program, tests, time_limit_s=1.0, tool_timeout_s=4.0)
    assert verdict(result) == "time_limit_exceeded" and result["timed_out"] is True
    assert 1 <= result["tests_run"] < 16 and elapsed < 3.0 + SLACK_S
    error = result["feedback"]["error"]
    assert "the evaluation's total time budget of 3s" in error and "--tool-timeout of 4s" in error
    passed, _ = evaluate(program, tests[:1], time_limit_s=1.0, tool_timeout_s=4.0)
    assert passed["passed"] and passed["tests_run"] == 1


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
def test_annotations_are_evaluated_when_defined_as_in_livecodebench() -> None:
    """LiveCodeBench execs the program's text as it is, so an annotation naming a class defined further
    down fails with a NameError when its ``def`` runs: the harness's own ``from __future__ import
    annotations`` must not reach the program's ``compile``."""
    program = "def total(xs: list[Pair]) -> int:\n    return sum(xs)\n\nclass Pair:\n    pass\n\nprint(3)\n"
    result, _ = evaluate(program)
    assert verdict(result) == "runtime_error"
    assert "NameError: name 'Pair' is not defined" in result["feedback"]["error"]


@real_process
def test_big_integers_convert_to_and_from_text_up_to_livecodebench_s_digit_limit() -> None:
    """LiveCodeBench's metrics module raises Python's 4,300-digit limit on int ↔ str conversion to
    50,000 before its tests run, so ``int(input())`` of a 6,001-digit number and ``print`` of one pass
    there; here they were a runtime_error ("Exceeds the limit (4300 digits)")."""
    tests = [{"input": "1" + "0" * 6000 + "\n", "output": "1" + "0" * 6001 + "\n"}]
    result, _ = evaluate("print(10 * int(input()))\n", tests)
    assert result["passed"], result["feedback"]
    # 51,001 digits: CPython 3.12 and later check a long int's str() against the limit only roughly, and
    # print 10 ** 50000 (50,001 digits) there, as LiveCodeBench on such a Python would
    too_long, _ = evaluate("print(10 ** 51000)\n", [{"input": "", "output": "1"}])
    assert verdict(too_long) == "runtime_error"
    assert "Exceeds the limit (50000 digits)" in too_long["feedback"]["error"]
    functional = [{"input": "", "output": "6021", "testtype": "functional"}]
    program = "class Solution:\n    def f(self):\n        return len(str(2 ** 20000))\n"
    assert evaluate(program, functional, func_name="f")[0]["passed"]


@real_process
def test_the_budget_counts_from_the_callers_call_not_from_the_tests_arrival() -> None:
    """Carrying a million tests to the worker took ~4 s before the evaluator started (pickled on the
    runtime's event loop, then decoded): the budget, counted from the evaluator's own start, ran past the
    runtime's tool timeout, which killed the worker (the trajectory failed, 'ran past 20s') instead of a
    time_limit_exceeded verdict. The runtime passes ``called_at``; the budget counts from it."""
    # A 27 s budget (30 s tool timeout; a 25 s time limit scales past it) of which the tests' arrival took
    # 26.5 s: the loop gets the 0.5 s left (plus the sandbox's start and end: SLACK_S), not 25 s. (With a
    # 3 s budget and 0.5 s left, the bound of 2 s was within a loaded machine's start and clean-up.)
    called_at = time.monotonic() - 26.5
    result, elapsed = evaluate(
        "while True:\n    pass\n", time_limit_s=25.0, tool_timeout_s=30.0, called_at=called_at
    )
    assert verdict(result) == "time_limit_exceeded" and result["timed_out"] is True
    assert "the evaluation's total time budget of 27s" in result["feedback"]["error"], result["feedback"]
    assert elapsed < 0.5 + SLACK_S < 25.0, elapsed


@real_process
def test_blank_input_lines_of_a_functional_test_are_skipped() -> None:
    """evaluate.py's list of differences from LiveCodeBench: a functional test's blank input lines (a
    trailing newline, an empty line between arguments) are skipped, each other line being one argument
    (LiveCodeBench reads a blank line as JSON and errs)."""
    tests = [{"input": "1\n\n2\n", "output": "3", "testtype": "functional"}]
    program = "class Solution:\n    def f(self, a, b):\n        return a + b\n"
    result, _ = evaluate(program, tests, func_name="f")
    assert result["passed"], result["feedback"]
