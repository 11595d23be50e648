"""The telemetry sampler: a probe before the measurement clock, then a sample every interval.

Lifecycle inside a run (``asyncroll/runtime/run.py``)::

    probe()   before measurement_started: one read of each requested source → ``resource_probe``
              (available or not, and why not); sources that failed are not sampled again
    run()     a task of the run's task group: a ``resource_sample`` for each point of a fixed grid of
              ``--telemetry-interval`` from measurement start (t = 0 the first, ``late_s`` how late it
              began; a late sample does not shift the next ones; missed slots are skipped and show up
              as a longer gap)
    stop()    after the measured window closed: one last sample, so the tail of the run is covered,
              then the sources are closed

It never crashes a run: every exception while sampling is caught, written into that sample's
``errors`` and counted; the sampler goes on. Should the sampling loop itself break (a bug), or a sample
fail to be emitted, sampling stops or that sample is lost, and the final sample's ``errors`` says so.
Cancellation always propagates. It never holds a run up either: a server read is bounded by its own
deadline (``ServerMetricsSource.deadline_s``), an NVML read runs in a thread and is given up after
:data:`~asyncroll.telemetry.nvml.READ_LIMIT_S` (a stuck one is not read again; the probe, NVML's init,
after :data:`~asyncroll.telemetry.nvml.PROBE_LIMIT_S`, the source then unavailable), and ``stop()`` waits
for the loop at most that long plus :data:`STOP_MARGIN_S` before cancelling it (the run's cleanup is
shielded from a signal, so an unbounded wait there would outlast SIGTERM).

Sources: the server's ``/metrics`` (``--metrics-url``; with ``--backend vllm`` or a declared vLLM/SGLang
``--server-kind`` it defaults to ``<endpoint>/metrics``; the names are those of the declared kind, else
detected from the text) and NVML (``--nvml-device``). On a virtual clock (simulation) no source is read:
real readings would not line up with virtual time.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from asyncroll.clock import Clock
from asyncroll.event_log import EventLog
from asyncroll.events import ResourceProbe, ResourceSample, SourceStatus
from asyncroll.telemetry import REQUESTED_BY, nvml
from asyncroll.telemetry.nvml import NvmlSource, NvmlStuck, NvmlUnavailable
from asyncroll.telemetry.server_metrics import FlavorSetting, MetricsUnavailable, ServerMetricsSource

if TYPE_CHECKING:
    from asyncroll.config import RunConfig

#: ``ServerSample`` null keys → ``ResourceSample`` field names.
SERVER_FIELDS = {
    "running": "server_running",
    "waiting": "server_waiting",
    "kv_cache_usage": "kv_cache_usage",
    "prompt_tokens": "prompt_tokens_per_s",
    "generation_tokens": "generation_tokens_per_s",
}
GPU_FIELDS = ("gpu_util_pct", "gpu_mem_util_pct", "gpu_mem_used_bytes", "gpu_mem_total_bytes")
PROBE_TIMEOUT_S = 5.0
#: The longest a server read may take, whatever the interval: a /metrics read takes milliseconds, and a
#: frozen server with ``--telemetry-interval 60`` held the run's start (the probe) and its end (the
#: last read) for minutes each.
MAX_READ_TIMEOUT_S = 10.0
#: How much longer than a read's deadline ``stop()`` waits for the sampling loop, and the final sample.
STOP_MARGIN_S = 0.5


def metrics_url(cfg: RunConfig) -> str | None:
    """``--metrics-url``; else ``<endpoint>/metrics`` for ``--backend vllm`` (SPEC §4.1) or a declared
    vLLM/SGLang ``--server-kind``; else None (nothing is assumed of another server)."""
    if not cfg.telemetry:
        return None
    if cfg.metrics_url is not None:
        return cfg.metrics_url
    if metrics_flavor(cfg) != "auto":
        return cfg.endpoint.rstrip("/") + "/metrics"
    return None


def metrics_flavor(cfg: RunConfig) -> FlavorSetting:
    """The metric names to read: those of the declared server kind (``--server-kind vllm|sglang``, or
    ``--backend vllm``), else detected from the text at the probe."""
    kind = cfg.declared_server_kind
    return "vllm" if kind == "vllm" else "sglang" if kind == "sglang" else "auto"


class TelemetrySampler:
    """Probes and samples the requested sources, emitting ``resource_probe``/``resource_sample``."""

    def __init__(
        self,
        clock: Clock,
        events: EventLog,
        *,
        interval: float,
        server: ServerMetricsSource | None = None,
        nvml: NvmlSource | None = None,
        enabled: bool = True,
        gpu_off_loop: bool = True,
    ) -> None:
        self._clock = clock
        self._events = events
        self.interval = interval
        self.enabled = enabled
        self._server = server
        self._nvml = nvml
        # NVML read in a thread of its own (a real run); False: on the loop, taking exactly the time its
        # reading advances a scripted clock (tests of what the samples record)
        self._gpu_off_loop = gpu_off_loop
        self._server_on = False
        self._nvml_on = False
        self._statuses: list[SourceStatus] = []
        self._seq = 0
        self.samples = 0
        self.errors = 0
        self.failed = False  # the sampling loop itself broke (a bug): no further samples
        # what went wrong outside any sample's sources (the loop broke, a sample could not be emitted):
        # said in the final sample's ``errors``, so that a gap in the samples comes with its reason
        self._broke: str | None = None
        self._unemitted = 0
        self._stop = asyncio.Event()
        self._running = False
        self._finished = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.probed = False  # probe() ran to its end (sources requested or not): the run did not stop first
        self._probing = False  # probe() began (a stop during it leaves ``probed`` False)

    @classmethod
    def from_config(cls, cfg: RunConfig, clock: Clock, events: EventLog) -> TelemetrySampler:
        url = metrics_url(cfg)
        server = None
        if url is not None:
            timeout = min(max(1.0, 3 * cfg.telemetry_interval), MAX_READ_TIMEOUT_S)
            server = ServerMetricsSource(url, flavor=metrics_flavor(cfg), model=cfg.model, timeout=timeout)
        nvml = NvmlSource(cfg.nvml_device) if cfg.telemetry and cfg.nvml_device is not None else None
        return cls(
            clock, events, interval=cfg.telemetry_interval, server=server, nvml=nvml, enabled=cfg.telemetry
        )

    @property
    def sampling(self) -> bool:
        """Whether any source answered the probe (and so samples will be taken)."""
        return self._server_on or self._nvml_on

    @property
    def statuses(self) -> list[SourceStatus]:
        return list(self._statuses)

    async def probe(self) -> None:
        """Read each requested source once, before the clock starts; emit ``resource_probe`` (only when
        a source was requested: a run without telemetry sources carries no telemetry events)."""
        self._probing = True
        if not self.enabled or (self._server is None and self._nvml is None):
            self.probed = True
            return
        statuses: list[SourceStatus] = []
        virtual = "not read on a virtual clock (simulation): real readings would not line up with its time"
        if self._server is not None:
            began = self._clock.now()
            reason: str | None = virtual if self._clock.virtual else None
            detail: dict[str, Any] = {"url": self._server.url}
            if reason is None:
                try:
                    detail = await self._server.probe(max(self._server.timeout, PROBE_TIMEOUT_S))
                    self._server_on = True
                except MetricsUnavailable as exc:
                    reason = str(exc)
                except Exception as exc:  # noqa: BLE001 - telemetry never crashes a run; reported instead
                    reason = f"{type(exc).__name__}: {exc}"
            statuses.append(
                SourceStatus(
                    source="server_metrics",
                    available=self._server_on,
                    reason=reason,
                    collection_s=round(self._clock.now() - began, 6),
                    detail=detail,
                )
            )
        if self._nvml is not None:
            began = self._clock.now()
            reason = virtual if self._clock.virtual else None
            detail = {"index": self._nvml.index}
            if reason is None:
                try:
                    off_loop = self._gpu_off_loop
                    detail = await self._nvml.probe_off_loop() if off_loop else self._nvml.probe()
                    self._nvml_on = True
                except NvmlUnavailable as exc:
                    reason = str(exc)
                except Exception as exc:  # noqa: BLE001 - telemetry never crashes a run; reported instead
                    reason = f"{type(exc).__name__}: {exc}"
            statuses.append(
                SourceStatus(
                    source="nvml",
                    available=self._nvml_on,
                    reason=reason,
                    collection_s=round(self._clock.now() - began, 6),
                    detail=detail,
                )
            )
        self._statuses = statuses
        self.probed = True
        self._events.emit(ResourceProbe(interval_s=self.interval, sources=statuses))

    def receipt(self) -> dict[str, Any]:
        """The ``telemetry`` section of ``run.json``."""
        return {
            "requested": self.enabled,
            "interval_s": self.interval,
            "sources": [s.model_dump(mode="json") for s in self._statuses],
            "note": None if self._statuses else self.no_source_note(),
        }

    def no_source_note(self) -> str:
        """Why no source was probed, for the run as configured (``note`` of run.json's and summary.json's
        ``telemetry`` sections when ``sources`` is empty)."""
        if not self.probed:
            return f"not probed: the run stopped {'during' if self._probing else 'before'} the probe"
        if not self.enabled:
            return "telemetry off (--no-telemetry)"
        if self._clock.virtual:
            return "a simulation (virtual clock) reads no server or GPU telemetry"
        return f"no telemetry source requested ({REQUESTED_BY})"

    async def run(self) -> None:
        """Sample on a fixed grid until :meth:`stop`. Never raises, except on cancellation: a failure
        of a source is recorded in its sample; a failure of the loop itself (a bug) is counted in
        ``errors``, sets ``failed`` and ends sampling, not the run."""
        if not self.sampling:
            return
        self._running = True
        self._task = asyncio.current_task()
        try:
            await self._loop()
        except Exception as exc:  # noqa: BLE001 - telemetry never crashes a run
            self.errors += 1
            self.failed = True
            self._broke = (
                f"sampler: the sampling loop broke after sample {self._seq} ({type(exc).__name__}: {exc}): "
                "no sample between that one and this last one"
            )
        finally:
            self._finished.set()

    async def _loop(self) -> None:
        clock = self._clock
        # The grid starts at the measurement's start (its first sample is the one at t = 0), not when
        # this task first ran: a loaded loop runs the trajectories first, and that delay is late_s.
        origin = self._events.origin
        start = clock.now() if origin is None else origin
        slot = 0
        while not self._stop.is_set():
            await self._sample(late=max(0.0, clock.now() - (start + slot * self.interval)))
            slot += 1
            now = clock.now()
            due = start + slot * self.interval
            if now > due:  # the sample overran its slot: skip to the next grid point still ahead
                missed = int((now - due) // self.interval) + 1
                slot += missed
                due = start + slot * self.interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=max(0.0, due - now))

    @property
    def stop_limit_s(self) -> float:
        """The longest :meth:`stop` waits for the loop to leave, and then for the final server read."""
        read = self._server.deadline_s if self._server_on and self._server is not None else 0.0
        if self._nvml_on and self._gpu_off_loop:  # a sample reads the GPU after the server
            read += nvml.READ_LIMIT_S
        return read + STOP_MARGIN_S

    async def stop(self) -> None:
        """End sampling: wait for the loop to leave, take one last sample, close the sources. Bounded:
        a loop still inside a read after :attr:`stop_limit_s` is cancelled (its source is stuck, so the
        final sample does not read it again but records why), and the final read has the same limit."""
        self._stop.set()
        if self._running:
            limit = self.stop_limit_s
            stuck: str | None = None
            if not await self._loop_left(limit):  # counted once, in the final sample's errors
                stuck = f"sampling did not stop within {limit:g} s (a read hung); cancelled, not read again"
            await self._sample(late=None, limit=limit, stuck=stuck, notes=self._notes())
        await self.aclose()

    def _notes(self) -> list[str]:
        """What the final sample says of the samples that were never taken or never recorded."""
        notes = [] if self._broke is None else [self._broke]
        if self._unemitted:
            lost = self._unemitted
            notes.append(f"sampler: {lost} sample(s) could not be recorded (emitting the event failed)")
        return notes

    async def _loop_left(self, limit: float) -> bool:
        """Whether the sampling loop left within ``limit`` s; if not, it is cancelled (and awaited)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(limit):
                await self._finished.wait()
            return True
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=STOP_MARGIN_S)  # never raises its CancelledError
        return False

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._nvml is not None:
            self._nvml.close()
        if self._server is not None:
            await self._server.aclose()

    async def _sample(
        self,
        late: float | None,
        limit: float | None = None,
        stuck: str | None = None,
        notes: list[str] | None = None,
    ) -> None:
        """Collect one sample from every available source and emit it; count and record any failure.
        ``limit`` bounds the server read (beyond its own deadline); ``stuck`` skips it, saying why;
        ``notes``: the sampler's own failures, among the sample's errors."""
        self._seq += 1
        values: dict[str, Any] = {}
        nulls: dict[str, str] = {}
        errors: list[str] = list(notes or ())
        timing: dict[str, float] = {}
        clock = self._clock
        if self._server_on and self._server is not None:
            began = clock.now()
            try:
                if stuck is not None:
                    raise _Skipped(stuck)
                async with asyncio.timeout(limit):  # None: the source's own deadline bounds the read
                    got = await self._server.read(clock.now)
                values.update(
                    server_running=got.running,
                    server_waiting=got.waiting,
                    kv_cache_usage=got.kv_cache_usage,
                    prompt_tokens_per_s=got.prompt_tokens_per_s,
                    generation_tokens_per_s=got.generation_tokens_per_s,
                    counter_resets=got.counter_resets,
                )
                nulls.update({SERVER_FIELDS[k]: v for k, v in got.nulls.items()})
                if got.error is not None:
                    nulls.update(dict.fromkeys(SERVER_FIELDS.values(), "error"))
                    errors.append(f"server_metrics: {got.error}")
            except Exception as exc:  # noqa: BLE001 - a sampler bug must not end the run; recorded
                nulls.update(dict.fromkeys(SERVER_FIELDS.values(), "error"))
                if isinstance(exc, _Skipped):
                    errors.append(f"server_metrics: {exc}")
                elif isinstance(exc, TimeoutError) and limit is not None:
                    errors.append(f"server_metrics: no sample within {limit:g} s")
                else:
                    errors.append(f"server_metrics: {type(exc).__name__}: {exc}")
            timing["server_metrics"] = round(clock.now() - began, 6)
        if self._nvml_on and self._nvml is not None:
            began = clock.now()
            try:
                gpu = await self._nvml.read_off_loop() if self._gpu_off_loop else self._nvml.read()
                values.update(
                    gpu_util_pct=gpu.util_pct,
                    gpu_mem_util_pct=gpu.mem_util_pct,
                    gpu_mem_used_bytes=gpu.mem_used_bytes,
                    gpu_mem_total_bytes=gpu.mem_total_bytes,
                )
                nulls.update(gpu.nulls)
                if gpu.error is not None:
                    errors.append(f"nvml: {gpu.error}")
            except NvmlStuck as exc:
                nulls.update(dict.fromkeys(GPU_FIELDS, "error"))
                errors.append(f"nvml: {exc}")
            except Exception as exc:  # noqa: BLE001 - a sampler bug must not end the run; recorded
                nulls.update(dict.fromkeys(GPU_FIELDS, "error"))
                errors.append(f"nvml: {type(exc).__name__}: {exc}")
            timing["nvml"] = round(clock.now() - began, 6)
        self.errors += len(errors)
        try:
            self._events.emit(
                ResourceSample(
                    seq=self._seq,
                    collection_s=timing,
                    nulls=nulls,
                    errors=[e[:500] for e in errors],
                    late_s=None if late is None else round(late, 6),
                    **values,
                )
            )
            self.samples += 1
        except Exception:  # noqa: BLE001 - e.g. a subscriber failed: counted, and sampling goes on
            self.errors += 1
            self._unemitted += 1


class _Skipped(Exception):
    """The server source hung in the loop's last read: the final sample does not read it again."""
