"""What a trajectory asks of the CPU dispatcher (:class:`JobSpec`) and gets back (:class:`JobOutcome`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from asyncroll.policies.base import JobKind


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A CPU job a trajectory wants run."""

    trajectory_id: str
    kind: JobKind
    tool: str
    arguments: dict[str, Any]
    turn: int
    arg_bytes: int = 0
    cost_s: float | None = None  # declared duration, for simulated workers
    resubmission: bool = False
    n_tests: int = 0  # evaluation jobs: features the predictor may use (never the tests themselves)
    test_bytes: int = 0
    code_bytes: int = 0
    declared: Any = None  # a declared result, returned by simulated workers (see JobRequest)
    declared_error: str | None = None  # a declared error, raised by simulated workers (see JobRequest)
    declared_death: str | None = None  # a declared worker death, by simulated workers (see JobRequest)
    observation_chars: int | None = None  # a tool result the model reads: (text, chars) (see JobRequest)


@dataclass(frozen=True, slots=True)
class JobOutcome:
    ok: bool
    value: Any = None
    error: str | None = None
    failure: str | None = None  # "timeout" | "worker_died" when the job did not run to completion
    execute_s: float | None = None
