"""A continuous-batching inference-server model, driven by a :class:`~asyncroll.clock.Clock`.

One implementation for two front ends: the simulator (virtual clock) and ``serve-sim`` (real time),
which count a request's prompt the same way (:mod:`asyncroll.serve_sim.sizes`). Like vLLM's scheduler
it keeps a *running* batch of at most ``max_num_seqs`` sequences and a FCFS *waiting* queue.
Each engine step admits waiting sequences while there is room, then takes

    step_ms = step_base_ms + step_per_seq_ms × running + prefill_ms_per_token × (prompt tokens admitted)

during which every running sequence produces one token (an admitted sequence's prefill step produces its
first token). A sequence finishes after its output tokens. Starving the batch therefore costs throughput
exactly as on a GPU: a step with one sequence costs almost as much as a step with sixty.

The defaults describe a 7B-class model on one H100-class GPU under vLLM (≈ 12 ms per decode step at
batch 1, +0.08 ms per extra sequence, ≈ 33k prefill tokens/s). They are *illustrative*, not measured
here (no GPU on the development machines): calibrate them from your own server's step times.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from asyncroll.clock import Clock, VirtualClock
from asyncroll.floats import shown

COST_FIELDS = ("step_base_ms", "step_per_seq_ms", "prefill_ms_per_token")
#: The largest step or per-token cost (ms): one day, the limit of a workload's declared durations
#: (``asyncroll.workload.MAX_DURATION_MS``). Above it every request waits for days of steps: in serve-sim
#: (real time) it never comes back, and near float's limit virtual time stops.
MAX_COST_MS = 86_400_000.0
#: The lateness of a real clock's step made up beyond the step's own length: a timer's (asyncio on Linux
#: waits whole milliseconds, rounded up, so a 0.2 ms step's timer ended ≈ 0.85 ms late). A longer stall
#: of the event loop is made up only to a step's length, not in a burst of steps.
TIMER_LATENESS_S = 0.002


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class ServerModelConfig:
    """Validated for both front ends (``simulate --server batching`` and ``serve-sim``); each error names
    the flag, as both spell it."""

    max_num_seqs: int = 256
    step_base_ms: float = 12.0
    step_per_seq_ms: float = 0.08
    prefill_ms_per_token: float = 0.03

    def __post_init__(self) -> None:
        if isinstance(self.max_num_seqs, bool) or not isinstance(self.max_num_seqs, int):
            raise ValueError(f"--max-num-seqs must be an integer, got {self.max_num_seqs!r}")
        if self.max_num_seqs < 1:
            raise ValueError(f"--max-num-seqs must be >= 1, got {self.max_num_seqs}")
        for name in COST_FIELDS:
            value = getattr(self, name)
            if not math.isfinite(value):  # NaN passes every comparison below
                raise ValueError(f"{_flag(name)} must be a finite number, got {value}")
            if not 0 <= value <= MAX_COST_MS:
                raise ValueError(
                    f"{_flag(name)} must be from 0 to {MAX_COST_MS:.0f} ms (one day), got {shown(value)}"
                )
        if self.step_base_ms + self.step_per_seq_ms <= 0:
            raise ValueError(
                "--step-base-ms and --step-per-seq-ms are both 0: a step must take some time (each step "
                "decodes one token of every running sequence)"
            )


@dataclass(frozen=True, slots=True)
class Generation:
    """Timing of one request as the server saw it."""

    queued_s: float  # arrival → admitted into the running batch
    ttft_s: float  # arrival → first token
    latency_s: float  # arrival → last token
    output_tokens: int


@dataclass(frozen=True, slots=True)
class ServerSnapshot:
    running: int
    waiting: int
    peak_running: int
    steps: int
    busy_s: float
    generated_tokens: int
    prompt_tokens: int


@dataclass(slots=True)
class _Sequence:
    prompt_tokens: int
    output_tokens: int
    remaining: int
    arrived: float
    future: asyncio.Future[Generation] = field(repr=False)
    admitted: float | None = None
    first_token: float | None = None
    #: called with the tokens generated so far at the end of every step that generated one (a stream)
    on_token: Callable[[int], None] | None = field(default=None, repr=False)


class BatchingServer:
    """``stepping``: on a :class:`~asyncroll.clock.VirtualClock`, let its loop step the engine in place of
    the engine's task when nothing else could tell (:meth:`~asyncroll.clock.VirtualClock.sleep_stepping`;
    the same results for ≈ 2 µs of CPU per decode step instead of ≈ 16 µs). False: one round of the event
    loop per step, as on a real clock (tests compare the two). A real clock (serve-sim) always takes one
    round per step, so a real arrival is admitted at the next step's start, never later."""

    def __init__(self, config: ServerModelConfig, clock: Clock, *, stepping: bool = True) -> None:
        self.config = config
        self.clock = clock
        self._clock = clock
        self._stepping = clock.sleep_stepping if stepping and isinstance(clock, VirtualClock) else None
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []
        self._wake = asyncio.Event()
        self._closed = False
        self._peak = 0
        self._step_s = 0.0  # the step under way: its duration and the prompt tokens it admitted
        self._admitted = 0
        self._fresh = False  # sequences admitted at this step's start (no first token yet)
        self._decoded = 0  # steps ended in place whose tokens ``remaining`` does not count yet
        self._spare: int | None = None
        self._next = (0.0, 0.0)  # the next step's time and lateness, as _next_sleep found them
        self._due: float | None = None  # when the step under way should end (back-to-back steps)
        self._steps = 0
        self._watched = 0  # sequences in the engine with an ``on_token``: no steps in place while any
        self._busy = 0.0
        self._generated = 0
        self._prompt = 0
        self.batch_seconds = 0.0  # Σ over finished requests of their time in the running batch

    def snapshot(self) -> ServerSnapshot:
        return ServerSnapshot(
            len(self._running),
            len(self._waiting),
            self._peak,
            self._steps,
            round(self._busy, 6),
            self._generated,
            self._prompt,
        )

    async def generate(
        self, prompt_tokens: int, output_tokens: int, on_token: Callable[[int], None] | None = None
    ) -> Generation:
        """Wait for a request of this size to be served; cancelling withdraws it. ``on_token`` (a streamed
        reply) is called with the number of tokens generated so far at the end of each step that added
        one, the last call before the result."""
        tokens = max(1, output_tokens)
        seq = _Sequence(
            max(0, prompt_tokens),
            tokens,
            tokens,
            self._clock.now(),
            asyncio.get_running_loop().create_future(),
            on_token=on_token,
        )
        self._waiting.append(seq)
        self._wake.set()
        if on_token is not None:
            self._watched += 1
        try:
            return await seq.future
        except asyncio.CancelledError:  # awaiting cancels the future too: withdraw the sequence here
            if seq in self._waiting:
                self._waiting.remove(seq)
            elif seq in self._running:
                self._running.remove(seq)
            raise
        finally:
            if on_token is not None:
                self._watched -= 1

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    async def serve(self) -> None:
        """The engine loop; run it as a task of the run's task group until :meth:`close`."""
        stepping = self._stepping
        while not self._closed:
            if not self._waiting and not self._running:
                self._wake.clear()
                self._due = None  # idle: the next step starts afresh
                await self._wake.wait()
                continue
            sleep = self._start_step()
            if stepping is not None:
                await stepping(sleep, self._next_sleep, self._start_next_step)
            else:
                await self._clock.sleep(sleep)
            self._end_step()

    def _step_time(self, admitted: int) -> float:
        cfg = self.config
        return (
            cfg.step_base_ms + cfg.step_per_seq_ms * len(self._running) + cfg.prefill_ms_per_token * admitted
        ) / 1000.0

    def _late(self, start: float, step_s: float) -> float:
        # Back-to-back steps keep to their schedule: on a real clock each timer fires a little late
        # (≈ 0.4 ms here), which would otherwise add up over a request's hundreds of steps (serve-sim
        # was 15% slower than the model at 5 ms steps). At most one step's lateness is made up, or a
        # timer's (TIMER_LATENESS_S) where that is more: steps shorter than a timer's own lateness (0.2 ms
        # ones took 2.9 times the model's time) catch up over the next steps, which then sleep 0.
        if self._due is None:
            return 0.0
        return min(max(0.0, start - self._due), max(step_s, TIMER_LATENESS_S))

    def _start_step(self) -> float:
        """Admit waiting sequences while there is room and start a step; returns how long to sleep."""
        admitted = 0
        now = self._clock.now()
        while self._waiting and len(self._running) < self.config.max_num_seqs:
            seq = self._waiting.popleft()
            seq.admitted = now
            admitted += seq.prompt_tokens
            self._running.append(seq)
            self._fresh = True
            self._spare = None
        self._peak = max(self._peak, len(self._running))
        step_s = self._step_time(admitted)
        start = self._clock.now()
        late = self._late(start, step_s)
        self._due = start - late + step_s
        self._step_s = step_s
        self._admitted = admitted
        return max(0.0, step_s - late)

    def _end_step(self) -> None:
        """The step ends: every running sequence has one more token; the finished ones are answered."""
        if self._decoded:  # the steps that ended in place
            for seq in self._running:
                seq.remaining -= self._decoded
            self._decoded = 0
        self._spare = None
        self._fresh = False
        self._steps += 1
        self._busy += self._step_s
        self._prompt += self._admitted
        now = self._clock.now()
        still: list[_Sequence] = []
        for seq in self._running:
            seq.remaining -= 1
            self._generated += 1
            if seq.first_token is None:
                seq.first_token = now
            if seq.on_token is not None:
                seq.on_token(seq.output_tokens - seq.remaining)
            if seq.remaining > 0:
                still.append(seq)
            elif not seq.future.done():
                assert seq.admitted is not None
                self.batch_seconds += now - seq.admitted
                seq.future.set_result(
                    Generation(
                        round(seq.admitted - seq.arrived, 9),
                        round(seq.first_token - seq.arrived, 9),
                        round(now - seq.arrived, 9),
                        seq.output_tokens,
                    )
                )
        self._running = still

    # On a virtual clock the loop may end a step and start the next in place of the engine's task
    # (VirtualClock.sleep_stepping): when the step ending answers nobody and the next admits nobody, the
    # task would only do _end_step then _start_step. Done in place, the tokens of those steps are counted
    # in _decoded and taken from the running sequences' ``remaining`` when the task next ends a step
    # (nobody else reads it); _spare is how many more steps may end in place (None: not known).

    def _next_sleep(self) -> float | None:
        """The sleep the task would start at the end of this step, when that is all it would do: none
        to admit (no sequence waits, or the batch is full), none finishes (none to answer, no room made),
        not closed; else None."""
        if (
            self._closed
            or self._watched  # a stream sees every step's token as it ends
            or not self._running
            or (self._waiting and len(self._running) < self.config.max_num_seqs)
        ):
            return None
        if self._spare is None:
            self._spare = min(seq.remaining for seq in self._running) - self._decoded - 1
        if self._spare < 1:
            return None
        step_s = self._step_time(0)
        late = self._late(self._clock.now(), step_s)
        self._next = (step_s, late)
        return max(0.0, step_s - late)

    def _start_next_step(self) -> None:
        """:meth:`_end_step` then :meth:`_start_step`, when :meth:`_next_sleep` (just called) said that
        is all they would do."""
        now = self._clock.now()
        self._steps += 1
        self._busy += self._step_s
        self._prompt += self._admitted
        self._generated += len(self._running)
        if self._fresh:  # admitted at this step's start: this is their first token
            self._fresh = False
            for seq in self._running:
                if seq.first_token is None:
                    seq.first_token = now
        self._decoded += 1
        self._spare -= 1  # type: ignore[operator]  # _next_sleep knew it
        step_s, late = self._next
        self._due = now - late + step_s
        self._step_s = step_s
        self._admitted = 0
