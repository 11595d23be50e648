"""The OpenAI-compatible backend driven through the real runtime against a real serve-sim on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import orjson
import pytest

from asyncroll.backends.action_schema import parse_action, turn_schema
from asyncroll.backends.completion import NotACompletion, message_text, read_completion
from asyncroll.backends.http_errors import describe_transport_error
from asyncroll.backends.openai import HttpSettings, OpenAIBackend
from asyncroll.backends.retry import RetryPolicy, retry_after_s
from asyncroll.backends.server_model import ServerModelConfig
from asyncroll.clock import SystemClock
from asyncroll.coerce import TYPE_NAMES
from asyncroll.config import build_config
from asyncroll.errors import InvalidActionError, ModelError, UsageError
from asyncroll.event_log import EventCapture
from asyncroll.events import (
    ModelEnqueued,
    ModelFailed,
    ModelFinished,
    ModelPaused,
    ModelRetrying,
    ModelStarted,
    ServerAvailable,
    ServerUnavailable,
    TrajectoryFinished,
    TrajectoryStarted,
)
from asyncroll.outputs.summary import SummaryBuilder
from asyncroll.runtime.run import Run, RunOutcome, prepare
from asyncroll.runtime.virtual_worker import builtin_duration, virtual_factory
from asyncroll.serve_sim.config import FaultConfig, SimConfig
from asyncroll.serve_sim.server import RunningSim, serve_in_thread
from asyncroll.workload import FinalAction, Problem, SubmitAction
from tests.children import end
from tests.conftest import REPO, write_workload
from tests.loopback import LoopbackServer, trickle

FAST = ServerModelConfig(max_num_seqs=64, step_base_ms=0.2, step_per_seq_ms=0.0, prefill_ms_per_token=0.0)
ADD = {"name": "add", "description": "Add two numbers.", "inputs": {"a": "number", "b": "number"}}


def final_problems(n: int) -> list[dict[str, Any]]:
    return [{"id": f"p{i}", "prompt": f"Answer question {i}."} for i in range(n)]


def http_run(
    tmp_path: Path,
    problems: list[dict[str, Any]],
    url: str,
    client: OpenAIBackend | None = None,
    **settings: Any,
) -> tuple[RunOutcome, EventCapture, Path]:
    """One run of the real runtime (system clock, virtual tool workers) against ``url``."""
    name = f"run{len(list(tmp_path.glob('run*')))}"
    workload = write_workload(tmp_path / f"{name}.jsonl", problems)
    values = {
        "workload": workload,
        "output": tmp_path / name,
        "backend": "vllm",
        "model": "sim",
        "endpoint": url,
        "warmup_requests": 0,
        "circuit_failures": 0,
        **settings,
    }
    cfg = build_config(values)
    clock = SystemClock()
    capture = EventCapture()
    run = Run(
        prepare(cfg, ["test"]),
        clock,
        worker_factory=virtual_factory(clock, builtin_duration),
        backend=client,
        subscribers=(capture,),
    )
    return asyncio.run(run.execute()), capture, tmp_path / name


def serve(**settings: Any) -> contextlib.AbstractContextManager[RunningSim]:
    faults = settings.pop("faults", FaultConfig())
    return serve_in_thread(SimConfig(engine=settings.pop("engine", FAST), faults=faults, **settings))


def requests_of(running: RunningSim) -> list[dict[str, Any]]:
    return list(running.call(lambda: list(running.sim.recent_requests)))


# --- payloads ------------------------------------------------------------------------------------------


def _closed(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


FINAL_SCHEMA = _closed({"type": {"const": "final"}, "answer": {"type": "string"}})


@pytest.mark.timeout(60)
def test_agent_requests_carry_the_spec_schemas_exactly(tmp_path: Path) -> None:
    problem = {"id": "t", "prompt": "What is 2 + 3?", "tools": [ADD]}
    with serve(seed=1) as running:
        outcome, capture, _ = http_run(tmp_path, [problem], running.url, max_tokens=64, seed=7)
        bodies = [r["body"] for r in requests_of(running)]
    assert outcome.status == "complete"
    assert [e.status for e in capture.of(TrajectoryFinished)] == ["completed"]
    first, second = bodies
    add_branch = _closed(
        {
            "type": {"const": "tool"},
            "name": {"const": "add"},
            "arguments": _closed({"a": {"type": "number"}, "b": {"type": "number"}}),
        }
    )
    assert first["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "agent_action", "strict": True, "schema": {"anyOf": [add_branch]}},
    }
    assert {k: first[k] for k in ("model", "temperature", "max_tokens", "seed")} == {
        "model": "sim",
        "temperature": 0,
        "max_tokens": 64,
        "seed": 7,
    }
    assert "min_tokens" not in first and "ignore_eos" not in first  # agent mode: the model decides
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert first["messages"][1]["content"] == "What is 2 + 3?"
    assert second["response_format"]["json_schema"]["schema"] == FINAL_SCHEMA
    roles = [m["role"] for m in second["messages"]]
    assert roles == ["system", "user", "assistant", "user"]
    tool_call = json.loads(second["messages"][2]["content"])
    assert tool_call["type"] == "tool" and tool_call["name"] == "add"
    expected = tool_call["arguments"]["a"] + tool_call["arguments"]["b"]
    assert json.loads(second["messages"][3]["content"].removeprefix("Tool result: ")) == expected
    finished = capture.of(ModelFinished)
    assert all(e.prompt_tokens and e.completion_tokens for e in finished)  # usage recorded


def test_typed_arguments_bound_inputs_and_code_schema() -> None:
    problem = Problem.model_validate(
        {
            "prompt": "p",
            "tools": [
                {
                    "name": "f",
                    "implementation": "tools.py",
                    "inputs": {
                        "n": "int",
                        "xs": "list[float]",
                        "m": "dict[int, int]",
                        "flag": "bool",
                        "s": "str",
                        "secret": "str",
                    },
                    "bound_arguments": {"secret": "k"},
                },
                ADD,
            ],
        }
    )
    schema = turn_schema(problem, 0)
    f_args = schema["anyOf"][0]["properties"]["arguments"]
    assert f_args["properties"] == {
        "n": {"type": "integer"},
        "xs": {"type": "array", "items": {"type": "number"}},
        "m": {
            "type": "object",
            "patternProperties": {"^(0|-?[1-9][0-9]*)$": {"type": "integer"}},
            "additionalProperties": False,
        },
        "flag": {"type": "boolean"},
        "s": {"type": "string"},
    }
    assert f_args["required"] == ["n", "xs", "m", "flag", "s"] and f_args["additionalProperties"] is False
    assert [b["properties"]["name"] for b in schema["anyOf"]] == [{"const": "f"}, {"const": "add"}]
    assert turn_schema(problem, 1) == FINAL_SCHEMA
    code = Problem.model_validate(
        {"prompt": "p", "metadata": {"prompt_metadata": {"protocol": "one_repair"}}}
    )
    assert turn_schema(code, 0) == _closed({"type": {"const": "submit"}, "code": {"type": "string"}})
    # A model's bad call names the argument at fault, not only "not valid under any of the given schemas"
    rest = {"xs": [], "m": {}, "flag": True, "s": ""}
    for arguments, message in (
        ({"n": "20", **rest}, r"\['arguments'\]\['n'\]: '20' is not of type"),
        (rest, r"\['arguments'\]: 'n' is a required property"),
        ({"n": 1, **rest, "secret": "x"}, r"\['arguments'\]: .*\('secret' was unexpected\)"),
    ):
        with pytest.raises(InvalidActionError, match=f"the turn's schema: {message}"):
            text = json.dumps({"type": "tool", "name": "f", "arguments": arguments})
            parse_action(text, schema, structured=True, code=False)
    with pytest.raises(
        InvalidActionError, match=r"'g' is not a tool of this problem \(its tools: 'f', 'add'\)"
    ):
        parse_action('{"type": "tool", "name": "g", "arguments": {}}', schema, structured=True, code=False)


def test_schemas_use_only_keywords_that_grammar_engines_enforce() -> None:
    """A ``dict[int, int]`` input was sent as ``propertyNames`` + a typed ``additionalProperties``:
    llguidance refuses ``propertyNames`` (vLLM's default ``auto`` backend falls back to it from xgrammar,
    so every such request got a 400) and xgrammar before 0.2.7 dropped the value type beside it. The
    schemas of every declared input type keep to keywords xgrammar and llguidance both enforce, and
    still mean what validation means: integer keys, each spelled one way, and integer values."""
    tool = {"name": "f", "implementation": "t.py", "inputs": {f"x{i}": t for i, t in enumerate(TYPE_NAMES)}}
    problem = Problem.model_validate({"prompt": "p", "tools": [tool, ADD]})
    repair = {"prompt_metadata": {"protocol": "one_repair"}}
    code = Problem.model_validate({"prompt": "p", "metadata": repair})
    schemas = [turn_schema(problem, 0), turn_schema(problem, 1), turn_schema(code, 0)]
    keywords: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                keywords.add(key)
                if key in ("properties", "patternProperties"):
                    for sub in value.values():
                        walk(sub)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    for schema in schemas:
        walk(schema)
    portable = {"anyOf", "type", "const", "properties", "required", "additionalProperties", "items"}
    assert keywords <= portable | {"patternProperties"}, keywords - portable
    schema = schemas[0]
    values = [".", 1, 1.5, True, 2, {"-3": 4, "0": 0}, [1], [1], [1.5], [2], [[1], []], [[2]], [[1.5, 2]], []]
    good = {f"x{i}": v for i, v in enumerate(values)}

    def call(**changed: Any) -> str:
        return json.dumps({"type": "tool", "name": "f", "arguments": {**good, **changed}})

    assert parse_action(call(), schema, structured=True, code=False).arguments["x5"] == {"-3": 4, "0": 0}
    for bad in ({"07": 1}, {"+7": 1}, {"-0": 1}, {"a": 1}, {"1": "2"}, {"1": 1.5}):
        with pytest.raises(InvalidActionError, match=r"\['arguments'\]\['x5'\]"):
            parse_action(call(x5=bad), schema, structured=True, code=False)


def test_parsing_is_strict_in_both_modes() -> None:
    final = FINAL_SCHEMA
    assert parse_action(
        '{"type": "final", "answer": "7"}', final, structured=True, code=False
    ) == FinalAction(type="final", answer="7")
    for bad, needle in (
        ("The answer is 7.", "not JSON"),
        ('{"type": "final", "answer": 7}', "does not match the turn's schema"),
        ('{"type": "final", "answer": "7", "why": "x"}', "does not match"),
        ('{"type": "tool", "name": "add", "arguments": {}}', "does not match"),
        (None, "no message content"),
    ):
        with pytest.raises(InvalidActionError, match=needle):
            parse_action(bad, final, structured=True, code=False)
    # --no-structured-output: JSON still required outside code workloads (one fence may surround it) ...
    fenced = '```json\n{"type": "final", "answer": "7"}\n```'
    assert parse_action(fenced, final, structured=False, code=False).type == "final"
    with pytest.raises(InvalidActionError, match="not JSON"):
        parse_action("seven", final, structured=False, code=False)
    # ... while code workloads take plain source, one surrounding fence stripped.
    source = parse_action("```python\nprint(input())\n```", {}, structured=False, code=True)
    assert source == SubmitAction(type="submit", code="print(input())")
    assert parse_action("x = 1\n", {}, structured=False, code=True).code == "x = 1\n"
    with pytest.raises(InvalidActionError, match="no source"):
        parse_action("```\n\n```", {}, structured=False, code=True)


def test_a_tool_call_that_fits_no_branch_says_what_is_wrong() -> None:
    """The first turn's ``anyOf`` said of every bad tool call only that it "is not valid under any of the
    given schemas": which argument, which name, or that a tool call was due, is what a user needs."""
    sleep = {"name": "sleep_ms", "inputs": {"milliseconds": "number"}}
    schema = turn_schema(Problem.model_validate({"prompt": "p", "tools": [ADD, sleep]}), 0)
    for reply, error in (
        (
            {"name": "mul", "arguments": {}},
            "['name']: 'mul' is not a tool of this problem (its tools: 'add', 'sleep_ms')",
        ),
        ({"name": "add", "arguments": {"a": "1", "b": 2}}, "['arguments']['a']: '1' is not of type 'number'"),
        ({"name": "add", "arguments": {"a": 1}}, "['arguments']: 'b' is a required property"),
        (
            {"name": "sleep_ms", "arguments": {"milliseconds": 1, "x": 2}},
            "['arguments']: Additional properties",
        ),
    ):
        with pytest.raises(InvalidActionError) as caught:
            parse_action(json.dumps({"type": "tool", **reply}), schema, structured=True, code=False)
        assert str(caught.value).startswith(f"the action does not match the turn's schema: {error}")
    with pytest.raises(InvalidActionError, match=r"\['type'\]: 'final' where this turn takes a tool call"):
        parse_action('{"type": "final", "answer": "5"}', schema, structured=True, code=False)


@pytest.mark.timeout(60)
def test_no_structured_output_sends_no_schema(tmp_path: Path) -> None:
    with serve() as running:
        outcome, capture, _ = http_run(tmp_path, final_problems(2), running.url, structured_output=False)
        bodies = [r["body"] for r in requests_of(running)]
    assert outcome.status == "complete" and len(bodies) == 2
    assert all("response_format" not in b for b in bodies)
    assert all(b["messages"][0]["role"] == "system" for b in bodies)  # the format is told, not enforced
    assert [e.status for e in capture.of(TrajectoryFinished)] == ["completed", "completed"]


# --- errors --------------------------------------------------------------------------------------------

ERROR_CASES = {
    "reset": ({"faults": FaultConfig(reset_rate=0.5)}, {}, "transport", None, False, False),
    "truncated": ({"faults": FaultConfig(truncate_rate=0.5)}, {}, "transport", None, False, False),
    "timeout": (
        {"faults": FaultConfig(slow_rate=0.5, slow_s=1.0)},
        {"request_timeout": 0.3},
        "timeout",
        None,
        False,
        False,
    ),
    "429": ({"faults": FaultConfig(rate_429=0.5)}, {}, "http_status", 429, True, False),
    "500": ({"faults": FaultConfig(rate_500=0.5)}, {}, "http_status", 500, True, False),
    "503": ({"faults": FaultConfig(rate_503=0.5)}, {}, "http_status", 503, True, False),
    "malformed": ({"faults": FaultConfig(malformed_rate=0.5)}, {}, "bad_response", 200, True, True),
    "invalid_action": (
        {"enforce_schema": False, "faults": FaultConfig(invalid_action_rate=0.5)},
        {},
        "invalid_action",
        200,
        True,
        True,
    ),
    "schema_rejected": ({"faults": FaultConfig(reject_schema=True)}, {}, "schema_rejected", 400, True, False),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_each_error_class_is_recorded_and_isolated(tmp_path: Path, case: str) -> None:
    sim_settings, run_settings, kind, status, received, parsed = ERROR_CASES[case]
    with serve(seed=2, **sim_settings) as running:
        outcome, capture, _ = http_run(
            tmp_path, final_problems(8), running.url, max_active_trajectories=1, **run_settings
        )
    assert outcome.status == "complete"  # a model failure ends its trajectory, never the run
    failed = capture.of(ModelFailed)
    finished = {e.id: e for e in capture.of(TrajectoryFinished)}
    assert len(finished) == 8
    assert failed, "the seeded faults should have hit at least one request"
    for event in failed:
        assert (event.kind, event.status, event.response_received, event.attempts) == (
            kind,
            status,
            received,
            1,
        )
        assert (event.parse_s is not None) == parsed
        assert event.latency_s > 0
        assert not event.error.rstrip().endswith(":"), event.error  # never "ReadError: " and nothing else
        assert finished[event.id].status == "failed"
        assert finished[event.id].error.startswith(f"model {kind}: ")
    failed_ids = {e.id for e in failed}
    assert len(failed_ids) == len(failed)  # one failure per failed trajectory, no retries by default
    others = [e for i, e in finished.items() if i not in failed_ids]
    assert all(e.status == "completed" for e in others)
    if case != "schema_rejected":
        assert others, "the other trajectories completed"
    if case == "timeout":
        assert all(0.3 <= e.latency_s < 0.9 for e in failed)
    # validity: a 200 that is not a valid action (garbled body or invalid action) is a response received
    assert outcome.summary is not None
    valid = len(capture.of(ModelFinished))
    responses = valid + (len(failed) if parsed else 0)
    assert outcome.summary["rates"]["validity_denominator"] == responses
    assert outcome.summary["rates"]["validity_rate"] == (round(valid / responses, 6) if responses else None)


# --- retries, inflight, replay, warm-up, server kind ---------------------------------------------------


@pytest.mark.timeout(60)
def test_retries_are_counted_and_honour_retry_after(tmp_path: Path) -> None:
    faults = FaultConfig(rate_429=0.3, rate_503=0.3, retry_after_s=0.05)
    with serve(seed=4, faults=faults) as running:
        outcome, capture, _ = http_run(
            tmp_path,
            final_problems(6),
            running.url,
            max_retries=8,
            retry_max_delay=0.2,
            max_active_trajectories=1,  # one request at a time: the seeded fault sequence is exact
        )
        injected = running.stats()["faults"]
    assert outcome.status == "complete"
    retries = capture.of(ModelRetrying)
    assert not capture.of(ModelFailed)
    assert [e.status for e in capture.of(TrajectoryFinished)] == ["completed"] * 6
    assert len(retries) == injected.get("http_429", 0) + injected.get("http_503", 0) > 0
    assert outcome.summary is not None
    assert outcome.summary["model"]["retries"] == {"http_status": len(retries)}
    for event in retries:
        assert event.kind == "http_status" and event.status in (429, 503)
        if event.status == 429:
            assert event.delay_s == 0.05  # the server's retry-after-ms, honoured exactly
        else:
            assert 0.75 * min(0.5 * 2 ** (event.attempt - 1), 0.2) <= event.delay_s <= 0.2


@pytest.mark.timeout(60)
def test_exhausted_retries_fail_with_the_attempt_count(tmp_path: Path) -> None:
    with serve(faults=FaultConfig(rate_500=1.0)) as running:
        outcome, capture, _ = http_run(
            tmp_path, final_problems(2), running.url, max_retries=2, retry_max_delay=0.02
        )
    assert outcome.status == "complete"
    assert [(e.kind, e.status, e.attempts) for e in capture.of(ModelFailed)] == [("http_status", 500, 3)] * 2
    assert sorted(e.attempt for e in capture.of(ModelRetrying)) == [1, 1, 2, 2]


def test_retry_policy_units() -> None:
    import random

    policy = RetryPolicy(max_retries=3, base_delay=0.5, max_delay=8.0)
    rng = random.Random(0)
    assert 0.375 <= policy.delay(1, rng) <= 0.5 and 3.0 <= policy.delay(4, rng) <= 4.0
    assert policy.delay(10, rng) <= 8.0
    assert policy.delay(1, rng, {"retry-after-ms": "1500"}) == 1.5
    assert policy.delay(1, rng, {"retry-after": "60"}) == 8.0  # capped
    assert retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, now_epoch=1445412470) == 10.0
    assert retry_after_s({"retry-after": "soon"}) is None


@pytest.mark.timeout(60)
def test_inflight_limit_is_respected_at_the_server(tmp_path: Path) -> None:
    engine = ServerModelConfig(
        max_num_seqs=64, step_base_ms=2.0, step_per_seq_ms=0.0, prefill_ms_per_token=0.0
    )
    with serve(engine=engine) as running:
        outcome, _, _ = http_run(
            tmp_path,
            final_problems(30),
            running.url,
            max_active_trajectories=16,
            max_inflight_model_requests=3,
        )
        stats = running.stats()
    assert outcome.status == "complete" and stats["requests"] == 30
    assert stats["peak_inflight"] == 3  # the simulator's own counter: never more, and the limit was reached
    assert outcome.summary is not None
    assert outcome.summary["peaks"]["inflight_model_requests"] == 3


@pytest.mark.timeout(60)
def test_replay_sends_the_scripted_budgets(tmp_path: Path) -> None:
    problem = {
        "id": "r",
        "prompt": "What is 2 + 3?",
        "tools": [ADD],
        "reference_answer": "5",
        "script": [
            {"type": "tool", "name": "add", "arguments": {"a": 2, "b": 3}, "output_tokens": 7},
            {"type": "final", "answer": "5", "output_tokens": 13, "latency_ms": 1},
        ],
    }
    with serve() as running:
        outcome, capture, out = http_run(tmp_path, [problem], running.url, replay=True, max_tokens=99)
        seen = requests_of(running)
    assert outcome.status == "complete"
    assert [(s["body"]["max_tokens"], s["body"]["min_tokens"], s["body"]["ignore_eos"]) for s in seen] == [
        (7, 7, True),
        (13, 13, True),
    ]
    assert all("response_format" not in s["body"] for s in seen)
    assert json.loads(seen[0]["action_header"]) == {
        "type": "tool",
        "name": "add",
        "arguments": {"a": 2, "b": 3},
    }
    assert json.loads(seen[1]["action_header"]) == {"type": "final", "answer": "5"}
    assert [e.completion_tokens for e in capture.of(ModelFinished)] == [7, 13]
    finished = capture.of(TrajectoryFinished)[0]
    assert finished.status == "completed" and finished.correct is True
    receipt = json.loads((out / "run.json").read_text())
    assert receipt["backend"]["mode"] == "replay"
    assert receipt["backend"]["replay_fixed_length"] == "min_tokens + ignore_eos"


def test_replay_body_per_server_kind() -> None:
    problem = Problem.model_validate(
        {"prompt": "p", "script": [{"type": "final", "answer": "a", "output_tokens": 5}]}
    )
    from asyncroll.backends.base import ModelRequest

    request = ModelRequest("t", problem, 0, [{"role": "user", "content": "p"}])
    action = FinalAction(type="final", answer="a", output_tokens=5)
    bodies = {}
    for kind in ("vllm", "sglang", "transformers", "generic"):
        settings = HttpSettings(endpoint="http://x", model="m", inflight=1, replay=True, server_kind=kind)  # type: ignore[arg-type]
        bodies[kind] = OpenAIBackend(settings, SystemClock()).build_body(request, action)
    assert bodies["vllm"]["min_tokens"] == 5 and bodies["sglang"]["ignore_eos"] is True
    assert "min_tokens" not in bodies["transformers"] and "ignore_eos" not in bodies["transformers"]
    assert json.loads(bodies["transformers"]["generation_config"]) == {
        "max_new_tokens": 5,
        "min_new_tokens": 5,
    }
    assert set(bodies["generic"]) == {"model", "messages", "temperature", "max_tokens", "seed"}
    assert all(b["max_tokens"] == 5 for b in bodies.values())


@pytest.mark.timeout(60)
def test_warmup_and_probed_server_kind(tmp_path: Path) -> None:
    with serve(metrics_flavor="sglang") as running:
        outcome, _, out = http_run(
            tmp_path, final_problems(2), running.url, backend="openai", warmup_requests=3
        )
        stats = running.stats()
    assert outcome.status == "complete" and stats["requests"] == 5
    receipt = json.loads((out / "run.json").read_text())
    assert receipt["warmup"] == {"requested": 3, "sent": 3}
    assert receipt["backend"]["server_kind"] == "sglang"
    assert receipt["backend"]["server_kind_source"].startswith("probed")


@pytest.mark.timeout(60)
def test_warmup_requests_are_retried_like_turns(tmp_path: Path) -> None:
    """A transient 429/503 during the untimed warm-up is retried under ``--max-retries`` (counted in
    run.json, no events: the clock has not started); only a request that still fails fails the run."""
    faults = FaultConfig(rate_429=0.3, rate_503=0.3, retry_after_s=0.01)
    with serve(seed=4, faults=faults) as running:
        outcome, capture, out = http_run(
            tmp_path, final_problems(1), running.url, max_retries=20, retry_max_delay=0.05, warmup_requests=6
        )
        injected = running.stats()["faults"]
    assert outcome.status == "complete", outcome.error
    receipt = json.loads((out / "run.json").read_text())
    assert receipt["warmup"] == {"requested": 6, "sent": 6}
    turn_retries = len(capture.of(ModelRetrying))
    warmup_retries = receipt["backend"]["warmup_retries"]
    assert warmup_retries > 0 and warmup_retries + turn_retries == sum(injected.values())
    with serve(faults=FaultConfig(rate_500=1.0)) as running:
        outcome, capture, _ = http_run(
            tmp_path,
            final_problems(1),
            running.url,
            max_retries=2,
            retry_max_delay=0.02,
            warmup_requests=1,
        )
    assert outcome.status == "failed" and not capture.of(TrajectoryStarted)
    assert (
        outcome.error is not None and "warm-up request 1/1 failed after 3 attempts: HTTP 500" in outcome.error
    )


# --- a server that is down -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def down_backend(tmp_path: Path, port: int, **settings: Any) -> OpenAIBackend:
    cfg = build_config(
        {
            "workload": tmp_path / "unused.jsonl",
            "output": tmp_path / "unused",
            "backend": "vllm",
            "model": "sim",
            "endpoint": f"http://127.0.0.1:{port}",
            "max_active_trajectories": 2,
            **settings,
        }
    )
    return OpenAIBackend(HttpSettings.from_config(cfg), SystemClock())


@pytest.mark.timeout(60)
def test_a_server_that_stays_down_pauses_admission_then_fails_the_run(tmp_path: Path) -> None:
    port = free_port()
    backend = down_backend(tmp_path, port, circuit_failures=2, server_down_timeout=0.5)
    outcome, capture, _ = http_run(
        tmp_path,
        final_problems(10),
        f"http://127.0.0.1:{port}",
        client=backend,
        max_active_trajectories=2,
        circuit_failures=2,
        server_down_timeout=0.5,
    )
    assert outcome.status == "failed" and outcome.exit_code == 1
    assert outcome.error is not None and "stayed unavailable" in outcome.error
    assert "last probe: GET /health: ConnectError" in outcome.error, outcome.error
    # Two failures open the circuit. At most one more trajectory was admitted in between (when the first
    # failure freed its slot before the second failure); the other seven were never admitted.
    started, failed = capture.of(TrajectoryStarted), capture.of(ModelFailed)
    assert len(started) in (2, 3) and 2 <= len(failed) <= len(started)
    assert {e.kind for e in failed} == {"transport"}


@pytest.mark.timeout(60)
def test_admission_resumes_when_the_server_comes_back(tmp_path: Path) -> None:
    outcome, capture, _ = down_run(tmp_path, free_port(), True, server_down_timeout=30)
    assert outcome.status == "complete"
    statuses = [e.status for e in capture.of(TrajectoryFinished)]
    # The two that met the refused connections failed (a third, if it slipped in before the circuit
    # opened); every later one waited for the server and completed.
    assert len(statuses) == 6 and statuses.count("failed") in (2, 3)
    assert statuses.count("completed") == 6 - statuses.count("failed")
    assert outcome.summary is not None
    circuit = outcome.summary["model"]["circuit"]
    assert circuit["opened"] == 1 and not circuit["open_at_end"]


# --- validation and the end-to-end subprocess ----------------------------------------------------------


def test_http_only_flags_and_replay_needs_scripts(tmp_path: Path) -> None:
    workload = write_workload(tmp_path / "w.jsonl", final_problems(1))
    with pytest.raises(UsageError, match="--replay, --max-retries only apply to HTTP backends"):
        build_config({"workload": workload, "output": tmp_path / "o", "replay": True, "max_retries": 1})
    cfg = build_config(
        {"workload": workload, "output": tmp_path / "o", "backend": "vllm", "model": "m", "replay": True}
    )
    with pytest.raises(UsageError, match="script: required"):
        prepare(cfg)
    assert not (tmp_path / "o").exists()


@pytest.mark.timeout(90)
def test_end_to_end_run_against_a_serve_sim_subprocess(tmp_path: Path) -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "asyncroll.cli", "serve-sim", "--port", "0", "--step-base-ms", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().split()[3]
        out = tmp_path / "run"
        run = subprocess.run(
            [
                sys.executable, "-m", "asyncroll.cli", "run",
                "--workload", REPO / "examples" / "smoke.jsonl", "--output", out,
                "--backend", "vllm", "--model", "sim", "--endpoint", url,
                "--replay", "--max-tokens", "32", "--cpu-workers", "1", "--telemetry-interval", "0.02",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert "complete: 3/3 completed" in run.stdout
        for name in (
            "run.json",
            "events.jsonl",
            "results.jsonl",
            "summary.json",
            "trace.json",
            "timeline.html",
        ):
            assert (out / name).stat().st_size > 0, name
        summary = json.loads((out / "summary.json").read_text())
        assert summary["counts"]["completed"] == 3 and summary["accuracy"]["exact"] == 1.0
        receipt = json.loads((out / "run.json").read_text())
        assert receipt["status"] == "complete" and receipt["backend"]["server_kind"] == "vllm"
        events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
        tokens = [e["completion_tokens"] for e in events if e["event"] == "model_finished"]
        assert tokens == [32] * 5  # smoke actions carry no output_tokens: --max-tokens is the budget
        reasons = [e["finish_reason"] for e in events if e["event"] == "model_finished"]
        assert reasons == ["length"] * 5  # serve-sim generates the whole --max-tokens budget
        assert summary["model"]["finish_reasons"] == {"length": 5}
        # telemetry is on by default with --backend vllm: serve-sim's /metrics sampled, estimates covered
        assert receipt["telemetry"]["sources"][0]["available"] is True
        assert sum(e["event"] == "resource_sample" for e in events) >= 3
        resources = summary["resources"]
        # covered, though not how much: a loaded machine delays samples past the gap limit (≈ 0.8 of a
        # 0.2 s run when idle, 0.34 seen under a loaded full suite); the folding is unit-tested
        assert resources["server_coverage_s"] > 0 and resources["server_coverage_fraction"] <= 1
        assert resources["sampled_starvation_s"] is not None
        assert resources["sampled_starvation_coverage_s"] > 0
    finally:
        server.terminate()
        try:
            server.communicate(timeout=30)
        finally:
            end(server)


@pytest.mark.timeout(60)
def test_a_wrong_model_fails_the_warmup_before_the_clock(tmp_path: Path) -> None:
    with serve() as running:
        outcome, capture, out = http_run(
            tmp_path, final_problems(2), running.url, model="gpt-9", warmup_requests=1
        )
    assert outcome.status == "failed"
    assert outcome.error is not None and "warm-up request 1/1 failed: HTTP 404" in outcome.error
    assert "The model `gpt-9` does not exist" in outcome.error
    assert not capture.of(TrajectoryStarted)
    assert json.loads((out / "run.json").read_text())["status"] == "failed"


def test_server_kind_probe_without_a_model_list() -> None:
    """Pure protocol cases of the probe (``httpx.MockTransport``): no list → generic; no server → error."""
    import httpx

    async def probe(handler: Any) -> tuple[str | None, str]:
        settings = HttpSettings(endpoint="http://server", model="m", inflight=1)
        backend = OpenAIBackend(settings, SystemClock(), transport=httpx.MockTransport(handler))
        async with asyncio.TaskGroup() as tg:
            try:
                await backend.start(tg)
            finally:
                await backend.aclose()
        return backend.server_kind, backend.describe()["server_kind_source"]

    kind, source = asyncio.run(probe(lambda request: httpx.Response(404, text="Not Found")))
    assert kind == "generic" and "HTTP 404 without a model list" in source
    listed = {"data": [{"id": "m", "owned_by": "huggingface"}]}
    kind, source = asyncio.run(probe(lambda request: httpx.Response(200, json=listed)))
    assert kind == "generic" and "huggingface" in source
    deep = b'{"data": ' + b"[" * 100_000  # json raises RecursionError here, not a ValueError
    kind, source = asyncio.run(probe(lambda request: httpx.Response(200, content=deep)))
    assert kind == "generic" and "HTTP 200 without a model list" in source

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(ExceptionGroup) as raised:  # raised inside the run's task group
        asyncio.run(probe(refuse))
    assert raised.group_contains(ModelError, match="or declare its kind with --server-kind")


@pytest.mark.timeout(60)
def test_replay_of_a_large_action_skips_the_echo_header(tmp_path: Path) -> None:
    answer = "x" * 10_000  # larger than servers accept in headers
    problem = {
        "id": "big",
        "prompt": "p",
        "script": [{"type": "final", "answer": answer, "output_tokens": 3}],
    }
    with serve() as running:
        outcome, capture, _ = http_run(tmp_path, [problem], running.url, replay=True)
        seen = requests_of(running)
    assert outcome.status == "complete" and seen[0]["action_header"] is None
    assert seen[0]["body"]["max_tokens"] == 3
    assert [e.completion_tokens for e in capture.of(ModelFinished)] == [3]
    assert [e.finish_reason for e in capture.of(ModelFinished)] == ["length"]  # cut at max_tokens: 3


# --- odd 200 bodies, interrupted requests, the server circuit ------------------------------------------

FINAL = json.dumps({"type": "final", "answer": "1"})


def completion(content: Any, usage: Any = None) -> dict[str, Any]:
    message = {"role": "assistant", "content": content}
    body = {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
    }
    return body | {"usage": {"prompt_tokens": 5, "completion_tokens": 3} if usage is None else usage}


#: One reply per request, in order (served one request at a time): (body, ending kind, tokens recorded).
ODD_BODIES: list[tuple[Any, str, int | None]] = [
    (completion([{"type": "text", "text": FINAL[:10]}, {"type": "text", "text": FINAL[10:]}]), "final", 3),
    (completion(5), "bad_response", None),
    (completion({"type": "final", "answer": "1"}), "bad_response", None),
    (completion([{"type": "image_url", "image_url": {"url": "x"}}]), "bad_response", None),
    (completion(FINAL, usage=[1, 2]), "final", None),  # usage that is not an object is ignored
    (completion(FINAL, usage="n/a"), "final", None),
    (completion(FINAL, usage={"prompt_tokens": -1, "completion_tokens": "3"}), "final", None),  # never 0
    ({"choices": []}, "bad_response", None),
    ({"choices": {"0": {}}}, "bad_response", None),
    ({"choices": [{"index": 0}]}, "bad_response", None),
    ({"choices": ["text"]}, "bad_response", None),
    ([1, 2, 3], "bad_response", None),
    ({"error": {"message": "overloaded"}}, "bad_response", None),
    # past Python's integer digit limit; an invalid reply's usage is kept (the server did the work)
    (completion("1" * 5000), "invalid_action", 3),
    # a finish_reason that is not a string is recorded as none
    (completion(FINAL) | {"choices": [{"message": {"content": FINAL}, "finish_reason": 7}]}, "final", 3),
    (completion(FINAL), "final", 3),
]


class FakeOpenAI(LoopbackServer):
    """A real loopback HTTP server answering ``/v1/chat/completions`` with ``bodies`` in turn (then the
    last one again); ``/v1/models`` names vLLM, ``/health`` is 200."""

    def __init__(
        self,
        bodies: list[Any],
        get_status: dict[str, int] | None = None,
        delays: list[float] | None = None,
        key: str | None = None,
    ) -> None:
        """``delays``: seconds to wait before answering each chat request, in turn (then none); ``key``:
        an API key every request must carry (``Authorization: Bearer KEY``), else 401."""
        statuses = get_status or {}
        self.authorizations: list[str | None] = []  # each request's Authorization header
        waits = iter(delays or [])

        served = iter(bodies)
        last = [bodies[-1]]
        seen = self.authorizations

        class Handler(BaseHTTPRequestHandler):
            def send(self, obj: Any, status: int = 200) -> None:
                data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                if isinstance(obj, bytes):  # raw bytes are sent as a gzip body that is not gzip
                    self.send_header("content-encoding", "gzip")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def refused(self) -> bool:
                if self.path == "/metrics":  # as vLLM: its metrics are not behind the API key
                    return False
                seen.append(self.headers.get("authorization"))
                if key is None or self.headers.get("authorization") == f"Bearer {key}":
                    return False
                self.send({"error": {"message": "invalid API key"}}, 401)
                return True

            def do_GET(self) -> None:
                if self.refused():
                    return
                body = {"data": [{"id": "sim", "owned_by": "vllm"}]} if self.path == "/v1/models" else {}
                self.send(body, statuses.get(self.path, 200))

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.refused():
                    return
                time.sleep(next(waits, 0.0))
                last[0] = next(served, last[0])
                self.send(last[0])

            def log_message(self, *args: Any) -> None:
                return None

        super().__init__(Handler)


@pytest.mark.timeout(60)
def test_an_api_key_from_the_environment_is_sent_and_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server started with an API key (vLLM's or SGLang's ``--api-key``, a hosted endpoint) answered
    every request 401: there was no way to send one. ``--api-key-env NAME`` sends the key NAME holds;
    the key is in no output (run.json records the command line and the config: the name only)."""
    secret = "sk-test-5f1c0a"
    monkeypatch.setenv("ASYNCROLL_TEST_KEY", secret)
    with FakeOpenAI([completion(FINAL)], key=secret) as server:
        outcome, _, out = http_run(
            tmp_path, final_problems(2), server.url, api_key_env="ASYNCROLL_TEST_KEY", warmup_requests=1
        )
        refused, _, _ = http_run(tmp_path, final_problems(1), server.url, warmup_requests=1)
    assert outcome.status == "complete" and outcome.summary is not None, outcome.error
    assert outcome.summary["counts"]["completed"] == 2
    assert server.authorizations[:3] == [f"Bearer {secret}"] * 3  # the warm-up and both turns
    assert refused.status == "failed" and refused.error is not None and "401" in refused.error
    receipt = json.loads((out / "run.json").read_text())
    assert receipt["backend"]["api_key"] == "from the environment variable ASYNCROLL_TEST_KEY"
    assert receipt["config"]["api_key_env"] == "ASYNCROLL_TEST_KEY"
    assert not [f for f in out.rglob("*") if f.is_file() and secret.encode() in f.read_bytes()]
    monkeypatch.delenv("ASYNCROLL_TEST_KEY")
    with pytest.raises(
        UsageError, match="--api-key-env ASYNCROLL_TEST_KEY: that environment variable is not set"
    ):
        build_config(
            {
                "workload": "w",
                "output": "o",
                "backend": "vllm",
                "model": "m",
                "api_key_env": "ASYNCROLL_TEST_KEY",
            }
        )
    with pytest.raises(UsageError, match="--api-key-env only applies to HTTP backends"):
        build_config({"workload": "w", "output": "o", "api_key_env": "HOME"})


@pytest.mark.timeout(60)
def test_odd_200_bodies_fail_only_their_own_request(tmp_path: Path) -> None:
    """A 200 whose content is a list of text parts is read as their text; one whose content, choices or
    message is any other shape is ``bad_response``; a ``usage`` that is not an object is ignored, and a
    count that is not a non-negative integer is null. None of them may escape as a
    TypeError/AttributeError and stop the run. An invalid action's usage is recorded on its
    ``model_failed`` (it was dropped: the tokens of truncated replies, often the costliest, were lost)."""
    with FakeOpenAI([body for body, _, _ in ODD_BODIES]) as server:
        outcome, capture, _ = http_run(
            tmp_path, final_problems(len(ODD_BODIES)), server.url, max_active_trajectories=1
        )
    assert outcome.status == "complete", outcome.error
    ends = sorted(capture.of(ModelFinished) + capture.of(ModelFailed), key=lambda e: e.request_id)
    got = [
        (e.action if isinstance(e, ModelFinished) else e.kind, getattr(e, "completion_tokens", None))
        for e in ends
    ]
    assert got == [(kind, tokens) for _, kind, tokens in ODD_BODIES]
    finished = sorted(capture.of(ModelFinished), key=lambda e: e.request_id)
    assert [e.finish_reason for e in finished] == ["stop"] * 4 + [None, "stop"]
    assert outcome.summary is not None and outcome.summary["model"]["finish_reasons"] == {"stop": 5}
    for event in capture.of(ModelFailed):
        assert event.response_received is True and event.status == 200 and event.parse_s is not None
    bad = [e.error for e in capture.of(ModelFailed) if e.kind == "bad_response"]
    assert "content is a JSON number" in bad[0] and "content[0] is not a text part" in bad[2]
    assert "choices is empty" in bad[3] and "choices[0].message is missing" in bad[5]
    assert outcome.summary is not None
    assert outcome.summary["counts"]["completed"] == 6 and outcome.summary["counts"]["failed"] == 10
    # every 200 is a response received: 6 valid of 16 (garbled bodies are invalid responses, not absent)
    assert outcome.summary["rates"]["validity_denominator"] == 16
    assert outcome.summary["rates"]["validity_rate"] == round(6 / 16, 6)


@pytest.mark.timeout(60)
def test_a_slow_reply_times_out_inside_httpx_and_never_locks_the_pool(tmp_path: Path) -> None:
    """A request that times out must end inside httpx (its own read timeout, which closes the
    connection): a cancellation delivered inside httpcore's pool can leave a connection counted for ever
    (encode/httpcore#1093), and a pool limited to the inflight limit then locked up — every later
    request timed out against a healthy server. The pool has no limit of its own (the model gate is the
    limit); the whole-request deadline, a little later, only ends a server that trickles bytes."""
    from asyncroll.http_read import request_deadline_s

    assert request_deadline_s(0.3) == 1.3 and request_deadline_s(120) == 132
    with FakeOpenAI([completion(FINAL)], delays=[2.0]) as server:
        outcome, capture, _ = http_run(
            tmp_path, final_problems(3), server.url, max_active_trajectories=1, request_timeout=0.3
        )
    assert outcome.status == "complete", outcome.error
    (failed,) = capture.of(ModelFailed)
    assert failed.kind == "timeout" and "(ReadTimeout)" in failed.error
    assert outcome.summary is not None and outcome.summary["counts"]["completed"] == 2
    backend = OpenAIBackend(HttpSettings(endpoint=server.url, model="m", inflight=4), SystemClock())
    pool = backend._http()._transport._pool  # type: ignore[attr-defined]
    assert (pool._max_connections, pool._max_keepalive_connections) == (sys.maxsize, 4)  # no limit


@pytest.mark.timeout(60)
def test_an_undecodable_body_fails_only_its_own_request(tmp_path: Path) -> None:
    """A 200 whose body fails its content-encoding (httpx's DecodingError) is that request's
    ``bad_response``; it escaped the backend and failed the whole run."""
    with FakeOpenAI([completion(FINAL), b"not gzip at all", completion(FINAL)]) as server:
        outcome, capture, _ = http_run(tmp_path, final_problems(3), server.url, max_active_trajectories=1)
    assert outcome.status == "complete", outcome.error
    (failed,) = capture.of(ModelFailed)
    assert failed.kind == "bad_response" and failed.response_received is True
    assert "DecodingError" in failed.error
    assert outcome.summary is not None and outcome.summary["counts"]["completed"] == 2


@pytest.mark.timeout(60)
def test_a_native_tool_call_reply_says_so(tmp_path: Path) -> None:
    """A server serving with automatic tool choice answers ``tool_calls`` and no content: the error says
    that, not only that the content is missing. So do a refusal (OpenAI's structured outputs), reasoning
    with no answer after it (vLLM's reasoning parser) and any other finish_reason but ``stop`` (a reply
    the server's content filter emptied said only that it had no content)."""
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}

    def reply(message: dict[str, Any], finish: Any) -> dict[str, Any]:
        return completion(None) | {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}

    bodies = [
        reply({"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"),
        reply({"role": "assistant", "content": None}, "content_filter"),
        reply({"role": "assistant", "content": None, "refusal": "I can't help with that."}, "stop"),
        reply({"role": "assistant", "content": "", "reasoning_content": "Let me think"}, "stop"),
        reply({"role": "assistant", "content": "no", "reasoning_content": "Let me think"}, "stop"),
    ]
    with FakeOpenAI(bodies) as server:
        outcome, capture, _ = http_run(tmp_path, final_problems(5), server.url, max_active_trajectories=1)
    assert outcome.status == "complete", outcome.error
    tools, filtered, refused, thought, stopped = (e.error for e in capture.of(ModelFailed))
    assert "native tool_calls, finish_reason='tool_calls'" in tools
    assert filtered == "the response has no message content (finish_reason='content_filter')"
    assert refused == 'the response has no message content (the model refused: "I can\'t help with that.")'
    assert thought.endswith("(the message has reasoning but no content: no answer followed the reasoning)")
    assert stopped.startswith("the response is not JSON") and stopped.endswith("'no'")


@pytest.mark.timeout(60)
def test_a_lone_surrogate_escape_in_an_action_is_an_invalid_action(tmp_path: Path) -> None:
    """``"\\ud800"`` in a model's JSON decodes to a string that no UTF-8 write accepts: a submission
    holding one failed the whole run (UnicodeEncodeError), every other trajectory cancelled. It is that
    request's invalid action, counted; an escaped pair (an emoji) is fine."""
    code = {
        "id": "code",
        "prompt": "write a program",
        "tools": [{"name": "lcb_evaluate"}],
        "metadata": {
            "reference_tests": [{"input": "1", "output": "1", "testtype": "stdin"}],
            "prompt_metadata": {"protocol": "one_repair", "max_generations": 2},
        },
    }
    bodies = [
        completion('{"type": "submit", "code": "print(\\"\\ud800\\")"}'),
        completion('{"type": "final", "answer": "x\\udfff"}'),
        completion('{"type": "final", "answer": "\\ud83d\\ude00"}'),
    ]
    with FakeOpenAI(bodies) as server:
        outcome, capture, out = http_run(
            tmp_path,
            [code, *final_problems(2)],
            server.url,
            max_active_trajectories=1,
            allow_weak_isolation=True,
        )
    assert outcome.status == "complete", outcome.error
    failed = [(e.kind, e.error) for e in capture.of(ModelFailed)]
    assert failed == [
        (
            "invalid_action",
            f"the action's {where} is not valid Unicode: a lone UTF-16 surrogate escape (\\ud800-\\udfff)",
        )
        for where in ("code", "answer")
    ]
    rows = [orjson.loads(line) for line in (out / "results.jsonl").read_bytes().splitlines()]
    assert [(r["status"], r["answer"]) for r in rows] == [
        ("failed", None),
        ("failed", None),
        ("completed", "😀"),
    ]
    assert outcome.summary is not None and outcome.summary["rates"]["validity_denominator"] == 3


@pytest.mark.timeout(60)
def test_arguments_the_schema_passes_but_coercion_refuses_are_an_invalid_response(tmp_path: Path) -> None:
    """An integer of 400 digits is a JSON ``number`` but no ``float``: the request was a valid response
    (``model_finished``, validity 1.0) while its trajectory failed as ``model invalid_action``. It is
    the request's own invalid action now, counted in the validity rate."""
    (tmp_path / "tools.py").write_text("def half(x: float) -> float:\n    return x / 2\n")
    half = {"name": "half", "inputs": {"x": "float"}, "implementation": "tools.py"}
    problem = {"id": "p", "prompt": "Halve a big number.", "tools": [half]}
    call = '{"type": "tool", "name": "half", "arguments": {"x": 1' + "0" * 400 + "}}"
    with FakeOpenAI([completion(call)]) as server:
        outcome, capture, _ = http_run(tmp_path, [problem], server.url)
    assert outcome.status == "complete", outcome.error
    assert not capture.of(ModelFinished)
    (failed,) = capture.of(ModelFailed)
    assert failed.kind == "invalid_action" and "tool 'half' arguments.x: 1000" in failed.error
    assert "too large for a float" in failed.error
    (finished,) = capture.of(TrajectoryFinished)
    assert finished.status == "failed" and finished.error is not None
    assert finished.error.startswith("model invalid_action: tool 'half' arguments.x")
    assert outcome.summary is not None
    assert (outcome.summary["rates"]["validity_rate"], outcome.summary["model"]["failed"]) == (
        0.0,
        {"invalid_action": 1},
    )


def test_read_completion_never_raises_anything_but_not_a_completion() -> None:
    for payload in (b"", b"null", b"[]", b'"x"', b"{}", b'{"choices": null}', b'{"choices": [null]}'):
        with pytest.raises(NotACompletion):
            read_completion(payload)
    assert message_text([]) == "" and message_text(None) is None
    got = read_completion(
        orjson.dumps(completion(FINAL, usage={"prompt_tokens": 5.0, "completion_tokens": 3}))
    )
    assert (got.content, got.prompt_tokens, got.completion_tokens) == (FINAL, None, 3)
    deep = "[" * 100_000 + "]" * 100_000  # json.loads raises RecursionError, not JSONDecodeError
    for text in (deep, "1" * 5000):  # ... and ValueError past the integer digit limit
        with pytest.raises(InvalidActionError, match="not JSON"):
            parse_action(text, FINAL_SCHEMA, structured=True, code=False)


def test_validity_rate_counts_garbled_200s_as_received_invalid_responses() -> None:
    def failed(kind: str, received: bool | None) -> ModelFailed:
        return ModelFailed(
            request_id=1, turn=0, latency_s=0.1, kind=kind, error="x", response_received=received
        )

    def rates(events: list[Any]) -> dict[str, Any]:
        builder = SummaryBuilder()
        for event in events:
            builder(event)
        summary = builder.build(
            makespan_s=1.0, policy="fifo", limits=LIMITS, cpu_cost={}, peaks={}, status="complete"
        )
        return dict(summary["rates"])

    ok = [ModelFinished(request_id=i, turn=0, latency_s=0.1, action="final") for i in range(9)]
    got = rates([*ok, failed("bad_response", True), failed("transport", False), failed("cancelled", False)])
    assert (got["validity_rate"], got["validity_denominator"]) == (0.9, 10)
    got = rates([failed("bad_response", True), failed("invalid_action", True), failed("http_status", True)])
    assert (got["validity_rate"], got["validity_denominator"]) == (0.0, 2)


LIMITS = {"max_active_trajectories": 1, "max_inflight_model_requests": 1, "cpu_workers": 1}


def test_transport_errors_without_text_still_say_what_happened() -> None:
    import httpx

    assert describe_transport_error(httpx.ReadError("")) == (
        "ReadError: the connection was closed or reset while reading the response"
    )
    assert describe_transport_error(httpx.ReadTimeout("")) == "ReadTimeout: no response within the timeout"
    assert describe_transport_error(httpx.ConnectError("[Errno 111] refused")) == (
        "ConnectError: [Errno 111] refused"
    )
    try:
        try:
            raise OSError("socket closed")
        except OSError as inner:
            raise httpx.ReadError("") from inner
    except httpx.ReadError as exc:
        assert describe_transport_error(exc) == "ReadError: socket closed"  # the cause's text first

    def hang(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("", request=request)

    async def probe() -> None:
        settings = HttpSettings(endpoint="http://server", model="m", inflight=1)
        backend = OpenAIBackend(settings, SystemClock(), transport=httpx.MockTransport(hang))
        async with asyncio.TaskGroup() as tg:
            try:
                await backend.start(tg)
            finally:
                await backend.aclose()

    with pytest.raises(ExceptionGroup) as raised:
        asyncio.run(probe())
    assert raised.group_contains(ModelError, match=r"\(ReadTimeout: no response within the timeout\)")


@pytest.mark.timeout(60)
def test_requests_in_flight_when_the_run_is_stopped_end_as_cancelled(tmp_path: Path) -> None:
    """Interrupting a run ends every request holding a slot with ``model_failed`` kind ``cancelled`` (as a
    CPU job holding a worker gets ``cpu_failed`` reason ``cancelled``); a request still queued for a slot
    was never sent and ends with nothing. They are counted, but are neither errors nor responses."""
    workload = write_workload(tmp_path / "w.jsonl", final_problems(4))
    capture = EventCapture()

    async def main(url: str) -> None:
        ready = asyncio.Event()  # two requests in flight and two queued behind them

        def watch(event: Any) -> None:
            if len(capture.of(ModelStarted)) == 2 and len(capture.of(ModelEnqueued)) == 4:
                ready.set()

        cfg = build_config(
            {
                "workload": workload,
                "output": tmp_path / "run",
                "backend": "vllm",
                "model": "sim",
                "endpoint": url,
                "warmup_requests": 0,
                "max_inflight_model_requests": 2,
                "telemetry": False,
            }
        )
        clock = SystemClock()
        run = Run(
            prepare(cfg, ["test"]),
            clock,
            worker_factory=virtual_factory(clock, builtin_duration),
            subscribers=(capture, watch),
        )
        task = asyncio.create_task(run.execute())
        async with asyncio.timeout(20):
            await ready.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with serve(faults=FaultConfig(slow_rate=1.0, slow_s=30.0)) as running:
        asyncio.run(main(running.url))
    cancelled = capture.of(ModelFailed)
    assert sorted(e.request_id for e in cancelled) == sorted(e.request_id for e in capture.of(ModelStarted))
    assert len(cancelled) == 2 and {(e.kind, e.response_received) for e in cancelled} == {
        ("cancelled", False)
    }
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert summary["model"]["requests"] == 2 and summary["model"]["failed"] == {"cancelled": 2}
    assert summary["rates"]["validity_denominator"] == 0
    trace = json.loads((tmp_path / "run" / "trace.json").read_text())
    assert trace["metadata"]["unknown_events"] == {}


def down_run(tmp_path: Path, port: int, bring_up: bool, **settings: Any) -> tuple[Any, EventCapture, Path]:
    """A run against ``port`` where nothing listens; with ``bring_up`` a serve-sim starts there as soon as
    the circuit opens."""
    backend = down_backend(tmp_path, port, circuit_failures=2, **settings)
    result: dict[str, Any] = {}

    async def main() -> None:
        with contextlib.ExitStack() as stack:

            async def start_server() -> None:
                await backend.circuit.wait_opened()
                await asyncio.sleep(0.3)  # a measurable outage
                await asyncio.to_thread(
                    stack.enter_context, serve_in_thread(SimConfig(engine=FAST), port=port)
                )

            helper = asyncio.create_task(start_server()) if bring_up else None
            workload = write_workload(tmp_path / "w.jsonl", final_problems(6))
            cfg = build_config(
                {
                    "workload": workload,
                    "output": tmp_path / "run",
                    "backend": "vllm",
                    "model": "sim",
                    "endpoint": f"http://127.0.0.1:{port}",
                    "warmup_requests": 0,
                    "max_active_trajectories": 2,
                    "circuit_failures": 2,
                    "telemetry": False,
                    **settings,
                }
            )
            clock = SystemClock()
            capture = EventCapture()
            run = Run(
                prepare(cfg, ["test"]),
                clock,
                worker_factory=virtual_factory(clock, builtin_duration),
                backend=backend,
                subscribers=(capture,),
            )
            result["outcome"] = await run.execute()
            if helper is not None:
                await helper
            result["capture"] = capture
            result["backend"] = backend

    asyncio.run(main())
    return result["outcome"], result["capture"], tmp_path / "run"


@pytest.mark.timeout(60)
def test_a_server_outage_is_recorded_counted_and_drawn(tmp_path: Path) -> None:
    """The circuit's opening and closing are events; summary.json counts the openings, the seconds
    admission was paused and the requests that waited for the server (inside their latency), and the
    trace draws the outage on the scheduler track."""
    outcome, capture, out = down_run(tmp_path, free_port(), True, max_retries=5, retry_max_delay=0.05)
    assert outcome.status == "complete", outcome.error
    [opened] = capture.of(ServerUnavailable)
    [closed] = capture.of(ServerAvailable)
    assert opened.failures == 2 and opened.opened == 1 and opened.reason.startswith("transport: ConnectError")
    assert closed.t > opened.t and closed.paused_s >= 0.3 and closed.probes >= 1
    waits = capture.of(ModelPaused)
    assert waits and all(w.waited_s > 0 for w in waits)  # retried requests waited for the server
    assert [e.status for e in capture.of(TrajectoryFinished)] == ["completed"] * 6
    assert outcome.summary is not None
    circuit = outcome.summary["model"]["circuit"]
    assert circuit["opened"] == 1 and not circuit["open_at_end"]
    assert circuit["paused_s"] == pytest.approx(closed.t - opened.t, abs=1e-5)
    assert circuit["requests_waited"] == len(waits)
    assert circuit["request_wait_s"] == pytest.approx(sum(w.waited_s for w in waits), abs=1e-5)
    trace = json.loads((out / "trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e.get("cat") == "circuit"]
    outage = [e for e in spans if e["name"] == "server unavailable: admission paused"]
    assert len(outage) == 1 and outage[0]["args"]["paused_s"] == closed.paused_s
    assert sum(e["name"] == "waiting for the server" for e in spans) == len(waits)
    assert trace["metadata"]["unknown_events"] == {}


@pytest.mark.timeout(60)
def test_server_down_timeout_fails_once_and_closes_the_client(tmp_path: Path) -> None:
    outcome, capture, _ = down_run(tmp_path, free_port(), False, server_down_timeout=0.5)
    assert outcome.status == "failed" and outcome.error is not None
    assert outcome.error.count("stayed unavailable") == 1, outcome.error  # not repeated by aclose()
    assert len(capture.of(ServerUnavailable)) == 1 and not capture.of(ServerAvailable)
    assert outcome.summary is not None
    circuit = outcome.summary["model"]["circuit"]
    assert circuit["opened"] == 1 and circuit["open_at_end"] and circuit["paused_s"] >= 0.5


@pytest.mark.timeout(60)
def test_a_wait_for_the_server_that_the_run_ends_is_still_recorded(tmp_path: Path) -> None:
    """Requests waiting for the server when it stays down too long: their waits are events and counted."""
    outcome, capture, _ = down_run(
        tmp_path, free_port(), False, server_down_timeout=0.5, max_retries=5, retry_max_delay=0.05
    )
    assert outcome.status == "failed"
    waits = capture.of(ModelPaused)
    assert waits and all(w.waited_s > 0 for w in waits)
    assert outcome.summary is not None
    assert outcome.summary["model"]["circuit"]["requests_waited"] == len(waits)


@pytest.mark.timeout(30)
def test_the_health_probe_falls_back_to_the_model_list() -> None:
    """A server without ``/health`` (404) is probed with ``/v1/models``; what the last probe got is kept
    for the error of a server that stays down."""

    async def probe(get_status: dict[str, int]) -> tuple[bool, str]:
        with FakeOpenAI([completion(FINAL)], get_status) as server:
            backend = OpenAIBackend(
                HttpSettings.from_config(
                    build_config(
                        {"workload": "w.jsonl", "output": "o", "backend": "openai", "model": "sim"}
                        | {"endpoint": server.url}
                    )
                ),
                SystemClock(),
            )
            try:
                return await backend._healthy(), backend._last_probe
            finally:
                await backend.aclose()

    assert asyncio.run(probe({})) == (True, "GET /health: HTTP 200")
    assert asyncio.run(probe({"/health": 404})) == (True, "GET /v1/models: HTTP 200")
    assert asyncio.run(probe({"/health": 404, "/v1/models": 503})) == (False, "GET /v1/models: HTTP 503")
    assert asyncio.run(probe({"/health": 503})) == (False, "GET /health: HTTP 503")


@pytest.mark.timeout(60)
def test_replay_warmup_sends_no_schema(tmp_path: Path) -> None:
    """Replay requests carry no schema, so neither do its warm-up requests: a server that refuses schemas
    serves the whole replay (the warm-up used to send one and fail the run)."""
    problem = {
        "id": "r",
        "prompt": "p",
        "reference_answer": "5",
        "script": [{"type": "final", "answer": "5", "output_tokens": 3}],
    }
    with serve(faults=FaultConfig(reject_schema=True)) as running:
        outcome, _, _ = http_run(tmp_path, [problem], running.url, replay=True, warmup_requests=2)
        seen = requests_of(running)
    assert outcome.status == "complete", outcome.error
    assert len(seen) == 3 and all("response_format" not in s["body"] for s in seen)


@pytest.mark.timeout(60)
def test_an_endpoint_with_v1_is_refused_and_a_404_names_its_url(tmp_path: Path) -> None:
    values = {"workload": "w.jsonl", "output": "o", "backend": "openai", "model": "sim"}
    with pytest.raises(UsageError, match="without /v1"):
        build_config(values | {"endpoint": "http://127.0.0.1:8000/v1/"})
    with serve() as running:
        _, capture, _ = http_run(tmp_path, final_problems(1), running.url + "/api")
    (failed,) = capture.of(ModelFailed)
    assert failed.status == 404 and f"(POST {running.url}/api/v1/chat/completions)" in failed.error


def test_aclose_closes_the_client_even_when_the_watch_failed() -> None:
    async def main() -> OpenAIBackend:
        settings = HttpSettings(endpoint="http://127.0.0.1:9", model="m", inflight=1, server_kind="vllm")
        backend = OpenAIBackend(settings, SystemClock())

        async def failed_watch() -> None:
            raise ModelError("server_down", "stayed unavailable")

        backend._http()
        backend._watch = asyncio.ensure_future(failed_watch())
        await asyncio.sleep(0)
        await backend.aclose()  # does not raise the watch's error again
        return backend

    backend = asyncio.run(main())
    assert backend._client is None and backend._watch is None


# --- a hostile server ------------------------------------------------------------------------------------


def _trickle(handler: Any, stop: threading.Event) -> None:
    trickle(handler, stop, "application/json")


def _raw(status: int, headers: dict[str, str], body: bytes) -> Any:
    def reply(handler: Any, stop: threading.Event) -> None:
        handler.send_response(status)
        for name, value in {**headers, "content-length": str(len(body))}.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(body)

    return reply


class HostileServer(LoopbackServer):
    """A loopback server whose chat replies are ``replies`` in turn (callables writing the whole HTTP
    answer, then the last again) and whose GET routes are ``gets`` (path → callable; else 200 ``{}``)."""

    def __init__(self, replies: list[Any], gets: dict[str, Any] | None = None) -> None:
        stop = self._stop = threading.Event()
        served, last, routes = iter(replies), [replies[-1]], gets or {}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                routes.get(self.path, _raw(200, {"content-type": "application/json"}, b"{}"))(self, stop)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                last[0] = next(served, last[0])
                last[0](self, stop)

            def log_message(self, *args: Any) -> None:
                return None

        super().__init__(Handler)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()  # first: a handler still trickling ends, so shutdown does not wait for it
        super().__exit__(*exc)


def _json_reply(body: Any) -> Any:
    return _raw(200, {"content-type": "application/json"}, json.dumps(body).encode())


@pytest.mark.timeout(60)
def test_hostile_replies_fail_only_their_own_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reply whose charset no codec can use (the run failed with a TypeError from deep in the codec),
    a compression bomb (the client's memory grew without bound), a redirect (named with its target),
    NaN in an action (JSON has no such number) and a negative token count (recorded as real): each is
    its own request's failure or missing number, and the run goes on."""
    import gzip

    import asyncroll.backends.exchange as exchange

    monkeypatch.setattr(exchange, "MAX_RESPONSE_BYTES", 1 << 20)
    bomb = gzip.compress(b"\0" * (8 << 20))  # 8 MiB decoded, ~8 KB on the wire
    nan_call = '{"type": "tool", "name": "add", "arguments": {"a": NaN, "b": 1}}'
    replies = [
        _raw(503, {"content-type": "text/plain; charset=rot13"}, b"busy"),
        _raw(200, {"content-type": "application/json", "content-encoding": "gzip"}, bomb),
        _raw(307, {"location": "http://elsewhere.invalid/v1/chat/completions"}, b""),
        _json_reply(completion(nan_call)),
        _json_reply(completion(FINAL, usage={"prompt_tokens": -5, "completion_tokens": 3})),
    ]
    problems = [
        *final_problems(3),
        {"id": "tool", "prompt": "Add.", "tools": [ADD]},
        {"id": "p3", "prompt": "?"},
    ]
    with HostileServer(replies) as server:
        outcome, capture, _ = http_run(tmp_path, problems, server.url, max_active_trajectories=1)
    assert outcome.status == "complete", outcome.error
    failed = sorted(capture.of(ModelFailed), key=lambda e: e.request_id)
    assert [e.kind for e in failed] == ["http_status", "bad_response", "http_status", "invalid_action"]
    assert failed[0].error == "HTTP 503: busy"
    assert "longer than 1,048,576 bytes (decoded)" in failed[1].error
    assert "redirect to 'http://elsewhere.invalid/v1/chat/completions', not followed" in failed[2].error
    assert "NaN is not a JSON number" in failed[3].error
    (finished,) = capture.of(ModelFinished)
    assert (finished.prompt_tokens, finished.completion_tokens) == (None, 3)


@pytest.mark.timeout(60)
def test_a_trickling_probe_answer_ends_at_its_deadline() -> None:
    """``/v1/models`` (the server-kind probe) and ``/health`` (the down-server probe) had only httpx's
    per-phase timeout, which every trickled byte resets: the run hung before its start, and a down
    server's probe outlived ``--server-down-timeout``."""
    from asyncroll.http_read import request_deadline_s

    settings = HttpSettings(endpoint="", model="m", inflight=1, request_timeout=0.5)
    deadline = request_deadline_s(0.5)
    for path in ("/v1/models", "/health"):
        with HostileServer([_json_reply(completion(FINAL))], gets={path: _trickle}) as server:
            backend = OpenAIBackend(replace(settings, endpoint=server.url), SystemClock())

            async def probe(backend: OpenAIBackend = backend, path: str = path) -> Any:
                try:
                    if path == "/health":
                        return await backend._healthy()
                    return await backend._probe_kind(backend._http())
                finally:
                    await backend.aclose()

            began = time.monotonic()
            if path == "/health":
                assert asyncio.run(probe()) is False
                assert backend._last_probe == f"GET /health: no complete answer within {deadline:g}s"
            else:
                with pytest.raises(ModelError, match=f"\\(no complete answer within {deadline:g}s\\)"):
                    asyncio.run(probe())
            assert time.monotonic() - began < deadline + 2.0


@pytest.mark.timeout(30)
def test_a_model_list_that_cannot_be_decoded_is_generic_not_unreachable() -> None:
    """The server answered, so it is reachable: an undecodable answer makes it ``generic`` with the
    reason, as a missing model list does (it was a transport error said to be "within 3s")."""
    unreadable = _raw(200, {"content-encoding": "gzip"}, b"not gzip at all")
    with HostileServer([_json_reply(completion(FINAL))], gets={"/v1/models": unreadable}) as server:
        backend = OpenAIBackend(HttpSettings(endpoint=server.url, model="m", inflight=1), SystemClock())

        async def probe() -> tuple[str, str]:
            try:
                return await backend._probe_kind(backend._http())
            finally:
                await backend.aclose()

        kind, source = asyncio.run(probe())
    assert kind == "generic" and source.startswith("probed: /v1/models answered unreadably (DecodingError")


@pytest.mark.timeout(60)
def test_an_error_status_with_an_unreadable_body_is_still_that_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 503 whose body fails its content-encoding, or is longer than the cap, is an HTTP 503: retried
    with ``--max-retries`` like any 503 (it was a ``bad_response`` with no status, never retried, and
    counted as a received invalid reply in the validity rate); a 200 with an oversized body stays
    ``bad_response``, now with its status."""
    import asyncroll.backends.exchange as exchange

    monkeypatch.setattr(exchange, "MAX_RESPONSE_BYTES", 1 << 10)
    replies = [
        _raw(503, {"content-encoding": "gzip", "retry-after": "0"}, b"not gzip at all"),
        _raw(503, {"content-type": "text/html", "retry-after": "0"}, b"x" * 4096),
        _json_reply(completion(FINAL)),
        _raw(200, {"content-type": "application/json"}, b" " * 4096),
    ]
    with HostileServer(replies) as server:
        outcome, capture, _ = http_run(
            tmp_path, final_problems(2), server.url, max_active_trajectories=1, max_retries=2
        )
    assert outcome.status == "complete", outcome.error
    retried = capture.of(ModelRetrying)
    assert [(e.kind, e.status) for e in retried] == [("http_status", 503), ("http_status", 503)]
    assert "DecodingError" in retried[0].error and "longer than 1,024 bytes" in retried[1].error
    (failed,) = capture.of(ModelFailed)
    assert (failed.kind, failed.status, failed.response_received) == ("bad_response", 200, True)
    assert outcome.summary is not None
    assert outcome.summary["model"]["retries"] == {"http_status": 2}
    assert outcome.summary["rates"]["validity_denominator"] == 2  # one finished, one 200 unreadable


@contextlib.contextmanager
def syn_dropping_port() -> Any:
    """A loopback port whose connects time out, like a host that is down or firewalled (it drops SYNs,
    it never refuses): a listener that never accepts, its accept queue already full."""
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = int(listener.getsockname()[1])
        for _ in range(3):  # fill the accept queue; later SYNs are dropped
            filler = stack.enter_context(socket.socket())
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
        yield port


@pytest.mark.timeout(60)
def test_a_server_whose_connects_time_out_opens_the_circuit(tmp_path: Path) -> None:
    """A server host that drops connection attempts (down, rebooting, firewalled) is not there, as one
    that refuses them is: its ConnectTimeouts open the circuit, admission pauses and the run fails after
    --server-down-timeout (they were kind ``timeout`` only, never opened it, and every trajectory of the
    workload failed one after another, each after --request-timeout)."""
    with syn_dropping_port() as port:
        backend = down_backend(
            tmp_path, port, circuit_failures=2, server_down_timeout=0.5, request_timeout=0.3
        )
        outcome, capture, _ = http_run(
            tmp_path,
            final_problems(10),
            f"http://127.0.0.1:{port}",
            client=backend,
            max_active_trajectories=2,
            circuit_failures=2,
            server_down_timeout=0.5,
            request_timeout=0.3,
            telemetry=False,  # its /metrics probe would wait out its own connect timeout first
        )
    assert outcome.status == "failed" and outcome.exit_code == 1
    assert outcome.error is not None and "stayed unavailable" in outcome.error, outcome.error
    (opened,) = capture.of(ServerUnavailable)
    assert "ConnectTimeout" in opened.reason
    failed = capture.of(ModelFailed)
    assert {e.kind for e in failed} <= {"timeout", "cancelled"} and len(capture.of(TrajectoryStarted)) <= 4


@pytest.mark.timeout(60)
def test_a_lone_surrogate_in_a_message_is_sent_escaped_not_a_failed_run() -> None:
    """Text a tool or the evaluator made with a lone surrogate (``"\\ud800"``) in a message: orjson
    refused to encode the request, a TypeError outside the exchange's handling that failed the whole run.
    It is sent as the escape, a valid JSON text (the server decides); ordinary text stays UTF-8."""
    import httpx

    from asyncroll.backends.exchange import post_chat

    received: list[bytes] = []

    class Echo(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(self.rfile.read(int(self.headers["content-length"])))
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *_: Any) -> None:
            pass

    async def send(text: str) -> tuple[int, bytes]:
        async with httpx.AsyncClient(base_url=server.url) as client:
            return await post_chat(client, {"messages": [{"role": "user", "content": text}]}, {}, 10.0)

    with LoopbackServer(Echo) as server:
        assert asyncio.run(send("bad \ud800 value")) == (200, b"{}")
        assert asyncio.run(send("café")) == (200, b"{}")
    assert received[0] == b'{"messages":[{"role":"user","content":"bad \\ud800 value"}]}'
    assert json.loads(received[0])["messages"][0]["content"] == "bad \ud800 value"
    assert received[1] == '{"messages":[{"role":"user","content":"café"}]}'.encode()
