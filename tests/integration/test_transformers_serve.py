"""A real inference engine nobody here wrote: Hugging Face ``transformers serve`` on CPU.

Needs an environment with the engine, named by ``ASYNCROLL_HF_PYTHON`` (its ``python``); skipped
otherwise. ``.ci/run`` creates one (``pip install torch==2.13.0 'transformers[serving]'``) and runs this
module as its own step. The model is a tiny random-weight Llama built offline by
``scripts/make_tiny_llama.py``. What the engine does differently, and the backend must handle visibly:
``response_format`` is accepted but not enforced (agent mode fails loudly on invalid actions),
``min_tokens``/``ignore_eos`` are rejected (replay sends the budget through ``generation_config``), and
there is no ``/metrics`` (telemetry reports the source unavailable, never zeros).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.common import write_workload
from bench.transformers_serve import Engine, build_model, run_client, start_engine, workload

HF_PYTHON = os.environ.get("ASYNCROLL_HF_PYTHON")
pytestmark = pytest.mark.skipif(
    not HF_PYTHON,  # when it is set, a missing interpreter is a failure, not a skip
    reason="set ASYNCROLL_HF_PYTHON to a python with torch==2.13.0 and transformers[serving] (.ci/run does)",
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    assert HF_PYTHON is not None
    tmp = tmp_path_factory.mktemp("hf")
    model = build_model(Path(HF_PYTHON), tmp / "tiny-llama")
    server = start_engine(Path(HF_PYTHON), model, tmp / "server.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("inflight", [1, 4])
def test_replay_drives_the_real_engine(engine: Engine, tmp_path: Path, inflight: int) -> None:
    path = write_workload(tmp_path / "w.jsonl", workload(8, tool_tokens=12, final_tokens=6))
    out = tmp_path / "run"
    row = run_client(engine, path, out, inflight, "--replay", "--metrics-url", f"{engine.url}/metrics")
    assert row["returncode"] == 0, row["stderr"][-2000:]
    summary = row["summary"]
    assert summary["counts"]["completed"] == 8 and summary["model"]["finished"] == 16
    # each reply decodes its action's scripted budget, no more and no fewer
    finished = [e for e in row["events"] if e["event"] == "model_finished"]
    budgets = [12 if e["action"] == "tool" else 6 for e in finished]
    assert [e["completion_tokens"] for e in finished] == budgets
    started = [e for e in row["events"] if e["event"] == "model_started"]
    assert max(e["inflight"] for e in started) <= inflight
    # no /metrics on this server: reported unavailable with its reason, no sample values invented
    receipt = json.loads((out / "run.json").read_text())
    sources = receipt["telemetry"]["sources"]
    server = next(s for s in sources if s["source"] == "server_metrics")
    assert server["available"] is False and "404" in server["reason"]
    assert not [e for e in row["events"] if e["event"] == "resource_sample" and e.get("running") is not None]


@pytest.mark.timeout(600)
def test_unenforced_schema_fails_loudly_in_agent_mode(engine: Engine, tmp_path: Path) -> None:
    path = write_workload(tmp_path / "w.jsonl", workload(2))
    row = run_client(engine, path, tmp_path / "run", 2, "--max-tokens", "16")
    summary = row["summary"]
    assert summary["counts"]["failed"] == 2
    assert summary["model"]["failed"].get("invalid_action") == 2
    failed = [e for e in row["events"] if e["event"] == "model_failed"]
    assert all(e["kind"] == "invalid_action" and e["status"] == 200 for e in failed)


@pytest.mark.timeout(600)
def test_replay_decodes_the_whole_budget_past_an_end_of_sequence(engine: Engine, tmp_path: Path) -> None:
    # the smoke workload at 64 tokens a turn: the random model ends one of its replies (smoke-sleep's first)
    # after 20 tokens, and continuous batching drops min_new_tokens: only no eos_token_id keeps it decoding
    smoke = Path(__file__).resolve().parents[2] / "examples" / "smoke.jsonl"
    # its kind probed, not declared: transformers serve 5.x lists each model with a status of its own
    row = run_client(engine, smoke, tmp_path / "run", 3, "--replay", "--max-tokens", "64", probe=True)
    assert row["returncode"] == 0, row["stderr"][-2000:]
    backend = json.loads((tmp_path / "run" / "run.json").read_text())["backend"]
    assert backend["server_kind"] == "transformers", backend["server_kind_source"]
    assert "decode length was not fixed" not in row["stderr"]
    assert row["summary"]["counts"]["completed"] == 3
    finished = [e for e in row["events"] if e["event"] == "model_finished"]
    assert len(finished) == 5
    assert [(e["completion_tokens"], e["finish_reason"]) for e in finished] == [(64, "length")] * 5
