"""Replies that are not a valid action (odd 200 bodies, hostile answers, invalid actions): each fails only
its own request, says why, and counts in the validity rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from asyncroll.backends.action_schema import parse_action
from asyncroll.backends.completion import NotACompletion, message_text, read_completion
from asyncroll.errors import InvalidActionError
from asyncroll.events import ModelFailed, ModelFinished, TrajectoryFinished
from asyncroll.outputs.summary import SummaryBuilder
from tests.hostile_http import HostileServer, json_reply, raw_reply
from tests.http_backend import ADD, FINAL, FINAL_SCHEMA, FakeOpenAI, completion, final_problems, http_run

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
    with pytest.raises(InvalidActionError, match="not JSON"):  # ValueError past the integer digit limit
        parse_action("1" * 5000, FINAL_SCHEMA, structured=True, code=False)
    # valid JSON nested too deep (RecursionError on 3.11, read on 3.13): refused, and not called "not JSON"
    for depth in (501, 2_000, 100_000):
        deep = "[" * depth + "]" * depth
        with pytest.raises(InvalidActionError, match=r"^the response is refused \(JSON nested deeper than"):
            parse_action(deep, FINAL_SCHEMA, structured=True, code=False)


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
        raw_reply(503, {"content-type": "text/plain; charset=rot13"}, b"busy"),
        raw_reply(200, {"content-type": "application/json", "content-encoding": "gzip"}, bomb),
        raw_reply(307, {"location": "http://elsewhere.invalid/v1/chat/completions"}, b""),
        json_reply(completion(nan_call)),
        json_reply(completion(FINAL, usage={"prompt_tokens": -5, "completion_tokens": 3})),
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
