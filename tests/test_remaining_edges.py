"""The repair rule's estimate for a first evaluation that is not its trajectory's first job: its own
predicted time stands for its repair's at any turn, not only at turn 0."""

from __future__ import annotations

import pytest

from asyncroll.policies import JobView
from asyncroll.policies.remaining import StepwiseWork
from tests.test_remaining_chain import Script


def test_a_first_evaluation_after_turn_0_has_its_own_time_for_its_repair() -> None:
    """Four trajectories: a first evaluation at turn 1 (0.3 s), 0.4 s of model, its repair (1 s), the end.
    After a first evaluation predicted at 0.5 s comes 0.4 s + 0.5 s; predicted at 5 s, 0.4 s + 5 s."""
    work = StepwiseWork(own_repair=True)
    for i in range(4):
        script = Script(f"t{i}", work)
        script.model(0, 0.4)
        script.job(1, 0.3)
        script.model(1, 0.4)
        script.job(3, 1.0, resub=True)
        script.finish()
    first = JobView(9, "y", "tool", "crunch", 1, 0.0)
    assert work.estimate(first) == pytest.approx(1.4)  # no prediction: the repairs' mean, 1 s
    assert (work.estimate(first, 0.5), work.estimate(first, 5.0)) == (pytest.approx(0.9), pytest.approx(5.4))
