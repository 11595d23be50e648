"""asyncroll's own request bodies against serve-sim's vLLM field checks: every body the HTTP backend
builds — agent turns (per-tool ``anyOf`` schemas over every declared input type, the final and the code
``submit`` schemas), replayed turns on every server kind, ``--no-structured-output``, the warm-up, ``seed``
and ``max_tokens`` at the ends of what ``asyncroll run`` accepts — is served (200), never refused with a
400 that real vLLM would not give."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncroll.backends.base import ModelRequest
from asyncroll.backends.http_settings import HttpSettings
from asyncroll.backends.request_body import chat_body, warmup_body
from asyncroll.config import ServerKind
from asyncroll.workload import FinalAction, Problem, ToolAction
from tests.sim_servers import sim

EVERY_TYPE = {
    "s": "str", "i": "int", "f": "float", "b": "bool", "n": "number", "d": "dict[int, int]",
    "li": "list[int]", "Li": "List[int]", "lf": "list[float]", "Lf": "List[float]",
    "lli": "list[list[int]]", "llf": "List[List[float]]",
}  # fmt: skip
SEEDS = (0, -(2**63), 2**63 - 1)
KINDS: tuple[ServerKind | None, ...] = ("vllm", "sglang", "transformers", "generic", None)
CODE_PROBLEM = Path(__file__).resolve().parent.parent / "examples" / "livecodebench" / "workload.jsonl"


def _problems() -> list[Problem]:
    every = {"name": "every", "description": "all types", "inputs": EVERY_TYPE}
    bound = {**every, "name": "bound", "bound_arguments": {"s": "z", "i": 1}}
    only = [{"name": f"only_{arg}", "inputs": {arg: kind}} for arg, kind in EVERY_TYPE.items()]
    return [
        Problem.model_validate({"id": "every", "prompt": "p", "tools": [every]}),
        Problem.model_validate({"id": "bound", "prompt": "p", "tools": [bound]}),
        Problem.model_validate({"id": "none", "prompt": "p", "tools": [{"name": "nullary"}]}),
        Problem.model_validate({"id": "many", "prompt": "p", "tools": [every, *only]}),
        Problem.model_validate({"id": "plain", "prompt": "p"}),
        Problem.model_validate(json.loads(CODE_PROBLEM.read_text().splitlines()[0])),
    ]


def _requests(problem: Problem) -> list[ModelRequest]:
    """Turn 0, and a later turn after a long conversation of large tool observations."""
    first = ModelRequest("t", problem, 0, [{"role": "user", "content": problem.prompt}])
    history: list[dict[str, Any]] = [{"role": "user", "content": problem.prompt}]
    call = ToolAction(type="tool", name="x", arguments={"s": '\u00e9"\\\n\U0001f600'})
    for _ in range(30):
        history += [{"role": "assistant", "action": call}, {"role": "tool", "content": '\u00e9"{}' * 300}]
    return [first, ModelRequest("t", problem, 30, history)]


def _served(client: Any, body: dict[str, Any]) -> None:
    reply = client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, (reply.text[:600], json.dumps(body)[:600])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_every_body_the_http_backend_builds_is_served(flavor: str) -> None:
    scripted = FinalAction(type="final", answer="ok", output_tokens=3)
    with sim(metrics_flavor=flavor, max_model_len=65536, kv_cache_tokens=1 << 20) as (_, client):
        for seed in SEEDS:
            for max_tokens in (1, 16, 512):
                for kind in KINDS:
                    for replay, structured in ((False, True), (False, False), (True, True)):
                        s = HttpSettings(
                            endpoint="http://x", model="sim", inflight=1, max_tokens=max_tokens, seed=seed,
                            structured=structured, replay=replay, server_kind=kind,
                        )  # fmt: skip
                        _served(client, warmup_body(s, kind))
                        for problem in _problems():
                            for request in _requests(problem):
                                _served(client, chat_body(s, kind, request, scripted if replay else None))


@pytest.mark.timeout(60)
def test_a_tool_call_of_each_declared_input_type_is_served_and_drawn_to_its_schema() -> None:
    """A problem of one tool is an ``anyOf`` of one branch: serve-sim draws that tool's call, so each input
    type's schema (``patternProperties`` of ``dict[int, int]``, nested lists) is drawn from, not only
    checked."""
    s = HttpSettings(endpoint="http://x", model="sim", inflight=1, max_tokens=512)
    with sim() as (_, client):
        for arg, kind in EVERY_TYPE.items():
            tool = {"name": f"only_{arg}", "inputs": {arg: kind}}
            problem = Problem.model_validate({"id": arg, "prompt": "p", "tools": [tool]})
            request = ModelRequest("t", problem, 0, [{"role": "user", "content": "p"}])
            reply = client.post("/v1/chat/completions", json=chat_body(s, "vllm", request, None))
            assert reply.status_code == 200, reply.text[:600]
            action = json.loads(reply.json()["choices"][0]["message"]["content"])
            assert action["name"] == f"only_{arg}" and list(action["arguments"]) == [arg], action


def test_a_run_whose_every_request_the_server_refused_does_not_ask_whether_it_is_up(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--max-tokens`` past the served context: the server answers every turn with vLLM's 400 ("This
    model's maximum context length is ..."), and the run's warning asked "is the server up?" of a server
    that answered each request."""
    from asyncroll.commands.run_warnings import warn_server_down

    circuit = {"open_at_end": False, "opened": 0, "paused_s": 0.0}
    warn_server_down({"model": {"finished": 0, "failed": {"http_status": 8}, "circuit": circuit}})
    said = capsys.readouterr().err
    assert "no model request succeeded (8 failed: http_status 8)" in said, said
    assert "is the server up?" not in said and "the server answered each with an error status" in said, said
    statuses = {"400": 7, "422": 1}  # summary.json's model.failed_statuses: which status the server said
    warn_server_down(
        {
            "model": {
                "finished": 0,
                "failed": {"http_status": 8},
                "failed_statuses": statuses,
                "circuit": circuit,
            }
        }
    )
    assert "answered each with an error status (400 ×7, 422 ×1)" in capsys.readouterr().err
    warn_server_down(
        {"model": {"finished": 0, "failed": {"http_status": 1, "timeout": 2}, "circuit": circuit}}
    )
    assert "is the server up?" in capsys.readouterr().err  # some went unanswered


@pytest.mark.timeout(120)
def test_a_run_refused_with_400s_counts_them_by_status_and_says_so(tmp_path: Path) -> None:
    """A real run whose every turn serve-sim refuses (``--max-tokens`` past its 32,768-token context):
    summary.json's ``model.failed_statuses`` says which status (``model.failed`` only said http_status),
    and the warning repeats it."""
    from tests.cli_runs import SMOKE
    from tests.conftest import invoke

    with sim() as (running, _):
        out = tmp_path / "run"
        said = invoke(  # in this process, as tests/test_scripted_failures.py runs its replays
            "run", "--workload", SMOKE, "--output", out, "--backend", "vllm", "--model", "sim",
            "--endpoint", running.url, "--replay", "--max-tokens", "40000", "--warmup-requests", "0",
            "--cpu-workers", "1", "--no-telemetry", "--no-progress",
        )  # fmt: skip
    assert said.exit_code == 0, said.output
    model = json.loads((out / "summary.json").read_text())["model"]
    assert model["failed"] == {"http_status": 3} and model["failed_statuses"] == {"400": 3}
    assert "the server answered each with an error status (400 ×3)" in said.stderr, said.stderr
