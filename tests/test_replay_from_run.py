"""Replays of recorded runs (``simulate --from-run``): the measured timings replayed, every trajectory's
outcome reproduced, and the run directories a replay refuses, naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli_runs import SMOKE, load_run
from tests.conftest import invoke, tool_problem, write_workload
from tests.simulations import _edit_json, _edit_lines, simulate_here

# --- replays of recorded runs ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A completed (simulated) run to replay: eight trajectories, two of them failed by a tool timeout."""
    from bench import synthetic

    tmp = tmp_path_factory.mktemp("recorded")
    workload = synthetic.write(tmp / "w.jsonl", 8, 20.0, 15.0, seed=0)
    run = tmp / "run"
    result = simulate_here("--workload", workload, "--output", run, "--tool-timeout", "0.015")
    assert result.exit_code == 0, result.output
    return run


def _statuses(run: Path) -> dict[str, str]:
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    return {row["id"]: row["status"] for row in rows}


@pytest.mark.timeout(90)
def test_from_run_replays_the_recorded_timings(tmp_path: Path) -> None:
    problems = [tool_problem(f"p{i}", model_ms=30, cpu_ms=40, turns=2, tool="sleep_ms") for i in range(6)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    real = tmp_path / "real"
    # the real run (real workers) made in this process: the replay is what is tested
    assert invoke("run", "--workload", workload, "--output", real, "--cpu-workers", "2").exit_code == 0
    _, real_summary, real_events = load_run(real)
    assert real_summary["bounds"]["lower_bound_s"] <= real_summary["makespan_s"]
    sim = tmp_path / "sim"
    result = simulate_here("--from-run", real, "--output", sim)
    assert result.exit_code == 0, result.output
    receipt, summary, events = load_run(sim)
    assert receipt["simulation"]["from_run"] == str(real.resolve())
    assert receipt["simulation"]["replayed"]["trajectories"] == 6
    assert receipt["simulation"]["replayed"]["source_simulated"] is False
    assert "itself a simulation" not in result.stderr
    assert receipt["config"]["cpu_workers"] == 2 and receipt["config"]["policy"] == "fifo"
    # every model turn of the replay takes exactly the latency the real run measured for it
    real_lat = {(e.id, e.turn): e.latency_s for e in real_events if e.event == "model_finished"}
    sim_lat = {(e.id, e.turn): e.latency_s for e in events if e.event == "model_finished"}
    assert sim_lat.keys() == real_lat.keys()
    assert all(sim_lat[k] == pytest.approx(real_lat[k], abs=2e-6) for k in real_lat)
    replay = [json.loads(line) for line in (sim / "replay-workload.jsonl").read_text().splitlines()]
    assert all(a.get("cpu_ms") for p in replay for a in p["script"] if a["type"] == "tool")
    # the replay leaves out only the runtime's own overhead, so it is a little faster, never slower
    assert 0.5 * real_summary["makespan_s"] <= summary["makespan_s"] <= real_summary["makespan_s"] * 1.05


@pytest.mark.timeout(60)
def test_a_replay_of_a_run_with_tool_timeouts_reproduces_every_trajectorys_outcome(
    recorded: Path, tmp_path: Path
) -> None:
    """A timed-out job's only measurement is its round trip, which equals the timeout; replayed as that,
    it no longer exceeded the timeout and its trajectory completed. It is replayed just over it."""
    statuses = _statuses(recorded)
    assert sorted(statuses.values()).count("failed") >= 1  # the timeout did bite
    replay = tmp_path / "replay"
    result = simulate_here("--from-run", recorded, "--output", replay)
    assert result.exit_code == 0, result.output
    assert _statuses(replay) == statuses
    _, source, source_events = load_run(recorded)
    _, summary, _ = load_run(replay)
    assert summary["counts"] == source["counts"]
    assert summary["workers"]["restarts"] == source["workers"]["restarts"]
    timeouts = sum(e.event == "cpu_failed" and e.reason == "timeout" for e in source_events)
    replayed = [
        a
        for line in (replay / "replay-workload.jsonl").read_text().splitlines()
        for a in json.loads(line)["script"]
    ]
    assert timeouts and sum(a.get("cpu_ms") == 15.001 for a in replayed) == timeouts  # 1 µs over


@pytest.mark.timeout(60)
@pytest.mark.parametrize("status", ["interrupted", "failed", "running", "preparing"])
def test_from_run_refuses_a_run_that_did_not_complete(recorded: Path, tmp_path: Path, status: str) -> None:
    """Only part of such a run's turns were measured; the rest would silently take scripted timings."""
    import shutil

    source = tmp_path / "source"
    shutil.copytree(recorded, source)
    receipt = json.loads((source / "run.json").read_text())
    (source / "run.json").write_text(json.dumps({**receipt, "status": status}))
    if status in ("running", "preparing"):  # killed before its summary: none written
        (source / "summary.json").unlink()
    out = tmp_path / "out"
    result = simulate_here("--from-run", source, "--output", out)
    assert result.exit_code == 2
    if status == "preparing":  # nothing measured: not "only part of its model turns"
        assert "status is 'preparing' (killed, or still starting: it never began" in result.stderr
        assert "none of its model turns and jobs were measured" in result.stderr
    else:
        assert f"the run's status is {status!r}, not 'complete'" in result.stderr
    assert not out.exists()


@pytest.mark.timeout(60)
def test_from_run_replays_a_run_killed_after_its_summary(recorded: Path, tmp_path: Path) -> None:
    """A run killed (kill -9, a container's stop) while it wrote its exports: every turn and job was
    measured and summary.json says complete, but run.json still says running. It was refused as a run of
    which 'only part of its model turns and jobs were measured', though nothing was missing, and no
    command finalises run.json: the run could never be replayed."""
    import shutil

    source = tmp_path / "source"
    shutil.copytree(recorded, source)
    for name in ("trace.json", "timeline.html"):
        (source / name).unlink()
    receipt = json.loads((source / "run.json").read_text())
    (source / "run.json").write_text(json.dumps({**receipt, "status": "running"}))
    killed = simulate_here("--from-run", source, "--output", tmp_path / "killed")
    assert killed.exit_code == 0, killed.output
    whole = simulate_here("--from-run", recorded, "--output", tmp_path / "whole")
    assert whole.exit_code == 0, whole.output
    summaries = [json.loads((tmp_path / d / "summary.json").read_text()) for d in ("killed", "whole")]
    assert summaries[0]["makespan_s"] == summaries[1]["makespan_s"]


@pytest.mark.timeout(60)
def test_a_timed_out_job_is_replayed_just_over_the_timeout_not_at_its_round_trip(
    recorded: Path, tmp_path: Path
) -> None:
    """A real timed-out job's round trip also holds the kill (here 6 ms more): only "past the timeout" is
    known of the job, so it is replayed 1 µs over the timeout, a lower bound under a longer timeout."""
    import shutil

    source = tmp_path / "source"
    shutil.copytree(recorded, source)

    def slow_kill(lines: list[str]) -> list[str]:
        out = []
        for line in lines:
            event = json.loads(line)
            if event["event"] == "cpu_failed" and event["reason"] == "timeout":
                line = json.dumps({**event, "roundtrip_s": 0.021}) + "\n"
            out.append(line)
        return out

    _edit_lines(source / "events.jsonl", slow_kill)
    replay = tmp_path / "replay"
    result = simulate_here("--from-run", source, "--output", replay, "--tool-timeout", "10")
    assert result.exit_code == 0, result.output
    cpu_ms = [
        a.get("cpu_ms")
        for line in (replay / "replay-workload.jsonl").read_text().splitlines()
        for a in json.loads(line)["script"]
    ]
    assert 15.001 in cpu_ms and 21.0 not in cpu_ms


@pytest.mark.timeout(60)
@pytest.mark.parametrize("replay", [False, True])
def test_from_run_refuses_an_agent_mode_http_run_whose_actions_the_model_chose(
    recorded: Path, tmp_path: Path, replay: bool
) -> None:
    """An agent-mode run's timings belong to the model's actions, not to the workload's script; an HTTP
    run with --replay took its actions from the script and can be replayed."""
    import shutil

    source = tmp_path / "source"
    shutil.copytree(recorded, source)
    _edit_json(
        source / "run.json", lambda r: {**r, "config": {**r["config"], "backend": "vllm", "replay": replay}}
    )
    out = tmp_path / "out"
    result = simulate_here("--from-run", source, "--output", out)
    if replay:
        assert result.exit_code == 0, result.output
    else:
        assert result.exit_code == 2, result.output
        assert "the run's actions came from the model (--backend vllm without --replay)" in result.stderr
        assert not out.exists()


def _drop_first_turn(lines: list[str]) -> list[str]:
    out, dropped = [], False
    for line in lines:
        event = json.loads(line)
        if event["event"] == "model_finished" and not dropped:
            del event["turn"]
            line, dropped = json.dumps(event) + "\n", True
        out.append(line)
    return out


@pytest.mark.timeout(60)
def test_a_signal_after_the_replay_workload_is_written_but_before_the_run_leaves_nothing(
    recorded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGINT between the replay workload and run.json left OUT holding only replay-workload.jsonl,
    said "partial outputs", and the same command was then refused (OUT exists). As `run` does, the
    directory the command had just made is removed and "nothing written" is said."""
    from asyncroll.simulation import engine

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(engine, "simulate", interrupted)
    out = tmp_path / "replay"
    result = simulate_here("--from-run", recorded, "--output", out)
    assert result.exit_code == 130, result.output
    assert "nothing written" in result.stderr and not out.exists()
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep").write_text("")
    result = simulate_here("--workload", SMOKE, "--output", existing)
    assert result.exit_code == 130 and (existing / "keep").exists()  # not its own: never removed


def _drop_last_trajectory(lines: list[str]) -> list[str]:
    started = [json.loads(line)["id"] for line in lines if '"trajectory_started"' in line]
    return [line for line in lines if json.loads(line).get("id") != started[-1]]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: (d / "run.json").write_text("[1, 2]"), r"run\.json: not a run receipt \(a JSON list\)"),
        (lambda d: (d / "run.json").write_text("{"), "cannot read run.json"),
        (
            lambda d: _edit_json(d / "run.json", lambda r: {**r, "schema_version": 99}),
            r"run\.json: schema_version 99; this asyncroll reads run\.json version 1 only",
        ),
        (
            lambda d: _edit_json(d / "run.json", lambda r: {**r, "workload": "w.jsonl"}),
            r"run\.json: 'workload' is missing or not an object",
        ),
        (
            lambda d: _edit_json(
                d / "run.json", lambda r: {**r, "config": {**r["config"], "tool_timeout": "x"}}
            ),
            "config.tool_timeout is not a positive number",
        ),
        (
            lambda d: _edit_lines(d / "events.jsonl", _drop_first_turn),
            r"events\.jsonl:\d+: 'model_finished' lacks a valid 'turn'",
        ),
        (
            lambda d: _edit_lines(d / "events.jsonl", lambda lines: [*lines[:-1], lines[-1][:25]]),
            r"events\.jsonl:\d+: not valid JSON",
        ),
        (
            lambda d: _edit_lines(
                d / "events.jsonl", lambda lines: [ln.replace('"v":1,', '"v":99,') for ln in lines]
            ),
            r"events\.jsonl:1: event schema version 99; this asyncroll reads version 1 only",
        ),
        (
            lambda d: _edit_lines(d / "events.jsonl", lambda lines: ["[]\n", *lines]),
            r"events\.jsonl:1: not a JSON object",
        ),
        (
            lambda d: _edit_lines(
                d / "results.jsonl", lambda lines: [*lines, '{"id": "x", "generations": "2"}\n']
            ),
            r"results\.jsonl:9: 'generations' or 'id' is not valid",
        ),
        (lambda d: (d / "events.jsonl").unlink(), r"cannot read .*events\.jsonl"),
        # an infinite replay cost was written as null: the timed-out jobs took 0 s in the replay
        (
            lambda d: _edit_json(
                d / "run.json", lambda r: {**r, "config": {**r["config"], "tool_timeout": 1e308}}
            ),
            r"events\.jsonl:\d+: tool job \d+ .* timed out, but run\.json's config\.tool_timeout 1e\+308 s",
        ),
        # one trajectory's events all removed: it would vanish from the replay, its work with it
        (
            lambda d: _edit_lines(d / "events.jsonl", _drop_last_trajectory),
            r"results\.jsonl:\d+: trajectory '[^']+' ended in the run, but .*events\.jsonl has no "
            "trajectory_started for it",
        ),
        (
            lambda d: _edit_lines(d / "results.jsonl", lambda lines: lines[:-1]),
            r"events\.jsonl:\d+: trajectory '[^']+' started, but .*results\.jsonl has no row for it",
        ),
        (  # a run stopped before its first trajectory: its events hold the workers and the start only
            lambda d: _edit_lines(
                d / "events.jsonl",
                lambda lines: [ln for ln in lines if '"worker_ready"' in ln or '"measurement_started"' in ln],
            ),
            r"the run started no trajectory; nothing to replay",
        ),
    ],
)
def test_from_run_refuses_damaged_or_other_version_run_dirs_naming_the_file(
    recorded: Path, tmp_path: Path, damage: Any, message: str
) -> None:
    import re
    import shutil

    source = tmp_path / "source"
    shutil.copytree(recorded, source)
    damage(source)
    out = tmp_path / "out"
    result = simulate_here("--from-run", source, "--output", out)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: --from-run ") and re.search(message, result.stderr), result.stderr
    assert "Traceback" not in result.output and not out.exists()


@pytest.mark.timeout(60)
def test_from_run_resolves_a_relative_tool_root_without_the_original_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run.json keeps --tool-root as typed; a relative one is recovered from the tool files it records
    (absolute) or from its cwd, so the replay does not depend on where it is started. Where nothing pins
    it down (an older run.json without cwd), the user is told to pass --tool-root, which then overrides
    it."""
    from bench import synthetic

    project = tmp_path / "project"
    synthetic.write(project / "tools" / "w.jsonl", 3, 20.0, 10.0, seed=1)
    monkeypatch.chdir(project)
    assert (
        simulate_here("--workload", "tools/w.jsonl", "--output", "run", "--tool-root", "tools").exit_code == 0
    )
    assert json.loads((project / "run" / "run.json").read_text())["config"]["tool_root"] == "tools"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = simulate_here("--from-run", project / "run", "--output", "replay")
    assert result.exit_code == 0, result.output
    receipt = json.loads((elsewhere / "replay" / "run.json").read_text())
    assert receipt["config"]["tool_root"] == str(project / "tools")

    # built-in tools only: run.json's cwd says what "sub" was relative to
    (project / "sub").mkdir()
    monkeypatch.chdir(project)
    assert simulate_here("--workload", SMOKE, "--output", "smoke", "--tool-root", "sub").exit_code == 0
    monkeypatch.chdir(elsewhere)
    found = simulate_here("--from-run", project / "smoke", "--output", "r1")
    assert found.exit_code == 0, found.output
    assert json.loads((elsewhere / "r1" / "run.json").read_text())["config"]["tool_root"] == str(
        project / "sub"
    )
    # a run directory from before run.json recorded its cwd: nothing says what "sub" was relative to
    receipt_path = project / "smoke" / "run.json"
    receipt = json.loads(receipt_path.read_text())
    del receipt["cwd"]
    receipt_path.write_text(json.dumps(receipt))
    refused = simulate_here("--from-run", project / "smoke", "--output", "r2")
    assert refused.exit_code == 2 and "pass --tool-root" in refused.stderr and not Path("r2").exists()
    given = simulate_here("--from-run", project / "smoke", "--output", "r2", "--tool-root", project / "sub")
    assert given.exit_code == 0, given.output


def test_a_replay_refuses_the_batching_server(tmp_path: Path) -> None:
    """A replay's model turns take their measured latencies; the batching model would silently replace
    them (a 51 ms turn replayed at 345 ms) from token counts a recorded run does not carry."""
    real = tmp_path / "real"
    assert simulate_here("--workload", SMOKE, "--output", real).exit_code == 0
    refused = simulate_here("--from-run", real, "--output", tmp_path / "r", "--server", "batching")
    assert (
        refused.exit_code == 2 and "--from-run replays the run's measured model latencies" in refused.stderr
    )
    assert not (tmp_path / "r").exists()


@pytest.mark.timeout(60)
def test_a_run_recorded_elsewhere_replays_with_its_workload_where_it_is_now(tmp_path: Path) -> None:
    """run.json records the workload's absolute path: a run directory copied from another machine (or a
    workload folder moved since) is replayed with ``--workload`` naming the copy, checked by SHA-256."""
    import shutil

    from bench import synthetic

    there = tmp_path / "there"
    there.mkdir()
    workload = synthetic.write(there / "w.jsonl", 6, 20.0, 15.0, seed=1)
    run = tmp_path / "run"
    assert simulate_here("--workload", workload, "--output", run).exit_code == 0
    at_home = simulate_here("--from-run", run, "--output", tmp_path / "at-home")
    assert at_home.exit_code == 0, at_home.output
    here = tmp_path / "here"
    there.rename(here)  # the workload and its tool file, moved
    lost = simulate_here("--from-run", run, "--output", tmp_path / "lost")
    assert lost.exit_code == 2 and "no longer exists" in lost.stderr and "pass --workload" in lost.stderr
    assert not (tmp_path / "lost").exists()
    moved = simulate_here("--from-run", run, "--workload", here / "w.jsonl", "--output", tmp_path / "moved")
    assert moved.exit_code == 0, moved.output
    replays = [(tmp_path / d / "replay-workload.jsonl").read_bytes() for d in ("at-home", "moved")]
    assert replays[0] == replays[1]
    assert (tmp_path / "moved" / "summary.json").read_bytes() == (
        tmp_path / "at-home" / "summary.json"
    ).read_bytes()
    receipt, _, _ = load_run(tmp_path / "moved")
    assert receipt["config"]["tool_root"] == str(here)  # the tools beside the workload, where it is now
    other = shutil.copy(here / "w.jsonl", tmp_path / "other.jsonl")
    with open(other, "a", encoding="utf-8") as f:
        f.write("\n")
    wrong = simulate_here("--from-run", run, "--workload", other, "--output", tmp_path / "wrong")
    assert wrong.exit_code == 2 and "is not the workload the run read" in wrong.stderr
    assert not (tmp_path / "wrong").exists()
    here.rename(there)  # back where the run read it, then edited there
    shutil.copy(other, there / "w.jsonl")
    edited = simulate_here("--from-run", run, "--output", tmp_path / "edited")
    assert edited.exit_code == 2 and "changed since the run" in edited.stderr, edited.stderr
    assert "pass --workload with a copy of the file the run read" in edited.stderr  # what to do about it
    assert not (tmp_path / "edited").exists()


def _code_problem(pid: str, verdicts: list[bool]) -> dict[str, Any]:
    """A one-repair problem whose submissions take the declared ``verdicts`` in the recorded run."""
    return {
        "id": pid,
        "prompt": f"write {pid}",
        "tools": [{"name": "lcb_evaluate"}],
        "script": [
            {"type": "submit", "code": f"print({i})", "latency_ms": 10, "cpu_ms": 40, "passes": v}
            for i, v in enumerate(verdicts)
        ],
        "metadata": {
            "reference_tests": [{"input": "1", "output": "1", "testtype": "stdin"}],
            "prompt_metadata": {"protocol": "one_repair", "max_generations": 2},
        },
    }


@pytest.mark.timeout(60)
def test_a_replay_workload_that_is_no_file_says_what_it_is(tmp_path: Path) -> None:
    """``simulate --from-run RUN --workload W`` called a folder, or a symlink loop, "no such file"."""
    run = tmp_path / "run"
    assert simulate_here("--workload", SMOKE, "--output", run).exit_code == 0
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for given, said in (
        (tmp_path, "is a directory, not a workload file"),
        (loop, "Too many levels of symbolic links"),
        (tmp_path / "gone.jsonl", "no such file"),
    ):
        result = simulate_here("--from-run", run, "--workload", given, "--output", tmp_path / "r")
        assert result.exit_code == 2 and f"--workload {given}: {said}" in result.stderr, result.stderr
        assert not (tmp_path / "r").exists()


def test_a_replay_repairs_exactly_where_the_run_did(tmp_path: Path) -> None:
    """Each submission keeps the verdict the run reached (results.jsonl): every program before the last
    failed, the last passed or not."""
    verdicts = {"first": [True, False], "fixed": [False, True], "bad": [False, False]}
    problems = [_code_problem(pid, v) for pid, v in verdicts.items()]
    run = tmp_path / "run"
    assert (
        simulate_here("--workload", write_workload(tmp_path / "w.jsonl", problems), "--output", run).exit_code
        == 0
    )
    replay = tmp_path / "replay"
    result = simulate_here("--from-run", run, "--output", replay)
    assert result.exit_code == 0, result.output
    replayed = {
        p["id"]: [a.get("passes") for a in p["script"]]
        for p in map(json.loads, (replay / "replay-workload.jsonl").read_text().splitlines())
    }
    assert replayed["fixed"] == [False, True] and replayed["bad"] == [False, False]
    assert replayed["first"][0] is True  # its second program was never reached, in the run or the replay
    assert _statuses(replay) == _statuses(run)


def test_a_replay_whose_output_another_command_makes_meanwhile_says_it_exists(
    recorded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two replays given one --output at the same instant: both pass the first look, one mkdir wins. The
    other is refused as any command is whose output exists (it said 'cannot create: File exists'), and
    what the winner wrote there is left as it was."""
    from asyncroll.errors import OutputExistsError
    from asyncroll.runtime import prepare
    from asyncroll.simulation.engine import prepare_from_run

    out = tmp_path / "out"
    out.mkdir()
    (out / "run.json").write_text("{}")  # the winner's
    monkeypatch.setattr(prepare, "output_exists", lambda path: False)  # it was not there when looked at
    with pytest.raises(OutputExistsError, match=r"already exists; asyncroll never overwrites a run"):
        prepare_from_run(recorded, out)
    assert sorted(p.name for p in out.iterdir()) == ["run.json"]
