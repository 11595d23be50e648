"""Retry policy and the server circuit of the HTTP backend.

Retries follow the OpenAI Python client: only 408, 409, 429, any status ≥ 500, connection errors and
timeouts are retried; the delay is ``min(base × 2^(attempt-1), max_delay)`` scaled by a jitter in
``[0.75, 1]``; a ``retry-after-ms`` or ``retry-after`` header (seconds or an HTTP date, GMT in each of
its three forms) replaces it, capped at ``max_delay`` (a negative or NaN value asks for nothing: the
backoff stands). Retries are off unless ``--max-retries`` asks for them.

The :class:`Circuit` is how a server that stays down pauses the run instead of failing every trajectory:
after ``--circuit-failures`` consecutive *unavailable* failures (no connection, a reset, 502/503/504, or a
reply that never came within ``--request-timeout`` from a server whose health probe then fails too — a frozen
server, as against a slow one that still answers it; any other answer from the server — a 200, a 429, a
500 — ends the run of them) it opens;
while open, admission admits no new trajectory and requests wait before their next attempt; a probe of
``GET /health`` (``/v1/models`` where a server has no ``/health``) closes it again, and a circuit open
longer than ``--server-down-timeout`` fails the run.
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass

RETRYABLE_STATUS = frozenset({408, 409, 429})
UNAVAILABLE_STATUS = frozenset({502, 503, 504})
RETRYABLE_KINDS = frozenset({"transport", "timeout"})


def is_retryable(kind: str, status: int | None) -> bool:
    """The OpenAI client's retryable set: 408, 409, 429, ≥ 500, connection errors, timeouts."""
    if kind in RETRYABLE_KINDS:
        return True
    return kind == "http_status" and status is not None and (status in RETRYABLE_STATUS or status >= 500)


def means_unavailable(kind: str, status: int | None) -> bool:
    """Failures that say the server is not there (as opposed to busy, slow or wrong). A connect that
    timed out (kind ``timeout``) says so too; the HTTP backend counts it apart, knowing the phase."""
    return kind == "transport" or (status is not None and status in UNAVAILABLE_STATUS)


def retry_after_s(headers: Mapping[str, str] | None, now_epoch: float | None = None) -> float | None:
    """The server's requested delay from ``retry-after-ms`` or ``retry-after``, if it gave a usable one."""
    if not headers:
        return None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            value = float(raw_ms) / 1000.0
        except ValueError:
            value = -1.0
        if value >= 0:
            return value + 0.0  # -0 (a "-0" header) is 0: events would show "delay_s": -0.0
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        pass
    else:  # a negative or NaN delay is no delay the server asked for (as in retry-after-ms): backoff
        return seconds + 0.0 if seconds >= 0 else None
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError, OverflowError):  # a day, hour or zone past a C int: OverflowError
        return None
    if when.tzinfo is None:  # asctime (or '-0000') names no zone: an HTTP-date is GMT, not local time
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, when.timestamp() - (time.time() if now_epoch is None else now_epoch))


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 0
    base_delay: float = 0.5
    max_delay: float = 8.0

    def delay(self, attempt: int, rng: random.Random, headers: Mapping[str, str] | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        asked = retry_after_s(headers)
        if asked is not None:
            return min(asked, self.max_delay)
        backoff = min(self.base_delay * 2.0 ** (attempt - 1), self.max_delay)
        return backoff * (1.0 - 0.25 * rng.random())


@dataclass(frozen=True, slots=True)
class CircuitSnapshot:
    open: bool
    consecutive_failures: int
    opened: int
    open_since: float | None


class Circuit:
    """Counts consecutive unavailable failures; open = admission and new attempts wait."""

    def __init__(self, threshold: int) -> None:
        """``threshold`` 0 disables the circuit (it never opens)."""
        self.threshold = threshold
        self._failures = 0
        self._opened = 0
        self._open_since: float | None = None
        self._closed = asyncio.Event()
        self._closed.set()
        self._opened_event = asyncio.Event()

    @property
    def is_open(self) -> bool:
        return not self._closed.is_set()

    def snapshot(self) -> CircuitSnapshot:
        return CircuitSnapshot(self.is_open, self._failures, self._opened, self._open_since)

    def record_success(self) -> None:
        self._failures = 0

    def record_failure(self, unavailable: bool, answered: bool, now: float) -> bool:
        """One failed attempt: an unavailable one counts (returns True if it opened the circuit); one the
        server answered (a 429, a 500: it is there) ends a run of them, as a success does."""
        if unavailable:
            return self.record_unavailable(now)
        if answered:
            self.record_success()
        return False

    def record_unavailable(self, now: float) -> bool:
        """Count one unavailable failure; returns True if this one opened the circuit."""
        self._failures += 1
        if self.threshold and self._failures >= self.threshold and not self.is_open:
            self._opened += 1
            self._open_since = now
            self._closed.clear()
            self._opened_event.set()
            return True
        return False

    def close(self) -> None:
        self._failures = 0
        self._open_since = None
        self._opened_event.clear()
        self._closed.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def wait_opened(self) -> None:
        await self._opened_event.wait()
