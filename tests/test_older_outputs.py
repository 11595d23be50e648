"""Outputs another asyncroll wrote, read by this one: what it reads is checked for its schema version,
and what it cannot read is refused naming the file and field, never a traceback or a rewritten file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from asyncroll.errors import UsageError
from asyncroll.experiment.receipts import ExperimentReceipt
from tests.conftest import invoke

RECEIPT = {
    "schema_version": 1,
    "kind": "asyncroll.experiment",
    "status": "interrupted",
    "fingerprint": {"sha256": "0" * 64, "components": {}, "detail": {}},
    "plan": [],
    "stages": {},
    "arms": {},
    "resumes": [],
    "updated_at": "2026-12-01T00:00:00.000+00:00",
}


def test_loading_an_experiment_receipt_for_a_resume_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    """``--resume`` read experiment.json by rewriting it (a new ``updated_at``) before checking that it
    could resume at all: an experiment an older asyncroll started, whose resume is refused because the
    protocol changed, had its receipt changed by the refusal."""
    path = tmp_path / "experiment.json"
    path.write_text(json.dumps(RECEIPT, indent=2))
    before = path.read_bytes()
    receipt = ExperimentReceipt.load(path)
    assert receipt.data["updated_at"] == RECEIPT["updated_at"]
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"schema_version": 1, "kind": "asyncroll.exp', "not valid JSON"),
        ("[]", "not a JSON object"),
        (json.dumps({**RECEIPT, "schema_version": 2}), "schema_version 2"),
        (json.dumps({**RECEIPT, "kind": "asyncroll.comparison"}), "kind 'asyncroll.comparison'"),
        (json.dumps({k: v for k, v in RECEIPT.items() if k != "fingerprint"}), "no 'fingerprint'"),
        (json.dumps({**RECEIPT, "fingerprint": "abc"}), "'fingerprint' is not an object"),
        (json.dumps({k: v for k, v in RECEIPT.items() if k != "status"}), "no 'status'"),
        (json.dumps({**RECEIPT, "stages": {"qualification": {}}}), "no 'stages.qualification.status'"),
        (json.dumps({**RECEIPT, "arms": {"a": {"status": "failed"}}}), "no 'arms.a.attempts_interrupted'"),
        (json.dumps({**RECEIPT, "arms": {"a": []}}), "no 'arms.a.status'"),
        (
            json.dumps({**RECEIPT, "arms": {"a": {"status": 3, "attempts_interrupted": []}}}),
            "'arms.a.status' is not a string",
        ),
    ],
)
def test_an_experiment_receipt_this_version_cannot_resume_is_refused_naming_it(
    tmp_path: Path, text: str, said: str
) -> None:
    """A cut, foreign or other-version experiment.json was a KeyError or JSONDecodeError traceback on
    ``--resume``; it is a usage error naming the file and what is wrong, and the file is kept."""
    path = tmp_path / "experiment.json"
    path.write_text(text)
    with pytest.raises(UsageError) as refused:
        ExperimentReceipt.load(path)
    assert str(path) in str(refused.value)
    assert said in str(refused.value)
    assert path.read_text() == text


def other_version(recorded: Path, tmp_path: Path, name: str) -> Path:
    """A copy of ``recorded`` whose ``name`` says schema version 2 (events: every line's ``v``)."""
    run = tmp_path / "run"
    shutil.copytree(recorded, run)
    path = run / name
    if name == "events.jsonl":
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({**e, "v": 2}) + "\n" for e in lines))
    else:
        path.write_text(json.dumps({**json.loads(path.read_text()), "schema_version": 2}, indent=2))
    return run


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("events.jsonl", "events.jsonl line 1: event schema version 2; this asyncroll reads version 1"),
        ("run.json", "run.json: schema_version 2; this asyncroll reads run.json version 1"),
    ],
)
def test_timeline_refuses_a_run_of_another_schema_version_and_keeps_its_files(
    recorded: Path, tmp_path: Path, name: str, said: str
) -> None:
    """``asyncroll timeline`` drew events of any ``v`` as this version's and wrote into a run.json of any
    ``schema_version`` (``optimum`` and ``simulate --from-run`` refuse both): a run another version wrote
    is refused naming the file, line and version, its exports and receipt left as they were."""
    run = other_version(recorded, tmp_path, name)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    result = invoke("timeline", run)
    assert result.exit_code == 2, result.output
    assert said in result.output
    assert "Traceback" not in result.output
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_optimum_refuses_a_summary_of_another_schema_version(recorded: Path, tmp_path: Path) -> None:
    """``optimum`` read limits, makespan and analytic bound from a summary.json of any schema version
    (it refuses another events version): such a summary is refused naming it."""
    run = other_version(recorded, tmp_path, "summary.json")
    result = invoke("optimum", run)
    assert result.exit_code == 2, result.output
    assert "summary.json: schema_version 2; this asyncroll reads summary.json version 1 only" in result.output


def test_optimum_refuses_a_run_json_of_another_schema_version(recorded: Path, tmp_path: Path) -> None:
    """MEASUREMENT.md: a run another schema version wrote is refused, judged by run.json and the first
    event, as timeline and simulate --from-run refuse it; optimum judged summary.json and the events only,
    and solved a run whose run.json said schema_version 2 (reading its status as this version's)."""
    run = other_version(recorded, tmp_path, "run.json")
    result = invoke("optimum", run)
    assert result.exit_code == 2, result.output
    assert "run.json: schema_version 2; this asyncroll reads run.json version 1 only" in result.output
    assert "Traceback" not in result.output


def test_an_event_of_another_version_in_the_middle_of_a_run_is_not_drawn(
    recorded: Path, tmp_path: Path
) -> None:
    """Only the first event's ``v`` was checked: a hand-joined file whose later lines another version wrote
    had those lines drawn as this version's events. Such a line is now no valid event: skipped and counted,
    as a damaged line is."""
    from asyncroll.events import parse_event

    run = tmp_path / "mixed"
    shutil.copytree(recorded, run)
    path = run / "events.jsonl"
    lines = path.read_text().splitlines()
    later = json.loads(lines[5])
    later["v"] = 2
    lines[5] = json.dumps(later)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError):
        parse_event(lines[5])
    result = invoke("timeline", run)
    assert result.exit_code == 0, result.output
    assert f"1 line(s) of {path} are not valid events" in result.stderr


def test_exports_an_older_run_had_regenerated_say_which_code_drew_them(
    recorded: Path, tmp_path: Path
) -> None:
    """``exports_regenerated`` said only ``asyncroll: 0.1.0``, the version every checkout has: a run that an
    older asyncroll wrote (no ``code`` in its run.json, 0.1.0 in its ``versions``) and this one redrew said
    the same version for both, so which code drew the timeline a user opens could not be told. It names the
    code as run.json's ``code`` does."""
    from asyncroll.code_identity import code_version_once

    run = tmp_path / "older"
    shutil.copytree(recorded, run)
    receipt = json.loads((run / "run.json").read_text())
    receipt.pop("code", None)  # as 175efe0 wrote it: no ``code``
    (run / "run.json").write_text(json.dumps(receipt))
    result = invoke("timeline", run)
    assert result.exit_code == 0, result.output
    regenerated = json.loads((run / "run.json").read_text())["exports_regenerated"]
    assert regenerated["code"] == code_version_once()
    assert "code" not in {k for k in json.loads((run / "run.json").read_text()) if k != "exports_regenerated"}
