"""A CP-SAT solve that a stop signal ends at once: the solver runs in a thread while the calling one waits,
so that the signal's Python handler runs (:func:`solve_stoppably`)."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

#: Seconds a stopped solver has to return before the process leaves without it (exit 130).
STOP_GRACE_S = 10.0


def solve_stoppably(
    solver: Any, model: Any, stop_grace_s: float = STOP_GRACE_S, time_limit_s: float | None = None
) -> Any:
    """``solver.solve(model)`` in a thread while this one waits: a signal's Python handler runs only in the
    main thread, between bytecodes, never inside the solver's C++ call, so SIGTERM or SIGHUP waited for the
    whole time limit, and CP-SAT's own SIGINT handler ended the solve with exit code 0, as if it were done.
    Now a stop signal (KeyboardInterrupt, under the CLI's guard) stops the search, waits for the solver to
    return, and goes on.

    The wait is on an event, not ``Thread.join``: a KeyboardInterrupt inside ``join`` marks the thread
    stopped while it still runs (Python 3.11), and a process that exited with the solver still in C++
    aborted ("terminate called without an active exception", exit 134).

    A solver that does not return within ``stop_grace_s`` of the stop (CP-SAT on a 10,000-step instance
    went on for minutes after ``stop_search``) is left behind: the process says so on
    stderr and exits at once with 130 (``os._exit``: no clean-up that would wait for, or abort on, the
    thread still in C++). Nothing is lost: the solve's result was what the stop gave up.

    The same for a solver that runs on past its own ``time_limit_s`` (CP-SAT, same instance, limit 60 s:
    not returned after 11 minutes): ``stop_grace_s`` after the limit it is stopped, and if it does not
    return within ``stop_grace_s`` more, the process says so and exits with 1."""
    outcome: list[Any] = []
    done = threading.Event()
    go = threading.Event()  # set once this thread is inside the try below, where a signal stops the solve
    abandoned = threading.Event()  # a signal came first: the solve that has not begun never begins

    def target() -> None:
        try:
            go.wait()
            if not abandoned.is_set():
                outcome.append(solver.solve(model))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the waiting thread
            outcome.append(exc)
        finally:
            done.set()

    # The solve waits for `go`: a signal whose handler ran as start() returned (on a loaded machine the
    # new thread ran first) left without stop_search while the solve began, and ran on for --time-limit.
    solving = threading.Thread(target=target, name="cp-sat", daemon=True)
    try:
        solving.start()
        go.set()
        late = None if time_limit_s is None else time.monotonic() + time_limit_s + stop_grace_s
        asked: float | None = None  # when the overrunning solver was asked to stop
        while not done.wait(0.1):
            if late is None or time.monotonic() < late:
                continue
            if asked is None:  # past its limit and the grace: ask it to stop, then give it the grace
                solver.stop_search()
                asked = time.monotonic()
            elif time.monotonic() - asked > stop_grace_s:
                _leave(
                    f"the solver ran past its time limit ({time_limit_s:g} s) and did not return within "
                    f"{stop_grace_s:g} s of being stopped; leaving without its result",
                    1,
                )
    except BaseException:
        stopped_at = time.monotonic()
        while True:  # until it returns: CP-SAT drops a stop_search made before its search began
            try:
                abandoned.set()
                go.set()
                solver.stop_search()
                if done.wait(0.05) or not solving.is_alive():  # not alive: start() never started it
                    break
                if time.monotonic() - stopped_at > stop_grace_s:
                    _leave(
                        f"stopped: the solver did not return within {stop_grace_s:g} s of the stop; "
                        "leaving without its result",
                        130,
                    )
            except KeyboardInterrupt:  # a second Ctrl-C of a burst: the solver is stopping already, and
                pass  # a process that left with it still in C++ aborted (exit 134)
        raise
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def _leave(message: str, code: int) -> None:
    """Says why on stderr and ends the process at once: the solver's thread is still in C++, and an
    ordinary exit would wait for it or abort on it (exit 134)."""
    try:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):  # stderr closed (2>&-: None), gone, or full
        pass
    os._exit(code)
