"""A virtual loop's timers fall on a nanosecond grid (``asyncroll.clock.on_grid``): durations that add up to
one instant end at that instant, whichever float sums got them there, so a replay that sleeps a recorded
duration in one piece keeps its source's schedule."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from asyncroll.clock import VirtualClock, on_grid
from tests.conftest import invoke, write_workload


def test_sleeps_that_add_up_to_one_instant_end_at_it_together() -> None:
    """0.1 + 0.2 is 0.30000000000000004 in floats, and 0.16 + 0.175 + 0.0025 is not 0.335 + 0.0025: each
    such pair once woke one ulp apart, so which ran first was decided by the rounding."""
    clock = VirtualClock()
    woke: dict[str, float] = {}

    async def sleeper(name: str, *delays: float) -> None:
        for delay in delays:
            await asyncio.sleep(delay)
        woke[name] = clock.now()

    async def main() -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(sleeper("0.1+0.2", 0.1, 0.2))
            group.create_task(sleeper("0.3", 0.3))
            group.create_task(sleeper("0.16+0.175+0.0025", 0.16, 0.175, 0.0025))
            group.create_task(sleeper("0.335+0.0025", 0.335, 0.0025))
            group.create_task(sleeper("0.3375", 0.3375))

    clock.run(main())
    assert woke["0.1+0.2"] == woke["0.3"] == 0.3
    assert woke["0.16+0.175+0.0025"] == woke["0.335+0.0025"] == woke["0.3375"] == 0.3375


@pytest.mark.parametrize("in_place", [True, False])
def test_a_sleeper_stepped_in_place_lands_on_the_grid_too(in_place: bool) -> None:
    """:meth:`VirtualClock.sleep_stepping` moves its timer itself (no ``call_later``): that timer lies on the
    grid as well, so a sleeper stepped in place (0.1 s three times: 0.30000000000000004 off the grid) and a
    plain one due at that instant (0.25 + 0.05) wake in the order they do when nothing is done in place:
    their timers' (the stepper's was set first)."""
    clock = VirtualClock()
    steps: list[float] = []
    woke: list[tuple[str, float]] = []

    def next_sleep() -> float | None:
        return 0.1 if len(steps) < 2 else None

    async def stepper() -> None:
        if in_place:
            await clock.sleep_stepping(0.1, next_sleep, lambda: steps.append(clock.now()))
        else:
            for _ in range(2):
                await asyncio.sleep(0.1)
                steps.append(clock.now())
            await asyncio.sleep(0.1)
        woke.append(("stepper", clock.now()))

    async def plain() -> None:
        await asyncio.sleep(0.25)
        await asyncio.sleep(0.05)
        woke.append(("plain", clock.now()))

    async def main() -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(stepper())
            group.create_task(plain())

    clock.run(main())
    assert steps == [0.1, 0.2]
    assert woke == [("stepper", 0.3), ("plain", 0.3)]


@pytest.mark.parametrize(
    ("when", "expected"),
    [
        (0.1 + 0.2, 0.3),
        (0.3375 - 1e-17, 0.3375),
        (1.0000000004, 1.0),
        (1.0000000006, 1.000000001),
        (-0.1 - 0.2, -0.3),
        (2.0**53 / 1e9 + 0.25, 2.0**53 / 1e9 + 0.25),  # past the grid: left as it is
        (float("inf"), float("inf")),
    ],
)
def test_on_grid_rounds_to_the_nearest_nanosecond_until_floats_are_coarser(
    when: float, expected: float
) -> None:
    assert on_grid(when) == expected


def test_on_grid_leaves_nan_alone() -> None:
    when = on_grid(float("nan"))
    assert when != when


def _order(run: Path) -> list[tuple[Any, ...]]:
    lines = (run / "events.jsonl").read_text(encoding="utf-8").splitlines()
    return [
        (e["event"], e.get("id"), e.get("job_id"), e.get("request_id"), e["t"])
        for e in map(json.loads, lines)
    ]


def test_a_replay_of_a_simulation_whose_jobs_end_together_keeps_its_order(tmp_path: Path) -> None:
    """p0's job starts at 12.5 + 2.5 ms (its turn's latency and the turn overhead) and takes 2.5 ms; p1's
    starts at 0 + 2.5 ms and takes 12.5 ms. Both end at 17.5 ms, and so do their final turns at 30 ms.
    The replay sleeps each measured latency in one piece (15 ms, not 12.5 + 2.5): before the grid, its
    ends fell in the other order from its source's."""

    def problem(pid: str, latency_ms: float, spin_ms: float) -> dict[str, Any]:
        script = [
            {
                "type": "tool",
                "name": "spin_ms",
                "arguments": {"milliseconds": spin_ms},
                "latency_ms": latency_ms,
            },
            {"type": "final", "answer": "7", "latency_ms": 10},
        ]
        return {"id": pid, "prompt": pid, "tools": [{"name": "spin_ms"}], "script": script}

    workload = write_workload(tmp_path / "w.jsonl", [problem("p0", 12.5, 2.5), problem("p1", 2.5, 12.5)])
    source, replay = tmp_path / "run", tmp_path / "replay"
    settings = ("--policy", "fifo", "--cpu-workers", "2", "--turn-overhead-ms", "2.5")
    done = invoke("simulate", "--workload", workload, "--output", source, *settings)
    assert done.exit_code == 0, done.output
    done = invoke("simulate", "--from-run", source, "--output", replay)
    assert done.exit_code == 0, done.output
    ends = [e for e in _order(source) if e[0] == "cpu_finished"]
    assert [e[4] for e in ends] == [0.0175, 0.0175]  # the tie this is about
    assert _order(replay) == _order(source)
