"""The chain's walk on a chain with a longer cycle (made by hand: the runtime runs one job per turn and
turns only increase): a key met again while its own expectation is being computed counts 0 after it, on
every path back to it, and the walk ends."""

from __future__ import annotations

import pytest

from asyncroll.policies import JobView
from asyncroll.policies.remaining import StepwiseWork
from tests.test_remaining_chain import Script


@pytest.mark.timeout(10)
def test_a_key_met_again_deeper_on_its_own_chain_counts_nothing_more() -> None:
    """A (turn 0) → B (turn 1) → C (turn 3) → B again → the end. From A: B, then half C and back to B
    (counted 0 after it, as it is being computed), half the end."""
    chain = StepwiseWork(min_transitions=1)
    s = Script("t", chain)
    s.model(0, 0.1)
    s.job(0, 0.5)  # A
    s.model(1, 0.2)
    s.job(1, 1.0)  # B
    s.model(3, 0.3)
    s.job(3, 2.0)  # C
    s.model(1, 0.4)
    s.job(1, 3.0)  # B again: its mean execute time is 2 s
    s.model(4, 0.6)
    s.finish()
    after_c = 0.4 + 2.0 + 0.0  # back to B, which is on the walk: nothing more
    after_b = 0.5 * (0.3 + 2.0 + after_c) + 0.5 * 0.6
    first = JobView(9, "u", "tool", "crunch", 0, 0.0)
    assert chain.estimate(first) == pytest.approx(0.2 + 2.0 + after_b)
