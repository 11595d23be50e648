"""Policy names → policy objects; the one place that knows the aliases."""

from __future__ import annotations

from collections.abc import Iterable

from asyncroll.policies.base import Policy
from asyncroll.policies.baseline import Fifo, ToolFirst
from asyncroll.policies.pressure import PressurePolicy
from asyncroll.policies.remaining import RemainingEstimator, RemainingWork, StepwiseWork

#: What ``--policy asyncroll`` means: the chain rule (since 2026-12-03) — the critical-path rule, which the
#: simulated map in RESULTS.md chose over the unlock rule, the seed's rule and the tail guard, with its
#: remaining-work estimate learned step by step: the same on the 200-trajectory map, better on 20-trajectory
#: batches. The critical rule (the default 2026-12-01 to 03) and the balanced rule (critical path plus a
#: straggler guard; the default for a few hours on 2026-12-03) are kept, unchanged, for comparison.
DEFAULT_PRESSURE = "asyncroll_chain"
PRESSURE_POLICIES = (
    "asyncroll_seed",
    "asyncroll_guarded",
    "asyncroll_unlock",
    "asyncroll_critical",
    "asyncroll_balanced",
    "asyncroll_chain",
)
#: The rules that order the tail by the work after each job (the chain rule learns it step by step).
CRITICAL_PATH = ("asyncroll_critical", "asyncroll_balanced", "asyncroll_chain")
#: Settings that only the pressure-aware policies read (config field → flag).
PRESSURE_SETTINGS = {
    "starvation_threshold": "--starvation-threshold",
    "aging_seconds": "--aging-seconds",
    "aging_weight": "--aging-weight",
}


def unread_pressure_flags(given: Iterable[str], policies: Iterable[str]) -> list[str]:
    """The pressure settings among ``given`` that none of ``policies`` reads (say so: a flag that
    silently does nothing misleads)."""
    if any(name == "asyncroll" or name in PRESSURE_POLICIES for name in policies):
        return []
    given = set(given)
    return [flag for key, flag in PRESSURE_SETTINGS.items() if key in given]


def canonical_policy(name: str) -> str:
    """The policy a name runs: a deprecated alias its policy (``gpu_first`` is ``tool_first``),
    ``asyncroll`` the default pressure rule."""
    from asyncroll.config import DEPRECATED_ALIASES

    return {**DEPRECATED_ALIASES, "asyncroll": DEFAULT_PRESSURE}.get(name, name)


def estimator_for(policy: str) -> RemainingEstimator:
    """The remaining-work estimator a run subscribes for its policy (the rule's name, as ``get_policy``
    builds it): the chain rule's step-by-step chain, the other critical-path rules' per-trajectory means,
    and for every other policy the default rule's, so its logged estimates compare with the default's."""
    rule = policy if policy in CRITICAL_PATH else DEFAULT_PRESSURE
    return StepwiseWork() if rule == "asyncroll_chain" else RemainingWork()


def get_policy(name: str, *, aging_seconds: float = 30.0, aging_weight: float = 0.02) -> Policy:
    """Build a policy by its name (``gpu_first`` is the deprecated alias of ``tool_first``)."""
    if name == "asyncroll":
        name = DEFAULT_PRESSURE
    if name in PRESSURE_POLICIES:
        return PressurePolicy(
            name,
            aging_seconds,
            aging_weight,
            tail_guard=name == "asyncroll_guarded",
            unlock=name in ("asyncroll_unlock", *CRITICAL_PATH),
            drain_multiple=None if name in CRITICAL_PATH else 2.0,
            critical_path=name in CRITICAL_PATH,
            straggler=name == "asyncroll_balanced",
        )
    if name == "sync":
        return Fifo(name="sync")
    if name == "fifo":
        return Fifo()
    if name in ("tool_first", "gpu_first"):
        return ToolFirst()
    raise ValueError(f"unknown policy {name!r}")
