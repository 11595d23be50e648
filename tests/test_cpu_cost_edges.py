"""summary.json's ``cpu_cost`` at its edges: a worker reading missing at one end only, a replaced worker
in a run with no completion, a simulation, and the rounding of each number."""

from __future__ import annotations

import pytest

from asyncroll.outputs.cpu_cost import cpu_cost


@pytest.mark.parametrize(("start", "end"), [((1.0, 10.0), (3.0, None)), ((1.0, None), (3.0, 16.0))])
def test_a_worker_reading_missing_at_one_end_is_unknown(
    start: tuple[float, float | None], end: tuple[float, float | None]
) -> None:
    """A worker killed as the run stopped has no reading at the end (one that psutil could not read at the
    start, none there): the workers' share is unknown, the client's still measured."""
    cost = cpu_cost(start, end, replaced=False, completed=4)
    assert cost["client_cpu_s"] == 2.0
    assert cost["workers_cpu_s"] is None and cost["total_cpu_s"] is None and cost["per_completion_s"] is None
    assert cost["reason"] is not None and cost["reason"].startswith("worker CPU time unavailable")


def test_a_replaced_worker_in_a_run_without_completions_keeps_its_reason() -> None:
    cost = cpu_cost((1.0, 10.0), (3.0, 16.0), replaced=True, completed=0)
    assert (cost["workers_cpu_s"], cost["total_cpu_s"], cost["per_completion_s"]) == (None, None, None)
    assert cost["reason"] is not None and "replaced" in cost["reason"]


def test_a_simulation_has_no_cpu_cost_even_with_readings() -> None:
    cost = cpu_cost((1.0, 10.0), (3.0, 16.0), replaced=False, completed=4, simulated=True)
    assert {k: v for k, v in cost.items() if k != "reason"} == dict.fromkeys(
        ("client_cpu_s", "workers_cpu_s", "total_cpu_s", "per_completion_s")
    )
    assert cost["reason"] is not None and "simulated" in cost["reason"]


def test_each_number_is_rounded_to_the_microsecond() -> None:
    """Client 0.1234567 s, workers 0.3000014 s, 3 completions: per completion 0.423458 / 3."""
    cost = cpu_cost((0.0, 0.5), (0.1234567, 0.8000014), replaced=False, completed=3)
    assert cost == {
        "client_cpu_s": 0.123457,
        "workers_cpu_s": 0.300001,
        "total_cpu_s": 0.423458,
        "per_completion_s": 0.141153,
        "reason": None,
    }
