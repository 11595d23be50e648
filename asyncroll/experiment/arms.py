"""One arm, start to finish: GPU check → fresh server → readiness → client subprocess → checks → stop.

Nothing is retried. A failure at any step is written to ``arm.json`` with the step and the error (with
the log tail it carries), the server is stopped anyway, and the runner moves on. An unexpected error (a
bug, a server answering something nobody planned for) fails the arm the same way, at the step it
happened in, with its type and message; it is never mistaken for an interrupt.

An interrupt (``ExperimentInterrupted``) stops the client, then the server's whole group, each in its own
``finally`` (a failure stopping the client never leaves the server running), and ends the arm
``interrupted`` before it propagates; an arm that already had its verdict (its client finished and its
outputs passed the checks, or a step had failed) keeps it, so an interrupt while its server is being
stopped never makes a finished arm run again. The runner ignores further signals while this runs.

While the client runs the server is watched: if it exits, the client is stopped at once and the arm
fails with the server's exit code (or signal) and its log, not with a client deadline.

The experiment's deadline (``time_left``) is not a failure of the arm: when it comes while the server
starts or the client runs, the arm's processes are stopped as usual and the arm ends ``interrupted``
(``interrupted_by: "deadline"``), like an arm cut by Ctrl-C, so a resume runs it again. Neither is a GPU
that another job keeps busy past ``gpu.idle_wait_s``: the arm ends ``interrupted`` before its server
starts (``interrupted_by: "gpu_busy"``), nor a server port that another process holds before the server
starts (``interrupted_by: "port_busy"``, ``port_busy.py``). The client's own
deadline (``client.deadline_s``) is part of the protocol: an arm that passes it fails.

The client is stopped however it ended (``ManagedProcess.stop``, a no-op for the leader once it exited):
what it left in its group and what it detached are killed then and recorded as the client's, before the
server's stop, which lists only what the server left.

When the client has exited, the protocol fingerprint is computed again (``protocol_check``; a file
changed while the arm ran does not show in the check before it), then the client's outputs are checked
against the plan: the run complete, and its ``run.json`` naming the experiment's workload SHA-256, tool
file hashes, software versions and code (the package version and source digest: the client imported the
runner's asyncroll, not another copy), and the arm's policy and seed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from asyncroll.experiment.client_check import ArmFailed, Expected, check_client
from asyncroll.experiment.config import ExperimentConfig
from asyncroll.experiment.gpu import GpuBusyError, GpuCheckError, check_gpu
from asyncroll.experiment.plan import (
    ArmPlan,
    client_command,
    client_environment,
    endpoint,
    server_command,
    server_environment,
)
from asyncroll.experiment.port_busy import port_busy
from asyncroll.experiment.receipts import TERMINAL, ArmReceipt, arm_verdict
from asyncroll.experiment.server import (
    InferenceServer,
    ManagedProcess,
    ReadinessTimeout,
    ServerStartError,
    exit_words,
    free_port,
    tail,
)

#: Seconds the client gets to finish its receipt after TERM at its deadline or on an interrupt.
CLIENT_GRACE_S = 20.0
#: Seconds between checks, while the client runs, that the server is still running.
SERVER_WATCH_S = 0.25
#: ``failed_step`` of an arm during which the protocol fingerprint changed: the runner stops there.
PROTOCOL_STEP = "checking_protocol"


class ExperimentInterrupted(BaseException):
    """SIGTERM/SIGINT/SIGHUP reached the runner: stop the arm's processes, mark it interrupted, stop."""


#: What a resume of an arm cut before its server started waits for, by what cut it.
RESUME_WHEN = {"gpu_busy": "the GPU is idle", "port_busy": "the port is free"}


class ArmCut(RuntimeError):
    """The arm was not let finish — the experiment's deadline came during ``step`` (``by="deadline"``),
    or before it started the GPU stayed busy (``"gpu_busy"``) or another process held the server's port
    (``"port_busy"``) — so it ends interrupted, not failed."""

    def __init__(
        self, step: str, message: str, by: Literal["deadline", "gpu_busy", "port_busy"] = "deadline"
    ) -> None:
        super().__init__(message)
        self.step = step
        self.by = by


#: How the wait for the client ended: it exited, the server exited, the client's deadline, the cut.
WaitEnd = Literal["client", "server", "deadline", "cut"]


@dataclass
class _Live:
    """The arm's processes that are still running (set once started, cleared once stopped)."""

    server: InferenceServer | None = None
    client: ManagedProcess | None = None


def run_arm(
    cfg: ExperimentConfig,
    plan: ArmPlan,
    arm_dir: Path,
    expected: Expected,
    deadline_s: float,
    protocol_check: Callable[[], str | None] | None = None,
    time_left: Callable[[], float] | None = None,
) -> ArmReceipt:
    """Run one arm in ``arm_dir`` (created here); returns its receipt: complete, failed, or interrupted
    (``interrupted_by: "deadline"``) when the experiment's deadline cut it.

    ``deadline_s`` is the client's deadline. ``protocol_check`` returns why the protocol changed (None:
    unchanged); it runs when the client exits. ``time_left`` gives the seconds left until the experiment's
    deadline (None: no deadline); it bounds the server's readiness and the client's run.
    """
    arm_dir.mkdir(parents=True)
    receipt = ArmReceipt(arm_dir / "arm.json", {"plan": plan.to_dict(), "dir": str(arm_dir)})
    live = _Live()
    cut: ArmCut | None = None
    try:
        try:
            _steps(cfg, plan, arm_dir, expected, deadline_s, protocol_check, time_left, receipt, live)
        except ArmFailed as exc:
            receipt.update(error=str(exc), failed_step=exc.step)
        except ArmCut as exc:
            cut = exc
        except Exception as exc:  # noqa: BLE001 - any error fails this arm at its step, never the runner
            receipt.update(error=_unexpected(receipt.status, exc), failed_step=receipt.status)
        if live.client is not None:
            _stop_client(receipt, live)
        if live.server is not None:
            receipt.transition("stopping_server")
            _stop_server(cfg, receipt, live)
        if cut is not None:
            receipt.transition("interrupted", error=str(cut), interrupted_by=cut.by, cut_step=cut.step)
        else:
            receipt.transition(_verdict(receipt) or "failed")
    except BaseException as exc:
        _abort(cfg, receipt, live, exc)
        raise
    return receipt


def _verdict(receipt: ArmReceipt) -> Literal["complete", "failed"] | None:
    return arm_verdict(receipt.data)


def _steps(
    cfg: ExperimentConfig,
    plan: ArmPlan,
    arm_dir: Path,
    expected: Expected,
    deadline_s: float,
    protocol_check: Callable[[], str | None] | None,
    time_left: Callable[[], float] | None,
    receipt: ArmReceipt,
    live: _Live,
) -> None:
    receipt.transition("checking_gpu")
    try:
        gpu = check_gpu(cfg.gpu)
    except GpuCheckError as exc:
        receipt.update(gpu={"declared": True, "checked": True, "error": str(exc)})
        if isinstance(exc, GpuBusyError):  # another job's, not the arm's: nothing was measured
            raise ArmCut("checking_gpu", str(exc), by="gpu_busy") from None
        raise ArmFailed("checking_gpu", str(exc)) from None
    receipt.update(gpu=gpu)
    if time_left is not None and time_left() <= 0:  # the GPU's idle wait took the rest of the time
        raise ArmCut("checking_gpu", "the experiment's deadline came while the GPU was checked")

    port = cfg.server.port or free_port(cfg.server.host)
    busy = port_busy(cfg.server.host, port, fixed=bool(cfg.server.port))
    if busy is not None:  # another process's, not the arm's: nothing was measured
        raise ArmCut("starting_server", busy, by="port_busy")
    command = server_command(cfg, port)
    url = endpoint(cfg, port)
    env = server_environment(cfg)
    server = InferenceServer(
        command, url, arm_dir / "server.log", env, cfg.model.served_name, cfg.server.check_listener
    )
    receipt.transition(
        "starting_server",
        server={
            "command": command,
            "env": dict(cfg.server.env),
            "url": url,
            "origin": server.process.planned_origin,  # before the spawn: see recover
        },
    )
    live.server = server  # before the spawn: a signal the moment it is spawned still stops it
    try:
        server.start()
    except OSError as exc:
        live.server = None
        raise ArmFailed("starting_server", f"cannot start {command[0]!r}: {exc}") from None
    receipt.update(server={**receipt.data["server"], "process": server.process.record()})
    startup_s = cfg.server.startup_timeout_s
    left = float("inf") if time_left is None else time_left()
    try:
        ready = server.wait_ready(cfg.server.readiness_paths, max(0.0, min(startup_s, left)))
    except ReadinessTimeout as exc:
        if left < startup_s:
            raise ArmCut(
                "starting_server",
                f"the experiment's deadline came while the server was starting (not ready after "
                f"{max(0.0, left):.3g}s of its {startup_s:g}s); the arm was stopped, not failed",
            ) from None
        raise ArmFailed("starting_server", str(exc)) from None
    except ServerStartError as exc:
        raise ArmFailed("starting_server", str(exc)) from None
    receipt.update(server={**receipt.data["server"], **ready, "startup_evidence": server.evidence()})

    run_dir = arm_dir / "run"
    command = client_command(cfg, plan, port, run_dir)
    client = ManagedProcess(command, arm_dir / "client.log", client_environment(), role="client")
    live.client = client  # before the spawn: a signal the moment it is spawned still stops it
    planned = {"command": command, "run_dir": str(run_dir), "origin": client.planned_origin}
    receipt.transition("running_client", client=planned)  # before the spawn: see recover
    client.start()
    receipt.update(client={**planned, "process": client.record()})
    began = time.monotonic()
    end, code = _wait_client(client, server, deadline_s, time_left)
    ended = time.monotonic()
    # stopped however it ended: its group's leftovers and what it detached are the client's
    stop = client.stop(CLIENT_GRACE_S)
    live.client = None
    if end != "client":
        code, ended = stop["exit_code"], time.monotonic()
    wall = round(ended - began, 3)
    receipt.update(client={**receipt.data["client"], "exit_code": code, "wall_s": wall, "stop": stop})
    if end == "server" or (code != 0 and server.process.poll() is not None):
        raise ArmFailed("running_client", _server_died(server, code, stopped=end == "server"))
    if end == "deadline":
        raise ArmFailed("running_client", f"client passed its deadline of {deadline_s:g}s and was stopped")
    if end == "cut":
        raise ArmCut(
            "running_client",
            f"the experiment's deadline came while the client ran (after {wall:g}s); the client and the "
            "server were stopped, the arm was not failed",
        )
    problem = None if protocol_check is None else protocol_check()
    if problem is not None:
        raise ArmFailed(PROTOCOL_STEP, problem)
    summary = check_client(run_dir, code, arm_dir / "client.log", plan, expected)
    receipt.update(summary_status=summary.status)


def _wait_client(
    client: ManagedProcess,
    server: InferenceServer,
    deadline_s: float,
    time_left: Callable[[], float] | None = None,
) -> tuple[WaitEnd, int | None]:
    """Wait for the client while watching the server: ("client", its exit code) when it exits, ("server",
    the server's exit code) as soon as the server exits first, ("deadline", None) at the client's
    deadline, ("cut", None) at the experiment's (whichever of the two deadlines comes first)."""
    end = time.monotonic() + deadline_s
    while True:
        left = end - time.monotonic()
        cut = float("inf") if time_left is None else time_left()
        if min(left, cut) <= 0:
            code = client.poll()  # it may have exited just in time: its run is then complete, not cut
            if code is not None:
                return "client", code
            return ("deadline" if left <= cut else "cut"), None
        code = client.wait(min(left, cut, SERVER_WATCH_S))
        if code is not None:
            return "client", code
        server_code = server.process.poll()
        if server_code is not None:
            return "server", server_code


def _server_died(server: InferenceServer, client_code: int | None, *, stopped: bool) -> str:
    """``stopped``: the runner stopped the client when it saw the server gone; else the client ended on
    its own (failing, its server gone)."""
    if not stopped:
        client = f"the client then {exit_words(client_code)}"
    elif client_code is None:  # no exit status came back
        client = "the client was stopped"
    else:
        client = f"the client was stopped (it {exit_words(client_code)})"
    return (
        f"server {exit_words(server.process.poll())} while the client ran; {client}; "
        f"server log {server.process.log}; its tail:\n{tail(server.process.log) or '(empty log)'}"
    )


def _unexpected(step: str, exc: BaseException) -> str:
    return f"unexpected error while {step}: {type(exc).__name__}: {exc}"


def _stop_client(receipt: ArmReceipt, live: _Live) -> None:
    if live.client is None:
        return
    stop = live.client.stop(CLIENT_GRACE_S)
    live.client = None
    receipt.update(client={**receipt.data.get("client", {}), "stop": stop})


def _stop_server(cfg: ExperimentConfig, receipt: ArmReceipt, live: _Live) -> None:
    if live.server is None or live.server.process.origin is None:  # never spawned (origin: set by start)
        live.server = None
        return
    stop = live.server.stop(cfg.server.stop_grace_s)
    evidence, others = live.server.evidence(), live.server.unattributed
    live.server = None
    fields: dict[str, Any] = {
        "server": {**receipt.data["server"], "stop": stop, "startup_evidence": evidence}
    }
    if others:  # killed with the arm's last stop; whose they were is not known (or its stop was cut short)
        fields["unattributed_orphans"] = others
    receipt.update(**fields)


def _abort(cfg: ExperimentConfig, receipt: ArmReceipt, live: _Live, exc: BaseException) -> None:
    """An interrupt (or an error while stopping): stop whatever still runs, and end the receipt.

    An arm that already had its verdict when the interrupt came (its client finished and its outputs
    passed the checks, or a step had failed) keeps it: only the stop of its processes was cut short, and
    it is finished all the same, so a resume never runs it again. So does one whose stop failed (a
    receipt write on a full disk, say): the error is kept as ``stop_error``, the measurement stands."""
    where = receipt.status
    try:
        _stop_client(receipt, live)
    finally:
        try:
            _stop_server(cfg, receipt, live)
        finally:
            verdict = _verdict(receipt)
            if where in TERMINAL:
                pass  # the interrupt came after the arm ended: nothing to change
            elif isinstance(exc, ExperimentInterrupted | KeyboardInterrupt):
                if verdict is None:
                    receipt.transition("interrupted", error="interrupted while " + where)
                else:
                    receipt.transition(verdict, interrupted_while=where)
            elif verdict is not None:  # e.g. a receipt write failed while stopping: the measurement stands
                receipt.transition(verdict, stop_error=_unexpected(where, exc))
            else:
                receipt.transition("failed", error=_unexpected(where, exc), failed_step=where)
