"""A worker that runs no process: each job takes a known duration on the run's clock.

On a :class:`~asyncroll.clock.VirtualClock` this makes the whole runtime — admission, model gate,
dispatcher, policies, pool, restarts — run deterministically in virtual time, which is how scheduling
is tested and how the simulator reuses the real runtime. Built-in tools compute their real value;
``spin_ms``/``sleep_ms`` take their argument as duration. A job longer than the tool timeout behaves as a
real one does: the worker "dies" and is replaced; so does one whose job declares its worker's death
(``worker_dies``), after the job's duration. A replacement may take a start-up time (a replay's
measured ones), during which its slot takes no job, as a real replacement's does while it starts. A
per-job overhead (a simulation's ``--job-overhead-ms``: the runtime's dispatch and hand-off) holds the
worker before the job's execution and is not part of its ``execute_s``, as in a real worker's reply.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from asyncroll.clock import Clock
from asyncroll.errors import WorkerDied, WorkerTimeout, error_text
from asyncroll.grading import grade
from asyncroll.workers.builtin import BUILTIN_TOOLS
from asyncroll.workers.process import CallResult
from asyncroll.workers.protocol import JobReply, JobRequest, observation

Duration = Callable[[JobRequest], float]


def builtin_duration(request: JobRequest) -> float:
    """Seconds a job takes: its declared cost if any, else the milliseconds of ``spin_ms``/``sleep_ms``,
    else zero."""
    if request.cost_s is not None:
        return request.cost_s
    if request.tool in ("spin_ms", "sleep_ms"):  # clamped at 0 as the real built-ins are
        return max(0.0, float(request.arguments.get("milliseconds", 0))) / 1000.0
    return 0.0


class VirtualWorker:
    def __init__(
        self,
        index: int,
        generation: int,
        clock: Clock,
        duration: Duration = builtin_duration,
        simulate_tools: bool = False,
        startup_s: float = 0.0,
        overhead_s: float = 0.0,
    ) -> None:
        """``simulate_tools``: a trusted file tool (which a virtual worker cannot run) succeeds with a
        null value instead of failing — what a simulation of scripted actions wants. ``startup_s``: the
        seconds :meth:`start` takes on the clock (reported in ``worker_ready``). ``overhead_s``: the
        seconds each job holds the worker before it executes (not in its ``execute_s``)."""
        for name, value in (("startup_s", startup_s), ("overhead_s", overhead_s)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        self.index = index
        self.generation = generation
        self.startup_s = startup_s
        self._overhead = overhead_s
        self._clock = clock
        self._duration = duration
        self._simulate_tools = simulate_tools
        self._exited = asyncio.Event()
        self.jobs = 0

    @property
    def pid(self) -> int | None:
        return None

    @property
    def alive(self) -> bool:
        return not self._exited.is_set()

    async def start(self) -> None:
        if self.startup_s:
            await self._clock.sleep(self.startup_s)

    async def call(
        self,
        request: JobRequest,
        timeout: float,  # noqa: ASYNC109 - as a real worker
        *,
        large: bool = False,
    ) -> CallResult:
        sent = self._clock.now()
        seconds = self._duration(request)
        if self._overhead + seconds > timeout:
            await self._clock.sleep(timeout)
            self._exited.set()
            # a real worker's words (workers/process.py), but for its pid and process tree: it has neither
            raise WorkerTimeout(
                f"worker {self.index} (virtual: no process) job {request.job_id} ({request.tool}) ran past "
                f"{timeout:g}s; the worker was killed"
            )
        await self._clock.sleep(self._overhead + seconds)  # one timer: the same instants as one duration
        if request.declared_death is not None:  # it dies holding the job, as the run's did
            self._exited.set()
            raise WorkerDied(request.declared_death)
        finished = self._clock.now()
        started = max(sent, finished - seconds)  # the overhead first, then the execution
        ok, value, error = _evaluate(request, self._simulate_tools)
        if ok and request.observation_chars is not None:
            value = observation(value, request.observation_chars)
        self.jobs += 1
        # no process ran it: no CPU time or serialisation to report (null, never a made-up number)
        reply = JobReply(request.job_id, ok, value, error, started, finished, seconds, None, None)
        return CallResult(reply, sent, finished)

    async def kill(self) -> None:
        self._exited.set()

    async def wait_exit(self) -> int:
        await self._exited.wait()
        return -9

    def cpu_seconds(self) -> float | None:
        return None

    async def aclose(self) -> None:
        self._exited.set()


def _evaluate(request: JobRequest, simulate_tools: bool) -> tuple[bool, Any, str | None]:
    if request.declared_error is not None:
        return False, None, request.declared_error
    if request.declared is not None:
        return True, request.declared, None
    if request.tool == "lcb_evaluate" and simulate_tools:
        # Untrusted code is never run in a simulation; with no declared verdict a submission passes.
        tests = request.arguments.get("tests") or []
        verdict = {"passed": True, "tests_run": len(tests), "tests_total": len(tests), "timed_out": False}
        return True, {**verdict, "feedback": None}, None
    fn = grade if request.tool == "__grade__" else BUILTIN_TOOLS.get(request.tool)
    if request.tool in ("spin_ms", "sleep_ms"):
        return True, request.arguments.get("milliseconds"), None
    if fn is None and simulate_tools:
        return True, None, None
    if fn is None:
        return False, None, f"virtual worker cannot execute {request.tool!r} (not a built-in)"
    try:
        return True, fn(**request.arguments), None
    except Exception as exc:  # noqa: BLE001 - a tool error is data, as in a real worker
        return False, None, error_text(f"{type(exc).__name__}: {exc}")  # as a real worker cuts it


def virtual_factory(
    clock: Clock,
    duration: Duration = builtin_duration,
    *,
    simulate_tools: bool = False,
    replacement_startup: Sequence[float] = (),
    overhead_s: float = 0.0,
) -> Callable[[int, int], VirtualWorker]:
    """Virtual workers on ``clock``. The initial ones (generation 0) are ready at once: they start before
    the measured window. The k-th replacement (generation > 0, in the order replacements start) takes
    ``replacement_startup[k]`` seconds to start; any beyond those take their median (none given: 0).
    Each job holds its worker ``overhead_s`` before it executes."""
    startups = tuple(replacement_startup)
    beyond = statistics.median(startups) if startups else 0.0
    replacements = itertools.count()

    def factory(index: int, generation: int) -> VirtualWorker:
        startup = 0.0
        if generation > 0:
            k = next(replacements)
            startup = startups[k] if k < len(startups) else beyond
        return VirtualWorker(index, generation, clock, duration, simulate_tools, startup, overhead_s)

    return factory
