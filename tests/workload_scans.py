"""A workload written line by line and scanned, for the workload validation tests: a good problem
(``GOOD``), ``_write`` (the lines as ``w.jsonl``) and ``_problems`` (what ``scan_workload`` reports)."""

from __future__ import annotations

from pathlib import Path

from asyncroll.workload import scan_workload

GOOD = {
    "id": "a",
    "prompt": "p",
    "tools": [{"name": "add"}],
    "script": [
        {"type": "tool", "name": "add", "arguments": {"a": 1, "b": 2}},
        {"type": "final", "answer": 3},
    ],
}


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _problems(tmp_path: Path, lines: list[str], scripted: bool = True) -> list[str]:
    path = _write(tmp_path, lines)
    return scan_workload(path, tmp_path, scripted=scripted).problems
