"""A signal handler installed from outside Python (C code, a program embedding Python) reads as ``None``
(:func:`signal.getsignal`), which :func:`signal.signal` refuses: every place that puts a stop signal's
handler back gives the OS default instead, not a TypeError raised over the command's own outcome."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest

from asyncroll.serve_sim import server
from asyncroll.serve_sim.config import SimConfig


@pytest.fixture
def sigterm_from_c(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """SIGTERM's handler as a C-installed one reads: ``None`` from getsignal and from the first
    signal.signal that replaces it (the real handler stays SIG_DFL underneath)."""
    real_signal, real_getsignal = signal.signal, signal.getsignal
    before = real_getsignal(signal.SIGTERM)
    replaced: list[Any] = []

    def fake_signal(sig: int, handler: Any) -> Any:
        old = real_signal(sig, handler)
        if sig == signal.SIGTERM and not replaced:
            replaced.append(handler)
            return None
        return old

    def fake_getsignal(sig: int) -> Any:
        return None if sig == signal.SIGTERM and not replaced else real_getsignal(sig)

    monkeypatch.setattr(signal, "signal", fake_signal)
    monkeypatch.setattr(signal, "getsignal", fake_getsignal)
    try:
        yield
    finally:
        real_signal(signal.SIGTERM, before)


@pytest.mark.usefixtures("sigterm_from_c")
def test_the_experiment_guard_leaves_the_os_default_for_a_foreign_handler() -> None:
    from asyncroll.experiment.signals import SignalGuard

    with SignalGuard():
        pass
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


@pytest.mark.usefixtures("sigterm_from_c")
@pytest.mark.timeout(30)
def test_serve_sim_leaves_the_os_default_for_a_foreign_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its start-up failing here: the TypeError of putting ``None`` back replaced the failure's own error."""

    def failed_start(*args: object, **kwargs: object) -> object:
        raise RuntimeError("the server did not start")

    monkeypatch.setattr(server, "start_thread", failed_start)
    with pytest.raises(RuntimeError, match="did not start"):
        server.serve_forever(SimConfig(), "127.0.0.1", 0)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
