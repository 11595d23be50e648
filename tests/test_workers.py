"""Tool workers with real processes: handshake, jobs, state, errors, timeouts, deaths and tree kills."""

from __future__ import annotations

import asyncio
import enum
import gc
import json
import math
import os
import pickle
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Coroutine, Generator
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from asyncroll.errors import WorkerDied, WorkerStartupError, WorkerTimeout
from asyncroll.workers import (
    JobReply,
    JobRequest,
    ProcessWorker,
    ProtocolError,
    Ready,
    StartupFailed,
    ToolSpec,
    child,
    results,
)
from asyncroll.workers.child import run_job
from asyncroll.workers.protocol import Message, decode, encode, frame
from asyncroll.workers.results import to_jsonable

T = TypeVar("T")
TOOLS = Path(__file__).parent / "fixtures" / "tools"
COUNTER = TOOLS / "counter.py"
real_process = pytest.mark.timeout(30)


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run one test coroutine under a hard deadline (the worker tests must never hang)."""

    async def bounded() -> T:
        async with asyncio.timeout(20):
            return await main

    return asyncio.run(bounded())


def gone(pid: int, within: float = 5.0) -> bool:
    """True once ``pid`` no longer runs (a zombie awaiting its reaper counts as gone)."""
    deadline = time.monotonic() + within
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


async def started(*tools: ToolSpec, **kwargs: Any) -> ProcessWorker:
    worker = ProcessWorker(0, tools or (ToolSpec("add"),), startup_timeout=10, **kwargs)
    await worker.start()
    return worker


def job(job_id: int, tool: str, **arguments: Any) -> JobRequest:
    return JobRequest(job_id, tool, arguments)


# --- protocol and conversion (no process) -------------------------------------------------------------


def test_messages_round_trip_through_frames() -> None:
    messages: list[Message] = [
        JobRequest(7, "add", {"a": 1, "b": 2.5}),
        JobReply(7, True, {"x": [1, 2], 3: None}, None, 1.0, 2.0, 1.0, 0.5, 1e-5),
        Ready(123, ["add", "/x.py::f"], 0.25),
        StartupFailed("boom"),
    ]
    for message in messages:
        data = encode(message)
        assert int.from_bytes(data[:4], "big") == len(data) - 4
        assert decode(data[4:]) == message


def test_decode_refuses_globals_and_garbage() -> None:
    with pytest.raises(ProtocolError, match="global"):
        decode(pickle.dumps(("reply", Path("/etc"))))
    with pytest.raises(ProtocolError):
        decode(b"not a pickle")
    with pytest.raises(ProtocolError, match="fields"):
        decode(frame(pickle.dumps(("failed", "a", "b")))[4:])


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


def test_child_module_imports_stay_light() -> None:
    code = (
        "import sys, asyncroll.workers.child; "
        "print(sorted(m for m in ('asyncio', 'psutil', 'pydantic', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30)
    assert out.stdout.strip() == "[]"


# --- real worker processes -----------------------------------------------------------------------------


@real_process
def test_ready_handshake_ping_and_polite_close() -> None:
    async def main() -> None:
        worker = await started()
        assert worker.alive and worker.pid is not None and worker.returncode is None
        assert worker.startup_s is not None and worker.startup_s > 0
        assert worker.preload_s is not None and worker.preload_s >= 0
        result = await worker.call(job(1, "__ping__"), timeout=5)
        assert result.reply.ok and result.reply.value == worker.pid
        await worker.aclose()
        assert worker.returncode == 0 and not worker.alive
        assert gone(worker.pid)
        await worker.kill()  # idempotent

    run(main())


@real_process
def test_add_returns_value_and_timings_on_the_shared_clock() -> None:
    async def main() -> None:
        worker = await started()
        result = await worker.call(job(5, "add", a=2, b=3), timeout=5)
        reply = result.reply
        assert (reply.job_id, reply.ok, reply.value, reply.error) == (5, True, 5, None)
        assert result.sent <= reply.started <= reply.finished <= result.received
        assert reply.execute_s == pytest.approx(reply.finished - reply.started)
        assert reply.cpu_s >= 0 and reply.serialize_s > 0
        assert 0 < result.round_trip_s < 5
        await worker.aclose()

    run(main())


@real_process
def test_module_state_persists_and_pid_is_stable_across_jobs() -> None:
    async def main() -> None:
        worker = await started(
            ToolSpec("count", COUNTER),
            ToolSpec("pid", COUNTER),
            ToolSpec("hypotenuse", TOOLS / "toolmath_style.py"),
            ToolSpec("circle_area", TOOLS / "toolmath_style.py"),
        )
        for expected in range(1, 51):
            assert (await worker.call(job(expected, "count"), 5)).reply.value == expected
            assert (await worker.call(job(expected, "pid"), 5)).reply.value == worker.pid
        assert (await worker.call(job(99, "hypotenuse", a=3, b=4), 5)).reply.value == 5.0
        assert (await worker.call(job(100, "circle_area", r=1.0), 5)).reply.value == pytest.approx(3.14159265)
        # The key form always works, too.
        assert (await worker.call(job(101, ToolSpec("count", COUNTER).key), 5)).reply.value == 51
        await worker.aclose()

    run(main())


@real_process
def test_same_name_in_two_files_is_served_by_key_only() -> None:
    mine, other = ToolSpec("count", COUNTER), ToolSpec("count", TOOLS / "other_counter.py")

    async def main() -> None:
        worker = await started(mine, other, ToolSpec("add"))
        assert (await worker.call(job(1, mine.key), 5)).reply.value == 1
        assert (await worker.call(job(2, other.key), 5)).reply.value == "other"
        ambiguous = (await worker.call(job(3, "count"), 5)).reply
        assert not ambiguous.ok and ambiguous.error is not None and "ambiguous" in ambiguous.error
        await worker.aclose()

    run(main())


@real_process
def test_tool_exception_is_a_reply_and_the_worker_keeps_serving() -> None:
    async def main() -> None:
        worker = await started(
            ToolSpec("fail", COUNTER), ToolSpec("count", COUNTER), ToolSpec("shapes", COUNTER)
        )
        reply = (await worker.call(job(1, "fail", message="boom"), 5)).reply
        assert (reply.ok, reply.value, reply.error) == (False, None, "ValueError: boom")
        long = (await worker.call(job(2, "fail", message="x" * 10_000), 5)).reply
        assert long.error is not None and len(long.error) == 2000
        unknown = (await worker.call(job(3, "nope"), 5)).reply
        assert not unknown.ok and unknown.error is not None and unknown.error.startswith("KeyError")
        bad_args = (await worker.call(job(4, "count", extra=1), 5)).reply
        assert not bad_args.ok and bad_args.error is not None and bad_args.error.startswith("TypeError")
        assert (await worker.call(job(5, "count"), 5)).reply.value == 1
        shapes = (await worker.call(job(6, "shapes"), 5)).reply.value
        assert shapes == {
            "tuple": [1, 2],
            "set": [1, 2, 3],
            5: "int key",
            "(1, 2)": "tuple key",
            "obj": "object",
        }
        assert worker.alive
        await worker.aclose()

    run(main())


@real_process
@pytest.mark.parametrize("with_log", [True, False])
def test_printing_tool_does_not_corrupt_the_channel(tmp_path: Path, with_log: bool) -> None:
    log = tmp_path / "worker-0.log" if with_log else None

    async def main() -> None:
        worker = await started(ToolSpec("shout", COUNTER), ToolSpec("add"), log_path=log)
        assert (await worker.call(job(1, "shout", lines=5000), 10)).reply.value == 5000
        assert (await worker.call(job(2, "add", a=1, b=1), 5)).reply.value == 2
        await worker.aclose()

    run(main())
    if log is not None:
        text = log.read_text()
        assert "line 4999" in text and "err 4999" in text


@real_process
def test_a_worker_starts_with_more_tools_than_a_command_line_holds(tmp_path: Path) -> None:
    """The tool list went on the worker's command line as one argument, which Linux caps at 128 KiB: a
    workload of ~1,000 tool files (ToolMATH's scale) failed every worker with ``could not spawn:
    OSError(7, 'Argument list too long')``. It is the first frame on the job pipe now."""
    tool = tmp_path / "many.py"
    tool.write_text("def __getattr__(name):\n    return lambda: name\n")
    names = [f"tool_with_a_rather_long_descriptive_name_number_{i:05d}" for i in range(2_000)]
    specs = [ToolSpec(name, tool) for name in names]
    assert len(json.dumps([spec.to_json() for spec in specs])) > 128 * 1024

    async def main() -> None:
        worker = await started(*specs)
        assert (await worker.call(job(1, names[-1]), 5)).reply.value == names[-1]
        await worker.aclose()

    run(main())


@real_process
def test_each_job_starts_in_the_workers_directory_with_its_stdio(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/TOOLS.md: a tool that left the worker in a directory since removed, or closed fds 0-2, made
    every later call in that worker (another trajectory's) fail: ``os.getcwd()`` raised, a ``print``
    raised ``OSError: Bad file descriptor``. Each job now starts from the worker's directory and stdio."""
    tool = tmp_path / "vandal.py"
    tool.write_text(
        "import os, sys, tempfile\n\n"
        "def vandal():\n"
        "    with tempfile.TemporaryDirectory() as scratch:\n"
        "        os.chdir(scratch)\n"
        "    for fd in (0, 1, 2):\n"
        "        os.close(fd)\n"
        "    open(os.devnull)  # takes fd 0\n\n"
        "def where():\n    return os.getcwd()\n\n"
        "def say():\n    print('said', flush=True)\n    print('err', file=sys.stderr, flush=True)\n"
        "    return sys.stdin.read()\n"
    )
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "worker-0.log"

    async def main() -> None:
        worker = await started(*(ToolSpec(n, tool) for n in ("vandal", "where", "say")), log_path=log)
        assert (await worker.call(job(1, "vandal"), 5)).reply.ok
        assert (await worker.call(job(2, "where"), 5)).reply.value == str(tmp_path)
        said = (await worker.call(job(3, "say"), 5)).reply
        assert (said.ok, said.value, said.error) == (True, "", None)
        await worker.aclose()

    run(main())
    assert log.read_text().splitlines() == ["said", "err"]


@real_process
def test_a_worker_starts_and_serves_after_the_runtimes_directory_was_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker started after the directory the runtime runs in was removed (a scratch folder cleaned
    during the run, or a tool's ``rmtree``) exited at its dummy call (``os.getcwd()`` raised in the
    worker's set-up): every replacement failed to start, and the first replacement the run needed
    failed the run ('could not be replaced after 3 attempts'). It starts and serves now, each job in
    that directory as the others are in theirs."""
    tool = tmp_path / "tool.py"
    tool.write_text(
        "import os\n\ndef here():\n    return os.listdir('.')\n\ndef away():\n    os.chdir('/')\n"
    )
    gone_dir = tmp_path / "scratch"
    gone_dir.mkdir()
    monkeypatch.chdir(gone_dir)
    gone_dir.rmdir()

    async def main() -> None:
        worker = await started(ToolSpec("here", tool), ToolSpec("away", tool), ToolSpec("add"))
        assert (await worker.call(job(1, "add", a=1, b=2), 5)).reply.value == 3
        for job_id, tool_name in enumerate(["here", "away", "here"], start=2):
            reply = (await worker.call(job(job_id, tool_name), 5)).reply
            assert reply.ok, reply.error
        # each job starts in the removed (empty) directory, an earlier job's chdir('/') undone
        assert reply.value == []
        await worker.aclose()

    run(main())


@real_process
def test_a_forked_child_that_returns_from_the_tool_exits_there(tmp_path: Path) -> None:
    """A tool that forks and whose child returns (no ``os._exit``): the child answered the job in the
    worker's place — its result, a negative ``cpu_s`` — and then served the next job while the tool
    waited for it. The child ends where it leaves the tool; the tool gets its own result back."""
    tool = tmp_path / "forks.py"
    tool.write_text(
        "import os\n\ndef fork():\n    pid = os.fork()\n    if pid == 0:\n        return 'child'\n"
        "    return f'parent saw {os.waitpid(pid, 0)[1] >> 8}'\n"
    )
    log = tmp_path / "worker-0.log"

    async def main() -> None:
        worker = await started(ToolSpec("fork", tool), ToolSpec("add"), log_path=log)
        reply = (await worker.call(job(1, "fork"), 5)).reply
        assert (reply.ok, reply.value) == (True, "parent saw 1") and reply.cpu_s >= 0
        assert (await worker.call(job(2, "add", a=1, b=2), 5)).reply.value == 3
        await worker.aclose()

    run(main())
    assert "a process that tool 'fork' forked" in log.read_text()


@real_process
def test_timeout_kills_the_worker_and_its_setsid_grandchild(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "grandchild.pid"
    monkeypatch.setenv("ASYNCROLL_TEST_GRANDCHILD_FILE", str(marker))

    async def main() -> tuple[int, int]:
        worker = await started(ToolSpec("spawn_and_sleep", COUNTER))
        with pytest.raises(WorkerTimeout, match="process tree was killed"):
            await worker.call(job(1, "spawn_and_sleep", seconds=30), timeout=1.0)
        assert not worker.alive and worker.returncode is not None
        with pytest.raises(WorkerDied):
            await worker.call(job(2, "spawn_and_sleep", seconds=0), timeout=1.0)
        assert worker.pid is not None
        return worker.pid, int(marker.read_text())

    worker_pid, grandchild_pid = run(main())
    assert gone(worker_pid)
    assert gone(grandchild_pid)


@real_process
def test_external_sigkill_while_idle_is_detected() -> None:
    async def main() -> None:
        worker = await started()
        assert worker.pid is not None
        os.kill(worker.pid, signal.SIGKILL)
        assert await worker.wait_exit() == -signal.SIGKILL
        assert not worker.alive
        with pytest.raises(WorkerDied, match="SIGKILL"):
            await worker.call(job(1, "add", a=1, b=2), timeout=5)
        await worker.kill()

    run(main())


@real_process
def test_death_during_a_job_raises_worker_died() -> None:
    async def main() -> None:
        worker = await started(ToolSpec("sleep_ms"))
        assert worker.pid is not None
        asyncio.get_running_loop().call_later(0.2, os.kill, worker.pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(WorkerDied, match="SIGKILL"):
            await worker.call(job(1, "sleep_ms", milliseconds=10_000), timeout=15)
        assert time.monotonic() - t0 < 5
        await worker.kill()

    run(main())


@real_process
def test_death_is_detected_while_a_forked_descendant_holds_the_reply_pipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "forked.pid"
    monkeypatch.setenv("ASYNCROLL_TEST_GRANDCHILD_FILE", str(marker))

    async def main() -> int:
        worker = await started(ToolSpec("fork_and_sleep", COUNTER))
        assert worker.pid is not None
        call = asyncio.create_task(worker.call(job(1, "fork_and_sleep", seconds=30), timeout=15))
        while not marker.exists() or not marker.read_text():  # noqa: ASYNC110 - another process writes it
            await asyncio.sleep(0.01)
        os.kill(worker.pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(WorkerDied, match="SIGKILL"):
            await call
        assert time.monotonic() - t0 < 2  # no waiting for the pipe's end of stream
        await worker.kill()  # the fork stayed in the worker's process group
        return int(marker.read_text())

    assert gone(run(main()))


@real_process
def test_no_fds_or_children_left_behind() -> None:
    def open_fds() -> set[str]:
        """The open descriptors, by number and what they point to. Garbage from earlier tests is
        collected first: one collected during the test closed an fd and broke a count comparison."""
        gc.collect()
        fds = {}
        for fd in os.listdir("/proc/self/fd"):
            try:
                fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:  # the listing's own descriptor, closed by now
                continue
        return {f"{fd} -> {target}" for fd, target in fds.items()}

    async def main() -> None:
        for i in range(4):
            worker = await started(ToolSpec("sleep_ms"))
            if i % 2:
                with pytest.raises(WorkerTimeout):
                    await worker.call(job(1, "sleep_ms", milliseconds=5_000), timeout=0.2)
            else:
                await worker.call(job(1, "sleep_ms", milliseconds=1), timeout=5)
                await worker.aclose()
        assert psutil.Process().children() == []

    before = open_fds()
    run(main())
    assert open_fds() - before == set()  # nothing the workers opened is left open


@real_process
def test_cancelling_a_call_kills_the_worker_and_propagates() -> None:
    async def main() -> None:
        worker = await started(ToolSpec("sleep_ms"))
        task = asyncio.create_task(worker.call(job(1, "sleep_ms", milliseconds=10_000), timeout=15))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not worker.alive and worker.returncode == -signal.SIGKILL
        assert worker.pid is not None and gone(worker.pid)

    run(main())


@real_process
@pytest.mark.parametrize(
    ("tools", "timeout", "message"),
    [
        ((ToolSpec("nope", COUNTER),), 10, "no callable named 'nope'"),
        ((ToolSpec("whatever", TOOLS / "broken_import.py"),), 10, "broken on purpose"),
        ((ToolSpec("f", TOOLS / "missing.py"),), 10, "FileNotFoundError"),
        ((ToolSpec("lcb_nonexistent"),), 10, "unknown built-in tool"),
        (
            (ToolSpec("ready", TOOLS / "slow_import.py"),),
            0.5,
            r"not ready within 0.5s \(--worker-startup-timeout\)",
        ),
        ((ToolSpec("add"),), 0.001, r"within 0.001s \(--worker-startup-timeout\)"),
    ],
    ids=[
        "missing-function",
        "raises-on-import",
        "missing-file",
        "unknown-builtin",
        "startup-timeout",
        "spawn-timeout",
    ],
)
def test_startup_failures_raise_and_leave_no_process(
    tmp_path: Path, tools: tuple[ToolSpec, ...], timeout: float, message: str
) -> None:
    worker = ProcessWorker(3, tools, startup_timeout=timeout)
    with pytest.raises(WorkerStartupError, match=message) as failure:
        run(worker.start())
    if timeout > 1:  # the worker itself reported the failure (not read from a log: there is none)
        assert "could not load its tools" in str(failure.value)
    if worker.pid is not None:  # else it timed out before the process was spawned
        assert gone(worker.pid, within=1.0) and worker.returncode is not None
    assert not worker.alive


@real_process
def test_tool_imports_helpers_from_its_folder_not_the_cwd_and_sigint_still_kills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tool file imports a module that sits next to it (its folder is on sys.path, as a script's is);
    the runtime's working directory is not (``-P``): what imports must not depend on where the run was
    started. A SIGINT sent to the worker mid-job still kills it, as before."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "helper.py").write_text("def double(x):\n    return 2 * x\n")
    (tools / "uses.py").write_text(
        "import time\nfrom helper import double\n\n"
        "def twice(x):\n    return double(x)\n\n"
        "def from_cwd():\n    import only_in_cwd\n\n"
        "def wait(marker):\n    open(marker, 'w').close()\n    time.sleep(30)\n"
    )
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "only_in_cwd.py").write_text("")
    monkeypatch.chdir(cwd)
    marker = tmp_path / "waiting"
    uses = tools / "uses.py"

    async def main() -> None:
        worker = await started(ToolSpec("twice", uses), ToolSpec("from_cwd", uses), ToolSpec("wait", uses))
        assert (await worker.call(job(1, "twice", x=2), 5)).reply.value == 4
        reply = (await worker.call(job(2, "from_cwd"), 5)).reply
        assert reply.error == "ModuleNotFoundError: No module named 'only_in_cwd'"
        call = asyncio.create_task(worker.call(job(3, "wait", marker=str(marker)), timeout=15))
        while not marker.exists():  # noqa: ASYNC110 - the worker creates it
            await asyncio.sleep(0.01)
        assert worker.pid is not None
        os.kill(worker.pid, signal.SIGINT)
        with pytest.raises(WorkerDied, match="killed by SIGINT"):
            await call
        await worker.kill()

    run(main())


@real_process
def test_cpu_seconds_grow_with_cpu_work() -> None:
    async def main() -> None:
        worker = await started(ToolSpec("spin_ms"))
        before = worker.cpu_seconds()
        reply = (await worker.call(job(1, "spin_ms", milliseconds=100), 5)).reply
        after = worker.cpu_seconds()
        assert before is not None and after is not None and after > before
        assert reply.ok and reply.value == 100 and reply.execute_s >= 0.1 and reply.cpu_s > 0
        await worker.aclose()
        assert worker.cpu_seconds() is None

    run(main())


@real_process
def test_round_trip_micro_check(capsys: pytest.CaptureFixture[str]) -> None:
    async def main() -> list[float]:
        worker = await started()
        trips = []
        for i in range(100):
            trips.append((await worker.call(job(i, "add", a=i, b=1), 5)).round_trip_s)
        await worker.aclose()
        return trips

    trips = run(main())
    with capsys.disabled():
        print(f"\n[workers] add round trip over 100 calls: median {statistics.median(trips) * 1e6:.0f} µs")


@real_process
def test_death_during_startup_reports_status_and_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    log.write_text("output of an earlier generation\n")
    worker = ProcessWorker(1, [ToolSpec("f", TOOLS / "exits_on_import.py")], startup_timeout=10, log_path=log)
    with pytest.raises(WorkerStartupError, match="exit status 3") as failure:
        run(worker.start())
    assert "about to exit from tool import" in str(failure.value)
    assert "earlier generation" not in str(failure.value)
    assert worker.pid is not None and gone(worker.pid, within=1.0)


def test_unstarted_worker_is_safe_to_close_and_refuses_calls() -> None:
    async def main() -> None:
        worker = ProcessWorker(0, [ToolSpec("add")], generation=2, startup_timeout=1)
        assert (worker.generation, worker.alive, worker.returncode, worker.cpu_seconds()) == (
            2,
            False,
            None,
            None,
        )
        with pytest.raises(WorkerDied):
            await worker.call(job(1, "add", a=1, b=2), timeout=1)
        await worker.aclose()
        await worker.kill()

    run(main())
