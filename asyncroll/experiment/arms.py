"""One arm, start to finish: GPU check → fresh server → readiness → client subprocess → stop the server.

Nothing is retried: a failure at any step is written to ``arm.json`` with the step, the error and the log
tails, the server is stopped anyway, and the runner moves on. An interrupt (``ExperimentInterrupted``)
stops the client and the server's whole group in a ``finally`` before it propagates.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from asyncroll.experiment.config import ExperimentConfig
from asyncroll.experiment.gpu import GpuCheckError, check_gpu
from asyncroll.experiment.plan import ArmPlan, client_command, endpoint, server_command
from asyncroll.experiment.receipts import ArmReceipt, read_json
from asyncroll.experiment.server import (
    InferenceServer,
    ManagedProcess,
    ServerStartError,
    free_port,
    port_in_use,
    tail,
)
from asyncroll.schemas import RunReceiptModel, SummaryModel

#: Seconds the client gets to finish its receipt after TERM at its deadline or on an interrupt.
CLIENT_GRACE_S = 20.0


class ExperimentInterrupted(BaseException):
    """SIGTERM/SIGINT reached the runner: stop the arm's processes, mark it interrupted, stop."""


class ArmFailed(RuntimeError):
    """A step of the arm failed; ``step`` names it."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(message)
        self.step = step


def run_arm(
    cfg: ExperimentConfig, plan: ArmPlan, arm_dir: Path, workload_sha256: str, deadline_s: float
) -> ArmReceipt:
    """Run one arm in ``arm_dir`` (created here); returns its receipt, status complete or failed."""
    arm_dir.mkdir(parents=True)
    receipt = ArmReceipt(arm_dir / "arm.json", {"plan": plan.to_dict(), "dir": str(arm_dir)})
    server: InferenceServer | None = None
    client: ManagedProcess | None = None
    try:
        receipt.transition("checking_gpu")
        try:
            gpu = check_gpu(cfg.gpu)
        except GpuCheckError as exc:
            receipt.update(gpu={"declared": True, "checked": True, "error": str(exc)})
            raise ArmFailed("checking_gpu", str(exc)) from None
        receipt.update(gpu=gpu)

        port = cfg.server.port or free_port(cfg.server.host)
        if port_in_use(cfg.server.host, port):
            raise ArmFailed(
                "starting_server",
                f"{cfg.server.host}:{port} already accepts connections: another server is running there",
            )
        command = server_command(cfg, port)
        url = endpoint(cfg, port)
        server = InferenceServer(command, url, arm_dir / "server.log", cfg.server.env, cfg.model.served_name)
        receipt.transition("starting_server", server={"command": command, "url": url})
        try:
            server.start()
        except OSError as exc:
            raise ArmFailed("starting_server", f"cannot start {command[0]!r}: {exc}") from None
        receipt.update(server={**receipt.data["server"], "process": server.process.record()})
        try:
            ready = server.wait_ready(cfg.server.readiness_paths, cfg.server.startup_timeout_s)
        except ServerStartError as exc:
            raise ArmFailed("starting_server", str(exc)) from None
        receipt.update(server={**receipt.data["server"], **ready, "startup_evidence": server.evidence()})

        run_dir = arm_dir / "run"
        command = client_command(cfg, plan, port, run_dir)
        client = ManagedProcess(command, arm_dir / "client.log")
        client.start()
        receipt.transition(
            "running_client", client={"command": command, "run_dir": str(run_dir), "process": client.record()}
        )
        began = time.monotonic()
        code = client.wait(deadline_s)
        timed_out = code is None
        if timed_out:
            stop = client.stop(CLIENT_GRACE_S)
            code = stop["exit_code"]
        wall = round(time.monotonic() - began, 3)
        receipt.update(client={**receipt.data["client"], "exit_code": code, "wall_s": wall})
        client = None
        if timed_out:
            raise ArmFailed(
                "running_client", f"client passed its deadline of {deadline_s:g}s and was stopped"
            )
        summary = _check_client(run_dir, code, workload_sha256, arm_dir / "client.log")
        receipt.update(summary_status=summary.status)
    except ArmFailed as exc:
        receipt.update(error=str(exc), failed_step=exc.step)
    except BaseException:
        if client is not None:
            receipt.update(client={**receipt.data.get("client", {}), "stop": client.stop(CLIENT_GRACE_S)})
        if server is not None:
            receipt.update(server={**receipt.data["server"], "stop": server.stop(cfg.server.stop_grace_s)})
        receipt.transition("interrupted", error="interrupted while " + receipt.status)
        raise
    if server is not None:
        receipt.transition("stopping_server")
        stop = server.stop(cfg.server.stop_grace_s)
        receipt.update(server={**receipt.data["server"], "stop": stop, "startup_evidence": server.evidence()})
    if receipt.data["error"] is None:
        receipt.transition("complete")
    else:
        receipt.transition("failed")
    return receipt


def _check_client(run_dir: Path, code: int | None, workload_sha256: str, log: Path) -> SummaryModel:
    """The client's run must be complete, its receipt must name the expected workload, its summary valid."""
    if code != 0:
        raise ArmFailed("running_client", f"client exited with code {code}; log tail:\n{tail(log)}")
    try:
        run = RunReceiptModel.model_validate(read_json(run_dir / "run.json"))
        summary = SummaryModel.model_validate(read_json(run_dir / "summary.json"))
    except (OSError, ValueError, ValidationError) as exc:
        raise ArmFailed("running_client", f"client outputs unreadable: {exc}") from None
    if run.workload.get("sha256") != workload_sha256:
        raise ArmFailed(
            "running_client",
            f"client ran workload sha256 {run.workload.get('sha256')}, "
            f"not the experiment's {workload_sha256}",
        )
    if summary.status != "complete":
        raise ArmFailed("running_client", f"client run ended {summary.status}")
    return summary


def load_summary(arm_dir: Path) -> dict[str, Any] | None:
    """The arm's summary.json, validated against SummaryModel, or None when there is none."""
    path = arm_dir / "run" / "summary.json"
    if not path.is_file():
        return None
    data = read_json(path)
    SummaryModel.model_validate(data)
    return data
