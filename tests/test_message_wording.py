"""The wording of refusals: each names the place (file, line, field, flag) and says how to put it right,
in the same words for the same situation whichever command says it."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from asyncroll.errors import UsageError
from asyncroll.simulation.measured import jsonl_rows
from tests.conftest import REPO, invoke
from tests.experiments import SMOKE as EXPERIMENT

SMOKE = REPO / "examples" / "smoke.jsonl"
TOOLMATH = REPO / "examples" / "toolmath"


def test_a_workload_line_that_is_not_json_names_its_column_not_a_line_1_of_its_own(tmp_path: Path) -> None:
    """A bad third line said "w.jsonl:3: line: not valid JSON: Expecting value: line 1 column 1 (char 0)":
    json's own position counts within the line, so the message named line 3 and line 1 at once."""
    workload = tmp_path / "w.jsonl"
    good = '{"prompt": "p", "script": [{"type": "final", "answer": "1"}]}\n'
    workload.write_text(good * 2 + '{"prompt": "p", oops}\n')
    done = invoke("validate", workload)
    assert done.exit_code == 2, done.output
    assert f"{workload}:3: line: not valid JSON: Expecting property name" in done.stderr, done.stderr
    assert "(column 17)" in done.stderr and "line 1" not in done.stderr and "char" not in done.stderr


def test_a_replayed_runs_line_that_is_not_json_names_its_column_not_a_line_1_of_its_own(
    tmp_path: Path,
) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text('{"event": "a"}\n{"event": "b", oops}\n')  # no trailing comma: 3.13 words that apart
    with pytest.raises(UsageError) as info:
        list(jsonl_rows(events))
    said = str(info.value)
    assert f"--from-run {events}:2: not valid JSON (Expecting property name" in said, said
    assert "column 16" in said and "line 1" not in said and "char" not in said


def _run_with_second_event(tmp_path: Path, line: str) -> Path:
    """A run directory with a minimal summary.json and an events.jsonl whose second line is ``line``."""
    run = tmp_path / "run"
    run.mkdir()
    limits = {"max_active_trajectories": 1, "max_inflight_model_requests": 1, "cpu_workers": 1}
    summary = {"makespan_s": 1, "limits": limits, "bounds": {"model_capacity": 1, "lower_bound_s": 1}}
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "events.jsonl").write_text('{"v": 1, "t": 0, "event": "a", "id": null}\n' + line + "\n")
    return run


def test_an_optimum_runs_event_line_that_is_not_json_names_its_column_not_a_line_1_of_its_own(
    tmp_path: Path,
) -> None:
    """``asyncroll optimum`` read events.jsonl with json's own text: "events.jsonl line 2: not JSON:
    Expecting property name ...: line 1 column 15 (char 14)", line 2 and line 1 in one message."""
    from asyncroll.simulation.run_instance import instance_from_run

    run = _run_with_second_event(tmp_path, '{"event": "b", oops}')
    with pytest.raises(UsageError) as info:
        instance_from_run(run)
    said = str(info.value)
    assert f"{run}/events.jsonl line 2: not valid JSON (Expecting property name" in said, said
    assert "column 16" in said and "line 1" not in said and "char" not in said


@pytest.mark.parametrize("ending", ["\n", "\r\n"])
def test_a_workload_line_cut_short_names_its_end_not_column_1(tmp_path: Path, ending: str) -> None:
    """A line cut short (a missing brace, a trailing comma: a pretty-printed example pasted as is) said
    "(column 1)", the line's first character: json counted the error on a "line 2" after the line's own
    newline. Without the newline the same line said its end; now both do."""
    workload = tmp_path / "w.jsonl"
    workload.write_text('{"prompt": "p",' + ending + '{"prompt": "p"' + ending, newline="")
    done = invoke("validate", workload)
    assert done.exit_code == 2, done.output
    assert (
        f"{workload}:1: line: not valid JSON: Expecting property name enclosed in double quotes (column 16)"
        in (done.stderr)
    ), done.stderr
    assert f"{workload}:2: line: not valid JSON: Expecting ',' delimiter (column 15)" in done.stderr


def test_other_jsonl_readers_name_the_end_of_a_line_cut_short(tmp_path: Path) -> None:
    """--from-run's events, optimum's events and convert-livecodebench's rows said "column 1" too."""
    from asyncroll.convert.livecodebench import convert_livecodebench
    from asyncroll.simulation.run_instance import instance_from_run

    events = tmp_path / "events.jsonl"
    events.write_text('{"event": "a"}\n{"event": "b"\n')
    with pytest.raises(
        UsageError, match=r"events.jsonl:2: not valid JSON \(Expecting ',' delimiter, column 14\)"
    ):
        list(jsonl_rows(events))
    run = _run_with_second_event(tmp_path, '{"event": "b"')
    with pytest.raises(UsageError, match=r"line 2: not valid JSON \(Expecting ',' delimiter, column 14\)"):
        instance_from_run(run)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question_id": "a"}\n{"question_id": "b"\n')
    with pytest.raises(
        UsageError, match=r"rows.jsonl:2: invalid line: not valid JSON: Expecting ',' delimiter \(column 20\)"
    ):
        convert_livecodebench(rows, tmp_path / "w.jsonl")


def test_an_unknown_workload_field_is_called_one_and_its_likely_spelling_is_suggested(tmp_path: Path) -> None:
    """pydantic's "Extra inputs are not permitted" said neither that the key is unknown nor what it may be
    a misspelling of (a config file's unknown setting says both)."""
    workload = tmp_path / "w.jsonl"
    workload.write_text(
        '{"prompt": "p", "scirpt": [], "reference": "1", "tools": [{"name": "t", "implmentation": "t.py"}]}\n'
        '{"prompt": "p", "script": [{"type": "tool", "name": "t", "args": {}}, {"type": "final", '
        '"answer": "1", "latensy_ms": 5}]}\n'
    )
    done = invoke("validate", workload)
    assert done.exit_code == 2, done.output
    for line, where, meant in (
        (1, "scirpt", "script"),
        (1, "reference", "reference_answer"),
        (1, "tools[0].implmentation", "implementation"),
        (2, "script[1].final.latensy_ms", "latency_ms"),
    ):
        assert f"{workload}:{line}: {where}: unknown field (did you mean {meant!r}?)" in done.stderr
    assert f"{workload}:2: script[0].tool.args: unknown field\n" in done.stderr
    assert "Extra inputs" not in done.stderr


def test_a_setting_cut_short_in_a_config_file_suggests_the_one_it_starts(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text("max_inflight = 3\n")
    done = invoke("run", "--config", config, "--workload", tmp_path / "w.jsonl", "--output", tmp_path / "r")
    assert done.exit_code == 2, done.output
    said = "setting 'max_inflight': unknown setting (did you mean 'max_inflight_model_requests'?)"
    assert said in done.stderr, done.stderr


TIME_LIMIT = "--time-limit must be a finite number of seconds > 0"


@pytest.mark.parametrize(
    ("flags", "said", "not_said"),
    [
        (["--threads", "0"], "--threads must be ≥ 1, got 0", "--time-limit"),
        # CP-SAT refuses more workers as an invalid model: "unknown", "a longer --time-limit may do better"
        (["--threads", "10001"], "--threads must be at most 10000 (CP-SAT's limit), got 10001", "--time"),
        (["--time-limit", "0"], f"{TIME_LIMIT}, got 0", "--threads"),
        (["--time-limit", "nan"], f"{TIME_LIMIT}, got nan", "--threads"),
    ],
)
def test_optimum_names_the_one_flag_that_is_wrong_and_its_value(
    tmp_path: Path, flags: list[str], said: str, not_said: str
) -> None:
    """Either wrong flag was refused as "--time-limit must be a finite number > 0 and --threads ≥ 1"."""
    done = invoke("optimum", tmp_path, *flags)
    assert done.exit_code == 2, done.output
    assert f"error: {said}" in done.stderr and not_said not in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("args", "offered"),
    [
        (["simulate", "--config", "c.toml"], None),  # click offered --inflight: 60% alike
        (["run", "--max-inflight", "3"], "--max-inflight-model-requests"),
        (["run", "--worklaod", "w.jsonl"], "--workload"),
        (["convert-toolmath", "--functions", "f"], "--functions-dir"),
    ],
)
def test_an_unknown_option_is_offered_only_what_it_likely_meant(args: list[str], offered: str | None) -> None:
    done = invoke(*args)
    assert done.exit_code == 2 and done.stdout == "", done.output
    assert f"No such option: {args[1]}" in done.stderr, done.stderr
    if offered is None:
        assert "Possible options" not in done.stderr and "Did you mean" not in done.stderr, done.stderr
    else:
        # click 8.5's words; click 8.2 (the dev floor) says "Did you mean --workload?"
        assert any(f in done.stderr for f in (f"(Possible options: {offered})", f"Did you mean {offered}?"))


@pytest.mark.parametrize(
    ("typed", "offered"),
    [
        ("convert", "one of 'convert-livecodebench', 'convert-toolmath'?"),
        ("conver-livecodebench", "'convert-livecodebench'?"),
        ("simulat", "'simulate'?"),
    ],
)
def test_a_command_typed_as_the_start_of_several_is_offered_all_of_them(typed: str, offered: str) -> None:
    done = invoke(typed)
    assert done.exit_code == 2 and done.stdout == "", done.output
    assert f"No such command '{typed}'. Did you mean {offered}" in done.stderr, done.stderr


def test_every_command_that_makes_a_run_directory_refuses_an_existing_one_in_the_same_words(
    tmp_path: Path,
) -> None:
    """run and simulate said "(choose a new directory)"; a replay said only "asyncroll never overwrites a
    run", and a sweep (or a run whose directory appeared meanwhile) "--output X already exists"."""
    recorded = tmp_path / "recorded"
    assert invoke("simulate", "--workload", SMOKE, "--output", recorded).exit_code == 0
    taken = tmp_path / "taken"
    taken.mkdir()
    said = (
        f"error: --output {taken} already exists; asyncroll never overwrites a run (choose a new directory)"
    )
    commands: list[list[str | Path]] = [
        ["run", "--workload", SMOKE],
        ["simulate", "--workload", SMOKE],
        ["simulate", "--workload", SMOKE, "--sweep"],
        ["simulate", "--from-run", recorded],
    ]
    for args in commands:
        done = invoke(*args, "--output", taken)
        assert done.exit_code == 2 and done.stdout == "", (args, done.output)
        assert said in done.stderr, (args, done.stderr)
    assert list(taken.iterdir()) == []


def test_a_conversion_or_an_experiment_refusing_its_output_says_what_to_choose(tmp_path: Path) -> None:
    taken = tmp_path / "w.jsonl"
    taken.write_text("")
    done = invoke(
        "convert-toolmath",
        *("--source", TOOLMATH / "ToolMATH.json", "--functions-dir", TOOLMATH, "--output", taken),
    )
    assert done.exit_code == 2 and "conversions never overwrite a file (choose a new one)" in done.stderr
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    done = invoke("experiment", "run", "--config", EXPERIMENT, "--output", tmp_path / "busy")
    assert done.exit_code == 2, done.output
    assert (
        "exists and is not empty; asyncroll never overwrites (choose a new or empty directory)" in done.stderr
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_an_experiment_refuses_an_empty_folder_of_another_users(tmp_path: Path) -> None:
    """An existing empty --output was taken whoever owned it: its owner (a folder planted in a shared
    /tmp) could then plant links in it or read what the arms wrote."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    done = invoke("experiment", "run", "--config", EXPERIMENT, "--output", theirs)
    assert done.exit_code == 2, done.output
    assert f"--output {theirs}: an empty folder of another user's (uid 65534)" in done.stderr
    assert list(theirs.iterdir()) == []


@pytest.mark.parametrize("extra", [["run"], ["simulate"], ["simulate", "--sweep"]])
def test_a_workload_that_is_not_there_is_refused_naming_the_flag(tmp_path: Path, extra: list[str]) -> None:
    """It said "w.jsonl: cannot read: ...", where a missing --config, --source or --from-run workload is
    refused naming its flag."""
    missing = tmp_path / "w.jsonl"
    done = invoke(*extra, "--workload", missing, "--output", tmp_path / "out")
    assert done.exit_code == 2 and done.stdout == "", done.output
    assert f"error: --workload {missing}: cannot read: No such file or directory" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_a_port_in_use_is_refused_saying_what_to_do_without_pythons_address_tuple(tmp_path: Path) -> None:
    """``run --metrics-port`` said "Address already in use (while attempting to bind on address
    ('127.0.0.1', 41234))", a repr of socket's; neither it nor serve-sim said what to do (the experiment
    pre-flight says: stop it, or pick a free port)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        run = invoke("run", "--workload", SMOKE, "--output", tmp_path / "r", "--metrics-port", str(port))
        serve = invoke("serve-sim", "--port", str(port))
    assert run.exit_code == 2 and serve.exit_code == 2, (run.output, serve.output)
    assert f"--metrics-port {port} on 127.0.0.1: cannot listen: Address already in use; " in run.stderr
    assert "choose another --metrics-port (0 picks a free one)" in run.stderr, run.stderr
    assert "attempting" not in run.stderr and "('" not in run.stderr
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use; " in serve.stderr, serve.stderr
    assert "choose another --port (0 picks a free one)" in serve.stderr
    assert not (tmp_path / "r").exists()


def test_a_config_file_read_as_json_that_is_not_says_how_it_is_read(tmp_path: Path) -> None:
    """``--config run.yaml`` was refused as "not valid JSON: Expecting value: line 1 column 1 (char 0)":
    nothing said that a file not named .toml is read as JSON."""
    config = tmp_path / "run.yaml"
    config.write_text("max_turns: 3\n")
    done = invoke("run", "--config", config, "--workload", SMOKE, "--output", tmp_path / "r")
    assert done.exit_code == 2 and done.stdout == "", done.output
    said = f"--config {config}: not valid JSON: Expecting value (line 1, column 1) (a --config file is JSON"
    assert said in done.stderr and "char" not in done.stderr, done.stderr
    config = tmp_path / "run.json"
    config.write_text('{"max_turns": 3, oops}')  # not a trailing comma, which Python 3.13 words apart
    done = invoke("run", "--config", config, "--workload", SMOKE, "--output", tmp_path / "r")
    assert (
        "not valid JSON: Expecting property name enclosed in double quotes (line 1, column 18)" in done.stderr
    )
    assert "TOML" not in done.stderr and not (tmp_path / "r").exists()


@pytest.mark.timeout(90)
def test_a_run_that_ends_before_its_measurement_says_no_trajectory_ran(tmp_path: Path) -> None:
    """A server refused at the warm-up printed "failed: 0/0 completed, 0 failed, ... makespan n/a" for a
    3-problem workload: read as a workload of none."""
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    out = tmp_path / "r"
    done = invoke(
        "run", "--workload", REPO / "examples" / "smoke.jsonl", "--output", out, "--backend", "vllm",
        "--endpoint", f"http://127.0.0.1:{port}", "--model", "m", "--no-progress", "--cpu-workers", "1",
    )  # fmt: skip
    assert done.exit_code == 1
    assert done.stdout == f"failed before the measurement started: no trajectory ran\noutputs: {out}\n"
    assert "warm-up request 1/2 failed" in done.stderr


def test_an_existing_output_error_keeps_its_words_through_a_pickle_and_a_copy() -> None:
    """Rebuilt from its message (what pickling an exception does: a process pool's, ``copy``), it read
    "--output --output X already exists; ... already exists; ..."."""
    import copy
    import pickle

    from asyncroll.errors import OutputExistsError

    for where in (None, "--config c.toml: setting 'output'"):
        error = OutputExistsError(Path("runs/x"), where)
        for again in (pickle.loads(pickle.dumps(error)), copy.copy(error)):
            assert type(again) is OutputExistsError and str(again) == str(error)
            assert str(again).count("already exists") == 1


@pytest.mark.timeout(90)
def test_a_run_failed_by_a_server_that_stayed_down_says_it_once_and_counts_what_it_cut(
    tmp_path: Path,
) -> None:
    """A run failed by ``--server-down-timeout`` printed "0/3 completed, 0 failed" (its 3 trajectories,
    retrying when the failure cut them, in no count shown) and a warning that "trajectories that failed at
    the outage are counted failed" — none had — before the error that says the outage."""
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    out = tmp_path / "r"
    done = invoke(
        "run", "--workload", SMOKE, "--output", out, "--backend", "openai", "--server-kind", "vllm",
        "--endpoint", f"http://127.0.0.1:{port}", "--model", "m", "--replay", "--warmup-requests", "0",
        "--circuit-failures", "2", "--server-down-timeout", "0.5", "--max-retries", "3", "--no-progress",
    )  # fmt: skip
    assert done.exit_code == 1, done.output
    assert done.stdout.startswith("failed: 0/3 completed, 0 failed, 0 max_turns, 3 unfinished | "), (
        done.stdout
    )
    assert "still unavailable" not in done.stderr and done.stderr.count("stayed unavailable for") == 1


def test_a_slow_runs_summary_line_gives_its_completions_per_hour(tmp_path: Path) -> None:
    """Two day-long trajectories one after the other: two completions in 48 hours, 0.042 an hour, were
    printed '0.0 completed/h' beside '2/2 completed'."""
    line = {
        "id": "slow",
        "prompt": "x",
        "script": [{"type": "final", "answer": "1", "latency_ms": 86_400_000}],
    }
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps(line) + "\n" + json.dumps({**line, "id": "slow2"}) + "\n")
    done = invoke(
        "simulate", "--workload", workload, "--output", tmp_path / "r", "--max-active-trajectories", "1"
    )
    assert done.exit_code == 0, done.output
    assert "| makespan 172800.000s (virtual clock) | 0.042 completed/h |" in done.stdout


def test_a_sub_millisecond_simulation_gives_its_makespan_to_the_microsecond(tmp_path: Path) -> None:
    """Scripted turns of a few µs: a makespan of 98 µs was printed 'makespan 0.000s' beside millions of
    completions an hour, its lower bound '0.000s'."""
    lines = [{"id": f"p{i}", "prompt": "x", "script": [{"type": "final", "answer": "1", "latency_ms": 0.049}]}
             for i in range(2)]  # fmt: skip
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "r"
    done = invoke("simulate", "--workload", workload, "--output", out, "--max-active-trajectories", "1")
    assert done.exit_code == 0, done.output
    assert "| makespan 0.000098s (virtual clock) |" in done.stdout
    assert "lower bound 0.000098s (model_service_s)" in done.stdout
