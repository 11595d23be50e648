"""``--metrics-port``: the runtime's own gauges and counters for Prometheus, read at scrape time.

A custom collector (:class:`RuntimeCollector`) turns one :class:`~asyncroll.runtime.progress.RunSnapshot`
into metric families each time Prometheus scrapes; nothing is incremented in the hot path, so a run with
the exporter on schedules exactly as one without it. The snapshot is taken on the event loop's own thread
(the HTTP server answers on a thread of ``prometheus_client``), so one scrape sees one consistent instant
of every limiter.

The server binds ``127.0.0.1`` unless ``--metrics-host`` says otherwise (the numbers describe the client's
workload, not for the open network). Port 0 picks a free port; the bound address is written to
``run.json`` (``metrics``) and announced on stderr.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from asyncroll.errors import AsyncrollError
from asyncroll.runtime.progress import RunSnapshot, RunView

#: How long a scrape waits for the event loop to take the snapshot before it answers 500.
SNAPSHOT_TIMEOUT_S = 5.0
PREFIX = "asyncroll"


def listen_error(host: str, port: int) -> str | None:
    """Why :class:`MetricsExporter` could not listen on ``host``:``port`` now (None: it could), found by
    binding the way ``prometheus_client`` will: the first passive address of ``host`` (IPv4 or IPv6).
    A port in use says what to do about it."""
    import errno
    import socket

    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        with socket.create_server((host, port), family=family):
            return None
    except OSError as exc:  # create_server's strerror ends "(while attempting to bind on address ('::', 80))"
        reason = str(exc.strerror or exc).split(" (while attempting to bind", 1)[0]
        hint = "; stop what holds it, or choose another --metrics-port (0 picks a free one)"
        return f"{reason}{hint if exc.errno == errno.EADDRINUSE else ''}"


class RuntimeCollector(Collector):
    """Yields the run's gauges and counters from a fresh snapshot at every scrape."""

    def __init__(
        self,
        view: RunView,
        loop: asyncio.AbstractEventLoop | None = None,
        info: dict[str, str] | None = None,
    ) -> None:
        """``loop``: the run's event loop; snapshots are taken on it (None: read on the caller's thread).
        ``info``: static labels of the run (policy, backend) for ``asyncroll_run_info``. A value that is not
        valid text (a path's non-UTF-8 byte reaches Python as a lone surrogate, which no scrape could
        encode) has that byte shown as ``?``."""
        self._view = view
        self._loop = loop
        self._info = {k: _utf8(v) for k, v in (info or {}).items()}

    def snapshot(self) -> RunSnapshot:
        loop = self._loop
        if loop is None or loop.is_closed() or _on_loop_thread(loop):
            return self._view.snapshot()
        result: concurrent.futures.Future[RunSnapshot] = concurrent.futures.Future()

        def take() -> None:
            try:
                result.set_result(self._view.snapshot())
            except Exception as exc:  # noqa: BLE001 - handed to the scraping thread, which re-raises it
                result.set_exception(exc)

        try:
            loop.call_soon_threadsafe(take)
        except RuntimeError:  # the loop closed between the check and the call
            return self._view.snapshot()
        return result.result(timeout=SNAPSHOT_TIMEOUT_S)

    def collect(self) -> Iterator[Metric]:
        return self._families(self.snapshot())

    def describe(self) -> Iterator[Metric]:
        """The families :meth:`collect` yields, without their samples and without a snapshot: what lets a
        scrape that asks for some names (``/metrics?name[]=asyncroll_workers``) find them (the registry's
        ``auto_describe`` is off, so it would not run :meth:`collect` to learn them: the answer was empty)."""
        return self._families(None)

    def _families(self, snap: RunSnapshot | None) -> Iterator[Metric]:
        def value(read: Callable[[RunSnapshot], float]) -> float | None:
            return None if snap is None else read(snap)

        def gauge(name: str, doc: str, read: Callable[[RunSnapshot], float]) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value(read))

        def counter(name: str, doc: str, read: Callable[[RunSnapshot], float]) -> CounterMetricFamily:
            return CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value(read))

        if self._info:
            info = self._info if snap is not None else None
            yield InfoMetricFamily(f"{PREFIX}_run", "Static facts of this run.", value=info)
        yield gauge(
            "workload_trajectories", "Trajectories in the workload (after --limit).", lambda s: s.total
        )
        yield gauge(
            "active_trajectories", "Trajectories holding an admission slot.", lambda s: s.admission.holding
        )
        yield gauge("active_trajectories_limit", "--max-active-trajectories.", lambda s: s.admission.limit)
        yield gauge("model_requests_inflight", "Model requests holding a slot.", lambda s: s.model.inflight)
        yield gauge("model_requests_queued", "Model requests waiting for a slot.", lambda s: s.model.queued)
        yield gauge("model_requests_limit", "--max-inflight-model-requests.", lambda s: s.model.limit)
        yield gauge("cpu_queue_depth", "CPU jobs waiting for a worker.", lambda s: s.cpu.queued)
        yield gauge("workers_busy", "Tool workers running a job.", lambda s: s.pool.busy)
        yield gauge("workers_idle", "Tool workers ready for a job.", lambda s: s.pool.idle)
        yield gauge("workers_restarting", "Tool workers being replaced.", lambda s: s.pool.restarting)
        yield gauge("workers", "Size of the tool worker pool (--cpu-workers).", lambda s: s.pool.size)
        elapsed = None if snap is None else snap.elapsed_s  # before the start: no sample (missing, not -1)
        yield GaugeMetricFamily(
            f"{PREFIX}_measurement_elapsed_seconds",
            "Seconds since measurement start (no sample before it).",
            value=elapsed,
        )
        finished = CounterMetricFamily(
            f"{PREFIX}_trajectories_finished", "Trajectories that ended, by status.", labels=["status"]
        )
        by_status = {} if snap is None else snap.finished
        for status in sorted({"completed", "failed", *by_status}) if snap is not None else ():
            finished.add_metric([status], by_status.get(status, 0))
        yield finished
        yield counter("trajectories_completed", "Trajectories that completed.", lambda s: s.completed)
        yield counter("trajectories_failed", "Trajectories that failed.", lambda s: s.failed)
        yield counter("trajectories_started", "Trajectories admitted.", lambda s: s.admission.total_acquired)
        yield counter("model_requests", "Model requests that took a slot.", lambda s: s.model.started)
        yield counter(
            "model_requests_enqueued",
            "Model requests enqueued (waiting for a slot or beyond).",
            lambda s: s.model.requests,
        )
        yield counter(
            "model_request_failures",
            "Model requests that failed (not counting those cancelled when the run stopped).",
            lambda s: s.model.failures,
        )
        yield gauge(
            "server_unavailable",
            "1 while the inference server is unavailable (HTTP circuit open, admission paused), else 0.",
            lambda s: float(s.model.server_unavailable),
        )
        yield counter(
            "server_unavailable_events",
            "Times the inference server became unavailable (the HTTP circuit opened).",
            lambda s: s.model.server_unavailable_count,
        )
        yield counter(
            "server_unavailable_seconds",
            "Seconds the inference server was unavailable (admission paused), the current outage included.",
            lambda s: s.model.server_unavailable_s,
        )
        yield counter(
            "scheduler_decisions", "CPU dispatch decisions of the policy.", lambda s: s.cpu.decisions
        )
        yield counter(
            "scheduler_reorders", "Decisions that skipped the oldest CPU job.", lambda s: s.cpu.reorders
        )
        yield counter(
            "worker_restarts",
            "Tool workers replaced (timed out, died, or above --worker-max-rss-mb).",
            lambda s: s.pool.restarts,
        )
        yield counter(
            "event_loop_stalls",
            "Times the client's event loop woke 0.1 s or more late (held by a blocking call, or no CPU).",
            lambda s: s.loop_stalls,
        )
        yield counter(
            "event_loop_stalled_seconds",
            "Seconds the client's event loop was held in those stalls (admission, dispatch, reads waited).",
            lambda s: s.loop_stalled_s,
        )
        yield counter(
            "process_stops",
            "Times the client process was stopped (job control: Ctrl-Z, SIGSTOP) and continued; no stalls.",
            lambda s: s.process_stops,
        )
        yield counter(
            "process_stopped_seconds",
            "Seconds the client process was stopped in those stops (inside the makespan).",
            lambda s: s.process_stopped_s,
        )


def _utf8(text: str) -> str:
    """``text`` encodable as UTF-8: each lone surrogate (a byte ``os.fsdecode`` escaped) becomes ``?``."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class MetricsExporter:
    """An HTTP ``/metrics`` endpoint for one run, on its own registry (never the process-global one)."""

    def __init__(self, collector: RuntimeCollector, port: int, host: str = "127.0.0.1") -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self._requested = (host, port)
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    @property
    def host(self) -> str:
        return self._requested[0]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def start(self) -> MetricsExporter:
        """Listen now; a port in use or a bad host is a clear error naming the flag."""
        from prometheus_client import start_http_server

        host, port = self._requested
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # an IPv6 host in brackets
            raise AsyncrollError(
                f"--metrics-port {port}: cannot listen on {address}: {exc.strerror or exc}"
            ) from exc
        self.port = int(self._server.server_port)
        return self

    def describe(self) -> dict[str, Any]:
        """The ``metrics`` section of ``run.json``."""
        return {"host": self.host, "port": self.port, "url": self.url, "requested_port": self._requested[1]}

    def stop(self) -> None:
        """Stop serving and release the port (blocks briefly for the server thread)."""
        if self._server is None:
            return
        server, self._server = self._server, None
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
