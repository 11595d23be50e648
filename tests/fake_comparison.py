"""comparison.json of a two-arm experiment built from each pair's summary values, for the report's tests."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from asyncroll.experiment.comparison import build_comparison
from asyncroll.experiment.report import aggregate


def two_arms() -> dict[str, Any]:
    """experiment.json's config of a two-arm experiment (a = fifo, the baseline; b = asyncroll), fresh."""
    return {
        "name": "x",
        "arms": [{"name": "a", "policy": "fifo"}, {"name": "b", "policy": "asyncroll"}],
        "baseline": "a",
        "seed": 0,
        "bootstrap_resamples": 200,
    }


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def comparison(
    rows: list[tuple[dict[str, Any], dict[str, Any]]],
    errors: dict[str, str] | None = None,
    stages: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """comparison.json of a two-arm experiment (a = fifo, the baseline; b = asyncroll), from each pair's
    (a, b) summary values given as dotted paths; ``errors`` fails the named arms; ``stages``: the
    experiment's stage records (gates and their verdicts)."""
    n = len(rows)
    experiment = {
        "config": two_arms(),
        "status": "complete",
        "fingerprint": {"sha256": "f" * 64},
        "stages": stages or {},
        "plan": [
            {"id": f"pair{p + 1}-{a}", "stage": "comparison", "pair": p, "arm": a, "policy": a, "seed": p}
            for p in range(n)
            for a in ("a", "b")
        ],
        "arms": {
            f"pair{p + 1}-{a}": {"status": "failed", "error": (errors or {})[f"pair{p + 1}-{a}"]}
            if f"pair{p + 1}-{a}" in (errors or {})
            else {"status": "complete"}
            for p in range(n)
            for a in ("a", "b")
        },
    }
    base = {
        "counts.trajectories": 3,
        "counts.completed": 3,
        "accuracy.correct": 3,
        "accuracy.denominator": 3,
        "scheduler.reorders": 0,
        "scheduler.eligible_decisions": 0,
        "throughput.allocated_gpu_hours": 0.001,
        "cpu_cost.total_cpu_s": 0.3,
    }
    summaries = {}
    for p, (a, b) in enumerate(rows):
        summaries[f"pair{p + 1}-a"] = nest({**base, **a})
        summaries[f"pair{p + 1}-b"] = nest({**base, **b})
    return build_comparison(experiment, summaries)


def drawn(data: dict[str, Any], stem: Path) -> Any:
    """The figure ``draw`` made of ``data`` (warnings are errors), kept open and laid out to read back what
    it drew; the caller closes it."""
    import matplotlib.pyplot as plt

    from asyncroll.experiment import figure

    kept: list[Any] = []
    close = plt.close
    try:
        plt.close = kept.append  # type: ignore[assignment]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            figure.draw(data, aggregate(data), stem)
    finally:
        plt.close = close
    fig = kept[0]
    fig.canvas.draw()
    return fig
