"""The code evaluator's time and memory limits: defaults, bounds, and the rule of the total budget.

Stdlib only and import-light: :mod:`asyncroll.config` checks ``asyncroll run``'s evaluator flags
(``--test-timeout``, ``--evaluation-timeout``, ``--test-memory-mb``) against the same bounds and the same
cap that :func:`~asyncroll.evaluator.evaluate.lcb_evaluate` applies, without loading the sandbox.
"""

from __future__ import annotations

DEFAULT_TIME_LIMIT_S = 6.0
"""The wall limit of one test, as LiveCodeBench's."""
DEFAULT_TOTAL_TIME_LIMIT_S = 50.0
"""The cap of the default total budget when the caller gives no ``tool_timeout_s``: below the runtime's
default tool timeout (60 s), so a slow program gets a verdict, not a killed worker."""
MAX_TIME_LIMIT_S = 3600.0
"""Time limits (per test, total) must be below this."""
DEFAULT_MEMORY_LIMIT_MB = 768
"""Address space of each process of a test, MiB."""
MIN_MEMORY_LIMIT_MB = 64
MAX_MEMORY_LIMIT_MB = 1024 * 1024
"""1 TiB: far above any machine's test, and the byte count stays well inside ``setrlimit``'s range."""


def total_budget(time_limit_s: float, n_tests: int, tool_timeout_s: float | None) -> tuple[float, str]:
    """The default total budget of an evaluation, in seconds, and what set it (for the verdict):
    LiveCodeBench's ``(time_limit_s + 1) × n_tests + 5``, capped at :func:`tool_timeout_cap` of
    ``tool_timeout_s`` or, without one, at :data:`DEFAULT_TOTAL_TIME_LIMIT_S`."""
    scaled = (time_limit_s + 1.0) * n_tests + 5.0
    if tool_timeout_s is None:
        cap = DEFAULT_TOTAL_TIME_LIMIT_S
        why = "the default cap of an evaluation called without tool_timeout_s"
    else:
        cap = tool_timeout_cap(tool_timeout_s)
        why = (
            f"capped below the runtime's --tool-timeout of {tool_timeout_s:g}s so that the verdict comes "
            "back before the worker is killed; a larger --tool-timeout raises it"
        )
    if scaled <= cap:
        return scaled, f"({time_limit_s:g}s per test + 1s) × {n_tests} tests + 5s, as LiveCodeBench"
    return cap, why


def tool_timeout_cap(tool_timeout_s: float) -> float:
    """The longest total budget that leaves the worker time to answer before ``tool_timeout_s``: the
    timeout less a margin of max(1 s, 10%), but at least half of it."""
    return max(tool_timeout_s - max(1.0, 0.1 * tool_timeout_s), 0.5 * tool_timeout_s)
