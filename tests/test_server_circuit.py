"""A server that is down: the circuit opens, admission pauses, the run resumes when it comes back or
fails after --server-down-timeout; the health probe, and the outage recorded, counted and drawn."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from asyncroll.backends.openai import HttpSettings, OpenAIBackend
from asyncroll.clock import SystemClock
from asyncroll.config import build_config
from asyncroll.errors import ModelError
from asyncroll.event_log import EventCapture
from asyncroll.events import (
    ModelFailed,
    ModelPaused,
    ServerAvailable,
    ServerUnavailable,
    TrajectoryFinished,
    TrajectoryStarted,
)
from asyncroll.runtime.run import Run, prepare
from asyncroll.runtime.virtual_worker import builtin_duration, virtual_factory
from asyncroll.serve_sim.config import SimConfig
from asyncroll.serve_sim.server import serve_in_thread
from tests.conftest import write_workload
from tests.http_backend import FAST, FINAL, FakeOpenAI, completion, final_problems, http_run


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def down_backend(tmp_path: Path, port: int, **settings: Any) -> OpenAIBackend:
    cfg = build_config(
        {
            "workload": tmp_path / "unused.jsonl",
            "output": tmp_path / "unused",
            "backend": "vllm",
            "model": "sim",
            "endpoint": f"http://127.0.0.1:{port}",
            "max_active_trajectories": 2,
            **settings,
        }
    )
    return OpenAIBackend(HttpSettings.from_config(cfg), SystemClock())


def down_run(tmp_path: Path, port: int, bring_up: bool, **settings: Any) -> tuple[Any, EventCapture, Path]:
    """A run against ``port`` where nothing listens; with ``bring_up`` a serve-sim starts there as soon as
    the circuit opens."""
    backend = down_backend(tmp_path, port, circuit_failures=2, **settings)
    result: dict[str, Any] = {}

    async def main() -> None:
        with contextlib.ExitStack() as stack:

            async def start_server() -> None:
                await backend.circuit.wait_opened()
                await asyncio.sleep(0.3)  # a measurable outage
                await asyncio.to_thread(
                    stack.enter_context, serve_in_thread(SimConfig(engine=FAST), port=port)
                )

            helper = asyncio.create_task(start_server()) if bring_up else None
            workload = write_workload(tmp_path / "w.jsonl", final_problems(6))
            cfg = build_config(
                {
                    "workload": workload,
                    "output": tmp_path / "run",
                    "backend": "vllm",
                    "model": "sim",
                    "endpoint": f"http://127.0.0.1:{port}",
                    "warmup_requests": 0,
                    "max_active_trajectories": 2,
                    "circuit_failures": 2,
                    "telemetry": False,
                    **settings,
                }
            )
            clock = SystemClock()
            capture = EventCapture()
            run = Run(
                prepare(cfg, ["test"]),
                clock,
                worker_factory=virtual_factory(clock, builtin_duration),
                backend=backend,
                subscribers=(capture,),
            )
            result["outcome"] = await run.execute()
            if helper is not None:
                await helper
            result["capture"] = capture
            result["backend"] = backend

    asyncio.run(main())
    return result["outcome"], result["capture"], tmp_path / "run"


@pytest.mark.timeout(60)
def test_a_server_that_stays_down_pauses_admission_then_fails_the_run(tmp_path: Path) -> None:
    port = free_port()
    backend = down_backend(tmp_path, port, circuit_failures=2, server_down_timeout=0.5)
    outcome, capture, _ = http_run(
        tmp_path,
        final_problems(10),
        f"http://127.0.0.1:{port}",
        client=backend,
        max_active_trajectories=2,
        circuit_failures=2,
        server_down_timeout=0.5,
    )
    assert outcome.status == "failed" and outcome.exit_code == 1
    assert outcome.error is not None and "stayed unavailable" in outcome.error
    assert "last probe: GET /health: ConnectError" in outcome.error, outcome.error
    # Two failures open the circuit. At most one more trajectory was admitted in between (when the first
    # failure freed its slot before the second failure); the other seven were never admitted.
    started, failed = capture.of(TrajectoryStarted), capture.of(ModelFailed)
    assert len(started) in (2, 3) and 2 <= len(failed) <= len(started)
    assert {e.kind for e in failed} == {"transport"}


@pytest.mark.timeout(60)
def test_admission_resumes_when_the_server_comes_back(tmp_path: Path) -> None:
    outcome, capture, _ = down_run(tmp_path, free_port(), True, server_down_timeout=30)
    assert outcome.status == "complete"
    statuses = [e.status for e in capture.of(TrajectoryFinished)]
    # The two that met the refused connections failed (a third, if it slipped in before the circuit
    # opened); every later one waited for the server and completed.
    assert len(statuses) == 6 and statuses.count("failed") in (2, 3)
    assert statuses.count("completed") == 6 - statuses.count("failed")
    assert outcome.summary is not None
    circuit = outcome.summary["model"]["circuit"]
    assert circuit["opened"] == 1 and not circuit["open_at_end"]


@pytest.mark.timeout(60)
def test_a_server_outage_is_recorded_counted_and_drawn(tmp_path: Path) -> None:
    """The circuit's opening and closing are events; summary.json counts the openings, the seconds
    admission was paused and the requests that waited for the server (inside their latency), and the
    trace draws the outage on the scheduler track."""
    outcome, capture, out = down_run(tmp_path, free_port(), True, max_retries=5, retry_max_delay=0.05)
    assert outcome.status == "complete", outcome.error
    [opened] = capture.of(ServerUnavailable)
    [closed] = capture.of(ServerAvailable)
    assert opened.failures == 2 and opened.opened == 1 and opened.reason.startswith("transport: ConnectError")
    assert closed.t > opened.t and closed.paused_s >= 0.3 and closed.probes >= 1
    waits = capture.of(ModelPaused)
    assert waits and all(w.waited_s > 0 for w in waits)  # retried requests waited for the server
    assert [e.status for e in capture.of(TrajectoryFinished)] == ["completed"] * 6
    assert outcome.summary is not None
    circuit = outcome.summary["model"]["circuit"]
    assert circuit["opened"] == 1 and not circuit["open_at_end"]
    assert circuit["paused_s"] == pytest.approx(closed.t - opened.t, abs=1e-5)
    # the event's own paused_s spans the two events' t (each rounded to the microsecond)
    assert abs(closed.paused_s - (closed.t - opened.t)) <= 2.5e-6
    assert circuit["requests_waited"] == len(waits)
    assert circuit["request_wait_s"] == pytest.approx(sum(w.waited_s for w in waits), abs=1e-5)
    trace = json.loads((out / "trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e.get("cat") == "circuit"]
    outage = [e for e in spans if e["name"] == "server unavailable: admission paused"]
    assert len(outage) == 1 and outage[0]["args"]["paused_s"] == closed.paused_s
    assert sum(e["name"] == "waiting for the server" for e in spans) == len(waits)
    assert trace["metadata"]["unknown_events"] == {}


@pytest.mark.timeout(60)
def test_server_down_timeout_fails_once_and_closes_the_client(tmp_path: Path) -> None:
    outcome, capture, _ = down_run(tmp_path, free_port(), False, server_down_timeout=0.5)
    assert outcome.status == "failed" and outcome.error is not None
    assert outcome.error.count("stayed unavailable") == 1, outcome.error  # not repeated by aclose()
    assert len(capture.of(ServerUnavailable)) == 1 and not capture.of(ServerAvailable)
    assert outcome.summary is not None
    circuit = outcome.summary["model"]["circuit"]
    assert circuit["opened"] == 1 and circuit["open_at_end"] and circuit["paused_s"] >= 0.5


@pytest.mark.timeout(60)
def test_a_wait_for_the_server_that_the_run_ends_is_still_recorded(tmp_path: Path) -> None:
    """Requests waiting for the server when it stays down too long: their waits are events and counted."""
    outcome, capture, _ = down_run(
        tmp_path, free_port(), False, server_down_timeout=0.5, max_retries=5, retry_max_delay=0.05
    )
    assert outcome.status == "failed"
    waits = capture.of(ModelPaused)
    assert waits and all(w.waited_s > 0 for w in waits)
    assert outcome.summary is not None
    assert outcome.summary["model"]["circuit"]["requests_waited"] == len(waits)


@pytest.mark.timeout(30)
def test_the_health_probe_falls_back_to_the_model_list() -> None:
    """A server without ``/health`` (404) is probed with ``/v1/models``; what the last probe got is kept
    for the error of a server that stays down."""

    async def probe(get_status: dict[str, int]) -> tuple[bool, str]:
        with FakeOpenAI([completion(FINAL)], get_status) as server:
            backend = OpenAIBackend(
                HttpSettings.from_config(
                    build_config(
                        {"workload": "w.jsonl", "output": "o", "backend": "openai", "model": "sim"}
                        | {"endpoint": server.url}
                    )
                ),
                SystemClock(),
            )
            try:
                return await backend._healthy(), backend._last_probe
            finally:
                await backend.aclose()

    assert asyncio.run(probe({})) == (True, "GET /health: HTTP 200")
    assert asyncio.run(probe({"/health": 404})) == (True, "GET /v1/models: HTTP 200")
    assert asyncio.run(probe({"/health": 404, "/v1/models": 503})) == (False, "GET /v1/models: HTTP 503")
    assert asyncio.run(probe({"/health": 503})) == (False, "GET /health: HTTP 503")


@contextlib.contextmanager
def syn_dropping_port() -> Any:
    """A loopback port whose connects time out, like a host that is down or firewalled (it drops SYNs,
    it never refuses): a listener that never accepts, its accept queue already full."""
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = int(listener.getsockname()[1])
        for _ in range(3):  # fill the accept queue; later SYNs are dropped
            filler = stack.enter_context(socket.socket())
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
        yield port


@pytest.mark.timeout(60)
def test_a_server_whose_connects_time_out_opens_the_circuit(tmp_path: Path) -> None:
    """A server host that drops connection attempts (down, rebooting, firewalled) is not there, as one
    that refuses them is: its ConnectTimeouts open the circuit, admission pauses and the run fails after
    --server-down-timeout (they were kind ``timeout`` only, never opened it, and every trajectory of the
    workload failed one after another, each after --request-timeout)."""
    with syn_dropping_port() as port:
        backend = down_backend(
            tmp_path, port, circuit_failures=2, server_down_timeout=0.5, request_timeout=0.3
        )
        outcome, capture, _ = http_run(
            tmp_path,
            final_problems(10),
            f"http://127.0.0.1:{port}",
            client=backend,
            max_active_trajectories=2,
            circuit_failures=2,
            server_down_timeout=0.5,
            request_timeout=0.3,
            telemetry=False,  # its /metrics probe would wait out its own connect timeout first
        )
    assert outcome.status == "failed" and outcome.exit_code == 1
    assert outcome.error is not None and "stayed unavailable" in outcome.error, outcome.error
    (opened,) = capture.of(ServerUnavailable)
    assert "ConnectTimeout" in opened.reason
    failed = capture.of(ModelFailed)
    assert {e.kind for e in failed} <= {"timeout", "cancelled"} and len(capture.of(TrajectoryStarted)) <= 4


def test_aclose_closes_the_client_even_when_the_watch_failed() -> None:
    async def main() -> OpenAIBackend:
        settings = HttpSettings(endpoint="http://127.0.0.1:9", model="m", inflight=1, server_kind="vllm")
        backend = OpenAIBackend(settings, SystemClock())

        async def failed_watch() -> None:
            raise ModelError("server_down", "stayed unavailable")

        backend._http()
        backend._watch = asyncio.ensure_future(failed_watch())
        await asyncio.sleep(0)
        await backend.aclose()  # does not raise the watch's error again
        return backend

    backend = asyncio.run(main())
    assert backend._client is None and backend._watch is None


@pytest.mark.timeout(60)
def test_a_run_that_ends_with_the_server_down_says_so(tmp_path: Path) -> None:
    """Every trajectory failed at the outage before admission paused: the run ended ``complete``, exit 0,
    "0/3 completed", with only summary.json's ``open_at_end`` saying the server was down. It is now said
    on stderr."""
    from tests.cli_runs import SMOKE, cli

    out = tmp_path / "run"
    done = cli(
        "run", "--workload", SMOKE, "--output", out, "--backend", "vllm", "--model", "m",
        "--endpoint", f"http://127.0.0.1:{free_port()}", "--warmup-requests", "0",
        "--circuit-failures", "3", "--no-telemetry", "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "summary.json").read_text())["model"]["circuit"]["open_at_end"]
    assert "warning: the server was still unavailable when the run ended (admission paused 1 time(s)" in (
        done.stderr
    )
    from tests.conftest import invoke  # a run with no server to be down: nothing said (in this process)

    up = invoke("run", "--workload", SMOKE, "--output", tmp_path / "scripted", "--no-progress")
    assert up.exit_code == 0 and "unavailable" not in up.stderr


def test_the_server_down_warning_says_no_trajectory_failed_when_none_did(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A stop while admission waited for a server that was down, before any trajectory failed at it: the
    warning said that "trajectories that failed at the outage are counted failed", of none."""
    from asyncroll.commands.run_warnings import warn_server_down

    def said(failed: int) -> str:
        circuit = {"open_at_end": True, "opened": 1, "paused_s": 8.4}
        warn_server_down({"counts": {"failed": failed}, "model": {"circuit": circuit}})
        return capsys.readouterr().err

    assert said(0).endswith("8.400 s in all): no trajectory failed (summary.json: model.circuit)\n")
    assert "trajectories that failed at the outage are counted failed" in said(3)


@pytest.mark.timeout(150)
def test_a_run_stopped_while_the_server_is_down_says_it_was_down(tmp_path: Path) -> None:
    """Ctrl-C while admission waits for a server that is down (the circuit open, --server-down-timeout
    far off): the stop said only "interrupted by SIGINT", though summary.json's ``open_at_end`` said the
    server was down at the end; it is said on stderr as at the end of a complete or failed run (as is an
    unavailable telemetry source: the interrupted outcome carries no summary, both read it from none)."""
    import signal
    import subprocess
    import sys

    from tests.children import end
    from tests.cli_runs import _wait_for
    from tests.conftest import REPO
    from tests.simulations import signal_and_wait

    workload = write_workload(tmp_path / "w.jsonl", final_problems(10))
    out = tmp_path / "run"
    command = [
        "run", "--workload", workload, "--output", out, "--backend", "vllm", "--model", "m",
        "--endpoint", f"http://127.0.0.1:{free_port()}", "--warmup-requests", "0", "--max-retries", "0",
        "--circuit-failures", "2", "--server-down-timeout", "300", "--no-progress",
    ]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncroll.cli", *map(str, command)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # the circuit open, while the run runs, however long its start takes (the hard timeout bounds it):
        # after a fixed 40 s a loaded machine's run not yet open was stopped, and open_at_end was false
        _wait_for(out / "events.jsonl", '"server_unavailable"', writer=proc)
        stderr = signal_and_wait(proc, signal.SIGINT)
    finally:
        end(proc)
    assert proc.returncode == 130, stderr
    assert json.loads((out / "summary.json").read_text())["model"]["circuit"]["open_at_end"]
    assert "interrupted by SIGINT" in stderr
    down = "warning: the server was still unavailable when the run ended (admission paused 1 time(s)"
    assert down in stderr
    assert "warning: telemetry: server_metrics unavailable" in stderr  # also read from summary.json now


@pytest.mark.timeout(60)
@pytest.mark.parametrize("failures", ["5", "0"], ids=["below-the-circuit-threshold", "circuit-off"])
def test_a_run_whose_server_never_answered_says_so(tmp_path: Path, failures: str) -> None:
    """Fewer trajectories than --circuit-failures (the default 5 against a 3-problem workload), or the
    circuit off: every request failed at a server that was down, the circuit never opened, and the run
    ended ``complete``, exit 0, with nothing on stderr saying the server never answered."""
    from tests.cli_runs import SMOKE, cli

    out = tmp_path / "run"
    done = cli(
        "run", "--workload", SMOKE, "--output", out, "--backend", "vllm", "--model", "m",
        "--endpoint", f"http://127.0.0.1:{free_port()}", "--warmup-requests", "0",
        "--circuit-failures", failures, "--no-telemetry", "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not json.loads((out / "summary.json").read_text())["model"]["circuit"]["open_at_end"]
    assert "warning: no model request succeeded (3 failed: transport 3)" in done.stderr, done.stderr


def test_replies_that_all_failed_say_nothing_of_the_server(capsys: pytest.CaptureFixture[str]) -> None:
    """ "is the server up?" is for failures of reaching it: a random model whose every reply is an invalid
    action answered every request (the server is up), and a scripted backend's own failures have none."""
    from asyncroll.commands.run_warnings import warn_server_down

    def model(failed: dict[str, int], paused: float | None = 0.000105) -> dict[str, Any]:
        circuit = {"open_at_end": paused is not None, "opened": 1, "paused_s": paused}
        return {"model": {"finished": 0, "failed": failed, "circuit": circuit}}

    warn_server_down(model({"invalid_action": 3}, paused=None))
    warn_server_down(model({"invalid_action": 2, "transport": 1}, paused=None))
    assert capsys.readouterr().err == ""
    warn_server_down(model({"timeout": 2, "http_status": 1}, paused=None))
    assert "no model request succeeded (3 failed: http_status 1, timeout 2)" in capsys.readouterr().err
    warn_server_down(model({"transport": 3}))
    assert "admission paused 1 time(s), 0.000 s in all" in capsys.readouterr().err


def test_a_stopped_run_whose_every_ended_request_failed_to_reach_the_server_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Ctrl-C on a run against a server that is down, the circuit never open (off, or fewer failures than
    its threshold): the requests the stop cut (kind ``cancelled``) had no answer either, and the run said
    nothing of the server (a stopped run whose circuit was open says it is down)."""
    from asyncroll.commands.run_warnings import warn_server_down

    circuit = {"open_at_end": False, "opened": 0, "paused_s": 0.0}
    warn_server_down(
        {"model": {"finished": 0, "failed": {"transport": 5, "cancelled": 2}, "circuit": circuit}}
    )
    assert "warning: no model request succeeded (5 failed: transport 5)" in capsys.readouterr().err
    warn_server_down({"model": {"finished": 0, "failed": {"cancelled": 2}, "circuit": circuit}})
    warn_server_down(
        {"model": {"finished": 0, "failed": {"invalid_action": 1, "cancelled": 2}, "circuit": circuit}}
    )
    warn_server_down(
        {"model": {"finished": 1, "failed": {"transport": 1, "cancelled": 2}, "circuit": circuit}}
    )
    assert capsys.readouterr().err == ""  # none ended, or the server answered one
