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
                note = _why_unknown(summary, gate.metric)
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


def _why_unknown(summary: dict[str, Any] | None, metric: str) -> str:
    """Why a gate's metric has no value: the arm has no summary (it did not complete), the value's
    denominator is 0, a section on its path is null, the summary gives its own reason (``…_reason``
    beside it: ``per_wall_hour_reason`` for ``completed_per_wall_hour``, ``sampled_starvation_reason`` for
    ``sampled_starvation_s``; a ``…null_reasons`` group naming it; a section's own ``reason``, as
    ``cpu_cost``'s), it is null (not measured in this run), or it is not in the summary."""
    if summary is None:
        return "unknown (arm failed or its summary unreadable)"
    count = DENOMINATORS.get(metric)
    if count is not None and dig(summary, count) == 0:
        return f"undefined ({count} = 0)"
    *path, leaf = metric.split(".")
    parent: Any = summary
    for depth, part in enumerate(path):
        if isinstance(parent, dict) and parent.get(part, ...) is None:
            return f"unknown ({'.'.join(path[: depth + 1])} is null)"
        parent = parent.get(part) if isinstance(parent, dict) else None
    if not isinstance(parent, dict) or leaf not in parent:
        return "unknown (not in the arm's summary.json)"
    if parent[leaf] is not None:
        return f"unknown (not a number: {type(parent[leaf]).__name__})"
    reasons = [
        value
        for key, value in parent.items()
        if key.endswith("_reason")
        and isinstance(value, str)
        and _reason_of(key.removesuffix("_reason"), leaf)
    ] + [  # a group's reasons by name (``pearson_null_reasons``)
        value[leaf]
        for key, value in parent.items()
        if key.endswith("null_reasons") and isinstance(value, dict) and isinstance(value.get(leaf), str)
    ]
    if isinstance(parent.get("reason"), str):  # the whole section's (``cpu_cost``)
        reasons.append(parent["reason"])
    return f"unknown ({reasons[0]})" if reasons else "unknown (null: not measured in this run)"


def _reason_of(stem: str, leaf: str) -> bool:
    """Whether ``<stem>_reason`` speaks for ``leaf``: the figure itself (``completed_per_gpu_hour``), the
    figures it ends (``per_wall_hour``: ``completed_per_wall_hour``) or begins (``sampled_starvation``:
    ``sampled_starvation_s``, ``sampled_starvation_fraction_of_coverage``)."""
    return leaf == stem or leaf.endswith("_" + stem) or leaf.startswith(stem + "_")


def comparison_text(verdict: dict[str, Any], observed: str) -> str:
    """``<observed> <op> <threshold>`` of a gate's verdict, ``observed`` the observed value as written
    (or the note of one that is None), the threshold with ``g``. Unless, read back, they compare the other
    way than the values do (0.89996 >= 0.9 written "0.9 >= 0.9", a failed gate that reads as passed):
    then both with as many significant digits as it takes (17 give every double back)."""
    value, op, raw = verdict["value"], verdict["op"], verdict["observed"]
    threshold = format(value, "g")
    compare = OPS.get(op)  # None: a hand-edited comparison.json's operator, nothing to keep consistent
    if raw is not None and compare is not None:
        verdict_of_values = compare(raw, value)
        digits = 4
        while (
            digits <= 17 and compare(float(observed.replace(",", "")), float(threshold)) != verdict_of_values
        ):
            digits += 1
            observed, threshold = format(raw, f".{digits}g"), format(value, f".{digits}g")
    return f"{observed} {op} {threshold}"


def gate_text(verdicts: list[dict[str, Any]], failed_arms: list[str]) -> str:
    parts = [
        f"{v['metric']}[{v['arm']}] = "
        + comparison_text(v, v["note"] or "unknown" if v["observed"] is None else format(v["observed"], "g"))
        + f": {'ok' if v['passed'] else 'no'}"
        for v in verdicts
    ]
    if failed_arms:
        parts.append(f"failed arms: {', '.join(failed_arms)}")
    return (" (" + "; ".join(parts) + ")") if parts else ""
