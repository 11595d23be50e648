"""Long trajectories: the work per turn must not grow with the turns before it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from asyncroll.backends import action_schema, simulated
from asyncroll.backends.action_schema import render_messages
from asyncroll.backends.base import ModelRequest
from asyncroll.backends.server_model import BatchingServer, ServerModelConfig
from asyncroll.backends.simulated import SimulatedServerBackend
from asyncroll.clock import VirtualClock
from asyncroll.serve_sim.sizes import prompt_tokens
from asyncroll.workload import Problem
from tests.simulations import simulate_here

TURNS = 300


def _long_problem(pid: str, turns: int) -> Problem:
    script: list[dict[str, Any]] = [
        {"type": "tool", "name": "add", "arguments": {"a": i, "b": 1}, "latency_ms": 1, "output_tokens": 3}
        for i in range(turns - 1)
    ]
    script.append({"type": "final", "answer": "42", "latency_ms": 1, "output_tokens": 2})
    return Problem.model_validate(
        {
            "id": pid,
            "prompt": f"A long trajectory, {pid}.",
            "tools": [
                {"name": "add", "description": "Add two numbers.", "inputs": {"a": "number", "b": "number"}}
            ],
            "script": script,
        }
    )


def _drive(
    backend: SimulatedServerBackend, clock: VirtualClock, problems: list[Problem], turns: int
) -> tuple[list[tuple[int | None, int]], int]:
    """Interleave the problems' turns on the backend: each turn's (prompt tokens the backend counted,
    tokens of the messages the HTTP backend would send), and how many entries the backend rendered."""
    rendered = 0
    original = simulated.render_message

    def counted(message: dict[str, Any], code: bool) -> dict[str, str]:
        nonlocal rendered
        rendered += 1
        return original(message, code)

    conversations: dict[Any, list[dict[str, Any]]] = {
        p.id: [{"role": "user", "content": p.prompt}] for p in problems
    }
    seen: list[tuple[int | None, int]] = []

    async def turns_of_all() -> None:
        async with asyncio.TaskGroup() as tg:
            await backend.start(tg)
            for turn in range(turns):
                for problem in problems:
                    assert isinstance(problem.id, str)
                    messages = conversations[problem.id]
                    simulated.render_message = counted
                    try:
                        response = await backend.complete(ModelRequest(problem.id, problem, turn, messages))
                    finally:
                        simulated.render_message = original
                    sent = render_messages(problem, messages, turn)
                    seen.append((response.prompt_tokens, prompt_tokens(sent, 4.0)))
                    messages.append({"role": "assistant", "action": response.action, "turn": turn})
                    messages.append(
                        {"role": "tool", "content": str(turn + 1) * 7, "turn": turn, "name": "add"}
                    )
            await backend.aclose()

    clock.run(turns_of_all())
    return seen, rendered


@pytest.mark.timeout(30)
def test_a_long_trajectory_s_prompt_is_sized_once_per_message_and_the_same() -> None:
    """``simulate --server batching`` rendered the whole conversation again on every turn to size its
    prompt: O(n²) in a trajectory's turns (a 5,000-turn workload took ~410 s of CPU, 13 s now). Each
    message is now rendered once; every turn's prompt tokens stay what the HTTP backend would send."""
    clock = VirtualClock()
    engine = ServerModelConfig(
        max_num_seqs=4, step_base_ms=1.0, step_per_seq_ms=0.0, prefill_ms_per_token=0.0
    )
    backend = SimulatedServerBackend(BatchingServer(engine, clock), chars_per_token=4.0)
    problems = [_long_problem("a", TURNS), _long_problem("b", TURNS)]
    seen, rendered = _drive(backend, clock, problems, TURNS)
    assert len(seen) == 2 * TURNS
    assert [counted for counted, _ in seen] == [expected for _, expected in seen]
    assert seen[-1][1] > 50 * seen[0][1]  # the conversation did grow
    # one rendering per message, two a turn (quadratic was ~ TURNS² per trajectory)
    assert rendered <= 2 * 2 * TURNS
    assert not backend._sized  # a final answer drops its trajectory's entry


@pytest.mark.timeout(30)
def test_conversations_evicted_from_the_size_cache_are_sized_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for one conversation, two interleaved trajectories evict each other every turn: each is
    sized whole again, to the same tokens."""
    monkeypatch.setattr(simulated, "SIZED_CONVERSATIONS", 1)
    clock = VirtualClock()
    backend = SimulatedServerBackend(BatchingServer(ServerModelConfig(max_num_seqs=4), clock), 4.0)
    seen, rendered = _drive(backend, clock, [_long_problem("a", 40), _long_problem("b", 40)], 40)
    assert [counted for counted, _ in seen] == [expected for _, expected in seen]
    assert rendered > 40 * 39 // 2  # sized whole every turn


@pytest.mark.timeout(30)
def test_a_conversation_shorter_than_its_sized_prefix_is_sized_whole() -> None:
    """A trajectory asked again from an earlier point (its conversation shorter than the one sized on
    its last turn) is sized from its first message, to what the HTTP backend would send; at one
    character per token, to the character."""
    clock = VirtualClock()
    backend = SimulatedServerBackend(BatchingServer(ServerModelConfig(max_num_seqs=4), clock), 1.0)
    problem = _long_problem("a", 5)
    first: list[dict[str, Any]] = [{"role": "user", "content": problem.prompt}]

    async def main() -> tuple[int | None, int | None]:
        async with asyncio.TaskGroup() as tg:
            await backend.start(tg)
            alone = await backend.complete(ModelRequest("a", problem, 0, first))
            later = [
                *first,
                {"role": "assistant", "action": alone.action, "turn": 0},
                {"role": "tool", "content": "1" * 7, "turn": 0, "name": "add"},
            ]
            await backend.complete(ModelRequest("a", problem, 1, later))
            again = await backend.complete(ModelRequest("a", problem, 0, first))
            await backend.aclose()
        return alone.prompt_tokens, again.prompt_tokens

    alone, again = clock.run(main())
    assert alone == again == prompt_tokens(render_messages(problem, first, 0), 1.0)


@pytest.mark.timeout(60)
def test_a_2000_turn_trajectory_simulates_end_to_end_with_every_output(tmp_path: Path) -> None:
    """A 2,000-turn trajectory through the pressure policy, the batching server, transcripts and both
    exports: it completes and every output holds all of it (3 s here; 20 s when every turn re-rendered
    the conversation)."""
    turns = 2000
    problem = _long_problem("long", turns).model_dump(mode="json", exclude_none=True)
    problem["reference_answer"] = "42"
    workload = tmp_path / "long.jsonl"
    workload.write_text(json.dumps(problem) + "\n")
    out = tmp_path / "run"
    args: list[str | Path] = [
        "--workload",
        workload,
        "--output",
        out,
        "--max-turns",
        str(turns),
        "--policy",
        "asyncroll",
    ]
    result = simulate_here(*args, "--server", "batching", "--transcripts")
    assert result.exit_code == 0, result.output
    (line,) = (out / "results.jsonl").read_text().splitlines()
    assert json.loads(line) | {"turns": turns, "status": "completed", "correct": True} == json.loads(line)
    (transcript,) = (out / "transcripts.jsonl").read_text().splitlines()
    assert len(json.loads(transcript)["messages"]) == 2 * turns
    exports = json.loads((out / "run.json").read_text())["exports"]
    assert exports["trace.json"]["ok"] and exports["timeline.html"]["ok"], exports
    assert len(json.loads((out / "trace.json").read_text())["traceEvents"]) > 2 * turns


@pytest.mark.timeout(30)
def test_the_http_backend_renders_each_model_turn_of_a_conversation_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every turn's request body re-rendered each earlier model turn (its action dumped and encoded as
    JSON): O(n²) in a trajectory's turns, the largest client cost of a long run (1,600 turns of 4
    trajectories: 7.9 s of 30 s). Each assistant entry is now rendered once, and each turn's messages
    stay what a rendering from scratch sends."""
    rendered = 0
    original = action_schema.model_view

    def counted(action: Any) -> dict[str, Any]:
        nonlocal rendered
        rendered += 1
        return original(action)

    problem = _long_problem("a", TURNS)
    messages: list[dict[str, Any]] = [{"role": "user", "content": problem.prompt}]
    assert problem.script is not None
    for turn, action in enumerate(problem.script):
        monkeypatch.setattr(action_schema, "model_view", counted)
        sent = render_messages(problem, messages, turn)
        monkeypatch.setattr(action_schema, "model_view", original)
        fresh = [{k: v for k, v in m.items() if k in ("role", "content", "action")} for m in messages]
        assert sent == render_messages(problem, fresh, turn)
        messages.append({"role": "assistant", "action": action, "turn": turn})
        messages.append({"role": "tool", "content": str(turn) * 7, "turn": turn, "name": "add"})
    assert rendered <= TURNS  # quadratic was TURNS² / 2
