"""Seeded fault draws: one RNG, one draw per chat request, in arrival order.

Given the same seed and the same order of requests, the same requests fail the same way, so a test that
sends requests one at a time knows exactly which fault each one meets.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Literal

from asyncroll.serve_sim.config import FaultConfig

Fault = Literal["http_429", "http_500", "http_503", "reset", "truncate", "malformed", "invalid_action"]


class FaultPlan:
    def __init__(self, config: FaultConfig, seed: int, *, enforce_schema: bool) -> None:
        self.config = config
        self._rng = random.Random(seed)
        self._enforce = enforce_schema
        self.injected: Counter[str] = Counter()

    def _order(self) -> list[tuple[Fault, float]]:
        c = self.config
        order: list[tuple[Fault, float]] = [
            ("http_429", c.rate_429),
            ("http_500", c.rate_500),
            ("http_503", c.rate_503),
            ("reset", c.reset_rate),
            ("truncate", c.truncate_rate),
            ("malformed", c.malformed_rate),
        ]
        if not self._enforce:
            order.append(("invalid_action", c.invalid_action_rate))
        return order

    def draw(self) -> tuple[Fault | None, bool]:
        """(the fault this request meets, or None; whether it is also slowed). Always consumes the same
        number of random draws, so one request's outcome does not shift the next one's."""
        fault: Fault | None = None
        for name, rate in self._order():
            hit = self._rng.random() < rate
            if hit and fault is None:
                fault = name
        slow = self._rng.random() < self.config.slow_rate
        if fault is not None:
            self.injected[fault] += 1
        if slow:
            self.injected["slow"] += 1
        return fault, slow
