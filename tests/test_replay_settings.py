"""What a replay (``simulate --from-run``) keeps of the recorded run's settings: the pressure policy's knobs
(``--starvation-threshold``, ``--aging-seconds``, ``--aging-weight``, which ``simulate`` accepts as ``run``
does, in a sweep too) and the rule ``asyncroll`` named then, each overridden by its flag; a setting kept
from the run that is refused, missing or gone is named as the run's, never as a flag the user did not
give; waits inside the run's measured latencies are said. The recorded run to replay is simulated once
for the module (``knobbed``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli_runs import SMOKE
from tests.simulations import _edit_json, _edit_lines, simulate_here

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
            "--starvation-threshold: Input should be greater than or equal to 1 (got 0)",
        ),
        (["--aging-seconds", "0"], "--aging-seconds: Input should be greater than 0 (got 0)"),
        (["--aging-seconds", "nan"], "--aging-seconds: Input should be a finite number"),
        (["--aging-weight", "-1"], "--aging-weight: Input should be greater than or equal to 0 (got -1)"),
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


def test_a_run_of_the_first_n_problems_replays_without_reading_the_lines_past_them(tmp_path: Path) -> None:
    """``--limit N`` never reads a line past the first N problems, so a run of them is complete; its
    replay read the whole workload, and a bad line past them refused it (``lines 3:`` of a run of 2); a
    tool file gone made the refusal name every line of the workload, not only those the run had."""
    smoke = SMOKE.read_text().splitlines()
    workload = tmp_path / "w.jsonl"
    workload.write_text(f"{smoke[2]}\n{smoke[0]}\n" + '{"id": "x", "prompt": 3}\n')
    run = tmp_path / "run"
    assert simulate_here("--workload", workload, "--output", run, "--limit", "2").exit_code == 0
    replay = simulate_here("--from-run", run, "--output", tmp_path / "replay")
    assert replay.exit_code == 0, replay.output
    assert len((tmp_path / "replay" / "replay-workload.jsonl").read_text().splitlines()) == 2
    (tmp_path / "tools.py").write_text("def f(x):\n    return x\n")
    tool = {"name": "f", "inputs": {"x": "int"}, "implementation": "tools.py"}
    script = [{"type": "tool", "name": "f", "arguments": {"x": 1}}, {"type": "final", "answer": "1"}]
    filed = tmp_path / "filed.jsonl"
    filed.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "prompt": "p", "tools": [tool], "script": script}) + "\n"
            for i in range(3)
        )
    )
    first = tmp_path / "first"
    assert simulate_here("--workload", filed, "--output", first, "--limit", "1").exit_code == 0
    (tmp_path / "tools.py").unlink()
    gone = simulate_here("--from-run", first, "--output", tmp_path / "gone")
    assert gone.exit_code == 2 and f"{filed}:1: tools[0].implementation" in gone.stderr, gone.output
    assert f"{filed}:2:" not in gone.stderr


def test_a_sync_run_replayed_under_another_policy_says_which_active_slots_it_takes(tmp_path: Path) -> None:
    """A ``--policy sync`` run runs one trajectory at a time whatever its configured
    ``--max-active-trajectories``; its replay under another policy took the configured number, silently."""
    source = tmp_path / "sync"
    assert simulate_here("--workload", SMOKE, "--policy", "sync", "--output", source).exit_code == 0
    replay = simulate_here("--from-run", source, "--policy", "fifo", "--output", tmp_path / "fifo")
    assert replay.exit_code == 0, replay.output
    said = (
        f"warning: --from-run {source} ran --policy sync, one trajectory at a time; this replay under "
        "--policy fifo takes its configured --max-active-trajectories 16: add --max-active-trajectories 1"
    )
    assert said in replay.stderr, replay.stderr
    for args in (["--policy", "fifo", "--max-active-trajectories", "1"], []):  # at the run's one; sync again
        quiet = simulate_here("--from-run", source, *args, "--output", tmp_path / f"quiet{len(args)}")
        assert quiet.exit_code == 0 and "one trajectory at a time" not in quiet.stderr, quiet.stderr
