"""summary.json's scheduler diagnostics recomputed from the run's own events.jsonl, independently of the
summary's code (the standard library's correlation): decisions, eligible decisions, reorders, the
activation rate, reason counts, the queue's peak and the log-log prediction correlations, overall, over
first runs and over resubmissions (tool and evaluation jobs that finished ok, joined by job id)."""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import VirtualRun


def _problem(i: int) -> dict[str, Any]:
    """Alternately a fast and a slow tool, twice (the second call a resubmission), then a final."""
    tool, ms = ("sleep_ms", 5.0 + i % 3) if i % 2 else ("spin_ms", 400.0 + 10 * (i % 5))
    calls = [
        {"type": "tool", "name": tool, "arguments": {"milliseconds": ms * k}, "latency_ms": 20}
        for k in (1, 2)
    ]
    final = {"type": "final", "answer": "x", "latency_ms": 20}
    return {"id": f"q{i}", "prompt": "p", "tools": [{"name": tool}], "script": [*calls, final]}


def _events(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


def _r(pairs: list[tuple[float, float]]) -> float:
    return round(statistics.correlation([x for x, _ in pairs], [y for _, y in pairs]), 4)


@pytest.mark.parametrize("policy", ["asyncroll", "asyncroll_seed", "fifo"])
def test_scheduler_diagnostics_are_what_the_events_say(virtual_run: VirtualRun, policy: str) -> None:
    outcome, _, out = virtual_run(
        [_problem(i) for i in range(24)], policy=policy, cpu_workers=2, max_active_trajectories=8
    )
    assert outcome.status == "complete" and outcome.summary is not None
    scheduler = outcome.summary["scheduler"]
    events = _events(out)
    selected = [e for e in events if e["event"] == "cpu_selected"]
    eligible = sum(e["eligible"] for e in selected)
    reorders = sum(e["reordered"] for e in selected)
    assert scheduler["decisions"] == len(selected) == 48
    assert (scheduler["eligible_decisions"], scheduler["reorders"]) == (eligible, reorders)
    assert scheduler["activation_rate"] == (None if eligible == 0 else round(reorders / eligible, 6))
    assert scheduler["reasons"] == dict(Counter(e["reason"] for e in selected))
    depth = max(e["queue_depth"] for e in events if e["event"] == "cpu_enqueued")
    assert scheduler["max_queue_depth"] == depth
    if policy == "fifo":
        assert eligible == 0 and reorders == 0 and scheduler["activation_rate"] is None
    else:
        assert reorders > 0  # the rule fired: the hand-made workload has fast and slow jobs queued together
    resubmission = {e["job_id"]: e["resubmission"] for e in events if e["event"] == "cpu_enqueued"}
    predicted = {e["job_id"]: e["predicted_s"] for e in selected}
    pairs: dict[str, list[tuple[float, float]]] = {"all": [], "first": [], "repairs": []}
    for e in events:
        if e["event"] == "cpu_finished" and e["ok"] and e["kind"] != "grade" and e["execute_s"] > 0:
            pair = (math.log(predicted[e["job_id"]]), math.log(e["execute_s"]))
            pairs["all"].append(pair)
            pairs["repairs" if resubmission[e["job_id"]] else "first"].append(pair)
    prediction = scheduler["prediction"]
    assert (prediction["pairs"], prediction["pairs_first"], prediction["pairs_repairs"]) == (48, 24, 24)
    for field, key in (
        ("pearson_log", "all"),
        ("pearson_log_first", "first"),
        ("pearson_log_repairs", "repairs"),
    ):
        assert prediction[field] == pytest.approx(_r(pairs[key]), abs=1e-4), field
    assert prediction["pearson_log_repairs"] > 0.9  # each re-call predicted by its first call (same tool)
