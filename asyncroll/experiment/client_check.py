"""What an arm's client must have left: its run complete, and its ``run.json`` showing the experiment's
pinned inputs (its fingerprint: workload SHA-256, tool file hashes, software versions, code) and the arm's
plan (policy, seed); and the summary of an arm that completed, read back for the comparison."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from asyncroll.errors import UsageError
from asyncroll.experiment.fingerprint import CODE_HASHED
from asyncroll.experiment.plan import ArmPlan
from asyncroll.experiment.receipts import read_json
from asyncroll.experiment.server import exit_words, tail
from asyncroll.schemas import RunReceiptModel, SummaryModel
from asyncroll.setting_names import validation_message


class ArmFailed(RuntimeError):
    """A step of the arm failed; ``step`` names it."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(message)
        self.step = step


@dataclass(frozen=True, slots=True)
class Expected:
    """What every client's ``run.json`` must show: the experiment's pinned inputs (its fingerprint)."""

    workload_sha256: str
    tools: dict[str, str | None]
    software: dict[str, str | None]
    # the package version and source digest the runner pinned (CODE_HASHED); empty for an experiment
    # started before they were recorded
    code: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def from_fingerprint(cls, fp: dict[str, Any]) -> Expected:
        detail = fp.get("detail", {})
        code = detail.get("code") or {}
        return cls(
            fp["components"]["workload"],
            dict(detail.get("tools", {})),
            dict(detail.get("software", {})),
            {key: code.get(key) for key in CODE_HASHED} if code else {},
        )


def check_client(
    run_dir: Path, code: int | None, log: Path, plan: ArmPlan, expected: Expected
) -> SummaryModel:
    """The client's run must be complete, and its receipt must show the experiment's inputs and the plan."""
    from asyncroll.config import DEPRECATED_ALIASES

    if code != 0:
        why = f"client {exit_words(code)}; log tail:\n{tail(log) or '(empty log)'}"
        raise ArmFailed("running_client", why)
    try:
        run = RunReceiptModel.model_validate(read_json(run_dir / "run.json"))
        summary = SummaryModel.model_validate(read_json(run_dir / "summary.json"))
    except (OSError, ValueError, ValidationError) as exc:
        raise ArmFailed("running_client", f"client outputs unreadable: {exc}") from None
    problems = []
    if run.workload.get("sha256") != expected.workload_sha256:
        problems.append(
            f"workload sha256 {run.workload.get('sha256')}, not the experiment's {expected.workload_sha256}"
        )
    tools = {key: None if entry is None else entry.get("sha256") for key, entry in run.tools.items()}
    problems += _differences("tool file", tools, expected.tools)
    problems += _differences("software version", run.versions, expected.software)
    if expected.code:  # the client imported the runner's asyncroll, not another copy (another folder's)
        ran_code = run.code or {}
        problems += _differences("code", {key: ran_code.get(key) for key in expected.code}, expected.code)
    policies = {plan.policy, DEPRECATED_ALIASES.get(plan.policy, plan.policy)}
    if run.config.get("policy") != plan.policy or summary.policy not in policies:
        ran = f"{run.config.get('policy')!r} (summary: {summary.policy!r})"
        problems.append(f"policy {ran}, not the plan's {plan.policy!r}")
    if run.config.get("seed") != plan.seed:
        problems.append(f"seed {run.config.get('seed')!r}, not the plan's {plan.seed}")
    if problems:
        raise ArmFailed("running_client", "the client's run does not match the plan: " + "; ".join(problems))
    if summary.status != "complete":
        raise ArmFailed("running_client", f"client run ended {summary.status}")
    return summary


#: A name one side does not hold at all: not None (a built-in tool's hash, a package not installed).
_UNRECORDED = "(not recorded)"


def _differences(what: str, ran: dict[str, Any], pinned: dict[str, Any]) -> list[str]:
    """Each name whose value differs; one side lacks differs from None (a tool pinned as built-in that the
    client's run.json does not list at all used to pass)."""
    differ = []
    for key in sorted(set(ran) | set(pinned)):
        if key not in ran or key not in pinned or ran[key] != pinned[key]:
            had, wanted = ran.get(key, _UNRECORDED), pinned.get(key, _UNRECORDED)
            differ.append(f"{what} {key}: ran {had}, the experiment pinned {wanted}")
    return differ


def load_summary(arm_dir: Path) -> dict[str, Any] | None:
    """The summary.json of an arm that completed, validated against SummaryModel; None when its client
    left no run directory. One gone from the run directory since the client's run was checked (its
    metrics would read as "not measured"), that cannot be read or is not a summary this version reads
    (edited by hand, damaged) is a :class:`UsageError` naming it."""
    path = arm_dir / "run" / "summary.json"
    if not path.is_file():
        if path.parent.is_dir():
            raise UsageError(f"{path}: not found, though the arm completed (its arm.json): restore the file")
        return None
    try:
        data = read_json(path)
        SummaryModel.model_validate(data)
    except ValidationError as exc:
        where = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or '(top level)'}: {validation_message(error)}"
            for error in exc.errors(include_url=False)[:5]
        )
        raise UsageError(f"{path}: not a summary.json this asyncroll reads: {where}") from None
    except (OSError, ValueError, RecursionError) as exc:  # unreadable, not UTF-8, not JSON, not an object
        raise UsageError(f"{path}: cannot read: {exc}") from None
    return data
