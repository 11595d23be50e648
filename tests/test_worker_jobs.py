"""A real tool worker process serving jobs: the ready handshake, values and timings, module state kept
across jobs, tool errors as replies, printing tools, many tools, each job in the worker's directory and
stdio, forks, imports next to the tool file, CPU seconds and the round trip."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import time
from pathlib import Path

import pytest

from asyncroll.errors import MAX_ERROR_CHARS, WorkerDied
from asyncroll.workers import ToolSpec
from asyncroll.workers.protocol import encode
from tests.worker_processes import COUNTER, TOOLS, gone, job, real_process, run, started


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
        assert reply.cpu_s is not None and reply.serialize_s is not None  # a process ran it
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
        assert long.error is not None and len(long.error) == MAX_ERROR_CHARS  # what an event keeps
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
        assert (reply.ok, reply.value) == (True, "parent saw 1")
        assert reply.cpu_s is not None and reply.cpu_s >= 0
        assert (await worker.call(job(2, "add", a=1, b=2), 5)).reply.value == 3
        await worker.aclose()

    run(main())
    assert "a process that tool 'fork' forked" in log.read_text()


@real_process
def test_a_forked_child_that_raises_out_of_the_tool_is_logged_with_its_error(tmp_path: Path) -> None:
    """A forked child that raises out of the tool (``sys.exit`` in it too) ends there like one that
    returns, and the worker log says what it raised (it said "returned from the tool", the error lost)."""
    tool = tmp_path / "forks.py"
    tool.write_text(
        "import os\n\ndef fork():\n    pid = os.fork()\n    if pid == 0:\n"
        "        raise ValueError('child failed')\n    return os.waitpid(pid, 0)[1] >> 8\n"
    )
    log = tmp_path / "worker-0.log"

    async def main() -> None:
        worker = await started(ToolSpec("fork", tool), log_path=log)
        assert (await worker.call(job(1, "fork"), 5)).reply.value == 1
        await worker.aclose()

    run(main())
    text = log.read_text()
    assert "forked (pid" in text and "raised ValueError: child failed out of the tool" in text
    assert "returned from the tool" not in text


@real_process
@pytest.mark.usefixtures("sigint_not_ignored")
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
def test_a_tool_imports_from_the_users_pythonpath_before_asyncrolls_own_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's path keeps the user's ``PYTHONPATH`` first, as the runtime's own has it, and the
    folder holding asyncroll after it: that folder went first, so a module both hold (a lab's numpy on
    ``PYTHONPATH`` beside a wheel install's site-packages; here ``bench``, which this checkout's root
    holds) was imported from asyncroll's folder in the tools and from the user's in the runtime."""
    lab = tmp_path / "lab"
    (lab / "bench").mkdir(parents=True)
    (lab / "bench" / "__init__.py").write_text("WHOSE = 'the lab'\n")
    (tmp_path / "t.py").write_text(
        "def whose():\n    import bench\n    return getattr(bench, 'WHOSE', None)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(lab))

    async def main() -> None:
        worker = await started(ToolSpec("whose", tmp_path / "t.py"))
        try:
            assert (await worker.call(job(1, "whose"), 5)).reply.value == "the lab"
        finally:
            await worker.kill()

    run(main())


@real_process
def test_a_worker_imports_this_asyncroll_though_the_users_pythonpath_holds_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user's ``PYTHONPATH`` goes first, but not where one of its entries holds another
    ``asyncroll`` (a lab's shared install, another checkout) that the runtime did not import (it ran
    ``python -m asyncroll`` in its checkout): the worker imported that one, and never started."""
    other = tmp_path / "other"
    (other / "asyncroll").mkdir(parents=True)
    (other / "asyncroll" / "__init__.py").write_text("raise ImportError('the other asyncroll')\n")
    (tmp_path / "t.py").write_text("def one():\n    return 1\n")
    monkeypatch.setenv("PYTHONPATH", str(other))

    async def main() -> None:
        worker = await started(ToolSpec("one", tmp_path / "t.py"))
        try:
            assert (await worker.call(job(1, "one"), 5)).reply.value == 1
        finally:
            await worker.kill()

    run(main())


def test_a_childs_pythonpath_keeps_the_users_entries_and_this_asyncroll_ahead_of_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pythonpath_with: the user's entries first and this asyncroll's folder after them, unless an entry
    ahead of that folder (found by its real path) holds another asyncroll, a package or a lone
    ``asyncroll.py``: then that folder goes first, and every entry of the user's is kept after it."""
    from asyncroll.workers.spawn import pythonpath_with

    root, lab, other, single = (tmp_path / name for name in ("root", "lab", "other", "single"))
    for holder in (root, other):
        (holder / "asyncroll").mkdir(parents=True)
        (holder / "asyncroll" / "__init__.py").write_text("")
    lab.mkdir()
    single.mkdir()
    (single / "asyncroll.py").write_text("")
    (tmp_path / "link").symlink_to(root)
    link = tmp_path / "link"

    def path(*entries: Path | str) -> str:
        return os.pathsep.join(str(entry) for entry in entries)

    assert pythonpath_with(str(root), None) == pythonpath_with(str(root), "") == str(root)
    assert pythonpath_with(str(root), path(lab)) == path(lab, root)
    assert pythonpath_with(str(root), path(lab, other)) == path(root, lab, other)
    assert pythonpath_with(str(root), path(lab, single)) == path(root, lab, single)
    # this asyncroll's folder on the user's path already (by another name) ahead of another: it stays there
    assert pythonpath_with(str(root), path(lab, link, other)) == path(lab, link, other, root)
    assert pythonpath_with(str(link), path(lab, root, other)) == path(lab, root, other, link)
    monkeypatch.chdir(other)  # an empty entry is the working folder
    assert pythonpath_with(str(root), path("", lab)) == path(root, "", lab)


@real_process
def test_a_runtime_that_ignored_pythonpath_starts_workers_that_ignore_it_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -E`` (or ``-I``) keeps the user's ``PYTHONPATH`` off the runtime's path, so it imports
    and records (run.json ``versions``) its site-packages' numpy; the worker was given that
    ``PYTHONPATH`` all the same and its tools imported the lab's numpy there instead, without a word."""
    import sys
    import types

    lab = tmp_path / "lab"
    (lab / "numpy-0.0.1.dist-info").mkdir(parents=True)
    (lab / "numpy-0.0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: numpy\nVersion: 0.0.1\n"
    )
    (tmp_path / "t.py").write_text(
        "def version():\n    from importlib import metadata\n    return metadata.version('numpy')\n"
    )
    from importlib import metadata

    flags = {name: getattr(sys.flags, name) for name in dir(sys.flags) if not name.startswith(("_", "n_"))}
    monkeypatch.setattr(sys, "flags", types.SimpleNamespace(**{**flags, "ignore_environment": 1}))
    monkeypatch.setenv("PYTHONPATH", str(lab))  # as the runtime started under -E: not on its path

    async def main() -> None:
        worker = await started(ToolSpec("version", tmp_path / "t.py"))
        try:
            assert (await worker.call(job(1, "version"), 5)).reply.value == metadata.version("numpy")
        finally:
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
        assert (
            reply.ok
            and reply.value == 100
            and reply.execute_s >= 0.1
            and reply.cpu_s is not None
            and reply.cpu_s > 0
        )
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


_CPU_WITH_NO_DESCRIPTOR_LEFT = """
import os
from asyncroll import proctree
assert proctree.cpu_seconds(os.getpid()) is not None  # psutil imported and working
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
reading = proctree.cpu_seconds(os.getpid())
for fd in held:
    os.close(fd)
print(reading)
"""


@pytest.mark.timeout(60)
def test_a_cpu_reading_with_no_descriptor_left_is_unknown_not_an_error() -> None:
    """psutil reads /proc/PID/stat; at ``ulimit -n`` (a run with many requests in flight) the open raised
    OSError EMFILE, not a psutil.Error: the run's closing CPU reading failed a run whose every trajectory
    had ended ('run failed: OSError: [Errno 24] Too many open files: '/proc/PID/stat''). Unreadable is
    None, as the reading promises."""
    from tests.children import python_with_open_files

    done = python_with_open_files(_CPU_WITH_NO_DESCRIPTOR_LEFT, 64)
    assert done.returncode == 0 and done.stdout.strip() == "None", done.stderr


SIZES = TOOLS / "sizes.py"


@real_process
def test_a_large_request_is_encoded_with_the_event_loop_running() -> None:
    """A request of ~50 MB of tests (an evaluation's) is pickled a slice at a time: the loop's longest
    stall until it is sent stays far below the time pickling it in one piece takes (it was that long).
    Relative, not absolute, so that a loaded machine slows both; stalls while the pipe drains (the
    machine's other processes) are not the encoding's and are left out."""
    tests = [{"input": f"{i:0150d}", "output": str(i)} for i in range(300_000)]
    request = job(1, "sizes", tests=tests, code="c")
    t0 = time.monotonic()
    encode(request)
    whole_s = time.monotonic() - t0

    async def main() -> float:
        worker = await started(ToolSpec("sizes", SIZES))
        stop, gaps = asyncio.Event(), list[tuple[float, float]]()

        async def probe() -> None:  # each gap between its wake-ups, with when it began
            last = time.monotonic()
            while not stop.is_set():
                await asyncio.sleep(0.001)
                now = time.monotonic()
                gaps.append((now - last, last))
                last = now

        prober = asyncio.create_task(probe())
        await asyncio.sleep(0.01)
        result = await worker.call(request, timeout=15, large=True)
        stop.set()
        await prober
        assert result.reply.ok, result.reply.error
        inputs = sum(150 + len(str(i)) for i in range(300_000))
        assert result.reply.value == [300_000, inputs, tests[-1]["input"], "c"]
        await worker.aclose()
        return max(gap for gap, began in gaps if began < result.sent)

    gap = run(main())
    assert whole_s > 0.05  # enough to see (~0.4 s on a loaded 2-CPU VM)
    assert gap < whole_s / 2, f"the loop stalled {gap:.3f}s; pickling the request whole takes {whole_s:.3f}s"


@real_process
def test_a_call_cancelled_while_its_request_is_encoded_leaves_the_worker_usable() -> None:
    async def main() -> None:
        worker = await started(ToolSpec("sizes", SIZES), ToolSpec("add"))
        tests = [{"input": str(i), "output": ""} for i in range(50_000)]
        call = asyncio.create_task(worker.call(job(1, "sizes", tests=tests), timeout=15, large=True))
        await asyncio.sleep(0)  # the call encodes its first slice, then lets the loop run
        assert not call.done()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert worker.alive  # nothing of the job was written: no half frame in its pipe, not busy
        result = await worker.call(job(2, "sizes", tests=tests[:3], code="d"), timeout=5, large=True)
        assert result.reply.value == [3, 3, "2", "d"]
        result = await worker.call(job(3, "add", a=1, b=2), timeout=5)  # a small one, in one piece
        assert result.reply.value == 3
        await worker.aclose()
        assert worker.returncode == 0

    run(main())
