"""The bundled ToolMATH and LiveCodeBench examples: each committed workload is what its generator makes,
the ToolMATH one runs end to end and its tools in a real worker, and the LiveCodeBench one's first
submissions fail where their repairs pass."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from asyncroll.coerce import coerce_arguments
from asyncroll.workload import Problem, ToolAction, iter_problems, scan_workload
from tests.cli_runs import cli
from tests.conversions import LCB_EXAMPLE, LCB_ROW, TM_EXAMPLE, lines, real_process

# --- the bundled examples ----------------------------------------------------------------------------


def _load_generator(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"_example_{path.parent.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("example", [TM_EXAMPLE, LCB_EXAMPLE], ids=["toolmath", "livecodebench"])
def test_committed_example_workloads_are_what_their_generators_make(example: Path) -> None:
    generator = _load_generator(example / "make_example.py")
    assert (example / "workload.jsonl").read_text(encoding="utf-8") == generator.build()


def test_lcb_example_holds_the_real_row_and_a_repair_script_per_problem() -> None:
    source_rows = [
        json.loads(x) for x in (LCB_EXAMPLE / "test.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    assert source_rows[0] == json.loads(LCB_ROW.read_text(encoding="utf-8"))  # the real row, unchanged
    problems = lines(LCB_EXAMPLE / "workload.jsonl")
    assert {p["metadata"]["test_type"] for p in problems} == {"stdin", "functional"}
    for problem in problems:
        Problem.model_validate(problem)
        script = problem["script"]
        assert [a["type"] for a in script] == ["submit", "submit"] and script[0]["code"] != script[1]["code"]


def _passes(code: str, tests: list[dict[str, str]], func_name: str | None) -> bool:
    """A plain reference check of the example's programs (the sandboxed evaluator is tested elsewhere)."""
    if func_name is None:
        for test in tests:
            run = subprocess.run(
                [sys.executable, "-I", "-c", code],
                input=test["input"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            if run.returncode != 0 or run.stdout.split() != test["output"].split():
                return False
        return True
    harness = (
        "import json, sys\nfrom typing import *\nns = {}\nexec(sys.argv[1], ns)\n"
        "tests = json.loads(sys.argv[2])\n"
        "ok = all(getattr(ns['Solution'](), sys.argv[3])(*[json.loads(x) for x in t['input'].split('\\n')])"
        " == json.loads(t['output']) for t in tests)\nprint(ok)\n"
    )
    run = subprocess.run(
        [sys.executable, "-I", "-c", harness, code, json.dumps(tests), func_name],
        capture_output=True,
        text=True,
        timeout=10,
    )
    return run.stdout.strip() == "True"


@real_process
def test_lcb_example_first_submission_fails_and_the_repair_passes() -> None:
    for problem in lines(LCB_EXAMPLE / "workload.jsonl"):
        meta = problem["metadata"]
        wrong, right = (action["code"] for action in problem["script"])
        assert not _passes(wrong, meta["reference_tests"], meta.get("func_name")), problem["id"]
        assert _passes(right, meta["reference_tests"], meta.get("func_name")), problem["id"]


# --- ToolMATH execution: the converted example in real workers ---------------------------------------


@pytest.mark.timeout(90)
def test_toolmath_example_runs_end_to_end_with_the_scripted_backend(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = cli("run", "--workload", TM_EXAMPLE / "workload.jsonl", "--backend", "scripted", "--output", out)
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"]["completed"] == 8
    assert summary["tools"]["calls"] == 13
    assert summary["accuracy"]["exact"] == 1.0 and summary["accuracy"]["denominator"] == 8
    finished = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    tool_jobs = [e for e in finished if e["event"] == "cpu_finished" and e["kind"] == "tool"]
    assert len(tool_jobs) == 13 and all(e["ok"] for e in tool_jobs), tool_jobs
    results = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert all(r["status"] == "completed" and r["correct"] is True for r in results)


@real_process
def test_toolmath_tools_run_in_a_worker_with_math_coercion_and_json_safe_results() -> None:
    """Every scripted call of the example, as the runtime makes it: coerced from the declared inputs,
    run in a real worker that imported the converted tool files, answered with JSON-safe values."""
    import asyncio

    from asyncroll.workers import JobRequest, ProcessWorker, ToolSpec

    workload = TM_EXAMPLE / "workload.jsonl"
    scan = scan_workload(workload, TM_EXAMPLE.resolve(), scripted=True)
    assert scan.problems == []
    specs = [ToolSpec(src.name, src.path) for src in scan.tools.values()]
    calls: list[tuple[str, dict[str, Any]]] = []
    for _, _, problem in iter_problems(workload):
        for action in problem.script or []:
            if isinstance(action, ToolAction):
                tool = problem.tool(action.name)
                assert tool is not None and tool.implementation is not None
                key = ToolSpec(tool.name, (TM_EXAMPLE / tool.implementation).resolve()).key
                calls.append((key, coerce_arguments(action.arguments, tool.declared_inputs)))

    async def main() -> dict[str, Any]:
        worker = ProcessWorker(0, specs, startup_timeout=20)
        await worker.start()
        try:
            values = {}
            for job_id, (key, arguments) in enumerate(calls):
                reply = (await worker.call(JobRequest(job_id, key, arguments), 10)).reply
                assert reply.ok, reply.error
                values[key.rsplit("::", 1)[1] + json.dumps(arguments, sort_keys=True, default=str)] = (
                    reply.value
                )
            return values
        finally:
            await worker.aclose()

    async def bounded() -> dict[str, Any]:
        async with asyncio.timeout(40):
            return await main()

    values = asyncio.run(bounded())
    assert len(values) == 13
    by_name = {k.split("{", 1)[0]: v for k, v in values.items()}
    assert by_name["circle_center_from_standard_coeffs_a"] == [-2.0, 3.0]  # a tuple comes back as a list
    assert by_name["shifted_square_to_linear_coeffs"] == [4016.0, 4032064.0]
    assert by_name["circle_radius_from_standard_coeffs"] == 4.0  # uses math without importing it
    assert by_name["mean_of_values"] == 7.0  # list[float] from JSON ints
    assert by_name["min_and_max"] == [3, 12]  # List[int]
    assert by_name["total_from_counts"] == [36, 10]  # dict[int, int] from JSON string keys
    assert by_name["difference_of_numbers"] == 9  # number stays an int
    for value in values.values():
        assert json.loads(json.dumps(value)) == value
