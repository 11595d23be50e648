"""A stage's gates: each gate's metric read from each arm's summary, compared, and said in one line."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from asyncroll.experiment.comparison import DENOMINATORS, dig
from asyncroll.experiment.config import Gate

OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
    "==": operator.eq,
    "!=": operator.ne,
}


def evaluate_gates(
    gates: list[Gate], stage_arms: list[str], values: dict[str, dict[str, Any] | None]
) -> list[dict[str, Any]]:
    """Each gate on each arm it names: observed value (None if unknown) and the verdict."""
    verdicts = []
    for gate in gates:
        for arm in [gate.arm] if gate.arm else stage_arms:
            summary = values.get(arm)
            raw = None if summary is None else dig(summary, gate.metric)
            observed = float(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) else None
            passed = observed is not None and OPS[gate.op](observed, gate.value)
            note = None
            if observed is None:
                count = DENOMINATORS.get(gate.metric)
                zero = summary is not None and count is not None and dig(summary, count) == 0
                note = f"undefined ({count} = 0)" if zero else "unknown (arm failed or metric not measured)"
            verdicts.append(
                {
                    "metric": gate.metric,
                    "op": gate.op,
                    "value": gate.value,
                    "arm": arm,
                    "observed": observed,
                    "passed": passed,
                    "note": note,
                }
            )
    return verdicts


def gate_text(verdicts: list[dict[str, Any]], failed_arms: list[str]) -> str:
    parts = [
        f"{v['metric']}[{v['arm']}] = "
        f"{v['note'] or 'unknown' if v['observed'] is None else format(v['observed'], 'g')} "
        f"{v['op']} {v['value']:g}: {'ok' if v['passed'] else 'no'}"
        for v in verdicts
    ]
    if failed_arms:
        parts.append(f"failed arms: {', '.join(failed_arms)}")
    return (" (" + "; ".join(parts) + ")") if parts else ""
