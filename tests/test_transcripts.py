"""``--transcripts``: transcripts.jsonl holds each ended trajectory's conversation (prompt, each reply's
text and action, tool results and repair messages as the model saw them), never hidden data."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from asyncroll.backends.action_schema import model_view
from asyncroll.clock import VirtualClock
from asyncroll.config import build_config
from asyncroll.events import Event, TrajectoryFinished
from asyncroll.runtime.run import Run, prepare
from asyncroll.runtime.signals import interruptible
from asyncroll.runtime.virtual_worker import VirtualWorker
from asyncroll.workers.process import CallResult
from asyncroll.workers.protocol import JobRequest
from asyncroll.workload import SubmitAction
from tests.conftest import VirtualRun, invoke, tool_problem, write_workload
from tests.http_backend import ADD, FakeOpenAI, completion, http_run

SECRET = "hidden-input-51c9"  # a hidden test no feedback shows
SHOWN = "shown-input-0a2e"  # the hidden test the repair message shows (the first failing case)
ADD_PROBLEM = {
    "id": "add",
    "prompt": "What is 2 + 3? Use the add tool.",
    "tools": [ADD],
    "reference_answer": "5",
    "script": [
        {"type": "tool", "name": "add", "arguments": {"a": 2, "b": 3}, "latency_ms": 5},
        {"type": "final", "answer": "5", "latency_ms": 5},
    ],
}


def _code_problem(pid: str, verdicts: list[bool]) -> dict[str, Any]:
    return {
        "id": pid,
        "prompt": f"write a program for {pid}",
        "tools": [{"name": "lcb_evaluate"}],
        "script": [
            {"type": "submit", "code": f"print({i})", "latency_ms": 10, "cpu_ms": 40, "passes": v}
            for i, v in enumerate(verdicts)
        ],
        "metadata": {
            "reference_tests": [
                {"input": SHOWN, "output": "1", "testtype": "stdin"},
                {"input": SECRET, "output": "2", "testtype": "stdin"},
            ],
            "prompt_metadata": {"protocol": "one_repair", "max_generations": 2, "repair_instruction": "FIX"},
        },
    }


def _lines(path: Path) -> dict[str, dict[str, Any]]:
    text = path.read_text()
    assert text.endswith("\n")
    return {row["id"]: row for row in map(json.loads, text.splitlines())}


def _reply(turn: int, action: dict[str, Any] | None, **server: Any) -> dict[str, Any]:
    """A transcript's assistant entry; a scripted run has no server text, tokens or finish reason."""
    fields = {"text": None, "prompt_tokens": None, "completion_tokens": None, "finish_reason": None}
    return {"role": "assistant", "turn": turn, **fields, "action": action, **server}


def test_a_scripted_run_writes_each_ended_trajectory_s_conversation(virtual_run: VirtualRun) -> None:
    failing_tool = {"name": "echo", "inputs": {"n": "int"}, "implementation": "echo.py"}
    problems = [
        ADD_PROBLEM,
        _code_problem("repaired", [False, True]),
        {  # a tool job that fails ends the trajectory: its transcript ends with the call
            "id": "tool-fails",
            "prompt": "echo 3",
            "tools": [failing_tool],
            "script": [{"type": "tool", "name": "echo", "arguments": {"n": 3}}],
        },
        {  # a model failure after a tool turn: the transcript ends with what the model was shown last
            "id": "model-fails",
            "prompt": "wait",
            "tools": [{"name": "sleep_ms"}],
            "script": [{"type": "tool", "name": "sleep_ms", "arguments": {"milliseconds": 7}, "cpu_ms": 1}],
        },
    ]
    echo = {"echo.py": "def echo(n):\n    return n\n"}  # a virtual worker runs no file tool: it fails
    outcome, _, out = virtual_run(problems, transcripts=True, tool_files=echo)
    assert outcome.status == "complete", outcome.error
    transcripts, results = _lines(out / "transcripts.jsonl"), _lines(out / "results.jsonl")
    assert list(transcripts) == list(results)  # one line per ended trajectory, in the same order
    for pid, row in transcripts.items():
        assert {k: row[k] for k in ("index", "status", "error", "answer", "correct")} == {
            k: results[pid][k] for k in ("index", "status", "error", "answer", "correct")
        }
    assert transcripts["add"]["messages"] == [
        {"role": "user", "content": ADD_PROBLEM["prompt"]},
        _reply(0, {"type": "tool", "name": "add", "arguments": {"a": 2, "b": 3}}),  # no latency_ms
        {"role": "tool", "turn": 0, "name": "add", "content": "5"},
        _reply(1, {"type": "final", "answer": "5"}),
    ]
    assert (transcripts["add"]["status"], transcripts["add"]["correct"]) == ("completed", True)
    repaired = transcripts["repaired"]
    assert repaired["messages"] == [
        {"role": "user", "content": "write a program for repaired"},
        _reply(0, {"type": "submit", "code": "print(0)"}),  # no cpu_ms, no declared verdict (passes)
        {
            "role": "user",
            "turn": 0,
            "content": "FIX\n\n(simulated) the declared verdict of this submission is a failure",
        },
        _reply(1, {"type": "submit", "code": "print(1)"}),
    ]
    assert (repaired["status"], repaired["correct"]) == ("completed", True)
    failed = transcripts["tool-fails"]
    assert failed["status"] == "failed" and "tool 'echo' failed" in failed["error"]
    assert failed["messages"][-1] == _reply(0, {"type": "tool", "name": "echo", "arguments": {"n": 3}})
    model = transcripts["model-fails"]
    assert model["status"] == "failed" and model["error"].startswith("model script_exhausted")
    assert model["messages"][-1] == {"role": "tool", "turn": 0, "name": "sleep_ms", "content": "7"}
    text = (out / "transcripts.jsonl").read_text()
    assert SECRET not in text and SHOWN not in text  # a simulated verdict's feedback shows no case
    assert "reference_tests" not in text and "prompt_metadata" not in text
    receipt = json.loads((out / "run.json").read_text())
    assert receipt["config"]["transcripts"] is True


def test_no_transcripts_without_the_flag(virtual_run: VirtualRun) -> None:
    outcome, _, out = virtual_run([ADD_PROBLEM])
    assert outcome.status == "complete" and (out / "results.jsonl").exists()
    assert not (out / "transcripts.jsonl").exists()
    assert json.loads((out / "run.json").read_text())["config"]["transcripts"] is False


def test_simulated_replies_are_no_model_s_text() -> None:
    """A scripted action is no model's output: the script's simulation-only fields (its timing and its
    declared verdict) are not what a model writes, and ``passes`` was shown as if it were."""
    action = SubmitAction(
        type="submit", code="print(1)", latency_ms=5, cpu_ms=3, output_tokens=9, passes=False
    )
    assert model_view(action) == {"type": "submit", "code": "print(1)"}


class _FeedbackWorker(VirtualWorker):
    """Evaluates as the real evaluator reports a failure: the first hidden test as the failing case."""

    async def call(
        self,
        request: JobRequest,
        timeout: float,  # noqa: ASYNC109 - as a worker
        *,
        large: bool = False,
    ) -> CallResult:
        result = await super().call(request, timeout)
        if request.tool != "lcb_evaluate" or result.reply.value["passed"]:
            return result
        first = request.arguments["tests"][0]
        feedback = {
            "test": 0,
            "verdict": "wrong_answer",
            "input": first["input"],
            "expected": "1",
            "got": "0",
        }
        verdict = {**result.reply.value, "feedback": feedback}
        return replace(result, reply=replace(result.reply, value=verdict))


def _feedback_run(tmp_path: Path, passes: list[bool], **settings: Any) -> dict[str, Any]:
    """A virtual run of one code problem whose programs pass as ``passes`` says, on workers that give a
    failing program's feedback; its transcript row."""
    workload = write_workload(tmp_path / "w.jsonl", [_code_problem("p", passes)])
    cfg = build_config({"workload": workload, "output": tmp_path / "run", "transcripts": True, **settings})
    clock = VirtualClock()
    run = Run(
        prepare(cfg, ["test"]),
        clock,
        worker_factory=lambda index, generation: _FeedbackWorker(index, generation, clock),
    )
    outcome = clock.run(run.execute())
    assert outcome.status == "complete", outcome.error
    row: dict[str, Any] = _lines(tmp_path / "run" / "transcripts.jsonl")["p"]
    return row


def test_hidden_tests_reach_a_transcript_only_as_the_repair_message_showed_them(tmp_path: Path) -> None:
    """The repair message is recorded exactly as sent — the first failing case is what the protocol shows
    the model — but no other hidden test, the evaluator's arguments or its verdict."""
    row = _feedback_run(tmp_path, [False, False])
    assert row["messages"][2] == {
        "role": "user",
        "turn": 0,
        "content": f"FIX\n\nFailed test #0: wrong_answer\ninput:\n{SHOWN}\nexpected:\n1\ngot:\n0",
    }
    text = (tmp_path / "run" / "transcripts.jsonl").read_text()
    assert SECRET not in text and "tests_total" not in text and "testtype" not in text
    for name in ("results.jsonl", "summary.json", "events.jsonl"):  # nor, still, anywhere else
        assert SHOWN not in (tmp_path / "run" / name).read_text(), name


def test_a_repair_message_no_turn_sends_is_not_written(tmp_path: Path) -> None:
    """A failing program on the last turn --max-turns allows gets no repair turn: its repair message is
    never sent, so the first failing case (a hidden test) was never shown and is not written."""
    row = _feedback_run(tmp_path, [False, True], max_turns=1)
    assert row["status"] == "max_turns"
    assert row["messages"][-1] == _reply(0, {"type": "submit", "code": "print(0)"})
    assert SHOWN not in (tmp_path / "run" / "transcripts.jsonl").read_text()


@pytest.mark.timeout(60)
def test_the_http_backend_records_the_server_s_text_and_finish_reason(tmp_path: Path) -> None:
    """The raw completion text exactly as received (spacing and all), the server's token counts and
    finish reason; a reply that is no valid action is kept too (action null), with its own."""
    tool_text = '{"type": "tool",  "name": "add", "arguments": {"a": 2, "b": 3}}\n'
    final_text = '{"type":"final","answer":"5"}'
    cut = '{"type": "final", "answer": "5'  # max_tokens cut it short
    length = completion(cut) | {"choices": [{"message": {"content": cut}, "finish_reason": "length"}]}
    problem = {"id": "t", "prompt": "What is 2 + 3?", "tools": [ADD], "reference_answer": "5"}
    with FakeOpenAI([completion(tool_text), completion(final_text), length]) as server:
        outcome, _, out = http_run(
            tmp_path,
            [problem, {"id": "cut", "prompt": "Answer."}],
            server.url,
            transcripts=True,
            max_active_trajectories=1,  # one request at a time: the bodies are served in order
        )
    assert outcome.status == "complete", outcome.error
    rows = _lines(out / "transcripts.jsonl")
    tokens = {"prompt_tokens": 5, "completion_tokens": 3}
    assert rows["t"]["messages"] == [
        {"role": "user", "content": "What is 2 + 3?"},
        _reply(
            0,
            {"type": "tool", "name": "add", "arguments": {"a": 2, "b": 3}},
            text=tool_text,
            finish_reason="stop",
            **tokens,
        ),
        {"role": "tool", "turn": 0, "name": "add", "content": "5"},
        _reply(1, {"type": "final", "answer": "5"}, text=final_text, finish_reason="stop", **tokens),
    ]
    assert (rows["t"]["status"], rows["t"]["answer"], rows["t"]["correct"]) == ("completed", "5", True)
    invalid = rows["cut"]
    assert invalid["status"] == "failed" and invalid["error"].startswith("model invalid_action")
    assert invalid["messages"][-1] == _reply(0, None, text=cut, finish_reason="length", **tokens)


@pytest.mark.timeout(60)
def test_a_reply_with_no_content_is_kept_with_its_finish_reason_and_tokens(tmp_path: Path) -> None:
    """A reasoning model cut short by max_tokens sends a completion with reasoning and ``content: null``:
    the turn happened (the server spent 4096 tokens on it, finish_reason length), so the transcript keeps
    it as a reply that was no valid action; it used to end with the prompt, that turn gone."""
    message = {"role": "assistant", "content": None, "reasoning_content": "Let me think"}
    body = completion(None, usage={"prompt_tokens": 5, "completion_tokens": 4096})
    body["choices"] = [{"index": 0, "message": message, "finish_reason": "length"}]
    with FakeOpenAI([body]) as server:
        outcome, _, out = http_run(tmp_path, [{"id": "r", "prompt": "Answer."}], server.url, transcripts=True)
    assert outcome.status == "complete", outcome.error
    row = _lines(out / "transcripts.jsonl")["r"]
    assert row["status"] == "failed" and row["error"].startswith("model invalid_action")
    assert row["messages"] == [
        {"role": "user", "content": "Answer."},
        _reply(0, None, finish_reason="length", prompt_tokens=5, completion_tokens=4096),
    ]


def test_simulate_takes_the_flag_and_a_sweep_refuses_it(tmp_path: Path) -> None:
    workload = write_workload(tmp_path / "w.jsonl", [ADD_PROBLEM])
    result = invoke(
        "simulate",
        "--workload",
        workload,
        "--output",
        tmp_path / "sim",
        "--server",
        "batching",
        "--transcripts",
    )
    assert result.exit_code == 0, result.output
    messages = _lines(tmp_path / "sim" / "transcripts.jsonl")["add"]["messages"]
    replies = [m for m in messages if m["role"] == "assistant"]
    assert [m["text"] for m in replies] == [None, None]  # no server wrote them
    assert all(m["prompt_tokens"] and m["completion_tokens"] for m in replies)  # the server model's
    refused = invoke(
        "simulate", "--workload", workload, "--output", tmp_path / "sweep", "--sweep", "--transcripts"
    )
    assert refused.exit_code == 2 and "--transcripts does not apply with --sweep" in refused.output
    assert not (tmp_path / "sweep").exists()


@pytest.mark.timeout(60)
def test_an_interrupted_run_keeps_the_whole_lines_of_the_trajectories_that_ended(tmp_path: Path) -> None:
    problems = [tool_problem("short", model_ms=10, cpu_ms=5), tool_problem("long", model_ms=10_000, cpu_ms=5)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    out = tmp_path / "run"
    cfg = build_config({"workload": workload, "output": out, "transcripts": True})
    clock = VirtualClock()
    sent: list[bool] = []

    def subscriber(event: Event) -> None:
        if isinstance(event, TrajectoryFinished) and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)

    run = Run(
        prepare(cfg, ["test"]),
        clock,
        worker_factory=lambda index, generation: VirtualWorker(index, generation, clock),
        subscribers=(subscriber,),
    )
    outcome = clock.run(interruptible(run))
    assert sent and outcome.status == "interrupted"
    rows = _lines(out / "transcripts.jsonl")
    assert list(rows) == list(_lines(out / "results.jsonl")) == ["short"]
    assert [m["role"] for m in rows["short"]["messages"]] == ["user", "assistant", "tool", "assistant"]


@pytest.mark.timeout(120)
def test_asyncroll_run_transcripts_with_real_workers_show_the_cut_tool_result(tmp_path: Path) -> None:
    """The command end to end (real worker processes): a tool result is recorded exactly as the model
    was shown it, cut to --max-observation-chars with its note."""
    from asyncroll.runtime.trajectory import cut_observation
    from tests.cli_runs import cli

    (tmp_path / "echo.py").write_text("def echo(n):\n    return 'x' * n\n")
    tool = {"name": "echo", "inputs": {"n": "int"}, "implementation": "echo.py"}
    script = [{"type": "tool", "name": "echo", "arguments": {"n": 500}}, {"type": "final", "answer": "ok"}]
    workload = write_workload(
        tmp_path / "w.jsonl", [{"id": "e", "prompt": "p", "tools": [tool], "script": script}]
    )
    out = tmp_path / "run"
    result = cli(
        "run", "--workload", workload, "--output", out, "--max-observation-chars", "100", "--transcripts"
    )
    assert result.returncode == 0, result.stderr
    observation = json.dumps("x" * 500)
    shown = _lines(out / "transcripts.jsonl")["e"]["messages"][2]
    assert shown == {
        "role": "tool",
        "turn": 0,
        "name": "echo",
        "content": cut_observation(observation[:100], len(observation)),
    }
    assert json.loads((out / "run.json").read_text())["config"]["transcripts"] is True
