"""What a trajectory's CPU jobs look like to the dispatcher's readers: ``cpu_enqueued`` in events.jsonl
(kind, tool, turn, argument bytes, ``resubmission``: the trajectory ran this tool before) and the
:class:`JobView` a policy decides on (the evaluation-only features are 0 for tool calls and grades)."""

from __future__ import annotations

from typing import Any

import pytest

from asyncroll.events import CpuEnqueued
from asyncroll.policies import JobView, QueueSnapshot, get_policy
from tests.conftest import VirtualRun, tool_problem


def test_a_repeated_tool_call_is_a_resubmission_and_a_grade_is_not(
    virtual_run: VirtualRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    from asyncroll.runtime import assembly

    views: dict[int, JobView] = {}
    fifo = get_policy("fifo")

    class Spy:
        name = "fifo"

        def choose(self, snapshot: QueueSnapshot) -> Any:
            views.update((j.job_id, j) for j in snapshot.jobs)
            return fifo.choose(snapshot)

    monkeypatch.setattr(assembly, "get_policy", lambda *a, **k: Spy())
    problem = tool_problem("p", model_ms=1, cpu_ms=2, turns=3)
    problem["reference_answer"] = "ok"  # the final answer is graded: a CPU job of kind grade
    outcome, capture, _ = virtual_run([problem], policy="fifo")
    assert outcome.status == "complete"
    enqueued = [(e.kind, e.tool, e.turn, e.arg_bytes, e.resubmission) for e in capture.of(CpuEnqueued)]
    assert enqueued == [
        ("tool", "sleep_ms", 0, 19, False),  # {"milliseconds":2.0}: 19 bytes
        ("tool", "sleep_ms", 1, 19, True),
        ("tool", "sleep_ms", 2, 19, True),
        ("grade", "__grade__", 3, 2, False),  # the answer "ok"
    ]
    assert [(v.kind, v.resubmission, v.n_tests, v.test_bytes, v.code_bytes) for v in views.values()] == [
        ("tool", False, 0, 0, 0),
        ("tool", True, 0, 0, 0),
        ("tool", True, 0, 0, 0),
        ("grade", False, 0, 0, 0),
    ]
