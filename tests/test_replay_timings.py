"""The recorded timings a replay (``simulate --from-run``) takes: every replacement worker's measured
start-up (then their median, or the initial workers'), virtual and real; a replacement nothing waits
for stays outside the makespan; a damaged start-up or duration is refused naming its events.jsonl line;
a simulation replayed, or a worker death the replay cannot reproduce, is said and recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncroll.clock import VirtualClock
from asyncroll.config import build_config
from asyncroll.runtime.run import Run, prepare
from asyncroll.runtime.virtual_worker import builtin_duration, virtual_factory
from tests.cli_runs import load_run
from tests.conftest import invoke, tool_problem, write_workload
from tests.simulations import _edit_lines, simulate_here


def test_virtual_replacements_take_their_start_up_in_order_then_the_median() -> None:
    factory = virtual_factory(VirtualClock(), replacement_startup=(0.4, 0.1, 0.3))
    assert [factory(slot, 0).startup_s for slot in range(2)] == [0.0, 0.0]  # before the measured window
    assert [factory(k % 2, 1 + k // 2).startup_s for k in range(5)] == [0.4, 0.1, 0.3, 0.3, 0.3]
    assert virtual_factory(VirtualClock())(0, 1).startup_s == 0.0
    with pytest.raises(ValueError, match="startup_s"):
        virtual_factory(VirtualClock(), replacement_startup=(float("nan"),))(0, 1)


def _timeouts_workload(path: Path, n: int = 15, long_ms: float = 1500) -> Path:
    """Every third problem but the last three calls a tool that runs past a 1 s tool timeout, so its
    worker is replaced. The last three answer after 4 s, keeping the run going until every replacement
    is ready (one still starting when the batch ends is stopped, and records no start-up)."""
    problems = [
        tool_problem(f"p{i}", model_ms=50, cpu_ms=long_ms if i % 3 == 0 else 100, tool="spin_ms")
        if i < n - 3
        else tool_problem(f"p{i}", model_ms=50, cpu_ms=100, tool="spin_ms", final_ms=4000)
        for i in range(n)
    ]
    return write_workload(path, problems)


STARTUPS = (0.25, 0.28, 0.18, 0.18)


def _record_on_a_virtual_clock(tmp_path: Path, startups: tuple[float, ...], long_ms: float = 1500) -> Path:
    """A recorded run whose replacement workers took ``startups`` to start, as real ones take time."""
    tmp_path.mkdir(exist_ok=True)
    workload = _timeouts_workload(tmp_path / "w.jsonl", long_ms=long_ms)
    out = tmp_path / "recorded"
    settings = {"cpu_workers": 2, "tool_timeout": 1.0, "tool_errors": "observe"}
    cfg = build_config({"workload": workload, "output": out, **settings})
    clock = VirtualClock()
    factory = virtual_factory(clock, builtin_duration, replacement_startup=startups)
    outcome = clock.run(Run(prepare(cfg, ["test"]), clock, worker_factory=factory).execute())
    assert outcome.status == "complete", outcome.error
    return out


def _replacement_startups(run: Path) -> list[float]:
    _, _, events = load_run(run)
    return [e.startup_s for e in events if e.event == "worker_ready" and e.generation > 0]


@pytest.mark.timeout(60)
def test_a_replay_takes_each_replacements_recorded_start_up_time(tmp_path: Path) -> None:
    """Replacements used to be ready at the instant of the restart: the replay finished earlier than the
    run by about their start-up times. On a virtual clock the replay now reproduces the run exactly."""
    recorded = _record_on_a_virtual_clock(tmp_path, STARTUPS)
    assert _replacement_startups(recorded) == list(STARTUPS)
    replay = tmp_path / "replay"
    result = simulate_here("--from-run", recorded, "--output", replay)
    assert result.exit_code == 0, result.output
    assert _replacement_startups(replay) == list(STARTUPS)
    _, source, _ = load_run(recorded)
    _, summary, events = load_run(replay)
    assert summary["workers"]["restarts"] == source["workers"]["restarts"] == len(STARTUPS)
    assert summary["makespan_s"] == pytest.approx(source["makespan_s"], abs=1e-5)
    # each replacement is ready its start-up after it began to start
    began = {(e.worker, e.generation): e.t for e in events if e.event == "worker_restarting"}
    ready = {(e.worker, e.generation): (e.t, e.startup_s) for e in events if e.event == "worker_ready"}
    assert all(ready[key][0] - t == pytest.approx(ready[key][1], abs=1e-6) for key, t in began.items())
    instant = _record_on_a_virtual_clock(tmp_path / "instant", ())
    _, without, _ = load_run(instant)
    assert without["makespan_s"] < source["makespan_s"] - min(STARTUPS)  # what the replay used to say


@pytest.mark.timeout(60)
def test_replacements_beyond_the_runs_take_the_median_or_the_initial_workers_start_up(
    tmp_path: Path,
) -> None:
    """At a shorter --tool-timeout the replay replaces more workers than the run did."""
    recorded = _record_on_a_virtual_clock(tmp_path / "four", STARTUPS)
    more = tmp_path / "more"
    result = simulate_here("--from-run", recorded, "--output", more, "--tool-timeout", "0.09")
    assert result.exit_code == 0, result.output
    # then the median of the four (a replacement still starting when the batch ended records none)
    startups = _replacement_startups(more)
    assert startups[:4] == list(STARTUPS) and startups[4:] == [0.215] * (len(startups) - 4)
    assert len(startups) >= 10
    # a run that replaced no worker: its initial workers' start-ups are the one measurement there is
    quiet = _record_on_a_virtual_clock(tmp_path / "quiet", (), long_ms=500)
    assert _replacement_startups(quiet) == []
    _edit_lines(quiet / "events.jsonl", _initial_startups(0.2, 0.5))
    replay = tmp_path / "replay"
    result = simulate_here("--from-run", quiet, "--output", replay, "--tool-timeout", "0.09")
    assert result.exit_code == 0, result.output
    startups = _replacement_startups(replay)
    assert startups == [0.35] * len(startups) and len(startups) >= 10


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bad", [-0.1, "0.2", None])
def test_a_damaged_start_up_time_is_refused_naming_the_line(tmp_path: Path, bad: Any) -> None:
    recorded = _record_on_a_virtual_clock(tmp_path, STARTUPS)

    def damage(lines: list[str]) -> list[str]:
        return [
            json.dumps({**event, "startup_s": bad}) + "\n"
            if (event := json.loads(line))["event"] == "worker_ready" and event["generation"] == 2
            else line
            for line in lines
        ]

    _edit_lines(recorded / "events.jsonl", damage)
    out = tmp_path / "out"
    result = simulate_here("--from-run", recorded, "--output", out)
    assert result.exit_code == 2, result.output
    assert "events.jsonl:" in result.stderr and "'worker_ready' lacks a valid 'startup_s'" in result.stderr
    assert not out.exists()


def _initial_startups(*seconds: float) -> Any:
    def edit(lines: list[str]) -> list[str]:
        out, given = [], iter(seconds)
        for line in lines:
            event = json.loads(line)
            if event["event"] == "worker_ready" and event["generation"] == 0:
                line = json.dumps({**event, "startup_s": next(given)}) + "\n"
            out.append(line)
        return out

    return edit


@pytest.mark.timeout(90)
def test_a_replay_of_a_real_run_takes_its_measured_replacement_start_ups(tmp_path: Path) -> None:
    """Real worker processes: each replacement took a measured time to start; the replay takes each of
    them (it used to be ready at once and finish earlier than the run by about their sum). One worker,
    the two timed-out jobs first: every later job needs each replacement, so both are ready before the
    batch ends however slow the machine (with two workers a late replacement could still be starting at
    the end, and is then stopped, never ready)."""
    problems = [tool_problem(f"p{i}", model_ms=20, cpu_ms=600, tool="spin_ms") for i in range(2)]
    problems += [tool_problem(f"p{i}", model_ms=400, cpu_ms=30, tool="sleep_ms") for i in range(2, 5)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    real = tmp_path / "real"
    args = ["--cpu-workers", "1", "--tool-timeout", "0.3", "--tool-errors", "observe", "--no-progress"]
    args += ["--policy", "fifo"]
    result = invoke("run", "--workload", workload, "--output", real, *args)  # real workers, this process
    assert result.exit_code == 0, result.stderr
    measured = _replacement_startups(real)
    assert len(measured) == 2 and all(s > 0 for s in measured)
    replay = tmp_path / "replay"
    replayed = simulate_here("--from-run", real, "--output", replay)  # in this process: no workers
    assert replayed.exit_code == 0, replayed.output
    assert _replacement_startups(replay) == measured
    _, real_summary, _ = load_run(real)
    _, summary, _ = load_run(replay)
    # still only the runtime's own overhead left out: a little faster than the run, never slower
    assert summary["makespan_s"] <= real_summary["makespan_s"] * 1.05


@pytest.mark.timeout(60)
def test_a_replacement_no_trajectory_waits_for_is_outside_the_makespan(tmp_path: Path) -> None:
    """The last trajectory's tool job times out and its worker is replaced (5 s to start), but nothing
    needs that worker any more: the measured window ends with the last trajectory, not when the
    replacement is ready (it used to, adding a whole worker start-up to makespan and throughput)."""
    problems = [
        tool_problem("quick", model_ms=50, cpu_ms=10, tool="spin_ms"),
        tool_problem("slow", model_ms=50, cpu_ms=1500, tool="spin_ms"),
    ]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    settings = {"cpu_workers": 2, "tool_timeout": 1.0, "tool_errors": "observe"}
    cfg = build_config({"workload": workload, "output": tmp_path / "run", **settings})
    clock = VirtualClock()
    factory = virtual_factory(clock, builtin_duration, replacement_startup=(5.0,))
    outcome = clock.run(Run(prepare(cfg, ["test"]), clock, worker_factory=factory).execute())
    assert outcome.status == "complete", outcome.error
    _, summary, events = load_run(tmp_path / "run")
    last_end = max(e.t for e in events if e.event == "trajectory_finished")
    assert summary["workers"]["restarts"] == 1
    assert summary["makespan_s"] == pytest.approx(last_end, abs=1e-6)
    assert last_end < 1.5  # the timeout (1 s) and a model turn, not the replacement's 5 s start-up


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("event", "field", "bad"),
    [
        ("model_finished", "latency_s", float("nan")),
        ("cpu_finished", "execute_s", -1.0),
        ("model_finished", "latency_s", 1e9),
    ],
)
def test_a_damaged_duration_is_refused_naming_the_line(
    tmp_path: Path, event: str, field: str, bad: float
) -> None:
    """A NaN latency used to replay as 0 ms; a negative or absurd one was refused naming the replay's own
    (then deleted) workload file instead of the events.jsonl line."""
    recorded = _record_on_a_virtual_clock(tmp_path, STARTUPS)

    def damage(lines: list[str]) -> list[str]:
        out, done = [], False
        for line in lines:
            data = json.loads(line)
            if not done and data["event"] == event:
                data[field], done = bad, True
                line = json.dumps(data) + "\n"  # json writes NaN as NaN
            out.append(line)
        return out

    _edit_lines(recorded / "events.jsonl", damage)
    out = tmp_path / "out"
    result = simulate_here("--from-run", recorded, "--output", out)
    assert result.exit_code == 2, result.output
    assert "events.jsonl:" in result.stderr and f"has {field}" in result.stderr, result.stderr
    assert not out.exists()


def test_a_replacement_still_starting_at_the_end_is_replayed_as_still_starting(tmp_path: Path) -> None:
    """A replacement the run's end stopped while it started has no worker_ready: the replay gave it the
    median start-up, so that worker came back early and took a job that had waited in the run (makespan
    1.45 instead of 1.55). It now takes at least the rest of the window (fuzzing found it)."""

    def tool(ms: float, latency: float = 0) -> dict[str, Any]:
        return {"type": "tool", "name": "sleep_ms", "arguments": {"milliseconds": ms}, "latency_ms": latency}

    final = {"type": "final", "answer": "ok"}
    scripts = {"a": [tool(1000), tool(1000), final], "b": [tool(400), tool(400, 650), final]}
    scripts["c"] = [tool(100, 1100), final]
    problems = [
        {"id": k, "prompt": "p", "tools": [{"name": "sleep_ms"}], "script": v} for k, v in scripts.items()
    ]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    recorded = tmp_path / "recorded"
    settings = {"policy": "fifo", "cpu_workers": 2, "tool_timeout": 0.5, "tool_errors": "observe"}
    cfg = build_config({"workload": workload, "output": recorded, **settings})
    clock = VirtualClock()
    factory = virtual_factory(clock, builtin_duration, replacement_startup=(0.0, 5.0))
    assert (
        clock.run(Run(prepare(cfg, ["test"]), clock, worker_factory=factory).execute()).status == "complete"
    )
    assert len(_replacement_startups(recorded)) == 1  # the second was still starting at the end
    replay = tmp_path / "replay"
    result = simulate_here("--from-run", recorded, "--output", replay)
    assert result.exit_code == 0, result.output
    _, source, _ = load_run(recorded)
    _, summary, _ = load_run(replay)
    assert summary["makespan_s"] == source["makespan_s"] == 1.55


def test_a_replay_of_a_simulation_says_its_timings_were_not_measured(tmp_path: Path) -> None:
    """A simulated run's file-tool jobs without cpu_ms took 0 s, which its simulate warned about; replayed,
    those 0 s became "measured" times, the warning was gone and nothing said the source was no real run."""
    (tmp_path / "tools.py").write_text("def double(x: int) -> int:\n    return 2 * x\n")
    tool = {"name": "double", "description": "2x", "inputs": {"x": "int"}, "implementation": "tools.py"}
    script = [
        {"type": "tool", "name": "double", "arguments": {"x": 2}, "latency_ms": 20},
        {"type": "final", "answer": "4", "latency_ms": 10},
    ]
    problems = [{"id": f"p{i}", "prompt": "double 2", "tools": [tool], "script": script} for i in range(3)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    simulated = tmp_path / "simulated"
    first = simulate_here("--workload", workload, "--output", simulated)
    assert first.exit_code == 0 and "3 CPU job(s) took 0 s" in first.stderr, first.output
    replay = tmp_path / "replay"
    result = simulate_here("--from-run", simulated, "--output", replay)
    assert result.exit_code == 0, result.output
    assert f"warning: --from-run {simulated} is itself a simulation" in result.stderr
    receipt = json.loads((replay / "run.json").read_text())
    assert receipt["simulation"]["replayed"]["source_simulated"] is True


@pytest.mark.timeout(90)
def test_a_real_workers_death_holding_a_job_is_replayed(tmp_path: Path) -> None:
    """A real worker that died (its tool called os._exit) was replaced, and its replacement's start-up
    held its slot. The replay had no death and no replacement (said since as "not replayed"); now the
    job's action says ``worker_dies``: the replay's worker dies holding it, with the run's message, and is
    replaced as the run's was, so nothing is left unreplayed."""
    (tmp_path / "die.py").write_text("import os\n\n\ndef die(code):\n    os._exit(code)\n")
    tool = {"name": "die", "inputs": {"code": "int"}, "implementation": "die.py"}
    script = [
        {"type": "tool", "name": "die", "arguments": {"code": 3}, "latency_ms": 5},
        {"type": "final", "answer": "x", "latency_ms": 5},
    ]
    problems = [{"id": "die", "prompt": "p", "tools": [tool], "script": script}]
    workload = write_workload(tmp_path / "w.jsonl", [*problems, tool_problem("ok", model_ms=5, cpu_ms=5)])
    real = tmp_path / "real"
    args = ["--tool-errors", "observe", "--no-progress"]
    result = invoke("run", "--workload", workload, "--output", real, *args)  # real workers, this process
    assert result.exit_code == 0, result.stderr
    _, real_summary, real_events = load_run(real)
    assert real_summary["workers"]["restarts_by_reason"] == {"died": 1}
    assert real_summary["counts"]["completed"] == 2
    replay = tmp_path / "replay"
    replayed = simulate_here("--from-run", real, "--output", replay)
    assert replayed.exit_code == 0, replayed.output
    assert "ended otherwise" not in replayed.stderr and "not replayed" not in replayed.stderr
    _, summary, events = load_run(replay)
    assert summary["workers"]["restarts_by_reason"] == {"died": 1} and summary["counts"]["completed"] == 2

    def deaths(of: list[Any]) -> list[tuple[str, str]]:
        return [(e.reason, e.error) for e in of if e.event == "cpu_failed"]

    assert deaths(events) == deaths(real_events) and len(deaths(events)) == 1
    assert (
        "restarts_not_replayed" not in json.loads((replay / "run.json").read_text())["simulation"]["replayed"]
    )


def _an_idle_death_first(idle_s: float, holding_s: float) -> Any:
    """The run's replacement after a death holding a job took ``holding_s`` to start; before it, the other
    worker died idle (killed from outside) and its replacement took ``idle_s``."""

    def edit(lines: list[str]) -> list[str]:
        out: list[str] = []
        for line in lines:
            event = json.loads(line)
            if event["event"] == "worker_restarting" and event["reason"] == "died":
                common = {"v": 1, "t": event["t"], "worker": 1 - event["worker"], "generation": 1}
                killed = {**common, "event": "worker_restarting", "old_pid": None, "reason": "died"}
                ready = {**common, "event": "worker_ready", "pid": None, "startup_s": idle_s}
                out += [json.dumps({**killed, "restarts": 1}) + "\n", json.dumps(ready) + "\n"]
            elif event["event"] == "worker_ready" and event["generation"] == 1:
                line = json.dumps({**event, "startup_s": holding_s}) + "\n"
            out.append(line)
        return out

    return edit


def test_a_replayed_death_takes_its_own_replacements_start_up_not_an_idle_deaths(tmp_path: Path) -> None:
    """The replay replaces a worker that died holding a job (its ``worker_dies``), not one that died idle:
    its k-th replacement took the k-th start-up of *every* replacement the run started, so the death's
    replacement took the start-up of the idle death's, replaced first (3 s for 0.2 s)."""
    die = {"type": "tool", "name": "sleep_ms", "arguments": {"milliseconds": 50}, "latency_ms": 5}
    problems = [
        {
            "id": "die",
            "prompt": "p",
            "tools": [{"name": "sleep_ms"}],
            "script": [{**die, "worker_dies": "killed"}, {"type": "final", "answer": "x", "latency_ms": 5}],
        },
        tool_problem("ok", model_ms=5, cpu_ms=5, final_ms=5000),  # the run goes on past either start-up
    ]
    recorded = tmp_path / "recorded"
    workload = write_workload(tmp_path / "w.jsonl", problems)
    result = simulate_here("--workload", workload, "--output", recorded, "--cpu-workers", "2")
    assert result.exit_code == 0, result.output
    _edit_lines(recorded / "events.jsonl", _an_idle_death_first(3.0, 0.2))
    replay = tmp_path / "replay"
    replayed = simulate_here("--from-run", recorded, "--output", replay)
    assert replayed.exit_code == 0, replayed.output
    assert _replacement_startups(replay) == [0.2]
    receipt = json.loads((replay / "run.json").read_text())
    assert receipt["simulation"]["replayed"]["restarts_not_replayed"] == {"died": 1}


def test_replacements_the_replay_does_not_start_give_only_their_median() -> None:
    """Where the run replaced only workers the replay does not (a death while idle, memory), every
    replacement it starts takes their median start-up, not the k-th (nor the initial workers')."""
    from asyncroll.simulation.measured import Measured

    measured = Measured(Path("events.jsonl"), restarts=[(0, 1), (1, 1), (0, 2)], end=10.0)
    measured.ready = {(0, 0): 0.01, (1, 0): 0.01, (0, 1): 0.5, (1, 1): 0.1, (0, 2): 0.3}
    measured.unreplayed = {(0, 1), (1, 1), (0, 2)}
    assert measured.replacement_startup() == (0.3,)
    measured.unreplayed = {(0, 1), (0, 2)}
    assert measured.replacement_startup() == (0.1,)
