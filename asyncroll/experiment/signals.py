"""The runner's signal handling: the first SIGINT/SIGTERM/SIGHUP interrupts the arm, later ones wait."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType, TracebackType
from typing import Any

from asyncroll.cli_signals import put_back
from asyncroll.experiment.arms import ExperimentInterrupted


class SignalGuard:
    """SIGINT/SIGTERM/SIGHUP → ``ExperimentInterrupted``, once. A later signal (a second Ctrl-C while the
    arm's server and client are being stopped) is counted and otherwise ignored, so that cleanup always
    runs to its end; nothing is printed from the handler (it may land in the middle of a write)."""

    #: SIGHUP (the terminal or ssh session closed) is handled as SIGTERM: the arm's processes, each in
    #: its own session, would not get it and would keep running (and holding the GPU). Unless the runner
    #: was started ignoring it (``nohup``): then it stays ignored, and the experiment goes on.
    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def __init__(self) -> None:
        self.received: str | None = None
        self.ignored = 0
        self._previous: dict[signal.Signals, Any] = {}
        self._defer = False
        self._deferred = False

    def __enter__(self) -> SignalGuard:
        for sig in self.SIGNALS:
            previous = signal.getsignal(sig)
            if sig == signal.SIGHUP and previous == signal.SIG_IGN:
                continue  # nohup: the caller asked that a hangup not stop the experiment
            self._previous[sig] = previous
            signal.signal(sig, self._handle)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for sig, handler in self._previous.items():
            put_back(sig, handler)

    def hold(self) -> None:
        """From now on every signal is counted and ignored (the runner is already winding down)."""
        if self.received is None:
            self.received = "none (winding down)"

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Inside, the first signal is recorded, not raised: :meth:`raise_deferred` raises it after."""
        self._defer = True
        try:
            yield
        finally:
            self._defer = False

    def raise_deferred(self) -> None:
        """Raise the interrupt a :meth:`deferred` stretch recorded, if any."""
        if self._deferred:
            self._deferred = False
            raise ExperimentInterrupted(str(self.received))

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is not None:
            self.ignored += 1
            return
        self.received = signal.Signals(signum).name
        if self._defer:
            self._deferred = True
            return
        raise ExperimentInterrupted(self.received)
