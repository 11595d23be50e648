"""The CLI process's stop signals outside a command's own handlers (``asyncroll.cli_signals``), each in a
real ``python`` process started through :func:`asyncroll.cli.main` and signalled at a deterministic
point: while the command is still reading its settings, after a signal was swallowed, when an interrupt
surfaced as another exception, and in the interpreter's last clean-up. Every process has a hard timeout."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.children import end
from tests.conftest import REPO

SMOKE = REPO / "examples" / "smoke.jsonl"


def python(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """The exit status and stderr (killed after 60 s: a hang fails the test)."""
    code, _, stderr = outputs(proc)
    return code, stderr


def outputs(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    """The exit status, stdout and stderr (killed after 60 s: a hang fails the test)."""
    try:
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        end(proc)
    return proc.returncode, stdout, stderr


#: main() with the given argv, and an object whose __del__ sends a signal to this process when the
#: interpreter drops __main__'s globals: after the exit handlers, once Python has put the default
#: handlers back for its last clean-up.
LATE_SIGNAL = """
import os, signal, sys, time
class Late:
    def __del__(self, kill=os.kill, pid=os.getpid(), sig=int(sys.argv[1]), sleep=time.sleep):
        kill(pid, sig)
        sleep(0.5)
late = Late()
sys.argv = ["asyncroll", *sys.argv[2:]]
from asyncroll.cli import main
main()
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_in_the_interpreters_last_cleanup_keeps_the_commands_exit_code(sig: signal.Signals) -> None:
    """Python's last clean-up takes ≈ 0.5 s after a run (scikit-learn, SciPy): a second Ctrl-C or a
    SIGTERM after the first then ended the process by that signal (status -15 or -2), while run.json
    said exit code 130 (or 0)."""
    code, stderr = finish(python(LATE_SIGNAL, str(int(sig)), "validate", str(SMOKE)))
    assert code == 0, stderr
    assert "Traceback" not in stderr


#: main() with one more command, which registers an exit handler that never returns (as
#: multiprocessing's does when it joins a child that is stuck): it says so, then blocks on a pipe.
HANGING_EXIT_HANDLER = """
import atexit, os, sys
from asyncroll import cli

def hang() -> None:
    print("in the exit handler", flush=True)
    os.read(os.pipe()[0], 1)  # nobody ever writes: blocks for good

@cli.app.command("hang-at-exit")
def hang_at_exit() -> None:
    atexit.register(hang)

sys.argv = ["asyncroll", "hang-at-exit"]
cli.main()
"""


@pytest.mark.timeout(120)
def test_a_signal_ends_an_exit_handler_that_hangs_with_the_commands_exit_code() -> None:
    """The stop signals were ignored from the first exit handler on: one that hung could not be ended
    by Ctrl-C or SIGTERM (only by SIGKILL), where before they ended it with the command's exit code."""
    proc = python(HANGING_EXIT_HANDLER)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "in the exit handler\n"
        proc.send_signal(signal.SIGTERM)
        code, stderr = finish(proc)  # a process that ignores it is killed after 60 s: status -9
    finally:
        end(proc)
    assert code == 0, stderr
    assert "Traceback" not in stderr


@pytest.mark.timeout(120)
def test_sigterm_while_run_reads_its_settings_exits_130(tmp_path: Path) -> None:
    """Before the run's own handlers (imports, settings, validation: ≈ 1 s) SIGTERM and SIGHUP killed
    the process outright (status -15); now they stop it as Ctrl-C does. The command is held reading its
    config file, a FIFO nobody writes to."""
    fifo = tmp_path / "settings.json"
    os.mkfifo(fifo)
    out = tmp_path / "run"
    command = ["-m", "asyncroll.cli", "run", "--config", str(fifo), "--workload", str(SMOKE)]
    proc = subprocess.Popen(
        [sys.executable, *command, "--output", str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    writer = None
    try:
        deadline = time.monotonic() + 60
        while writer is None and proc.poll() is None and time.monotonic() < deadline:
            try:  # succeeds once the command has the FIFO open for reading: it is waiting in there
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                assert exc.errno == errno.ENXIO
                time.sleep(0.01)
        assert writer is not None, "the command never opened its config file"
        os.kill(proc.pid, signal.SIGTERM)
        code, stderr = finish(proc)
    finally:
        if writer is not None:
            os.close(writer)
        end(proc)
    assert code == 130, stderr
    assert "Traceback" not in stderr
    assert stderr.endswith("interrupted by SIGTERM\n"), stderr  # it said nothing at all
    assert not out.exists()


#: The ``asyncroll`` command's entry point, with a stop signal sent to the process as typer (the first of
#: the CLI's heavy imports) starts to import.
STOP_WHILE_IMPORTING = """
import importlib.abc, os, signal, sys

SIG = int(sys.argv[1])

class Stop(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "typer":
            os.kill(os.getpid(), SIG)
        return None

sys.meta_path.insert(0, Stop())
sys.argv = ["asyncroll", "validate", sys.argv[2]]
from asyncroll.__main__ import main
main()
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_cli_imports_exits_130_with_one_line(sig: signal.Signals) -> None:
    """The first ≈ 0.3 s of every command import typer and pydantic, before :func:`cli_signals.guard`: a
    Ctrl-C there printed a KeyboardInterrupt traceback from inside an import and ended the process by the
    signal (status -2); a SIGTERM killed it outright (-15)."""
    code, stdout, stderr = outputs(python(STOP_WHILE_IMPORTING, str(int(sig)), str(SMOKE)))
    assert code == 130, stderr
    assert (stdout, stderr) == ("", f"interrupted by {sig.name} while starting: nothing done\n")


@pytest.mark.timeout(120)
def test_a_sigint_the_process_was_started_ignoring_stops_it_while_it_imports_as_later() -> None:
    """A background job of a script (``asyncroll run … &``) starts with SIGINT ignored. The command honours
    it from its options on (:func:`cli_signals.guard`, the run's handlers: only a ``nohup``'s SIGHUP stays
    ignored), but while its modules imported it stayed ignored: a ``kill -INT`` in the first ≈ 0.3 s was
    lost and the run went on to exit 0, one a moment later stopped it (exit 130)."""
    script = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n" + STOP_WHILE_IMPORTING
    code, stdout, stderr = outputs(python(script, str(int(signal.SIGINT)), str(SMOKE)))
    assert (code, stdout, stderr) == (130, "", "interrupted by SIGINT while starting: nothing done\n")


def test_starting_puts_the_handlers_back_and_leaves_an_ignored_signal_ignored() -> None:
    from asyncroll import cli_signals

    def mine(_signum: int, _frame: object) -> None:
        pass

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
        signal.signal(signal.SIGTERM, mine)
        with cli_signals.starting():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not mine
        assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) == before[signal.SIGINT]
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


#: main() with one more command, in which a Ctrl-C arrives and is turned into an ImportError, as numpy's
#: C extension does when a Ctrl-C lands while it imports.
INTERRUPT_AS_IMPORT_ERROR = """
import os, signal, sys, time
from asyncroll import cli

@cli.app.command("import-numpy")
def import_numpy() -> None:
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
    except KeyboardInterrupt:
        raise ImportError("numpy._core.multiarray failed to import") from None

sys.argv = ["asyncroll", "import-numpy"]
cli.main()
"""


@pytest.mark.timeout(120)
def test_an_interrupt_that_surfaces_as_another_exception_exits_130_without_a_traceback() -> None:
    """A Ctrl-C while numpy loads (``asyncroll run`` imports it in its first second) ended with an
    ImportError traceback and exit code 1."""
    code, stderr = finish(python(INTERRUPT_AS_IMPORT_ERROR))
    assert code == 130, stderr
    assert "Traceback" not in stderr
    assert "interrupted by SIGINT (ImportError: numpy._core.multiarray failed to import)" in stderr


#: As above, in a command holding its own handlers (``run`` and ``simulate`` from their settings on), where
#: the Ctrl-C is a SIGTERM.
SIGTERM_AS_IMPORT_ERROR = """
import os, signal, sys, time
from asyncroll import cli
from asyncroll.runtime.signals import CommandSignals

@cli.app.command("import-numpy")
def import_numpy() -> None:
    signals = CommandSignals()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    except KeyboardInterrupt:
        raise ImportError("numpy._core.multiarray failed to import") from None
    finally:
        signals.restore()

sys.argv = ["asyncroll", "import-numpy"]
cli.main()
"""


@pytest.mark.timeout(120)
def test_an_interrupt_under_a_commands_own_handlers_names_the_signal_that_came() -> None:
    """The command's SIGTERM handler passed it on as a SIGINT, which the CLI recorded: the line said
    "interrupted by SIGINT" for a SIGTERM."""
    code, stderr = finish(python(SIGTERM_AS_IMPORT_ERROR))
    assert code == 130, stderr
    assert "interrupted by SIGTERM (ImportError: numpy._core.multiarray failed to import)" in stderr, stderr


#: run, where a SIGTERM is handled inside a weakref callback while the settings are built: Python reports
#: the KeyboardInterrupt the handler raised there as "ignored" and goes on.
SWALLOWED = """
import gc, os, signal, sys, time, weakref
import asyncroll.config as config

real = config.build_config

def build_config(*args, **kwargs):
    class Thing:
        pass

    def callback(_ref):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs (and raises) here, in the callback

    thing = Thing()
    ref = weakref.ref(thing, callback)
    del thing
    gc.collect()
    return real(*args, **kwargs)

config.build_config = build_config
sys.argv = ["asyncroll", "run", "--workload", sys.argv[1], "--output", sys.argv[2], "--no-progress"]
from asyncroll.cli import main
main()
"""


@pytest.mark.timeout(120)
def test_a_stop_signal_swallowed_before_the_run_still_stops_the_command(tmp_path: Path) -> None:
    """A KeyboardInterrupt raised in a weakref callback (or a ``__del__``) is only reported: the command
    went on and ran to the end, exit 0, the SIGTERM lost. Its record stops the command before the run
    (from where ``run`` has its own handlers: one swallowed after that is not covered)."""
    out = tmp_path / "run"
    code, stderr = finish(python(SWALLOWED, str(SMOKE), str(out)))
    assert "Exception ignored" in stderr  # Python's own report: the signal did land in the callback
    assert code == 130, stderr
    assert not out.exists()


#: the CLI's guard, then a command's own handlers and its asyncio.run: which SIGINT handler each stretch has,
#: and what a SIGTERM does inside the event loop
UNDER_ASYNCIO = """
import asyncio, os, signal
from asyncroll import cli_signals
from asyncroll.runtime.signals import CommandSignals

cli_signals.guard()
signals = CommandSignals()
print("command:", signal.getsignal(signal.SIGINT) is signal.default_int_handler)
seen = []

async def main():
    handler = signal.getsignal(signal.SIGINT)
    print("loop:", handler not in (signal.default_int_handler, cli_signals._interrupt))
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        seen.append("cancelled")
        raise

try:
    asyncio.run(main())
except KeyboardInterrupt:
    print("interrupted:", seen, signals.received, cli_signals.interrupted_by())
signals.restore()
print("restored:", signal.getsignal(signal.SIGINT) is cli_signals._interrupt)
"""


@pytest.mark.timeout(90)
def test_a_commands_event_loop_takes_a_stop_signal_as_asyncio_s_cancellation() -> None:
    """Under the CLI's guard asyncio.run found a SIGINT handler other than Python's and installed none of
    its own, so a stop signal raised KeyboardInterrupt wherever the loop was (its own close included: an
    unclosed loop's ``__del__`` then printed a traceback at exit). A command's handlers give SIGINT back to
    Python's while they are in place: the signal cancels the run's main task, and it is still named."""
    code, stdout, stderr = outputs(python(UNDER_ASYNCIO))
    assert code == 0, stderr
    assert stdout.splitlines() == [
        "command: True",
        "loop: True",
        "interrupted: ['cancelled'] SIGTERM SIGTERM",
        "restored: True",
    ], stdout + stderr


HALF_BUILT_LOOP = """
import asyncio, gc, inspect, signal
from asyncroll import cli_signals
from asyncroll.clock import run_on_new_loop

cli_signals.guard()
built = []

def new_loop():
    loop = asyncio.new_event_loop()
    built.append(loop)
    signal.raise_signal(signal.SIGTERM)  # a stop signal while the run's loop is being built
    return loop

async def main():
    return 1

coro = main()
try:
    run_on_new_loop(new_loop, coro, set_current=True)
except KeyboardInterrupt:
    print("interrupted:", cli_signals.interrupted_by())
print("loop closed:", built[0].is_closed(), "main:", inspect.getcoroutinestate(coro))
try:
    with cli_signals.deferred():
        signal.raise_signal(signal.SIGINT)
        print("inside: nothing yet")
except KeyboardInterrupt:
    print("after: interrupted")
"""


@pytest.mark.timeout(90)
def test_a_stop_signal_while_the_event_loop_is_built_waits_until_it_is_and_nothing_is_left_open() -> None:
    """A KeyboardInterrupt raised inside an event loop's constructor left half a loop, whose ``__del__``
    printed an AttributeError traceback at some random later moment, and the command's coroutine warned
    it was never awaited (test_signals' output-directory test failed about 1 run in 25). The signal now
    waits until the loop exists, then stops the command: the loop is closed and so is the coroutine."""
    code, stdout, stderr = outputs(python(HALF_BUILT_LOOP))
    assert code == 0, stdout + stderr
    assert stdout.splitlines() == [
        "interrupted: SIGTERM",
        "loop closed: True main: CORO_CLOSED",
        "inside: nothing yet",
        "after: interrupted",
    ], stdout + stderr
    assert "never awaited" not in stderr and "Exception ignored" not in stderr, stderr
