"""The pressure-aware rules the tests compare with, built as the registry builds them: the seed rule, the
tail guard, the unlock rule, the critical-path rule and the balanced rule (critical path plus the
straggler guard)."""

from __future__ import annotations

from asyncroll.policies.pressure import PressurePolicy

SEED = PressurePolicy("asyncroll_seed")
GUARDED = PressurePolicy("asyncroll_guarded", tail_guard=True)
UNLOCK = PressurePolicy("asyncroll_unlock", unlock=True)
CRITICAL = PressurePolicy("asyncroll_critical", unlock=True, drain_multiple=None, critical_path=True)
BALANCED = PressurePolicy(
    "asyncroll_balanced", unlock=True, drain_multiple=None, critical_path=True, straggler=True
)
