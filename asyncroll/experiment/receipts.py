"""``experiment.json`` and per-arm ``arm.json``: the experiment's receipts, rewritten atomically.

Each arm moves ``pending → checking_gpu → starting_server → running_client → stopping_server →
complete | failed | interrupted``; every transition is timestamped and written at once (temporary file
+ rename, the run receipt's helper), so an interrupted experiment leaves receipts that say exactly how far
each arm got. ``experiment.json`` holds the fingerprint, the plan, each stage's gate verdicts and each
arm's outcome; it is what resume reads.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from asyncroll.errors import UsageError
from asyncroll.json_depth import json_loads
from asyncroll.outputs.receipt import write_json_atomic

SCHEMA_VERSION = 1
ArmStatus = Literal[
    "pending",
    "checking_gpu",
    "starting_server",
    "running_client",
    "stopping_server",
    "complete",
    "failed",
    "interrupted",
]
TERMINAL = ("complete", "failed")
ExperimentStatus = Literal["running", "complete", "stopped", "interrupted", "failed"]


def arm_verdict(data: dict[str, Any]) -> Literal["complete", "failed"] | None:
    """An arm's verdict from its ``arm.json`` data, whatever its status says: ``failed`` once a step
    failed, ``complete`` once the client's outputs passed every check (the measurement exists), None while
    neither is known yet. (A cut or interrupted arm also records an error: read it only while it runs.)"""
    if data.get("error") is not None:
        return "failed"
    return "complete" if data.get("summary_status") is not None else None


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b")


def one_line(error: str | None, limit: int = 400) -> str:
    """A recorded failure in one line, for the console and REPORT.md: its first line and, when the rest
    is a log tail ("client exited with code 1; log tail:" says nothing by itself), the cause found there:
    the tail's last ``error:`` line (what ``asyncroll run`` prints when it fails), else its last exception
    line (``SomeError: …``), else its last non-empty line."""
    if not error or not error.strip():
        return "unknown"
    lines = [line.strip() for line in error.strip().splitlines()]
    head = lines[0].removesuffix("; log tail:").removesuffix(" log tail:").rstrip(";: ")
    rest = [line for line in lines[1:] if line]
    cause = next((line for line in reversed(rest) if line.lower().startswith("error:")), None)
    cause = cause or next((line for line in reversed(rest) if _EXCEPTION_LINE.match(line)), None)
    cause = cause or (rest[-1] if rest else None)
    text = f"{head}: {cause}" if cause else head
    return text if len(text) <= limit else text[: limit - 1] + "…"


def read_json(path: Path) -> dict[str, Any]:
    data = json_loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data


class ArmReceipt:
    """The one writer of an arm's ``arm.json``."""

    def __init__(self, path: Path, body: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "kind": "asyncroll.experiment.arm",
            "status": "pending",
            "created_at": now_iso(),
            "created_wall": time.time(),
            "transitions": [],
            **body,
            "error": None,
        }
        self.transition("pending")

    @property
    def status(self) -> str:
        return str(self.data["status"])

    def update(self, **fields: Any) -> None:
        self.data.update(fields)
        write_json_atomic(self.path, self.data)

    def transition(self, status: ArmStatus, **fields: Any) -> None:
        self.data["status"] = status
        self.data["transitions"].append({"status": status, "at": now_iso()})
        self.update(**fields)


class ExperimentReceipt:
    """The one writer of ``experiment.json``."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data

    @classmethod
    def create(cls, path: Path, body: dict[str, Any]) -> ExperimentReceipt:
        data = {
            "schema_version": SCHEMA_VERSION,
            "kind": "asyncroll.experiment",
            "status": "running",
            "created_at": now_iso(),
            "created_wall": time.time(),
            **body,
            "resumes": [],
            "stop_reason": None,
            "error": None,
        }
        receipt = cls(path, data)
        receipt.write()
        return receipt

    @classmethod
    def load(cls, path: Path) -> ExperimentReceipt:
        """``experiment.json`` as it is (a resume writes it once it goes on, not while it is checked);
        one this version cannot resume — cut, not an experiment's, another schema version — is a
        UsageError naming the file and what is wrong."""
        try:
            data = read_json(path)
        except (OSError, RecursionError) as exc:
            raise UsageError(f"{path}: cannot be read ({exc}); nothing was resumed") from None
        except ValueError as exc:
            why = str(exc) if str(exc).startswith(str(path)) else f"{path}: not valid JSON ({exc})"
            raise UsageError(f"{why}; nothing was resumed") from None
        kind, version = data.get("kind"), data.get("schema_version")
        if kind != "asyncroll.experiment" or version != SCHEMA_VERSION:
            raise UsageError(
                f"{path}: kind {kind!r}, schema_version {version!r}: not an experiment receipt this "
                f"asyncroll resumes (kind 'asyncroll.experiment', schema_version {SCHEMA_VERSION}); resume "
                "it with the asyncroll that started it, or start a new experiment in a new directory"
            )
        _check(path, data, "", (("status", str), ("fingerprint", dict), ("plan", list), ("stages", dict)))
        _check(path, data, "", (("arms", dict), ("resumes", list)))
        for name, stage in data["stages"].items():
            _check(path, stage, f"stages.{name}.", (("status", str),))
        for name, arm in data["arms"].items():
            _check(path, arm, f"arms.{name}.", (("status", str), ("attempts_interrupted", list)))
        return cls(path, data)

    def write(self) -> None:
        self.data["updated_at"] = now_iso()
        write_json_atomic(self.path, self.data)

    def set_status(self, status: ExperimentStatus, **fields: Any) -> None:
        self.data["status"] = status
        self.data[f"{status}_at"] = now_iso()
        self.data.update(fields)
        self.write()

    def arm(self, arm_id: str) -> dict[str, Any]:
        arms: dict[str, dict[str, Any]] = self.data["arms"]
        return arms[arm_id]

    def set_arm(self, arm_id: str, **fields: Any) -> None:
        self.data["arms"][arm_id].update(fields)
        self.write()

    def set_stage(self, stage: str, **fields: Any) -> None:
        self.data["stages"][stage].update(fields)
        self.write()


def _check(path: Path, data: Any, where: str, fields: tuple[tuple[str, type], ...]) -> None:
    """A UsageError naming the first of ``fields`` missing from ``data`` or not of its type."""
    names: dict[type, str] = {dict: "an object", list: "an array", str: "a string"}
    for key, kind_of in fields:
        if not isinstance(data, dict) or key not in data:
            raise UsageError(f"{path}: no {where + key!r}: not an experiment receipt this asyncroll resumes")
        if not isinstance(data[key], kind_of):
            raise UsageError(f"{path}: {where + key!r} is not {names[kind_of]}")
