"""A sweep's table: each cell's spread over seeds (min / median / max), its paired change of makespan
against FIFO on the same seeds, and the markdown of ``sweep.md``. (``sweep.json`` holds the same cells as
numbers.)"""

from __future__ import annotations

import statistics
from typing import Any

Spread = dict[str, float] | None


def _spread(values: list[float]) -> Spread:
    """Min, median and max over seeds (None: no value to summarise)."""
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def _shown(spread: Spread) -> str:
    if spread is None:
        return "n/a"
    return " / ".join(f"{spread[k]:.3f}" for k in ("min", "median", "max"))


def _shown_count(spread: Spread) -> str:
    """A count's spread as counts: ``513``, or ``280.5`` for the median of an even number of seeds."""
    if spread is None:
        return "n/a"
    return " / ".join(f"{spread[k]:.1f}".removesuffix(".0") for k in ("min", "median", "max"))


def _shown_rate(spread: Spread) -> str:
    """A rate's spread to four significant digits, whole with thousands separators from 10,000 (as the
    experiment report writes them): hours-long trajectories complete a few an hour, which whole numbers
    wrote as "0 / 0 / 0"."""
    if spread is None:
        return "n/a"

    def one(x: float) -> str:
        short = format(x, "z.4g")
        return format(x, "z,.0f") if "e+" in short else short

    return " / ".join(one(spread[k]) for k in ("min", "median", "max"))


def _shown_change(spread: Spread) -> str:
    if spread is None:
        return "n/a"
    return " / ".join(f"{100 * spread[k]:+.1f}%" for k in ("min", "median", "max"))


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (policy, point): each metric's spread over seeds (``{min, median, max}``, None when
    no seed has a value) and ``vs_fifo``, the paired change of makespan against fifo on the same seed
    (a fraction; None for fifo itself or without fifo in the sweep) over ``paired_seeds`` seeds: those with a
    fifo run at the same point, fewer than ``seeds`` in a sweep stopped part-way."""
    fifo = {
        (r["active"], r["inflight"], r["workers"], r["seed"]): r["makespan_s"]
        for r in rows
        if r["policy"] == "fifo"
    }
    cells: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        cells.setdefault((r["policy"], r["active"], r["inflight"], r["workers"]), []).append(r)
    out = []
    for (policy, active, inflight, workers), group in cells.items():
        paired = [
            r["makespan_s"] / fifo[(active, inflight, workers, r["seed"])] - 1.0
            for r in group
            if (active, inflight, workers, r["seed"]) in fifo and fifo[(active, inflight, workers, r["seed"])]
        ]
        out.append(
            {
                "policy": policy,
                "active": active,
                "inflight": inflight,
                "workers": workers,
                "seeds": len(group),
                "makespan_s": _spread([r["makespan_s"] for r in group]),
                "efficiency": _spread([r["efficiency"] for r in group if r["efficiency"] is not None]),
                "cpu_blocked_s": _spread([r["cpu_blocked_s"] for r in group]),
                "reorders": _spread([float(r["reorders"]) for r in group]),
                "vs_fifo": None if policy == "fifo" else _spread(paired),
                "paired_seeds": None if policy == "fifo" else len(paired),
                "failed": sum(r["failed"] for r in group),  # over the seeds
                # a seed with no completion has a measured 0 per hour: it counts (only null is left out)
                "completed_per_hour": _spread(
                    [r["completed_per_hour"] for r in group if r["completed_per_hour"] is not None]
                ),
            }
        )
    return out


def markdown(agg: list[dict[str, Any]]) -> str:
    # Cells that stand on different numbers of seeds (a sweep stopped part-way) show each one's count.
    uneven = len({c["seeds"] for c in agg}) > 1
    lines = [
        "| policy | active | inflight | workers |"
        + (" seeds |" if uneven else "")
        + " makespan s (min / med / max) | completed per hour "
        "| efficiency (min / med / max) | CPU-blocked s | reorders "
        "| makespan vs fifo, paired (min / med / max) |",
        "|---|---:|---:|---:|" + ("---:|" if uneven else "") + "---|---|---|---|---|---|",
    ]
    for c in sorted(agg, key=_cell_order):
        lines.append(
            f"| {c['policy']} | {c['active']} | {c['inflight']} | {c['workers']} "
            + (f"| {c['seeds']} " if uneven else "")
            + f"| {_shown(c['makespan_s'])} | {_shown_rate(c['completed_per_hour'])} "
            f"| {_shown(c['efficiency'])} "
            f"| {_shown(c['cpu_blocked_s'])} | {_shown_count(c['reorders'])} "
            f"| {_shown_change(c['vs_fifo'])}{_paired_on(c)} |"
        )
    failing = [c for c in sorted(agg, key=_cell_order) if c.get("failed")]
    if failing:  # a failed trajectory ends early: its cell's makespan covers less work than the others'
        lines += ["", "Failed trajectories (those cells' makespans cover less work; compare them with care):"]
        lines += [
            f"- {c['policy']} at {c['active']} / {c['inflight']} / {c['workers']}: {c['failed']} over "
            f"{c['seeds']} seed(s)"
            for c in failing
        ]
    ignored = sorted({c["active"] for c in agg if c["policy"] == "sync" and c["active"] > 1})
    if ignored:  # one simulation under several labels: said, as simulate --policy sync says it
        lines += [
            "",
            f"sync runs one trajectory at a time: its rows at active {', '.join(map(str, ignored))} ran with "
            "1 active trajectory (their numbers are those of active 1).",
        ]
    return "\n".join(lines) + "\n"


def _paired_on(cell: dict[str, Any]) -> str:
    """How many seeds a cell's change against fifo stands on, where fewer than the cell's own (a sweep
    stopped before fifo ran on some of them)."""
    paired = cell.get("paired_seeds")
    if cell["vs_fifo"] is None or paired is None or paired >= cell["seeds"]:
        return ""
    return f" ({paired} of {cell['seeds']} seeds)"


def _cell_order(c: dict[str, Any]) -> tuple[Any, ...]:
    return (c["active"], c["inflight"], c["workers"], c["policy"])
