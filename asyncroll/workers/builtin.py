"""Built-in tools that need no implementation file.

These run inside a worker process, so this module stays import-light (stdlib only): a worker's start-up
time is part of every run, and a replacement worker's start-up is part of the measured window.
``spin_ms`` and ``sleep_ms`` let scripted workloads and benchmarks request a known CPU or wall cost.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from asyncroll.grading import grade


def add(a: float, b: float) -> float:
    """Return ``a + b``."""
    return a + b


def sleep_ms(milliseconds: float) -> float:
    """Sleep (no CPU) for ``milliseconds`` and return the milliseconds requested."""
    time.sleep(max(0.0, milliseconds) / 1000.0)
    return milliseconds


def spin_ms(milliseconds: float) -> float:
    """Busy-loop on the CPU for ``milliseconds`` of wall time and return the milliseconds requested."""
    deadline = time.perf_counter() + max(0.0, milliseconds) / 1000.0
    while time.perf_counter() < deadline:
        pass
    return milliseconds


def lcb_evaluate(
    code: str,
    tests: list[dict[str, Any]],
    func_name: str | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Run untrusted ``code`` against hidden LiveCodeBench ``tests`` in the sandbox (SPEC §9).

    The model supplies only ``code``; ``tests`` and ``func_name`` are bound by the runtime from the
    problem's hidden metadata. The evaluator (and its isolation probe) loads on the first call, so
    workers that never evaluate code do not pay for it. ``options`` are the run's limits (``time_limit_s``
    and the rest, :func:`asyncroll.runtime.collaborators.evaluator_options`), defaulted by the evaluator
    itself. See :mod:`asyncroll.evaluator.evaluate`.
    """
    from asyncroll.evaluator.evaluate import lcb_evaluate as evaluate

    return evaluate(code, tests, func_name=func_name, **options)


BUILTIN_TOOLS: dict[str, Callable[..., Any]] = {
    "add": add,
    "sleep_ms": sleep_ms,
    "spin_ms": spin_ms,
    "lcb_evaluate": lcb_evaluate,
    "__grade__": grade,
}
"""Name → callable of every built-in tool a worker can serve without an implementation file."""
