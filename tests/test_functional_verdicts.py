"""Verdicts of functional (call-based) problems: ``Solution().<func_name>`` or the module's function
called with JSON arguments, results compared as LiveCodeBench's ``==`` does, values JSON cannot hold."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.evaluations import ADD_PROGRAM, ZIGZAG, evaluate, fragment_3708, real_process, verdict
from tests.hostile_programs import STATUS_FD


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
def test_ints_of_up_to_50000_digits_pass_as_arguments_expected_and_returned_values() -> None:
    """LiveCodeBench reads a functional test's lines and compares the returned value under its raised
    digit limit (50,000), so a test with a 5,001-digit argument or expected value runs there. Here the
    evaluator refused such a test ("Exceeds the limit (4300 digits)") and a program returning such an int
    was told it could never match."""
    big = "1" + "0" * 5000
    tests = [{"input": f"{big}\n2", "output": "2" + "0" * 5000, "testtype": "functional"}]
    program = "class Solution:\n    def f(self, a, b):\n        return a * b\n"
    result, _ = evaluate(program, tests, func_name="f")
    assert result["passed"], result["feedback"]
    result, _ = evaluate(program.replace("a * b", "a * b + 1"), tests, func_name="f")
    assert verdict(result) == "wrong_answer", result
    assert result["feedback"]["detail"] == "returned value differs from the expected value"
    assert result["feedback"]["got"].startswith("2000")


@real_process
@pytest.mark.parametrize("returned", ["10 ** 50000", "[1, {'k': 10 ** 50000}]"])
def test_an_int_too_long_for_json_is_a_wrong_answer_not_a_lost_report(returned: str) -> None:
    """An int of more than 50,000 digits (LiveCodeBench's limit on int <-> str conversion) cannot be
    written as text (nor as JSON): the expected value, read as JSON, cannot hold one, so LiveCodeBench's
    ``==`` is false. It was a runtime_error 'exited with status 0 before finishing normally': the report
    failed to encode and was lost."""
    tests = [{"input": "", "output": "1", "testtype": "functional"}]
    program = f"class Solution:\n    def f(self):\n        return {returned}\n"
    result, _ = evaluate(program, tests, func_name="f")
    assert verdict(result) == "wrong_answer", result
    assert "an int too long for JSON" in result["feedback"]["detail"]
    kind = "int" if returned.startswith("10") else "list"
    assert result["feedback"]["got"].startswith(f"<{kind} that cannot be shown: ")  # was "<a int …"


@real_process
def test_an_object_returned_is_shown_without_its_memory_address() -> None:
    """The feedback (and the transcript, and the repair message the model reads) held the object's
    address, ``<tmp_sol.Solution object at 0x7f…>``: a different text in every run of one program."""
    tests = [{"input": "", "output": "1", "testtype": "functional"}]
    program = "class Solution:\n    def f(self):\n        return [self, object()]\n"
    result, _ = evaluate(program, tests, func_name="f")
    assert verdict(result) == "wrong_answer", result
    assert result["feedback"]["got"] == "[<tmp_sol.Solution object>, <object object>]"


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


def _returning(head: str, returned: str, output: str, passes: bool) -> dict[str, Any]:
    """A functional test of ``Solution().f()`` returning ``returned`` (after ``head``) against ``output``:
    passed as ``passes`` says, a wrong answer otherwise; the evaluation's result."""
    program = f"{head}class Solution:\n    def f(self):\n        return {returned}\n"
    tests = [{"input": "", "output": output, "testtype": "functional"}]
    result, _ = evaluate(program, tests, func_name="f")
    assert result["passed"] is passes, result["feedback"]
    if not passes:
        assert verdict(result) == "wrong_answer"
    return result


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
    result = _returning("class L(list):\n    pass\n\nclass S(str):\n    pass\n\n", returned, output, passes)
    if not passes:
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


@real_process
def test_the_prelude_binds_the_module_names_livecodebench_binds_and_not_typing() -> None:
    """LiveCodeBench's import header runs ``from typing import *`` but never ``import typing``: a solution
    that names ``typing.List`` without importing it fails there with a NameError, so it must here."""
    tests = [{"input": "[1, 1, 2]", "output": "2", "testtype": "functional"}]
    program = (
        "class Solution:\n    def kinds(self, xs: {}) -> int:\n        return len(collections.Counter(xs))\n"
    )
    assert evaluate(program.format("List[int]"), tests, func_name="kinds")[0]["passed"]
    result, _ = evaluate(program.format("typing.List[int]"), tests, func_name="kinds")
    assert verdict(result) == "runtime_error"
    assert "NameError: name 'typing' is not defined" in result["feedback"]["error"]


@real_process
def test_what_a_functional_solution_prints_does_not_count() -> None:
    """LiveCodeBench judges a call-based solution by its return value alone and never reads its stdout:
    debugging prints past the stdout cap (8 MiB) must not turn a right answer into a verdict."""
    tests = [{"input": "[1, 1, 2]", "output": "3", "testtype": "functional"}]
    program = "class Solution:\n    def size(self, xs):\n        print('x' * (9 << 20))\n        return 3\n"
    result, _ = evaluate(program, tests, func_name="size")
    assert result["passed"], result


#: (returned expression, expected output, LiveCodeBench's verdict): run through nvidia-livecodebench 26.3's
#: ``check_correctness`` (``lcb_runner/evaluation/testing_util.py``), which compares with a bare ``==``.
STDLIB_NUMBERS_AND_USER_TYPES = [
    ("Fraction(6, 2)", "3", True),
    ("Fraction(1, 2)", "0.5", True),
    ("Fraction(1, 1)", "true", True),
    ("Fraction(1, 3)", "0.3333333333333333", False),
    ("[Fraction(1, 2), Fraction(4, 2)]", "[0.5, 2]", True),
    ("Decimal('2.50')", "2.5", True),
    ("Decimal(7)", "7", True),
    ("Decimal('0.1')", "0.1", False),
    ("Decimal('Infinity')", "Infinity", True),
    ("Decimal('NaN')", "NaN", False),
    ("complex(3, 0)", "3", True),
    ("complex(3, 1)", "3", False),
    ("UserList([1, 2])", "[1, 2]", True),
    ("UserDict({'a': 1})", '{"a": 1}', True),
    ("UserString('ab')", '"ab"', True),
    ("deque([1])", "[1]", False),
]


@real_process
@pytest.mark.parametrize(("returned", "output", "passes"), STDLIB_NUMBERS_AND_USER_TYPES)
def test_stdlib_numbers_and_user_containers_compare_as_livecodebench_compares_them(
    returned: str, output: str, passes: bool
) -> None:
    """LiveCodeBench's ``==`` accepts a ``Fraction``, ``Decimal`` or ``complex`` equal to the expected int or
    float, and a ``UserList``, ``UserDict`` or ``UserString`` holding the expected value. Here every one was
    judged 'can never equal a JSON value': a LeetCode solution computing with ``fractions`` failed."""
    _returning("from fractions import Fraction\nfrom decimal import Decimal\n", returned, output, passes)


def test_a_number_is_sent_as_the_int_or_float_it_equals_exactly() -> None:
    import fractions
    from decimal import Decimal

    from asyncroll.evaluator.harness import _plain

    for value, plain in [
        (fractions.Fraction(10**30, 1), 10**30),
        (Decimal("-0.25"), -0.25),
        (1.5 + 0j, 1.5),
        (Decimal("1e400"), 10**400),
    ]:
        sent = _plain(value)
        assert sent == plain and type(sent) is type(plain), (value, sent)
    for never in (fractions.Fraction(1, 3), Decimal("sNaN"), Decimal("NaN"), 1j):
        with pytest.raises(TypeError):
            _plain(never)


#: A ``numbers.Number`` the program registered, whose own ``==`` LiveCodeBench 26.3 called (every one of these
#: passed there against ``3``), but whose ``.real``, ``__int__`` or ``__float__`` fails or is missing.
BROKEN_NUMBERS = {
    "no .real": "numbers.Number.register(N)\n",
    ".real raises": "N.real = property(lambda self: {}['real'])\nnumbers.Number.register(N)\n",
    "__int__ raises": "N.real = property(lambda self: self)\nN.__int__ = N.__float__ = lambda self: {}[0]\n"
    "numbers.Number.register(N)\n",
}


@real_process
@pytest.mark.parametrize("setup", BROKEN_NUMBERS.values(), ids=list(BROKEN_NUMBERS))
def test_a_number_whose_own_conversions_fail_is_judged_wrong_not_a_runtime_error(setup: str) -> None:
    """Such a value cannot be sent as an int or a float, so it is judged wrong like any object. Here the
    harness's own ``value.real`` (or ``int()``) raised in the program's process: a ``runtime_error`` whose
    traceback (``'N' object has no attribute 'real'``) was none of the program's doing."""
    program = (
        "import numbers\nclass N:\n    def __eq__(self, other):\n        return other == 3\n"
        "    __hash__ = None\n"
        f"{setup}class Solution:\n    def f(self, x):\n        return N()\n"
    )
    tests = [{"input": "0", "output": "3", "testtype": "functional"}]
    result, _ = evaluate(program, tests, func_name="f")
    assert verdict(result) == "wrong_answer", result["feedback"]
    assert "N object" in result["feedback"]["got"]


@real_process
def test_a_decimal_past_the_digit_limit_is_judged_wrong_at_once_not_converted_until_the_time_limit() -> None:
    """No expected value holds an int past 50,000 digits, and LiveCodeBench's ``==`` says so at once. Here
    ``int(Decimal('1e1000000'))`` ran first (34 s on the reviewer's machine): a time-limit verdict."""
    program = "from decimal import Decimal\nclass Solution:\n    def f(self, x):\n"
    program += "        return Decimal('1e1000000')\n"
    tests = [{"input": "0", "output": "1", "testtype": "functional"}]
    result, _ = evaluate(program, tests, func_name="f", time_limit_s=3)
    assert verdict(result) == "wrong_answer", result["feedback"]
    assert result["feedback"]["got"] == "Decimal('1E+1000000')"


def test_numpy_scalars_are_sent_as_the_plain_value_they_equal() -> None:
    """numpy registers its ints, floats and complexes as ``numbers`` types, not its ``bool_``: on a sandbox
    interpreter with numpy, ``np.True_`` (which LiveCodeBench's ``==`` finds equal to ``true`` and to 1) was
    'can never equal a JSON value', a wrong answer."""
    np = pytest.importorskip("numpy")
    from asyncroll.evaluator.compare import compare_value, parse_expected
    from asyncroll.evaluator.harness import _plain

    for value, expected in [(np.True_, "true"), (np.False_, "false"), (np.True_, "1"), (np.int64(3), "3")]:
        assert value == json.loads(expected)  # LiveCodeBench's verdict: a pass
        assert compare_value(json.loads(json.dumps(_plain(value))), parse_expected(expected)) is None, value
    assert _plain([np.float32(0.5), np.complex128(2)]) == [0.5, 2]
    with pytest.raises(TypeError):
        _plain(np.array([1, 2]))  # no plain value: an array's == is elementwise
