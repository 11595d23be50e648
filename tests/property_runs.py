"""Generated workloads and settings for the property-based tests (``tests/test_properties.py``), and a
simulation of one in this process: the real runtime on the simulator's virtual clock.

A workload is 1–25 scripted problems: tool calls mixing ``spin_ms``/``sleep_ms``/``add`` with and without
``cpu_ms``, finals with and without a ``reference_answer`` (and scripts that run out before one), and
one-repair submissions that pass, fail or declare nothing. Settings: every registered policy, the three
limits, ``max_turns``, ``--tool-errors``, sometimes a tool timeout some jobs pass (or end exactly at),
the pressure policies' knobs, and a fixed-latency or batching server with or without overheads.
``contended_settings`` with ``workloads(cpu=LONG_MS)``: the same, CPU-bound, for the reordering policies.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from asyncroll.backends.server_model import ServerModelConfig
from asyncroll.config import build_config
from asyncroll.policies.registry import PRESSURE_POLICIES
from asyncroll.simulation.engine import SimulationSettings, simulate
from tests.conftest import write_workload

#: Every registered policy but the deprecated alias ``gpu_first`` (``tool_first`` under another name).
POLICIES = ("sync", "fifo", "tool_first", "asyncroll", *PRESSURE_POLICIES)
#: Deterministic, no database, no deadline (a loaded machine must not fail an example for its speed); no
#: ``explain`` phase: on a failing example it re-ran each simulation for minutes before reporting it.
PROPS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=60,
    phases=[phase for phase in Phase if phase is not Phase.explain],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: A few durations (ms) shared by many steps, so that events often fall on the same virtual instant.
MS = st.one_of(st.sampled_from([0, 1, 5, 10, 20, 50]), st.integers(0, 300))


@st.composite
def tool_problem(draw: st.DrawFn, pid: str, cpu: st.SearchStrategy[int] = MS) -> dict[str, Any]:
    tools = draw(
        st.lists(st.sampled_from(["spin_ms", "sleep_ms", "add"]), min_size=1, max_size=3, unique=True)
    )
    script: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(0, 6) | st.integers(2, 6))):
        name = draw(st.sampled_from(tools))
        arguments = {"a": draw(st.integers(-9, 9)), "b": 2} if name == "add" else {"milliseconds": draw(cpu)}
        step: dict[str, Any] = {"type": "tool", "name": name, "arguments": arguments}
        step["latency_ms"] = draw(st.none() | MS)
        if draw(st.booleans()):
            step["cpu_ms"] = draw(cpu)
        if draw(st.booleans()):
            step["output_tokens"] = draw(st.integers(1, 40))
        script.append(step)
    reference = draw(st.none() | st.just("7"))
    if not script or draw(st.integers(0, 5)):  # sometimes the script runs out: a model failure
        answer = draw(st.sampled_from(["7", " 7 ", "8"]))
        script.append({"type": "final", "answer": answer, "latency_ms": draw(st.none() | MS)})
    problem: dict[str, Any] = {"id": pid, "prompt": f"problem {pid}", "tools": [{"name": t} for t in tools]}
    problem["script"] = script
    if reference is not None:
        problem["reference_answer"] = reference
    return problem


@st.composite
def code_problem(draw: st.DrawFn, pid: str, failures: bool = False) -> dict[str, Any]:
    """A one-repair problem: one or two submissions, each passing, failing or declaring no verdict (with
    ``failures``, some that raise or whose worker dies)."""
    verdicts = draw(st.lists(st.sampled_from([True, False, None]), min_size=1, max_size=2))
    script = []
    for i, verdict in enumerate(verdicts):
        step: dict[str, Any] = {"type": "submit", "code": f"print({i})", "latency_ms": draw(MS)}
        if draw(st.booleans()):
            step["cpu_ms"] = draw(MS)
        if verdict is not None:
            step["passes"] = verdict
        failure = draw(st.sampled_from([None, None, "raises", "worker_dies"])) if failures else None
        if failure is not None:
            step[failure] = f"{failure} in {pid} submission {i}"
        script.append(step)
    return {
        "id": pid,
        "prompt": f"write a program for {pid}",
        "tools": [{"name": "lcb_evaluate"}],
        "script": script,
        "metadata": {
            "reference_tests": [{"input": "1", "output": "1", "testtype": "stdin"}],
            "prompt_metadata": {"protocol": "one_repair", "max_generations": 2},
        },
    }


@st.composite
def workloads(draw: st.DrawFn, cpu: st.SearchStrategy[int] = MS) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 25) | st.integers(12, 25))  # many, often: queues form
    return [
        draw(code_problem(f"p{i}") if draw(st.integers(0, 3)) == 0 else tool_problem(f"p{i}", cpu))
        for i in range(n)
    ]


@st.composite
def run_settings(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {
        "policy": draw(st.sampled_from(POLICIES)),
        "max_active_trajectories": draw(st.integers(1, 8)),
        "max_inflight_model_requests": draw(st.integers(1, 8)),
        "cpu_workers": draw(st.integers(1, 4)),
        "max_turns": draw(st.integers(1, 8)),
        "tool_errors": draw(st.sampled_from(["fail", "observe"])),
    }
    if draw(st.integers(0, 3)) == 0:  # a short tool timeout: some jobs time out, workers are replaced
        out["tool_timeout"] = draw(st.sampled_from([0.05, 0.15]))  # 50 ms: jobs that end at the timeout
    if out["policy"].startswith("asyncroll"):
        out["aging_seconds"] = draw(st.sampled_from([0.05, 0.2, 30.0]))
        out["aging_weight"] = draw(st.sampled_from([0.0, 0.02, 1.0]))
        if draw(st.booleans()):
            out["starvation_threshold"] = draw(st.integers(1, 8))
    return out


#: Tool jobs that outlast most model turns (``MS`` draws up to 300 ms for both): with the settings below
#: jobs queue behind one or two workers, so the reordering policies reorder in most examples.
LONG_MS = st.integers(100, 400)


@st.composite
def contended_settings(draw: st.DrawFn) -> dict[str, Any]:
    """``run_settings`` where CPU is the bottleneck, for the policies that can reorder: many active
    trajectories, one or two workers."""
    out = draw(run_settings())
    out["policy"] = draw(st.sampled_from(("tool_first", "asyncroll", *PRESSURE_POLICIES)))
    out["max_active_trajectories"] = draw(st.integers(4, 8))
    out["cpu_workers"] = draw(st.integers(1, 2))
    out.pop("tool_timeout", None)
    if not out["policy"].startswith("asyncroll"):  # knobs ``run_settings`` drew for another policy
        for knob in ("aging_seconds", "aging_weight", "starvation_threshold"):
            out.pop(knob, None)
    else:  # hard aging at 50 or 200 ms would take nearly every decision from the rules after it
        out["aging_seconds"] = draw(st.sampled_from([1.0, 30.0]))
    return out


OVERHEAD_MS = st.sampled_from([0.0, 0.0, 1.0, 2.5])
SERVERS = st.one_of(
    st.builds(SimulationSettings, turn_overhead_ms=OVERHEAD_MS, job_overhead_ms=OVERHEAD_MS),
    st.builds(
        lambda seqs, turn, job: SimulationSettings(
            "batching", ServerModelConfig(max_num_seqs=seqs), turn_overhead_ms=turn, job_overhead_ms=job
        ),
        st.integers(1, 8),
        OVERHEAD_MS,
        OVERHEAD_MS,
    ),
)


def simulated(
    folder: Path, problems: list[dict[str, Any]], values: dict[str, Any], server: SimulationSettings
) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    """Simulate ``problems`` into ``folder/run``: (summary, events, events.jsonl's text)."""
    workload = write_workload(folder / "w.jsonl", problems)
    out = folder / "run"
    cfg = build_config({"workload": workload, "output": out, **values})
    outcome = simulate(cfg, server, ["test"])
    assert outcome.status == "complete", outcome.error
    text = (out / "events.jsonl").read_text(encoding="utf-8")
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    return summary, [json.loads(line) for line in text.splitlines()], text
