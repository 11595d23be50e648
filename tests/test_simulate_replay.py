"""What a replay (``simulate --from-run``) keeps of the recorded run besides its timings: the pressure
policy's knobs (``--starvation-threshold``, ``--aging-seconds``, ``--aging-weight``, which ``simulate``
accepts as ``run`` does) and the start-up time of every worker replaced during the run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncroll.clock import VirtualClock
from asyncroll.config import build_config
from asyncroll.runtime.run import Run, prepare
from asyncroll.runtime.virtual_worker import builtin_duration, virtual_factory
from tests.cli_runs import SMOKE, cli, load_run
from tests.conftest import tool_problem, write_workload
from tests.test_simulation import _edit_json, _edit_lines, simulate_here

KNOBS = ["--starvation-threshold", "1", "--aging-seconds", "0.4", "--aging-weight", "0.5"]
LIMITS = ["--policy", "asyncroll", "--max-active-trajectories", "8", "--cpu-workers", "2"]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20 synthetic problems on which the pressure policy decides differently with ``KNOBS``."""
    from bench import synthetic

    tmp = tmp_path_factory.mktemp("knobs")
    return synthetic.write(tmp / "w.jsonl", 20, 150.0, 120.0, seed=1)


@pytest.fixture(scope="module")
def knobbed(synthetic: Path) -> Path:
    """A completed (simulated) run of the pressure policy with non-default knobs, to replay."""
    run = synthetic.parent / "knobbed"
    result = simulate_here("--workload", synthetic, "--output", run, *LIMITS, *KNOBS)
    assert result.exit_code == 0, result.output
    return run


def _selections(run: Path) -> list[tuple[int, str, int]]:
    events = (json.loads(line) for line in (run / "events.jsonl").read_text().splitlines())
    return [(e["job_id"], e["reason"], e["threshold"]) for e in events if e["event"] == "cpu_selected"]


def _knobs(run: Path) -> dict[str, Any]:
    config = json.loads((run / "run.json").read_text())["config"]
    names = ("starvation_threshold", "starvation_threshold_effective", "aging_seconds", "aging_weight")
    return {name: config[name] for name in names}


# --- the pressure policy's knobs ---------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_replay_keeps_the_runs_pressure_knobs_and_makes_its_decisions(
    knobbed: Path, synthetic: Path, tmp_path: Path
) -> None:
    """The replay used to run with the default knobs (threshold = inflight limit, aging 30 s / 0.02):
    every ``cpu_selected`` logged threshold 4 where the run had 1, and the decisions differed."""
    assert _knobs(knobbed) == {
        "starvation_threshold": 1,
        "starvation_threshold_effective": 1,
        "aging_seconds": 0.4,
        "aging_weight": 0.5,
    }
    replay = tmp_path / "replay"
    result = simulate_here("--from-run", knobbed, "--output", replay)
    assert result.exit_code == 0, result.output
    assert _knobs(replay) == _knobs(knobbed)
    decisions = _selections(replay)
    assert decisions and {threshold for _, _, threshold in decisions} == {1}
    # a replay of a simulated run is exact: the same job chosen for the same reason, decision by decision
    assert decisions == _selections(knobbed)
    defaults = tmp_path / "defaults"
    assert simulate_here("--workload", synthetic, "--output", defaults, *LIMITS).exit_code == 0
    assert [d[:2] for d in _selections(defaults)] != [d[:2] for d in decisions]  # the knobs matter here


@pytest.mark.timeout(60)
def test_flags_override_the_recorded_knobs_one_by_one(knobbed: Path, tmp_path: Path) -> None:
    replay = tmp_path / "replay"
    result = simulate_here("--from-run", knobbed, "--output", replay, "--starvation-threshold", "3")
    assert result.exit_code == 0, result.output
    assert _knobs(replay) == {
        "starvation_threshold": 3,
        "starvation_threshold_effective": 3,
        "aging_seconds": 0.4,
        "aging_weight": 0.5,
    }
    assert {threshold for _, _, threshold in _selections(replay)} == {3}
    other = tmp_path / "other"
    args = ["--aging-seconds", "5", "--aging-weight", "0", "--max-inflight-model-requests", "2"]
    result = simulate_here("--from-run", knobbed, "--output", other, *args)
    assert result.exit_code == 0, result.output
    assert _knobs(other) == {
        "starvation_threshold": 1,
        "starvation_threshold_effective": 1,
        "aging_seconds": 5.0,
        "aging_weight": 0.0,
    }


def _rules(run: Path) -> set[str]:
    events = (json.loads(line) for line in (run / "events.jsonl").read_text().splitlines())
    return {e["policy"] for e in events if e["event"] == "cpu_selected"}


@pytest.mark.timeout(60)
def test_a_replay_runs_the_rule_asyncroll_named_when_the_run_was_recorded(
    synthetic: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--policy asyncroll`` names today's default rule, which has changed: a run recorded as ``asyncroll``
    while it meant ``asyncroll_balanced`` (a few hours of 2026-12-03; its cpu_selected events say so) was
    replayed under the name with today's rule, silently, as the run's own policy; run.json's
    ``policy_canonical`` said ``asyncroll`` either way, so no receipt told which rule a run of it had been."""
    from asyncroll.policies import registry

    recorded = tmp_path / "recorded"
    with monkeypatch.context() as patch:  # the code of those hours
        patch.setattr(registry, "DEFAULT_PRESSURE", "asyncroll_balanced")
        result = simulate_here("--workload", synthetic, "--output", recorded, *LIMITS)
    assert result.exit_code == 0, result.output
    assert _rules(recorded) == {"asyncroll_balanced"}
    # summary.json and the run's last line name the rule too (they said only "asyncroll")
    scheduler = json.loads((recorded / "summary.json").read_text())["scheduler"]
    assert (scheduler["policy"], scheduler["policy_rule"]) == ("asyncroll", "asyncroll_balanced")
    assert "policy asyncroll (asyncroll_balanced):" in result.stdout
    replay = tmp_path / "replay"
    result = simulate_here("--from-run", recorded, "--output", replay)
    assert result.exit_code == 0, result.output
    assert "the run's --policy asyncroll was the rule asyncroll_balanced then" in result.stderr
    assert _rules(replay) == {"asyncroll_balanced"}
    assert _selections(replay) == _selections(recorded)  # the run's decisions, one by one
    config = json.loads((replay / "run.json").read_text())["config"]
    assert (config["policy"], config["policy_canonical"]) == ("asyncroll_balanced", "asyncroll_balanced")
    # asked for by name, today's rule runs, without a word; and its receipt names the rule
    today = tmp_path / "today"
    result = simulate_here("--from-run", recorded, "--output", today, "--policy", "asyncroll")
    assert result.exit_code == 0 and "was the rule" not in result.stderr, result.output
    assert _rules(today) == {"asyncroll_repair"}
    config = json.loads((today / "run.json").read_text())["config"]
    assert (config["policy"], config["policy_canonical"]) == ("asyncroll", "asyncroll_repair")
    scheduler = json.loads((today / "summary.json").read_text())["scheduler"]
    assert (scheduler["policy"], scheduler["policy_rule"]) == ("asyncroll", "asyncroll_repair")
    assert "policy asyncroll (asyncroll_repair):" in result.stdout
    assert _selections(today) != _selections(recorded)  # the two rules decide differently on this run


@pytest.mark.timeout(60)
def test_a_run_without_a_threshold_replays_without_one(synthetic: Path, tmp_path: Path) -> None:
    """The default threshold follows the inflight limit, in the replay too (it is not frozen at the
    run's limit)."""
    source = tmp_path / "source"
    assert simulate_here("--workload", synthetic, "--output", source, *LIMITS).exit_code == 0
    replay = tmp_path / "replay"
    result = simulate_here("--from-run", source, "--output", replay, "--max-inflight-model-requests", "2")
    assert result.exit_code == 0, result.output
    assert _knobs(replay)["starvation_threshold"] is None
    assert _knobs(replay)["starvation_threshold_effective"] == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--starvation-threshold", "0"],
            "--starvation-threshold: Input should be greater than or equal to 1",
        ),
        (["--aging-seconds", "0"], "--aging-seconds: Input should be greater than 0"),
        (["--aging-seconds", "nan"], "--aging-seconds: Input should be a finite number"),
        (["--aging-weight", "-1"], "--aging-weight: Input should be greater than or equal to 0"),
        (["--aging-weight", "inf"], "--aging-weight: Input should be a finite number"),
    ],
)
@pytest.mark.parametrize("mode", ["workload", "from_run", "sweep"])
def test_bad_knobs_are_refused_as_run_refuses_them_before_anything_exists(
    knobbed: Path, tmp_path: Path, args: list[str], message: str, mode: str
) -> None:
    out = tmp_path / "out"
    modes: dict[str, list[str | Path]] = {
        "workload": ["--workload", SMOKE],
        "from_run": ["--from-run", knobbed],
        "sweep": ["--sweep", "--workload", SMOKE],
    }
    given = modes[mode]
    result = simulate_here(*given, "--output", out, *args)
    assert result.exit_code == 2, result.output
    assert result.stderr == f"error: {message}\n"
    assert not out.exists()


def test_a_bad_setting_kept_from_the_run_is_named_as_the_runs_not_as_a_flag(
    knobbed: Path, tmp_path: Path
) -> None:
    """A run.json whose config holds a setting this version refuses was reported as the flag
    ("--policy: Input should be …"), which the user never gave."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(knobbed, run)
    receipt = json.loads((run / "run.json").read_text())
    receipt["config"]["policy"] = "nope"
    (run / "run.json").write_text(json.dumps(receipt))
    result = simulate_here("--from-run", run, "--output", tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: --from-run {run / 'run.json'}: config.policy: "), result.stderr
    assert not (tmp_path / "out").exists()
    flag = simulate_here("--from-run", run, "--output", tmp_path / "out", "--policy", "fifo")
    assert flag.exit_code == 0, flag.output  # the flag overrides the run's setting


@pytest.mark.timeout(60)
def test_a_sweep_applies_the_knobs_to_every_cell_and_records_them(synthetic: Path, tmp_path: Path) -> None:
    """With no jitter, a sweep cell is the single simulation of the same settings, knobs included."""
    single = tmp_path / "single"
    result = simulate_here("--workload", synthetic, "--output", single, *LIMITS, *KNOBS)
    assert result.exit_code == 0, result.output
    out = tmp_path / "sweep"
    args = ["--policies", "asyncroll", "--active", "8", "--workers", "2", "--seeds", "1", "--jitter", "0"]
    result = simulate_here("--sweep", "--workload", synthetic, "--output", out, *args, "--jobs", "1", *KNOBS)
    assert result.exit_code == 0, result.output
    record = json.loads((out / "sweep.json").read_text())
    assert record["policy_settings"] == {"starvation_threshold": 1, "aging_seconds": 0.4, "aging_weight": 0.5}
    # which rule `asyncroll` ran: the name alone no longer says once the default changes (QA)
    assert record["policy_rules"] == {"asyncroll": "asyncroll_repair"}
    [row] = record["rows"]
    summary = json.loads((single / "summary.json").read_text())
    assert row["makespan_s"] == summary["makespan_s"]
    assert row["reorders"] == summary["scheduler"]["reorders"]


# --- replacement workers' start-up time --------------------------------------------------------------


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
    result = cli("run", "--workload", workload, "--output", real, *args)
    assert result.returncode == 0, result.stderr
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


# --- every measurement fits the workload's script, or the replay is refused naming the line ----------


@pytest.fixture(scope="module")
def two_tools(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A completed run of two problems, each two tool calls then a final (turns 0, 1: tool; 2: final)."""
    tmp = tmp_path_factory.mktemp("fits")
    problems = [tool_problem(f"p{i}", model_ms=10, cpu_ms=5 + i, turns=2) for i in range(2)]
    workload = write_workload(tmp / "w.jsonl", problems)
    result = simulate_here("--workload", workload, "--output", tmp / "run")
    assert result.exit_code == 0, result.output
    return tmp / "run"


Edit = tuple[list[dict[str, Any]], int]  # the edited events, and the line (1-based) the refusal names


def _line(events: list[dict[str, Any]], kind: str, **match: Any) -> int:
    """The index of the one event of ``kind`` whose fields include ``match``."""
    found = [
        i for i, e in enumerate(events) if e["event"] == kind and all(e.get(k) == v for k, v in match.items())
    ]
    assert len(found) == 1, (kind, match, found)
    return found[0]


def _job(events: list[dict[str, Any]], tid: str, turn: int) -> int:
    return int(events[_line(events, "cpu_enqueued", id=tid, turn=turn)]["job_id"])


def _no_cpu_finished(events: list[dict[str, Any]]) -> Edit:
    del events[_line(events, "cpu_finished", job_id=_job(events, "p0", 1))]
    return events, _line(events, "cpu_enqueued", id="p0", turn=1) + 1


def _cancelled(events: list[dict[str, Any]]) -> Edit:
    i = _line(events, "cpu_finished", job_id=_job(events, "p0", 1))
    e = events[i]
    events[i] = {
        key: e[key] for key in ("v", "t", "id", "job_id", "worker", "kind", "tool", "roundtrip_s")
    } | {"event": "cpu_failed", "reason": "cancelled", "error": "the run was stopped"}
    return events, i + 1


def _turn_past_the_script(events: list[dict[str, Any]]) -> Edit:
    i = _line(events, "model_finished", id="p0", turn=2)
    events[i]["turn"] = 5
    return events, i + 1


def _turns_swapped(events: list[dict[str, Any]]) -> Edit:
    first, last = (
        _line(events, "model_finished", id="p0", turn=0),
        _line(events, "model_finished", id="p0", turn=2),
    )
    events[first]["turn"], events[last]["turn"] = 2, 0
    return events, last + 1  # now turn 0, returning the final the script has at turn 2


def _job_at_a_wrong_turn(events: list[dict[str, Any]]) -> Edit:
    i = _line(events, "cpu_enqueued", id="p0", turn=1)
    events[i]["turn"] = 2
    return events, i + 1


def _a_turn_without_its_request(events: list[dict[str, Any]]) -> Edit:
    del events[_line(events, "model_finished", id="p0", turn=1)]
    return events, _line(events, "model_finished", id="p0", turn=2) + 1


def _a_turn_gone_past_without_its_job(events: list[dict[str, Any]]) -> Edit:
    job = _job(events, "p0", 0)
    events = [e for e in events if not (e["event"].startswith("cpu_") and e.get("job_id") == job)]
    return events, _line(events, "model_finished", id="p0", turn=0) + 1


def _last_request_missing(events: list[dict[str, Any]]) -> Edit:
    del events[_line(events, "model_finished", id="p0", turn=2)]
    return events, _line(events, "trajectory_finished", id="p0") + 1


def _of_a_trajectory_never_started(events: list[dict[str, Any]]) -> Edit:
    i = _line(events, "model_finished", id="p0", turn=1)
    events[i]["id"] = "p9"
    return events, i + 1


MISFITS: list[tuple[Any, str]] = [
    (
        _no_cpu_finished,
        r"tool job \d+ \('sleep_ms'\) of 'p0' turn 1 has no cpu_finished or cpu_failed event",
    ),
    (_cancelled, r"tool job \d+ \('sleep_ms'\) of 'p0' turn 1 was cancelled while it ran"),
    (_turn_past_the_script, r"'p0' turn 5 is past the end of its script in the workload \(3 actions\)"),
    (_turns_swapped, r"'p0' turn 0 returned a 'final' action where the workload's script has 'tool'"),
    (
        _job_at_a_wrong_turn,
        r"tool job \d+ \('sleep_ms'\) of 'p0' turn 2 does not fit the workload's script, "
        r"which has a 'final' action at that turn",
    ),
    (
        _a_turn_without_its_request,
        r"'p0' turn 2 is recorded but turn 1 has no model_finished or model_failed",
    ),
    (
        _a_turn_gone_past_without_its_job,
        r"'p0' turn 0 returned a 'tool' action and the run went on to turn 1, "
        r"but no job of turn 0 was recorded",
    ),
    (
        _last_request_missing,
        r"'p0' finished after 3 model turns, but 2 have a model_finished or model_failed",
    ),
    (
        _of_a_trajectory_never_started,
        r"'model_finished' of 'p9', which no trajectory_started before it names",
    ),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("edit", "message"),
    [pytest.param(edit, message, id=edit.__name__.strip("_")) for edit, message in MISFITS],
)
def test_a_measurement_that_does_not_fit_the_script_is_refused_naming_its_line(
    two_tools: Path, tmp_path: Path, edit: Any, message: str
) -> None:
    """A job without cpu_finished was replayed at the script's cost, and a request or job recorded at
    another turn than the script's left the turn it measured at the script's timing: silently, either
    way (the replay exited 0). Each is refused naming the events.jsonl line, nothing written."""
    import re
    import shutil

    source = tmp_path / "source"
    shutil.copytree(two_tools, source)
    path = source / "events.jsonl"
    events, line = edit([json.loads(text) for text in path.read_text().splitlines()])
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    out = tmp_path / "out"
    result = simulate_here("--from-run", source, "--output", out)
    assert result.exit_code == 2, result.output
    assert re.search(rf"^error: --from-run {re.escape(str(path))}:{line}: {message}", result.stderr), (
        result.stderr
    )
    assert "Traceback" not in result.output and not out.exists()


@pytest.mark.timeout(60)
def test_a_run_that_ran_out_of_script_or_turns_still_replays_exactly(tmp_path: Path) -> None:
    """Nothing measured is missing where a trajectory ran out of script (its last request failed with
    script_exhausted, past the script's end) or of --max-turns (its last tool job ran, no turn followed)."""
    out_of_script = tool_problem("short", model_ms=10, cpu_ms=5, turns=1)
    out_of_script["script"].pop()  # no final: turn 1 asks past the end of the script
    problems = [
        tool_problem("whole", model_ms=10, cpu_ms=5),
        out_of_script,
        tool_problem("long", model_ms=10, cpu_ms=5, turns=4),
    ]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    run = tmp_path / "run"
    assert simulate_here("--workload", workload, "--output", run, "--max-turns", "3").exit_code == 0
    statuses = {
        row["id"]: row["status"] for row in map(json.loads, (run / "results.jsonl").read_text().splitlines())
    }
    assert statuses == {"whole": "completed", "short": "failed", "long": "max_turns"}
    replay = tmp_path / "replay"
    result = simulate_here("--from-run", run, "--output", replay)
    assert result.exit_code == 0, result.output
    _, source, _ = load_run(run)
    _, summary, _ = load_run(replay)
    assert summary["makespan_s"] == source["makespan_s"] and summary["counts"] == source["counts"]


@pytest.mark.timeout(60)
def test_a_killed_run_is_refused_for_its_status_not_for_the_job_it_left_running(
    two_tools: Path, tmp_path: Path
) -> None:
    """A run killed mid-job leaves run.json 'running' and a job without an end: that job never finished,
    so no duration exists to replay. ``optimum`` still bounds such a run from the steps it did record;
    a replay would have to invent the rest, so it refuses, saying why and what can read the run."""
    import shutil

    source = tmp_path / "source"
    shutil.copytree(two_tools, source)
    _edit_json(source / "run.json", lambda r: {**r, "status": "running"})
    (source / "summary.json").unlink(missing_ok=True)
    lines = (source / "events.jsonl").read_text().splitlines(keepends=True)
    events = [json.loads(text) for text in lines]
    killed_at = _line(events, "cpu_started", job_id=_job(events, "p0", 1))
    (source / "events.jsonl").write_text("".join(lines[: killed_at + 1]))
    out = tmp_path / "out"
    result = simulate_here("--from-run", source, "--output", out)
    assert result.exit_code == 2, result.output
    assert "the run's status is 'running', not 'complete' (killed, or still going" in result.stderr
    assert "`asyncroll optimum` still bounds the work it did record" in result.stderr
    assert "has no cpu_finished" not in result.stderr and not out.exists()


def test_a_trajectory_that_failed_in_the_run_and_not_in_the_replay_is_counted(tmp_path: Path) -> None:
    """A tool's error under --tool-errors fail ended a trajectory in the run; a replayed script cannot
    fail that way, so the replay goes on with the script's timings. It said nothing: now stderr and
    run.json count the trajectories that ended otherwise."""
    (tmp_path / "boom.py").write_text("def boom(x):\n    raise ValueError(x)\n")
    tool = {"name": "boom", "inputs": {"x": "int"}, "implementation": "boom.py"}
    script = [
        {"type": "tool", "name": "boom", "arguments": {"x": 1}, "latency_ms": 10, "cpu_ms": 5},
        {"type": "tool", "name": "boom", "arguments": {"x": 2}, "latency_ms": 10},  # never run for real
        {"type": "final", "answer": "1", "latency_ms": 10},
    ]
    problems = [{"id": "boom", "prompt": "p", "tools": [tool], "script": script}]
    workload = write_workload(tmp_path / "w.jsonl", [*problems, tool_problem("ok", model_ms=5, cpu_ms=5)])
    recorded = tmp_path / "recorded"
    cfg = build_config({"workload": workload, "output": recorded, "tool_errors": "fail"})
    clock = VirtualClock()
    run = Run(prepare(cfg, ["test"]), clock, worker_factory=virtual_factory(clock, builtin_duration))
    assert clock.run(run.execute()).status == "complete"
    replay = tmp_path / "replay"
    result = simulate_here("--from-run", recorded, "--output", replay)
    assert result.exit_code == 0, result.output
    assert "1 trajectories ended otherwise than in the run (1 failed → completed)" in result.stderr
    # the job the run never ran has no measured cost: said so, without advising the replay it already is
    assert "1 CPU job(s) took 0 s (boom.py::boom ×1) because the run never ran them" in result.stderr
    assert "simulate --from-run a real run" not in result.stderr
    receipt = json.loads((replay / "run.json").read_text())
    assert receipt["simulation"]["replayed"]["ended_otherwise"] == {"failed → completed": 1}


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


def test_a_refused_replay_leaves_no_folder_it_made_above_its_output(knobbed: Path, tmp_path: Path) -> None:
    """``--output new/a/b`` made ``new`` and ``new/a`` with it; a replay refused for its run directory
    (before the replay workload exists, or for a setting kept from the run after it) removed only ``b``,
    and left the two folders behind. A folder that already existed, or that got other contents, stays."""
    import shutil

    torn = tmp_path / "torn"
    shutil.copytree(knobbed, torn)
    with (torn / "events.jsonl").open("a") as handle:
        handle.write('{"v": 1, "event": ')
    badly_set = tmp_path / "badly_set"
    shutil.copytree(knobbed, badly_set)
    receipt = json.loads((badly_set / "run.json").read_text())
    receipt["config"]["policy"] = "nope"
    (badly_set / "run.json").write_text(json.dumps(receipt))
    for run, message in ((torn, "not valid JSON"), (badly_set, "config.policy")):
        home = tmp_path / f"home-{run.name}"
        home.mkdir()
        result = simulate_here("--from-run", run, "--output", home / "new" / "a" / "b")
        assert result.exit_code == 2 and message in result.stderr, result.output
        assert list(home.iterdir()) == []
    kept = tmp_path / "kept"
    (kept / "new").mkdir(parents=True)
    (kept / "new" / "note.txt").write_text("mine")
    result = simulate_here("--from-run", torn, "--output", kept / "new" / "a" / "b")
    assert result.exit_code == 2, result.output
    assert sorted(p.name for p in (kept / "new").iterdir()) == ["note.txt"]


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


def test_a_replay_refused_for_its_workload_names_the_runs_workload_lines(tmp_path: Path) -> None:
    """A tool file gone since the run refused the replay with lines of OUT/replay-workload.jsonl, a file
    removed with the refused output: the error now names the run's own workload, file and line."""
    (tmp_path / "tools.py").write_text("def double(x: int) -> int:\n    return 2 * x\n")
    tool = {"name": "double", "description": "2x", "inputs": {"x": "int"}, "implementation": "tools.py"}
    script = [
        {"type": "tool", "name": "double", "arguments": {"x": 2}, "latency_ms": 20, "cpu_ms": 5},
        {"type": "final", "answer": "4", "latency_ms": 10},
    ]
    problems = [{"id": f"p{i}", "prompt": "double 2", "tools": [tool], "script": script} for i in range(2)]
    plain = {"id": "plain", "prompt": "hi", "script": [{"type": "final", "answer": "4", "latency_ms": 5}]}
    workload = write_workload(tmp_path / "w.jsonl", [plain, *problems])
    recorded = tmp_path / "recorded"
    assert simulate_here("--workload", workload, "--output", recorded).exit_code == 0
    (tmp_path / "tools.py").unlink()
    replay = tmp_path / "replay"
    result = simulate_here("--from-run", recorded, "--output", replay)
    assert result.exit_code == 2, result.output
    assert f"{workload}:2: tools[0].implementation: 'tools.py' does not exist" in result.stderr
    assert f"{workload}:3: " in result.stderr and "replay-workload" not in result.stderr
    assert not replay.exists()


@pytest.mark.parametrize(
    "missing", [["max_active_trajectories", "cpu_workers"], ["aging_weight"], ["tool_timeout"]]
)
def test_a_setting_missing_from_the_runs_config_is_refused_not_defaulted(
    knobbed: Path, tmp_path: Path, missing: list[str]
) -> None:
    """A run.json whose config lacks one of the settings a replay keeps (hand-edited, or older) was
    replayed with the default in its place (16 active slots where the run had 8), under the run's name."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(knobbed, run)
    recorded = json.loads((run / "run.json").read_text())["config"]
    _edit_json(
        run / "run.json",
        lambda r: {**r, "config": {k: v for k, v in r["config"].items() if k not in missing}},
    )
    out = tmp_path / "out"
    result = simulate_here("--from-run", run, "--output", out)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(
        f"error: --from-run {run / 'run.json'}: config lacks {', '.join(missing)}"
    )
    assert not out.exists()
    if missing == ["tool_timeout"]:
        return  # what a timed-out job took is "past the run's timeout": no flag can say what that was
    flags = [part for key in missing for part in ("--" + key.replace("_", "-"), str(recorded[key]))]
    result = simulate_here("--from-run", run, "--output", out, *flags)
    assert result.exit_code == 0, result.output
    replayed = json.loads((out / "run.json").read_text())["config"]
    assert {key: replayed[key] for key in missing} == {key: recorded[key] for key in missing}


def test_from_run_given_twice_is_refused_not_the_last_one_kept(knobbed: Path, tmp_path: Path) -> None:
    """click keeps the last of a repeated option: ``--from-run A --from-run B`` replayed B alone, silently."""
    out = tmp_path / "out"
    result = simulate_here("--from-run", knobbed, "--from-run", knobbed, "--output", out)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: --from-run given 2 times"), result.stderr
    assert not out.exists()


def test_a_tool_root_of_the_run_that_has_moved_is_named_as_the_runs(tmp_path: Path) -> None:
    """The run's --tool-root, gone since, was refused as "--tool-root DIR: not a directory", a flag the
    user never gave, with no word of where it came from or what to do."""
    tools = tmp_path / "tools"
    tools.mkdir()
    source = tmp_path / "source"
    assert simulate_here("--workload", SMOKE, "--tool-root", tools, "--output", source).exit_code == 0
    tools.rename(tmp_path / "moved")
    out = tmp_path / "out"
    result = simulate_here("--from-run", source, "--output", out)
    assert result.exit_code == 2, result.output
    refusal = f"error: --from-run {source}: the run's --tool-root {tools} (config.tool_root) is no longer"
    assert result.stderr.startswith(refusal + " a directory"), result.stderr
    assert not out.exists()
    result = simulate_here("--from-run", source, "--output", out, "--tool-root", tmp_path / "moved")
    assert result.exit_code == 0, result.output


@pytest.mark.timeout(90)
def test_a_worker_death_the_replay_cannot_reproduce_is_said_and_recorded(tmp_path: Path) -> None:
    """A real worker that died (its tool called os._exit) was replaced, and its replacement's start-up
    held its slot; the replay has no death and no replacement, and said nothing: with --tool-errors
    observe every trajectory completes in both, so no other warning pointed at the difference."""
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
    result = cli("run", "--workload", workload, "--output", real, *args)
    assert result.returncode == 0, result.stderr
    _, real_summary, _ = load_run(real)
    assert real_summary["workers"]["restarts_by_reason"] == {"died": 1}
    assert real_summary["counts"]["completed"] == 2
    replay = tmp_path / "replay"
    replayed = simulate_here("--from-run", real, "--output", replay)
    assert replayed.exit_code == 0, replayed.output
    assert "ended otherwise" not in replayed.stderr
    assert "warning: 1 worker replacement(s) of the run not replayed (died: 1)" in replayed.stderr
    receipt = json.loads((replay / "run.json").read_text())
    assert receipt["simulation"]["replayed"]["restarts_not_replayed"] == {"died": 1}


def test_waits_inside_the_runs_measured_latencies_are_said_and_recorded(
    knobbed: Path, tmp_path: Path
) -> None:
    """A request that retried (back-off) or waited for an open circuit has those waits in its measured
    latency, which the replay takes as the request's service time under any policy: it said nothing."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(knobbed, run)
    retry = {"v": 1, "event": "model_retrying", "turn": 0, "attempt": 1, "kind": "http_status", "status": 503}

    def add_retry(lines: list[str]) -> list[str]:
        started = next(json.loads(line) for line in lines if json.loads(line)["event"] == "model_started")
        return [*lines, json.dumps({**retry, "t": started["t"], "id": started["id"], "delay_s": 0.1}) + "\n"]

    _edit_lines(run / "events.jsonl", add_retry)
    replay = tmp_path / "replay"
    result = simulate_here("--from-run", run, "--output", replay)
    assert result.exit_code == 0, result.output
    assert "waited inside their measured latencies (model_retrying ×1: retry back-off" in result.stderr
    receipt = json.loads((replay / "run.json").read_text())
    assert receipt["simulation"]["replayed"]["model_waits"] == {"model_retrying": 1}
    plain = simulate_here("--from-run", knobbed, "--output", tmp_path / "plain")
    assert plain.exit_code == 0 and "measured latencies" not in plain.stderr
