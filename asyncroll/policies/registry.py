"""Policy names → policy objects; the one place that knows the aliases."""

from __future__ import annotations

from collections.abc import Iterable

from asyncroll.policies.base import Policy
from asyncroll.policies.baseline import Fifo, ToolFirst
from asyncroll.policies.pressure import PressurePolicy
from asyncroll.policies.remaining import RemainingEstimator, RemainingWork, StepwiseWork

#: What ``--policy asyncroll`` means: the repair-aware chain rule (since 2026-12-03) — the critical-path
#: rule, which the simulated map in RESULTS.md chose over the unlock rule, the seed's rule and the tail
#: guard, with its remaining-work estimate learned step by step (the chain) and a first evaluation's own
#: predicted time standing for its repair's: never worse than FIFO beyond noise on the 200-trajectory map,
#: where the chain rule lost one cell. The critical rule (the default 2026-12-01 to 03), the balanced rule
#: (critical path plus a straggler guard) and the chain rule (each the default for a few hours on
#: 2026-12-03) are kept, unchanged, for comparison.
DEFAULT_PRESSURE = "asyncroll_repair"
PRESSURE_POLICIES = (
    "asyncroll_seed",
    "asyncroll_guarded",
    "asyncroll_unlock",
    "asyncroll_critical",
    "asyncroll_balanced",
    "asyncroll_chain",
    "asyncroll_repair",
)
#: The rules that order the tail by the work after each job (the chain rules learn it step by step).
CRITICAL_PATH = ("asyncroll_critical", "asyncroll_balanced", "asyncroll_chain", "asyncroll_repair")
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


def likely_policy(name: str) -> str | None:
    """The policy an unknown ``name`` most likely meant (another case, a hyphen for an underscore, a
    letter missing or wrong: ``FIFO``, ``tool-first``, ``asyncrol``), or None."""
    from difflib import get_close_matches

    from asyncroll.config import PolicyName

    known: tuple[str, ...] = PolicyName.__args__  # type: ignore[attr-defined]
    spelled = {policy.replace("_", ""): policy for policy in known}
    meant = spelled.get(name.lower().replace("-", "").replace("_", ""))
    close = get_close_matches(name.lower(), known, n=1, cutoff=0.8)
    return meant or (close[0] if close else None)


def unknown_policy_hint(name: str) -> str:
    """`` (did you mean 'fifo'?; known: ...)`` after an unknown policy: the names, and the likely one
    where there is one (another case, a hyphen for the underscore, a letter missing)."""
    from asyncroll.config import PolicyName

    meant = likely_policy(name)
    likely = f"did you mean {meant!r}?; " if meant else ""
    return f" ({likely}known: {', '.join(PolicyName.__args__)})"  # type: ignore[attr-defined]


def two_names_of_one(names: Iterable[str]) -> tuple[str, str] | None:
    """The first two of ``names`` that run one policy (``asyncroll`` and its rule, ``gpu_first`` and
    ``tool_first``, or one name given twice), or None: each would be a duplicate row of a table."""
    seen: dict[str, str] = {}
    for name in names:
        rule = canonical_policy(name)
        if rule in seen:
            return seen[rule], name
        seen[rule] = name
    return None


def estimator_for(policy: str) -> RemainingEstimator:
    """The remaining-work estimator a run subscribes for its policy (the rule's name, as ``get_policy``
    builds it): the chain rules' step-by-step chain (the repair rule's with a first evaluation's own
    prediction for its repair), the other critical-path rules' per-trajectory means, and for every other
    policy the default rule's, so its logged estimates compare with the default's."""
    rule = policy if policy in CRITICAL_PATH else DEFAULT_PRESSURE
    if rule in ("asyncroll_chain", "asyncroll_repair"):
        return StepwiseWork(own_repair=rule == "asyncroll_repair")
    return RemainingWork()


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
