"""The serve-sim command and its settings: values no server could serve are refused (in the settings and
on the command line, exit 2), a port it cannot listen on is a usage error, and the real command prints
its port and stops on SIGTERM or SIGHUP."""

from __future__ import annotations

import math
import signal
import socket
import subprocess
import sys
import threading
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from asyncroll.backends.server_model import ServerModelConfig
from asyncroll.serve_sim.config import FaultConfig, SimConfig
from tests.children import end
from tests.conftest import invoke


def test_fault_rates_are_validated() -> None:
    with pytest.raises(ValueError, match=r"--rate-503 must be in \[0, 1\]"):
        FaultConfig(rate_503=1.5)
    with pytest.raises(ValueError, match="--metrics-flavor"):
        SimConfig(metrics_flavor="tgi")  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_settings_are_refused(value: float) -> None:
    # NaN passed every `< 0` check: the server started, and /sim/stats failed after one request
    for name in ("slow_s", "retry_after_s", "rate_429", "slow_rate"):
        flag = "--retry-after" if name == "retry_after_s" else "--" + name.replace("_", "-")
        with pytest.raises(ValueError, match=f"{flag} must be a finite number"):
            FaultConfig(**{name: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="--chars-per-token must be a finite number"):
        SimConfig(chars_per_token=value)
    for name in ("step_base_ms", "step_per_seq_ms", "prefill_ms_per_token"):
        flag = "--" + name.replace("_", "-")
        with pytest.raises(ValueError, match=f"{flag} must be a finite number"):
            SimConfig(engine=ServerModelConfig(**{name: value}))  # type: ignore[arg-type]


@pytest.mark.timeout(30)
@pytest.mark.usefixtures("sighup_not_ignored")
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_cli_subprocess_prints_the_port_and_stops_on_sigterm(stop: signal.Signals) -> None:
    """A hangup (the terminal closed) stops it as SIGTERM does: gracefully, exit 0. It raised the CLI's
    KeyboardInterrupt instead: exit 130, and the server thread died with the process, no grace."""
    cmd = [
        sys.executable,
        "-m",
        "asyncroll.cli",
        "serve-sim",
        "--port",
        "0",
        "--model",
        "m",
        "--step-base-ms",
        "1",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("serve-sim listening on http://127.0.0.1:"), line
        url = line.split()[3]
        port = int(url.rsplit(":", 1)[1])
        assert port > 0 and f"port {port}" in line
        with httpx.Client(base_url=url, timeout=10) as client:
            assert client.get("/health").status_code == 200
            r = client.post(
                "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            )
            assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 1
        proc.send_signal(stop)
        _, stderr = proc.communicate(timeout=15)
        assert proc.returncode == 0, stderr
    finally:
        end(proc)


@pytest.mark.timeout(30)
def test_cli_refuses_bad_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked in this process, with the server replaced by a recorder: a setting let through would be
    seen, never served (the real command: test_cli_subprocess_prints_the_port_and_stops_on_sigterm)."""
    import asyncroll.serve_sim.server as server_module

    served: list[SimConfig] = []

    def recorder(sim: SimConfig, *_a: Any, **_k: Any) -> int:
        served.append(sim)
        return 0

    monkeypatch.setattr(server_module, "serve_forever", recorder)
    for args, needle in (
        (["--rate-429", "2"], "--rate-429 must be in [0, 1]"),
        (["--invalid-action-rate", "0.5"], "needs --no-enforce-schema"),
        (["--metrics-flavor", "tgi"], "--metrics-flavor must be vllm or sglang"),
        (["--step-base-ms", "0", "--step-per-seq-ms", "0"], "a step must take some time"),
        # a step of 1e297 s: every request waited for ever (the client timed out), with no error
        (["--step-base-ms", "1e300"], "--step-base-ms must be from 0 to 86400000 ms (one day), got 1e+300"),
        (["--prefill-ms-per-token", "-1"], "--prefill-ms-per-token must be from 0 to 86400000 ms"),
        (["--max-num-seqs", "0"], "--max-num-seqs must be >= 1, got 0"),
        (["--step-base-ms", "nan"], "--step-base-ms must be a finite number"),
        (["--prefill-ms-per-token", "inf"], "--prefill-ms-per-token must be a finite number"),
        (["--slow-s", "inf"], "--slow-s must be a finite number"),
        (["--retry-after", "-inf"], "--retry-after must be a finite number"),
        (["--chars-per-token", "nan"], "--chars-per-token must be a finite number"),
        # started, then answered every chat request 500 (OverflowError sizing the prompt); simulate
        # --server batching, the same server model, refused it
        (["--chars-per-token", "1e-310"], "--chars-per-token must be >= 0.01, got 1e-310"),
        (["--chars-per-token", "0.001"], "--chars-per-token must be >= 0.01, got 0.001"),
        (["--log-level", "bogus"], "--log-level must be one of critical, error, warning, info, debug, trace"),
        # served, with the KV gauge pinned at 1.0, where vLLM refuses to start: no sequence of the
        # context length fits in the cache
        (["--kv-cache-tokens", "1000"], "--max-model-len 32768 is larger than the KV cache holds"),
        # served with the setting unread: no request is answered 429 or delayed
        (["--retry-after", "3"], "--retry-after needs --rate-429 (no request is answered 429)"),
        (["--slow-s", "5"], "--slow-s needs --slow-rate (no request is delayed)"),
        (["--retry-after", "3", "--rate-429", "0"], "--retry-after needs --rate-429"),
    ):
        result = invoke("serve-sim", "--port", "0", *args)
        assert result.exit_code == 2 and not served, (args, result.output)
        assert needle in result.stderr
    assert invoke("serve-sim", "--port", "0").exit_code == 0 and len(served) == 1  # the recorder works
    for args in (["--retry-after", "3", "--rate-429", "0.1"], ["--slow-s", "5", "--slow-rate", "0.5"]):
        assert invoke("serve-sim", "--port", "0", *args).exit_code == 0, args
    assert served[1].faults.retry_after_s == 3 and served[2].faults.slow_s == 5


@pytest.mark.timeout(30)
def test_a_port_it_cannot_listen_on_is_a_usage_error_as_for_run() -> None:
    """A port in use exited 1 (a failed run, by the CLI's codes) where ``run --metrics-port`` and the
    experiment pre-flight give 2 for the same thing: nothing was started, the flag was unusable."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = invoke("serve-sim", "--port", str(port))
    assert result.exit_code == 2, result.output
    assert f"error: cannot listen on 127.0.0.1:{port}: " in result.stderr


@pytest.mark.timeout(30)
def test_an_ipv6_address_it_cannot_listen_on_is_written_in_brackets() -> None:
    """It said "cannot listen on ::1:33765", an address no URL or client reads."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    with socket.socket(socket.AF_INET6) as holder:
        try:
            holder.bind(("::1", 0))
        except OSError as exc:
            pytest.skip(f"::1 cannot be bound here: {exc}")
        holder.listen()
        port = holder.getsockname()[1]
        result = invoke("serve-sim", "--host", "::1", "--port", str(port))
    assert result.exit_code == 2, result.output
    assert f"error: cannot listen on [::1]:{port}: " in result.stderr, result.stderr


def test_help_names_every_endpoint_the_server_routes() -> None:
    """`serve-sim --help` lists the endpoints: every route the app serves, with its method (it left out
    GET /version and POST /sim/reset-stats, which docs/SERVERS.md documents)."""
    from starlette.routing import Route

    from asyncroll.serve_sim.app import SimApp

    routes = [r for r in SimApp(SimConfig()).app.routes if isinstance(r, Route)]
    assert len(routes) >= 7
    text = " ".join(invoke("serve-sim", "--help").output.split())  # help text rewrapped to one line
    for route in routes:
        methods = sorted((route.methods or set()) - {"HEAD"})
        for method in methods:
            assert f"{method} {route.path}" in text, (method, route.path)


class _OneOwnerLock:
    """A lock that refuses its own holder (a plain Lock would hang it), as a signal handler run in the
    middle of ``Event.wait`` is: that thread already holds the Event's lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        assert self._owner != threading.get_ident(), "the lock's holder took it again: it would hang"
        got = self._lock.acquire(blocking, timeout)
        if got:
            self._owner = threading.get_ident()
        return got

    def release(self) -> None:
        self._owner = None
        self._lock.release()

    def _is_owned(self) -> bool:
        return self._owner == threading.get_ident()

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_a_stop_signal_while_waiting_never_takes_the_lock_the_wait_holds(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """serve-sim's SIGTERM handler set the Event its main thread waits on: a signal that landed while
    ``Event.wait`` held the Event's own lock hung the server for good (seen once on Python 3.12)."""
    from asyncroll.serve_sim import server

    def start_thread(sock: socket.socket, sim: Any, uv: Any, *, done: threading.Event) -> Any:
        cond = threading.Condition(_OneOwnerLock())  # type: ignore[arg-type]
        setattr(done, "_cond", cond)  # noqa: B010 (private: what Event.wait and Event.set hold)
        with cond:  # as inside done.wait(), between taking the lock and sleeping
            handler = signal.getsignal(signal.SIGTERM)
            assert callable(handler)
            handler(signal.SIGTERM, None)  # what Python runs at the wait's next bytecode
        return SimpleNamespace(url="http://127.0.0.1:1")

    monkeypatch.setattr(server, "open_files_for_server", lambda: 0)
    monkeypatch.setattr(server, "start_thread", start_thread)
    monkeypatch.setattr(server, "stop", lambda running, timeout, **_: None)
    assert server.serve_forever(SimConfig(), "127.0.0.1", 0) == 0
    assert capsys.readouterr().out.startswith("serve-sim listening on http://127.0.0.1:1 ")


def test_the_commands_defaults_are_the_simulators_own() -> None:
    """serve-sim's flags and simulate's help state the engine's defaults as literals (importing the
    simulator would slow ``--help``); each must be the value the dataclasses hold, or --help lies."""
    import inspect

    from asyncroll.commands.serve import serve_sim
    from asyncroll.commands.simulate import simulate
    from asyncroll.commands.simulate_flags import DEFAULT_JITTER, DEFAULT_SEEDS, MAX_JITTER
    from asyncroll.simulation.engine import SimulationSettings
    from asyncroll.simulation.sweep import MAX_SEEDS

    flags = {n: p.default for n, p in inspect.signature(serve_sim).parameters.items() if n != "ctx"}
    sim, engine, faults = SimConfig(), ServerModelConfig(), FaultConfig()
    held: dict[str, Any] = {
        "model": sim.model,
        "chars_per_token": sim.chars_per_token,
        "kv_cache_tokens": sim.kv_cache_tokens,
        "max_model_len": sim.max_model_len,
        "metrics_flavor": sim.metrics_flavor,
        "enforce_schema": sim.enforce_schema,
        "seed": sim.seed,
        "retry_after": faults.retry_after_s,
    }
    for name in ("max_num_seqs", "step_base_ms", "step_per_seq_ms", "prefill_ms_per_token"):
        held[name] = getattr(engine, name)
    for name in ("rate_429", "rate_500", "rate_503", "reset_rate", "truncate_rate", "malformed_rate"):
        held[name] = getattr(faults, name)
    for name in ("invalid_action_rate", "slow_rate", "slow_s", "reject_schema"):
        held[name] = getattr(faults, name)
    assert {name: flags[name] for name in held} == held
    assert sim.engine == engine and SimulationSettings.__dataclass_fields__["chars_per_token"].default == 4.0

    helps = {
        name: p.default if isinstance(p.default, str) else p.annotation
        for name, p in inspect.signature(simulate).parameters.items()
    }
    said = {
        "max_num_seqs": f"({engine.max_num_seqs})",
        "step_base_ms": f"({engine.step_base_ms:g} ms)",
        "step_per_seq_ms": f"({engine.step_per_seq_ms:g} ms)",
        "prefill_ms_per_token": f"({engine.prefill_ms_per_token:g} ms)",
        "chars_per_token": f"({sim.chars_per_token:g};",
        "seeds": f"({DEFAULT_SEEDS}; at most {MAX_SEEDS})",
        "jitter": f"({DEFAULT_JITTER:g}; at most {MAX_JITTER:g})",
    }
    for name, text in said.items():
        assert text in str(helps[name]), (name, helps[name])
