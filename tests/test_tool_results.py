"""A tool's result or exception as a worker sends it back, checked in this process (no worker needed):
``to_jsonable`` and the worker's own ``run_job`` make JSON the model can read, cut in the worker and
bounded when a result holds itself or shared parts; whatever the tool raises is a tool error."""

from __future__ import annotations

import enum
import io
import json
import math
import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from asyncroll.workers import JobReply, JobRequest, child, results
from asyncroll.workers.child import run_job
from asyncroll.workers.protocol import decode, encode
from asyncroll.workers.results import to_jsonable


def test_to_jsonable_converts_python_and_numpy_like_values() -> None:
    class Array:
        def tolist(self) -> list[int]:
            return [1, 2]

    class Scalar:
        def item(self) -> float:
            return 0.5

    value = {"t": (1, (2, 3)), "s": {3, 1, 2}, 5: "int key", (1, 2): "tuple key", "a": Array(), "x": Scalar()}
    assert to_jsonable(value) == {
        "t": [1, [2, 3]],
        "s": [1, 2, 3],
        5: "int key",
        "(1, 2)": "tuple key",
        "a": [1, 2],
        "x": 0.5,
    }
    assert to_jsonable(True) is True
    assert to_jsonable({1, "a"}) == ["a", 1]  # unorderable: sorted by repr
    assert to_jsonable(b"\x00").startswith("b'")
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    assert isinstance(to_jsonable(cyclic), list)


def test_keys_that_json_would_write_as_one_string_stay_apart() -> None:
    """``{1: "a", "1": "b"}`` is two keys in Python but one in JSON: a reader of the observation or of
    results.jsonl would keep only the last. The str key stays; each other one says its type."""
    value = {1: "int", "1": "str", None: "none", "null": "str", 1.5: "float", "x": {True: "b", "true": "s"}}
    assert to_jsonable(value) == {
        "1 (int)": "int",
        "1": "str",
        "null (NoneType)": "none",
        "null": "str",
        1.5: "float",
        "x": {"true (bool)": "b", "true": "s"},
    }
    assert to_jsonable({1: "a", 2: "b"}) == {1: "a", 2: "b"}  # no collision: ints stay ints
    big = 10**5000
    assert to_jsonable({big: "a", "1": "b"}) == {big: "a", "1": "b"}


def test_a_renamed_key_never_takes_the_place_of_another() -> None:
    """The renaming itself keeps every key: a str key already spelt ``"1 (int)"``, a tuple key beside
    the str its repr is, two NaN keys (which Python keeps apart and JSON would write as one)."""
    assert to_jsonable({1: "a", "1": "b", "1 (int)": "c"}) == {"1 (int #2)": "a", "1": "b", "1 (int)": "c"}
    assert to_jsonable({(1, 2): "t", "(1, 2)": "s"}) == {"(1, 2) (tuple)": "t", "(1, 2)": "s"}
    nans = to_jsonable({float("nan"): "a", float("nan"): "b", "NaN": "c"})
    assert nans == {"NaN (float)": "a", "NaN (float #2)": "b", "NaN": "c"}


def test_non_finite_floats_become_strings_and_reprs_lose_memory_addresses() -> None:
    """An observation is JSON the model can read, and the same result reads the same in every run."""

    class Float(float):  # numpy.float64 is a float subclass
        pass

    value = {
        "nan": math.nan,
        "inf": [math.inf, -math.inf],
        "sub": Float("nan"),
        math.inf: 1.5,
        "obj": object(),
    }
    converted = to_jsonable(value)
    assert converted == {
        "nan": "NaN",
        "inf": ["Infinity", "-Infinity"],
        "sub": "NaN",
        "Infinity": 1.5,
        "obj": "<object object>",
    }
    json.dumps(converted, allow_nan=False)  # valid JSON: raises on a bare NaN
    assert to_jsonable(run_job) == "<function run_job>"
    # a key that is no JSON scalar is written as its text, an object's address left out there too
    keys = to_jsonable({(1, run_job): 1, frozenset([run_job]): 2})
    assert keys == {"(1, <function run_job>)": 1, "frozenset({<function run_job>})": 2}


def test_a_subclass_becomes_its_base_value_whatever_it_overrides() -> None:
    """docs/TOOLS.md: a subclass of str/int/float is sent as its base value; ``str()``/``float()``
    called the subclass's own overrides (an Enum's str is its name)."""

    class Colour(str, enum.Enum):  # noqa: UP042 - a plain Enum's str() is its name, the case at hand
        RED = "red"

    class Odd(float):
        def __float__(self) -> float:
            return 9.5

    class Level(enum.IntEnum):
        HIGH = 3

    assert to_jsonable([Colour.RED, Odd(1.5), Level.HIGH]) == ["red", 1.5, 3]
    assert [type(v) for v in to_jsonable([Colour.RED, Odd(1.5), Level.HIGH])] == [str, float, int]


def _in_process(function: Any, observation_chars: int | None = None, **arguments: Any) -> JobReply:
    """One job through the worker's own ``run_job``, in this process (no worker needed)."""
    request = JobRequest(1, "t", arguments, observation_chars=observation_chars)
    reply = decode(run_job({"t": function}, encode(request)[4:])[4:])
    assert isinstance(reply, JobReply)
    return reply


@pytest.mark.timeout(10)
def test_a_result_that_holds_itself_or_a_huge_int_reaches_the_model() -> None:
    """docs/TOOLS.md: a container met again inside itself reads as its repr does (``[...]``, ``{...}``)
    — following a parent pointer from each of a tree's nodes made 2^64 steps, until the tool timeout
    killed the worker for a result the tool had returned at once; an int longer than Python's
    4,300-digit limit is a JSON number (it failed the call: ``ValueError: Exceeds the limit``); a result
    that still cannot be encoded fails the call saying so, not as if the tool had raised."""
    root: dict[str, Any] = {"name": "root", "children": []}
    root["children"] += [{"name": i, "parent": root} for i in range(2)]
    assert to_jsonable(root) == {"name": "root", "children": [{"name": i, "parent": "{...}"} for i in (0, 1)]}
    twice: list[Any] = []
    twice += [twice, (twice,)]
    assert to_jsonable(twice) == ["[...]", ["[...]"]]
    shared = [1]
    assert to_jsonable([shared, {"s": shared}]) == [[1], {"s": [1]}]  # met twice, but not inside itself
    reply = _in_process(lambda: {"n": 10**5000, 10**4400: 1}, observation_chars=20_000)
    text = '{"n": 1' + "0" * 5000 + ', "1' + "0" * 4400 + '": 1}'
    assert reply.ok and reply.value == (text, len(text))
    assert sys.get_int_max_str_digits() == 4300  # lifted only while the result was written

    class Broken(dict[str, int]):
        def items(self) -> Any:
            raise RuntimeError("no items")

    reply = _in_process(lambda: Broken(a=1), observation_chars=100)
    assert (reply.ok, reply.error) == (False, "its result could not be encoded: RuntimeError: no items")


def test_an_observation_writes_characters_as_themselves() -> None:
    """The model reads "café", "日本語", not "caf\\u00e9" (six characters, several tokens, per letter);
    a lone surrogate (a file name decoded with surrogateescape) keeps its JSON escape, since no UTF-8
    request can carry it, and the text still reads back as the result."""
    result = {"name": "café", "jp": "日本語", "emoji": "\U0001f600", "file": "x\udcffy"}
    reply = _in_process(lambda: result, observation_chars=1_000)
    assert reply.ok
    text, chars = reply.value
    assert '"name": "café", "jp": "日本語", "emoji": "\U0001f600"' in text
    assert '"file": "x\\udcffy"' in text and chars == len(text)
    text.encode()  # sendable as UTF-8
    assert json.loads(text) == result
    assert _in_process(lambda: "日本語" * 10, observation_chars=4).value == ('"日本語', 32)


@pytest.mark.timeout(10)
def test_a_result_whose_shared_parts_multiply_fails_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """A list holding one list twice, 60 levels down, is 2^60 values once written out: converting it
    ran until the tool timeout, growing the worker's memory by gigabytes a second. Values written out
    again (a container met in several places) are bounded; distinct containers are not, and a shared
    part within the bound is written out in each place, as ``json.dumps`` writes it."""
    monkeypatch.setattr(results, "MAX_REPEATED", 1_000)
    doubling: list[Any] = [0]
    for _ in range(60):
        doubling = [doubling, doubling]
    reply = _in_process(lambda: doubling, observation_chars=100)
    assert not reply.ok and reply.error is not None
    assert reply.error.startswith("its result could not be encoded: ResultTooLarge: containers it holds")
    assert "more than 1,000 values written again" in reply.error
    row = list(range(10))
    assert to_jsonable([row] * 100) == [row] * 100  # 990 values written again: within the bound
    with pytest.raises(results.ResultTooLarge):
        to_jsonable([row] * 102)
    distinct = [[i, i] for i in range(5_000)]  # 10,000 values, none written twice
    assert to_jsonable(distinct) == distinct


def test_a_result_nested_past_64_levels_is_cut_there_to_a_repr() -> None:
    """TOOLS.md: "Nesting deeper than 64 levels is cut to a repr"; 65 levels were kept."""

    def nested(levels: int) -> Any:
        value: Any = 0
        for _ in range(levels):
            value = [value]
        return value

    assert to_jsonable(nested(results.MAX_DEPTH)) == nested(results.MAX_DEPTH)  # 64 levels: kept whole
    cut = to_jsonable(nested(results.MAX_DEPTH + 1))
    for _ in range(results.MAX_DEPTH):
        cut = cut[0]
    assert cut == "[0]"  # the 65th level, as its repr


def test_whatever_a_tool_raises_is_a_tool_error() -> None:
    class Custom(BaseException):
        pass

    def interrupt() -> None:
        raise KeyboardInterrupt

    def leave() -> None:
        sys.exit(3)

    def custom() -> None:
        raise Custom("mine")

    try:
        assert _in_process(interrupt).error == "KeyboardInterrupt"
    except KeyboardInterrupt:  # would end the pytest session: report it as what it is
        pytest.fail("a KeyboardInterrupt raised by a tool escaped run_job: it would kill the worker")
    assert _in_process(leave).error == "SystemExit: 3"
    assert _in_process(custom).error == "Custom: mine"

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise ValueError("bad __str__")

    def broken() -> None:
        raise Unprintable

    assert _in_process(broken).error == "Unprintable: <unprintable>"  # it escaped run_job: a dead worker

    def undecodable() -> None:
        raise FileNotFoundError("no file " + b"caf\xff".decode("utf-8", "surrogateescape"))

    # a lone surrogate is written as its escape: no UTF-8 write takes one (events.jsonl, the request that
    # shows it to the model under --tool-errors observe), and it failed the whole run
    assert _in_process(undecodable).error == "FileNotFoundError: no file caf\\udcff"
    assert _in_process(lambda x: -x, x=2).value == -2


def test_a_base_exception_from_the_tools_own_objects_is_a_tool_error() -> None:
    """An exception whose ``__str__``, or a result whose ``__repr__``, raises ``SystemExit`` or
    ``KeyboardInterrupt`` is still the tool's code: it escaped ``run_job`` and killed the worker (its job
    lost as 'closed its reply pipe', the worker replaced) instead of failing that one call."""

    armed = True  # off before pytest reports a failure: its report reprs the test's locals too

    class Leaving:
        def __repr__(self) -> str:
            if armed:
                raise SystemExit("repr exits")
            return "Leaving()"

    class Interrupting(Exception):
        def __str__(self) -> str:
            if armed:
                raise KeyboardInterrupt
            return "interrupting"

    def interrupting() -> None:
        raise Interrupting

    try:
        left = _in_process(Leaving)
        interrupted = _in_process(interrupting)
    except (SystemExit, KeyboardInterrupt) as exc:  # would end the pytest session: say what it means
        armed = False
        pytest.fail(f"{type(exc).__name__} from the tool's own object escaped run_job: a dead worker")
    assert not left.ok and left.error == "its result could not be encoded: SystemExit: repr exits"
    assert not interrupted.ok and interrupted.error == "Interrupting: <unprintable>"


def test_a_result_the_model_reads_is_encoded_and_cut_in_the_worker() -> None:
    """A tool job marked ``observation_chars`` gets back its result's JSON text cut to that many
    characters and the text's whole length: a 20 MB result never crosses the pipe, and the runtime's
    event loop never encodes it. Unmarked jobs (grading, evaluation, direct calls) get the value."""
    request = JobRequest(1, "t", {"n": 20_000_000}, observation_chars=10)
    frame_bytes = run_job({"t": lambda n: "x" * n}, encode(request)[4:])
    reply = decode(frame_bytes[4:])
    assert isinstance(reply, JobReply) and reply.ok
    assert reply.value == ('"' + "x" * 9, 20_000_002)
    assert len(frame_bytes) < 1_000
    nested = JobRequest(2, "t", {}, observation_chars=1_000)
    reply = decode(run_job({"t": lambda: {1: float("nan"), "p": Path("/a")}}, encode(nested)[4:])[4:])
    assert isinstance(reply, JobReply) and reply.value == ('{"1": "NaN", "p": "PosixPath(\'/a\')"}', 36)
    assert _in_process(lambda: "x" * 5).value == "xxxxx"


def test_a_sigint_the_worker_received_still_ends_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a KeyboardInterrupt a tool raised itself is a tool error; the worker's SIGINT handler marks a
    real one, which propagates as before (the worker then dies by SIGINT)."""

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(child, "_sigint_received", True)
    with pytest.raises(KeyboardInterrupt):
        _in_process(interrupted)


def test_a_tool_that_returns_a_coroutine_generator_or_awaitable_fails() -> None:
    """Nothing would run their body: never a success whose observation is ``<coroutine object ...>``."""
    ran: list[str] = []

    async def fetch() -> int:
        ran.append("fetch")
        return 1

    def numbers() -> Generator[int, None, None]:
        ran.append("numbers")
        yield 1

    class Later:
        def __await__(self) -> Generator[None, None, int]:
            yield None
            return 1

    for tool, what in ((fetch, "a coroutine"), (numbers, "a generator"), (Later, "an awaitable Later")):
        reply = _in_process(tool)
        assert (reply.ok, reply.value) == (False, None)
        assert reply.error is not None and reply.error.startswith(f"TypeError: the tool returned {what}")
    assert ran == []


def test_a_tool_that_returns_an_iterator_fails_where_an_array_with_tolist_does_not() -> None:
    """``return map(str, xs)`` was a success whose observation read ``"<map object>"``: nothing of the
    items. An iterator's items are not read for it (``itertools.count`` has no end)."""
    import itertools
    import re

    class Array:  # an iterator with tolist (numpy's flatiter has none: it is refused), converted by it
        def __iter__(self) -> Array:
            return self

        def __next__(self) -> int:
            raise StopIteration

        def tolist(self) -> list[int]:
            return [1, 2]

    iterators = {
        "map": lambda: map(str, [1, 2]),
        "zip": lambda: zip([1], [2], strict=True),
        "list_reverseiterator": lambda: reversed([1, 2]),
        "count": itertools.count,
        "callable_iterator": lambda: re.finditer("a", "aa"),
    }
    for name, tool in iterators.items():
        reply = _in_process(tool)
        assert (reply.ok, reply.value) == (False, None)
        assert reply.error == (
            f"TypeError: the tool returned an iterator ({name}), whose items a worker does not read (it "
            "could have no end): return them as a list, e.g. list(...)"
        )
    assert _in_process(Array).value == [1, 2]
    # a stream (StringIO, an open file) is an iterator of its lines: the way out is its contents
    stream = _in_process(lambda: io.StringIO("a\nb"))
    assert (stream.ok, stream.error) == (
        False,
        "TypeError: the tool returned an iterator (StringIO), whose items a worker does not read (it "
        "could have no end): return what it holds, e.g. .read() or .getvalue()",
    )

    class Rows(list[int]):  # a list, and an iterator too: the docs' table reads it as a list
        def __next__(self) -> int:
            raise StopIteration

    class Scalar:  # with .item() only: its item, as the table says
        def __iter__(self) -> Scalar:
            return self

        def __next__(self) -> int:
            raise StopIteration

        def item(self) -> int:
            return 3

    assert _in_process(lambda: Rows([1, 2])).value == [1, 2]
    assert _in_process(Scalar).value == 3
    assert _in_process(lambda: {"a": 1}.keys()).value == "dict_keys(['a'])"  # an iterable: its repr


def test_a_tool_that_met_a_full_disk_on_a_write_naming_no_file_is_told_its_prints_need_room() -> None:
    """A tool printing to a worker log at a full disk or a file size limit failed with a bare
    "OSError: [Errno 27] File too large", nothing saying the write was its print to the run's log."""
    import errno

    def prints() -> None:
        raise OSError(errno.EFBIG, "File too large")

    def opens() -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "/data/out.bin")

    said = _in_process(prints).error
    assert said == (
        "OSError: [Errno 27] File too large (no room for a write that names no file: the tool's prints go "
        "to the run's workers/ log)"
    )
    assert _in_process(opens).error == "OSError: [Errno 28] No space left on device: '/data/out.bin'"
