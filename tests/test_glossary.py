"""MEASUREMENT.md's glossary names every key a run writes, so that a user reading ``summary.json``,
``run.json``, ``results.jsonl`` or ``events.jsonl`` beside it finds each one (with its unit).

Two simulations in this process (a code workload on the batching server, then its ``--from-run``
replay) write the records; every key path they hold must be a backticked path in the glossary's section
for that file, where ``<name>`` stands for one key that is data (a kind, a tool). Event fields come
from the event models themselves, so an event the simulations do not emit is checked too. Left out:
``config``'s keys that are RunConfig fields (each named as its option, which ``--help`` and ``asyncroll
schema config`` describe), and a distribution's six keys, which the glossary defines once."""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from asyncroll.config import RunConfig
from asyncroll.events import Candidate, Event, SourceStatus
from tests.conftest import REPO, invoke
from tests.simulations import simulate_here

GLOSSARY = (REPO / "MEASUREMENT.md").read_text(encoding="utf-8")
LCB = REPO / "examples" / "livecodebench" / "workload.jsonl"
#: a distribution's keys, defined once in the glossary's preamble rather than under every key (and its
#: ``approximate``, past 65,536 samples)
DISTRIBUTION = {"count", "mean", "min", "p50", "p95", "max"}
ENVELOPE = {"v", "t", "event", "id"}

Path_ = tuple[str, ...]


def section(title: str) -> str:
    match = re.search(rf"^### {re.escape(title)}\n(.*?)(?=^##)", GLOSSARY + "\n## ", re.M | re.S)
    assert match is not None, f"MEASUREMENT.md has no '### {title}' glossary section"
    return match.group(1)


def documented(text: str) -> list[Path_]:
    return [tuple(token.split(".")) for token in re.findall(r"`([A-Za-z_<][^`\s]*)`", text)]


def leaves(value: Any, prefix: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    """Each key path to a value that is not an object of further keys (lists of objects: ``key[]``)."""
    if isinstance(value, dict) and value and not DISTRIBUTION <= set(value) <= DISTRIBUTION | {"approximate"}:
        for key, item in value.items():
            yield from leaves(item, (*prefix, key))
    elif isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
        for item in value:
            yield from leaves(item, (*prefix[:-1], f"{prefix[-1]}[]"))
    else:
        yield prefix, value


def named(path: Path_, value: Any, patterns: list[Path_]) -> bool:
    """``path`` is a documented key; an empty or null object may be documented by its keys alone."""
    for pattern in patterns:
        if len(pattern) < len(path) or (len(pattern) > len(path) and value not in (None, {}, [])):
            continue
        if all(
            p == k or (p.startswith("<") and p.endswith(">")) for p, k in zip(pattern, path, strict=False)
        ):
            return True
    return False


def undocumented(record: dict[str, Any], title: str, skip: Collection[Path_] = ()) -> list[str]:
    patterns = documented(section(title))
    return sorted(
        ".".join(path)
        for path, value in leaves(record)
        if path not in skip and not named(path, value, patterns)
    )


def undocumented_event_fields() -> list[str]:
    """Each event type's fields (from its model: events no simulation emits too) missing from its row."""
    text = section("events.jsonl")
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([a-z_]+)` \|.*$", text, re.M)}
    models = {cls.model_fields["event"].default: cls for cls in Event.__subclasses__()}
    assert set(rows) == set(models)  # no event left out, none documented that is not written
    nested: dict[str, type[BaseModel]] = {"candidates": Candidate, "sources": SourceStatus}
    missing = [f"envelope.{f}" for f in sorted(ENVELOPE) if f"`{f}`" not in text]
    for name, cls in models.items():
        fields = set(cls.model_fields) - ENVELOPE
        for field in fields & set(nested):
            fields |= set(nested[field].model_fields)
        missing += [f"{name}.{f}" for f in sorted(fields) if f"`{f}`" not in rows[name]]
    return missing


def test_the_glossary_names_every_key_a_run_writes(tmp_path: Path) -> None:
    sim, replay = tmp_path / "sim", tmp_path / "replay"
    first = simulate_here("--workload", LCB, "--output", sim, "--server", "batching")
    assert first.exit_code == 0, first.output
    second = simulate_here("--from-run", sim, "--output", replay)
    assert second.exit_code == 0, second.output
    regenerated = invoke("timeline", sim)  # run.json's exports_regenerated: keys only this writes
    assert regenerated.exit_code == 0, regenerated.output
    # run.json's config holds every RunConfig field under its option's name (``asyncroll schema config``
    # describes them); the keys it adds beside them are in the glossary
    options = {("config", name) for name in RunConfig.model_fields}
    missing: dict[str, list[str]] = {}
    for run in (sim, replay):
        summary = json.loads((run / "summary.json").read_text())
        receipt = json.loads((run / "run.json").read_text())
        results = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
        assert any("tests_total" in line for line in results)  # the code problems' keys are there
        for title, record, skip in (
            ("summary.json", summary, set()),
            ("run.json", receipt, options),
            ("results.jsonl", {k: v for line in results for k, v in line.items()}, set()),
        ):
            missing.setdefault(title, []).extend(undocumented(record, title, skip))
    missing["events.jsonl"] = undocumented_event_fields()
    assert {title: sorted(set(keys)) for title, keys in missing.items() if keys} == {}


def test_an_approximate_distribution_is_a_distribution_the_preamble_defines() -> None:
    """Past 65,536 samples a distribution carries ``approximate``: one leaf, not seven unnamed keys."""
    exact = dict.fromkeys(DISTRIBUTION, 1.0)
    approximate = {**exact, "approximate": {"relative_accuracy": 0.005, "exact_up_to": 65536}}
    summary = {"latency": {"model_latency_s": approximate, "trajectory_s": exact}}
    assert undocumented(summary, "summary.json") == []
    assert [path for path, _ in leaves(summary)] == [
        ("latency", "model_latency_s"),
        ("latency", "trajectory_s"),
    ]


def _decision_reasons() -> set[str]:
    """Every reason a policy's ``Decision`` can carry: its literal, or the literals a name it passes was
    given in the same function (``tool_first``'s ``"fifo" if … else "tool_before_grade"``)."""
    import ast

    reasons: set[str] = set()
    for source in sorted((REPO / "asyncroll" / "policies").glob("*.py")):
        for function in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if not isinstance(function, ast.FunctionDef):
                continue
            given: dict[str, list[ast.expr]] = {}
            for node in ast.walk(function):
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target = node.targets[0]
                    if isinstance(target, ast.Name):
                        given.setdefault(target.id, []).append(node.value)
            for node in ast.walk(function):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Decision":
                    arg = node.args[1]
                    values = given.get(arg.id, []) if isinstance(arg, ast.Name) else [arg]
                    for value in values:
                        reasons |= {
                            c.value
                            for c in ast.walk(value)
                            if isinstance(c, ast.Constant) and isinstance(c.value, str)
                        }
    return reasons


def test_the_glossary_names_every_reason_a_decision_can_give() -> None:
    """``scheduler.reasons`` and ``cpu_selected``'s ``reason`` are keyed by the policies' reasons;
    ``not_eligible_model_supply_ok``, ``tool_before_grade`` and ``tail_guard_longest_predicted`` were in
    no document (SPEC §6 names the first only as ``not_eligible_*``)."""
    reasons = _decision_reasons()
    assert {"fifo", "tool_before_grade", "hard_starvation_fifo", "tail_critical_path"} <= reasons, reasons
    missing = sorted(r for r in reasons if f"`{r}`" not in GLOSSARY)
    assert missing == [], missing
