"""Seeded jitter of a workload's timings, for sweeps with a spread over seeds.

Every model latency and every CPU cost (a tool job's ``cpu_ms`` and a ``submit``'s, its evaluation) is
multiplied by a mean-one lognormal factor drawn from a generator keyed by (seed, problem id, turn, kind)
— never from global random state — so the same seed gives the same durations to every policy and
operating point: sweep cells are paired comparisons on common random numbers. A
``spin_ms``/``sleep_ms`` call without ``cpu_ms`` gets ``cpu_ms`` from its argument first.
``sigma = 0`` copies the timings unchanged. A jittered duration is capped at one day, the limit of a
declared one (a large ``sigma`` could otherwise turn a valid long job into a workload the sweep refuses).

A declared ``output_tokens`` is scaled by the same factor as its turn's ``latency_ms`` (rounded, at least
one token): the batching server model (``--server batching``) times a turn by its tokens, not its
latency, and would otherwise see the same turns on every seed. A turn without ``output_tokens`` (the
batching model then counts the action's size) is not jittered there.
"""

from __future__ import annotations

import hashlib
import math
import random
from pathlib import Path
from typing import Any

from asyncroll.outputs.lines import TextOutput
from asyncroll.workload import (
    MAX_DURATION_MS,
    MAX_OUTPUT_TOKENS,
    ErrorStep,
    SubmitAction,
    ToolAction,
    iter_problems,
)


def factor(seed: int, problem: str, turn: int, kind: str, sigma: float) -> float:
    """A mean-one lognormal multiplier, a pure function of its arguments."""
    if sigma <= 0:
        return 1.0
    digest = hashlib.sha256(f"{seed}\0{problem}\0{turn}\0{kind}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    return math.exp(rng.gauss(-sigma * sigma / 2.0, sigma))


def perturb_workload(
    source: Path, destination: Path, seed: int, sigma: float, limit: int | None = None
) -> int:
    """Write ``source`` with jittered timings to ``destination`` (its first ``limit`` problems: the lines
    past them are never read, as a run's ``--limit`` reads none); returns the number of problems. A
    failure to write ``destination`` (a full disk) is an :class:`OutputWriteError` that names it."""
    count = 0
    with TextOutput(destination) as out:
        for _, pid, problem in iter_problems(source, limit):
            script = []
            for turn, action in enumerate(problem.script or []):
                update: dict[str, Any] = {}
                model = factor(seed, pid, turn, "model", sigma)
                if action.latency_ms is not None:
                    update["latency_ms"] = min(MAX_DURATION_MS, action.latency_ms * model)
                if not isinstance(action, ErrorStep) and action.output_tokens is not None and model != 1.0:
                    update["output_tokens"] = min(
                        MAX_OUTPUT_TOKENS, max(1, round(action.output_tokens * model))
                    )
                if isinstance(action, ToolAction | SubmitAction):  # an evaluation's cost too
                    cost = action.cpu_ms
                    if (
                        cost is None
                        and isinstance(action, ToolAction)
                        and action.name in ("spin_ms", "sleep_ms")
                    ):
                        cost = float(action.arguments.get("milliseconds", 0))
                    if cost is not None:
                        update["cpu_ms"] = min(MAX_DURATION_MS, cost * factor(seed, pid, turn, "cpu", sigma))
                script.append(action.model_copy(update=update))
            out.write(problem.model_copy(update={"id": pid, "script": script}).model_dump_json() + "\n")
            count += 1
    return count
