"""NVTX ranges for profilers (``--nvtx``; the ``profiling`` extra, package ``nvtx``).

Nsight Systems and other NVTX consumers show these ranges on the client's timeline next to the GPU's
kernels, in the domain ``asyncroll``:

=================  ==============================================  ==========================
range              from → to                                       where
=================  ==============================================  ==========================
``run``            measurement start → end of the measured window  ``runtime/run.py``
``model wait``     request enqueued → inflight slot acquired       ``runtime/model_gate.py``
``model request``  slot acquired → response or failure             ``runtime/model_gate.py``
``cpu queue``      job enqueued → given a worker                   ``runtime/dispatcher.py``
``cpu execution``  job sent to its worker → reply (the round trip  ``runtime/dispatcher.py``
                   as the client sees it)
=================  ==============================================  ==========================

They are *process* ranges (``start_range``/``end_range``), not push/pop thread ranges: asyncio tasks
overlap on one thread, so a stack would pair the wrong starts and ends. Each range carries the request
or job id as its payload, to line it up with ``events.jsonl``.

When ``--nvtx`` is off the runtime holds :data:`NO_RANGES`, whose methods do nothing; the hot path pays
one no-op method call per range.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

RangeName = Literal["run", "model wait", "model request", "cpu queue", "cpu execution"]
DOMAIN = "asyncroll"
_COLORS: dict[RangeName, str] = {
    "run": "white",
    "model wait": "yellow",
    "model request": "green",
    "cpu queue": "orange",
    "cpu execution": "blue",
}
EXTRA_HINT = "pip install 'asyncroll[profiling]'"


class Ranges(Protocol):
    """Starts and ends named ranges; ``start`` returns the handle ``end`` takes."""

    enabled: bool

    def start(self, name: RangeName, payload: int | None = None) -> Any: ...

    def end(self, handle: Any) -> None: ...


class NoRanges:
    """The ranges of a run without ``--nvtx``: nothing at all."""

    enabled = False

    def start(self, name: RangeName, payload: int | None = None) -> Any:
        return None

    def end(self, handle: Any) -> None:
        return None


NO_RANGES = NoRanges()


class NvtxUnavailable(Exception):
    """``--nvtx`` was asked for but the ``nvtx`` package is missing."""


class NvtxRanges:
    """Real NVTX process ranges in the ``asyncroll`` domain."""

    enabled = True

    def __init__(self) -> None:
        try:
            import nvtx
        except ImportError as exc:
            raise NvtxUnavailable(f"--nvtx needs the nvtx package: {EXTRA_HINT}") from exc
        self._domain = nvtx.get_domain(DOMAIN)
        self._colors = _COLORS

    def start(self, name: RangeName, payload: int | None = None) -> Any:
        attributes = self._domain.get_event_attributes(
            message=name, color=self._colors[name], payload=payload
        )
        return self._domain.start_range(attributes)

    def end(self, handle: Any) -> None:
        # Without a profiler attached nvtx hands out a dummy domain whose handles are None.
        if handle is not None:
            self._domain.end_range(handle)


def make_ranges(enabled: bool) -> Ranges:
    """The ranges object for a run: real NVTX with ``--nvtx``, else :data:`NO_RANGES`."""
    return NvtxRanges() if enabled else NO_RANGES


def nvtx_missing() -> str | None:
    """Why ``--nvtx`` cannot work here, or None. Imports the package (only asked with ``--nvtx``): a
    package that is found but fails to import must be refused at validation, not after the run's
    directory exists."""
    try:
        import nvtx  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - a broken install may raise anything (OSError from its library)
        return f"--nvtx needs the nvtx package: {EXTRA_HINT} (import failed: {exc})"
    return None
