"""Malformed inputs found by fuzzing the files and flags asyncroll reads: each is refused before anything
runs (exit 2, naming the file or flag and the field), never a traceback or a run that fails half-way."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from asyncroll.workload import scan_workload
from tests.conftest import REPO, invoke
from tests.experiments import SMOKE as EXPERIMENT
from tests.experiments import write_config

SMOKE = REPO / "examples" / "smoke.jsonl"
PAST_64_BITS = 10**21  # a valid JSON integer, and a valid int flag, that no 64-bit encoder writes


def test_an_integer_setting_past_64_bits_is_refused_before_the_run(tmp_path: Path) -> None:
    # Was: the run started and ended "run failed: TypeError: Integer exceeds 64-bit range", its output
    # directory half-written (the event encoder refuses the setting).
    out = tmp_path / "run"
    result = invoke(
        "simulate", "--workload", SMOKE, "--output", out, "--max-inflight-model-requests", str(PAST_64_BITS)
    )
    assert result.exit_code == 2, result.output
    assert "--max-inflight-model-requests" in result.output and "must fit in 64 bits" in result.output
    assert not out.exists()

    config = tmp_path / "settings.json"
    config.write_text(json.dumps({"starvation_threshold": PAST_64_BITS, "policy": "asyncroll"}))
    result = invoke("run", "--workload", SMOKE, "--output", out, "--config", config)
    assert result.exit_code == 2, result.output
    assert f"--config {config}: setting 'starvation_threshold'" in result.output
    assert not out.exists()


def test_a_scripted_sleep_past_one_day_is_refused_by_validation(tmp_path: Path) -> None:
    # Was: `validate` said ok, then `simulate` ended "run failed: OverflowError: int too large to convert
    # to float" (the argument is the simulated job's duration).
    workload = tmp_path / "w.jsonl"
    line = (
        '{"prompt": "p", "tools": [{"name": "sleep_ms"}], "script": [{"type": "tool", "name": "sleep_ms", '
        '"arguments": {"milliseconds": 1%s}}, {"type": "final", "answer": "x"}]}\n' % ("0" * 400)
    )
    workload.write_text(line + line.replace("sleep_ms", "spin_ms").replace("1" + "0" * 400, "86400001"))
    result = invoke("validate", workload)
    assert result.exit_code == 2, result.output
    assert f"{workload}:1: script[0].arguments.milliseconds: an integer of 301+ digits is past one day" in (
        result.output
    )
    assert f"{workload}:2: script[0].arguments.milliseconds: 86400001 is past one day" in result.output
    out = tmp_path / "run"
    assert invoke("simulate", "--workload", workload, "--output", out).exit_code == 2
    assert not out.exists()
    workload.write_text(line.replace("1" + "0" * 400, "86400000"))  # one day exactly is a valid duration
    assert invoke("validate", workload).exit_code == 0


def _sleep_line(milliseconds: int | float, implementation: str | None = None) -> str:
    tool: dict[str, object] = {"name": "sleep_ms"}
    if implementation is not None:
        tool.update(implementation=implementation, inputs={"milliseconds": "number"})
    action = {"type": "tool", "name": "sleep_ms", "arguments": {"milliseconds": milliseconds}}
    return json.dumps({"prompt": "p", "tools": [tool], "script": [action, {"type": "final", "answer": 1}]})


def test_a_sleep_past_one_day_is_shown_as_a_number_while_a_float_can_hold_it(tmp_path: Path) -> None:
    # Past 10**300 an integer is described, not formatted: formatting one past a float's range raised
    # OverflowError out of validation.
    workload = tmp_path / "w.jsonl"
    # Just past the bound, the value is shown in full: "8.64e+07 is past one day (86400000 ms)" read as
    # the bound itself.
    durations = (10**300 - 1, 10**300, 10**310, 86_400_001, 86_400_000.01, 1e20)
    workload.write_text("".join(_sleep_line(ms) + "\n" for ms in durations))
    problems = scan_workload(workload, tmp_path, scripted=True).problems
    shown = (
        "1e+300",
        "an integer of 301+ digits",
        "an integer of 301+ digits",
        "86400001",
        "86400000.01",
        "1e+20",
    )
    assert problems == [
        f"{workload}:{n}: script[0].arguments.milliseconds: {s} is past one day (86400000 ms): a typo "
        "would stall the run"
        for n, s in enumerate(shown, 1)
    ]


def test_a_trusted_tools_milliseconds_argument_is_not_a_simulated_duration(tmp_path: Path) -> None:
    # Only the built-in sleep_ms and spin_ms take their argument as the job's duration; a tool file's
    # function of the same name gets its argument as given (its simulated cost is its cpu_ms).
    (tmp_path / "t.py").write_text("def sleep_ms(milliseconds):\n    return milliseconds\n")
    workload = tmp_path / "w.jsonl"
    workload.write_text(_sleep_line(10**9, implementation="t.py") + "\n")
    assert scan_workload(workload, tmp_path, scripted=True).problems == []


def test_a_server_command_placeholder_with_a_format_spec_is_refused_naming_the_token(tmp_path: Path) -> None:
    # Was: validation read "{port:d}" as the known placeholder "port"; filling it raised ValueError ("Unknown
    # format code 'd' for object of type 'str'") out of `experiment plan` as a traceback.
    serve = json.loads(EXPERIMENT.read_text())["server"]["command"]
    for shaped in ("{port:d}", "{port!r}", "{port:>99999999999999999999}"):
        config = write_config(tmp_path, **{"server.command": [shaped if t == "{port}" else t for t in serve]})
        done = invoke("experiment", "plan", "--config", config)
        assert done.exit_code == 2, done.output
        assert f"{config}: config: server.command[{serve.index('{port}')}] {shaped!r}: a placeholder" in (
            done.stderr
        )
        assert "no {port} placeholder" not in done.stderr  # it is there, only shaped


def damaged(recorded: Path, tmp_path: Path, name: str, line: int, field: str, value: object) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(recorded, copy)
    rows = [json.loads(text) for text in (copy / name).read_text().splitlines()]
    rows[line - 1][field] = value
    (copy / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
    return copy


def test_a_replayed_run_whose_result_status_is_not_a_string_is_refused_before_the_replay(
    recorded: Path, tmp_path: Path
) -> None:
    # Was: the replay ran and wrote its outputs, then reading the statuses back raised the UsageError out
    # of the command (a traceback, exit 1).
    run = damaged(recorded, tmp_path, "results.jsonl", 1, "status", 5)
    out = tmp_path / "replay"
    done = invoke("simulate", "--from-run", run, "--output", out)
    assert done.exit_code == 2, (done.output, done.exception)
    assert f"--from-run {run / 'results.jsonl'}:1: 'status' is not a string" in done.output
    assert not out.exists()


def test_optimum_refuses_an_event_time_no_run_has(recorded: Path, tmp_path: Path) -> None:
    # Was: a model_finished at t = 1e20 s made a schedule horizon past 64 bits; CP-SAT raised a TypeError.
    lines = (recorded / "events.jsonl").read_text().splitlines()
    at = next(i for i, text in enumerate(lines, 1) if json.loads(text)["event"] == "model_finished")
    run = damaged(recorded, tmp_path, "events.jsonl", at, "t", 1e20)
    done = invoke("optimum", run, "--time-limit", "5")
    assert done.exit_code == 2, (done.output, done.exception)
    assert f"{run}/events.jsonl line {at}: model_finished has t 1e+20: not a time in seconds" in done.output


@pytest.mark.timeout(60)
def test_a_replay_refuses_a_recorded_worker_count_it_cannot_start(recorded: Path, tmp_path: Path) -> None:
    # Was: a run.json with config.cpu_workers 100000000 replayed, starting workers for ever; then refused
    # as if --cpu-workers had been given.
    run = tmp_path / "copy"
    shutil.copytree(recorded, run)
    receipt = json.loads((run / "run.json").read_text())
    receipt["config"]["cpu_workers"] = 100_000_000
    (run / "run.json").write_text(json.dumps(receipt))
    out = tmp_path / "replay"
    done = invoke("simulate", "--from-run", run, "--output", out)
    assert done.exit_code == 2, (done.output, done.exception)
    assert f"--from-run {run / 'run.json'}: config.cpu_workers 100000000: at most 10240" in done.output
    assert not out.exists()


def test_a_workload_error_quotes_a_key_that_is_not_a_plain_name(tmp_path: Path) -> None:
    # Was: "w.jsonl:1: tools[0].a" then "b: Extra inputs are not permitted" on a line of its own (and an
    # unknown key's control characters written to the terminal as they were).
    workload = tmp_path / "w.jsonl"
    workload.write_text(
        '{"prompt": "p", "tools": [{"name": "add", "a\\nb": 1, "\\u001b[2J": 2, "": 3, "x.y": 4}], '
        '"script": [{"type": "final", "answer": "5"}], "zz-top": 5}\n'
    )
    done = invoke("validate", workload)
    assert done.exit_code == 2, done.output
    errors = [line for line in done.output.splitlines() if "unknown field" in line]
    assert errors == [
        f"{workload}:1: {where}: unknown field"
        for where in (
            "tools[0]['a\\nb']",
            "tools[0]['\\x1b[2J']",
            "tools[0]['']",
            "tools[0]['x.y']",
            "zz-top",
        )
    ]


def test_a_sweep_value_past_64_bits_is_refused_naming_its_flag(tmp_path: Path) -> None:
    # Was (once settings were bounded): refused by the cell as "--max-active-trajectories", the sweep's
    # workloads folder left behind.
    out = tmp_path / "sweep"
    done = invoke(
        "simulate", "--workload", SMOKE, "--output", out, "--sweep", "--active", f"2,{PAST_64_BITS}"
    )
    assert done.exit_code == 2, (done.output, done.exception)
    assert "--active: every value must fit in 64 bits" in done.output
    assert not out.exists()
