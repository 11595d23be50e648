"""Reading a 2xx chat-completion body on its own: what is taken (content, token usage, finish reason, why
no action came) and what is refused, each refusal naming what is wrong."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from asyncroll.backends.completion import Completion, NotACompletion, message_text, read_completion


def body(message: dict[str, Any], usage: Any = None, **choice: Any) -> bytes:
    data: dict[str, Any] = {"choices": [{"index": 0, "message": message, **choice}]}
    if usage is not None:
        data["usage"] = usage
    return orjson.dumps(data)


def reply(content: Any = "x", **message: Any) -> Completion:
    return read_completion(body({"role": "assistant", "content": content, **message}))


def tokens(usage: Any) -> tuple[int | None, int | None]:
    got = read_completion(body({"content": "x"}, usage))
    return got.prompt_tokens, got.completion_tokens


def test_usage_counts_are_taken_as_given_and_zero_is_a_count() -> None:
    assert tokens({"prompt_tokens": 17, "completion_tokens": 0}) == (17, 0)
    assert tokens({"prompt_tokens": 0, "completion_tokens": 1}) == (0, 1)


@pytest.mark.parametrize("value", [True, False, -1, 2.0, "3", None, [1]])
def test_a_count_that_is_no_non_negative_integer_is_missing(value: Any) -> None:
    assert tokens({"prompt_tokens": value, "completion_tokens": value}) == (None, None)


def test_the_first_choice_is_read_whole() -> None:
    data = {
        "choices": [
            {"message": {"content": "first"}, "finish_reason": "length"},
            {"message": {"content": "second"}, "finish_reason": "stop"},
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4},
    }
    assert read_completion(orjson.dumps(data)) == Completion("first", "length", 3, 4)


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b"{", "not JSON: "),
        (b"7", "a JSON number, not an object"),
        (b"{}", "no choices list"),
        (b'{"choices": "a"}', "choices is a JSON string"),
        (b'{"choices": []}', "choices is empty"),
        (b'{"choices": [true]}', "choices[0] is a JSON boolean, not an object"),
        (b'{"choices": [{}]}', "choices[0].message is missing, not an object"),
        (b'{"choices": [{"message": [1]}]}', "choices[0].message is a JSON array, not an object"),
        (b'{"choices": [{"message": {"content": {}}}]}', "content is a JSON object, not a string"),
    ],
)
def test_each_body_that_is_no_completion_says_what_is_wrong(payload: bytes, why: str) -> None:
    with pytest.raises(NotACompletion) as caught:
        read_completion(payload)
    assert why in str(caught.value)


def test_text_parts_are_joined_and_any_other_part_is_named() -> None:
    assert message_text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]) == "ab"
    with pytest.raises(NotACompletion, match=r"content\[1\] is not a text part \(type 'image_url'\)"):
        message_text([{"type": "text", "text": "a"}, {"type": "image_url", "text": "b"}])
    with pytest.raises(NotACompletion, match=r"content\[0\] is not a text part \(type 'text'\)"):
        message_text([{"type": "text", "text": 5}])
    with pytest.raises(NotACompletion, match=r"content\[0\] is not a text part \(type a JSON string\)"):
        message_text(["a"])
    # the server writes the part's type: a 5 MB one was quoted whole into the error that events,
    # results, trace.json and timeline.html keep
    for kind, shown in (("x" * 150, repr("x" * 100)), (["y" * 60] * 3, repr(["y" * 60] * 3)[:100])):
        with pytest.raises(NotACompletion) as caught:
            message_text([{"type": kind}])
        assert str(caught.value) == f"choices[0].message.content[0] is not a text part (type {shown})"


def test_the_finish_reason_is_recorded_as_text_cut_to_100_characters() -> None:
    assert read_completion(body({"content": "x"}, finish_reason="stop")).finish_reason_text == "stop"
    long = read_completion(body({"content": "x"}, finish_reason="r" * 150))
    assert long.finish_reason_text == "r" * 100
    assert read_completion(body({"content": "x"}, finish_reason=3)).finish_reason_text is None


def test_a_refusal_tool_calls_and_reasoning_are_read_only_when_there() -> None:
    assert reply(refusal="no").refusal == "no"
    assert reply(refusal="").refusal is None and reply(refusal=3).refusal is None
    assert reply(tool_calls=[{"id": "c"}]).tool_calls and not reply(tool_calls=[]).tool_calls
    assert reply(None, reasoning_content="think").reasoning_only
    assert reply(" \n", reasoning="think").reasoning_only  # whitespace is no answer
    assert not reply("answer", reasoning_content="think").reasoning_only
    assert (
        not reply(None, reasoning_content="").reasoning_only and not reply(None, reasoning=5).reasoning_only
    )
    assert not reply(None).reasoning_only


def test_why_no_action_came_says_the_most_telling_thing_first() -> None:
    assert Completion("x", "length", None, None, tool_calls=True).why_invalid() == (
        " (finish_reason=length: max_tokens cut it short)"
    )
    assert "native tool_calls, finish_reason='tool_calls'" in (
        Completion(None, "tool_calls", None, None, tool_calls=True, refusal="no").why_invalid()
    )
    refused = Completion(None, "stop", None, None, refusal="n" * 400, reasoning_only=True).why_invalid()
    assert refused == f" (the model refused: {'n' * 300!r})"
    assert Completion(None, "stop", None, None, reasoning_only=True).why_invalid() == (
        " (the message has reasoning but no content: no answer followed the reasoning)"
    )
    assert Completion(None, "f" * 150, None, None).why_invalid() == f" (finish_reason={'f' * 100!r})"
    assert Completion(None, 7, None, None).why_invalid() == " (finish_reason='7')"
    assert Completion("x", "stop", None, None).why_invalid() == ""
    assert Completion("x", None, None, None).why_invalid() == ""


def test_a_huge_finish_reason_beside_native_tool_calls_is_cut_as_any_other_is() -> None:
    # the server sets finish_reason: beside tool_calls it was quoted whole, so a 10 MB one (or a list of
    # megabytes) went whole into the error that events, results, trace.json and timeline.html keep
    for reason, shown in (("f" * 150, repr("f" * 100)), (["x" * 60] * 3, repr(str(["x" * 60] * 3)[:100]))):
        why = Completion(None, reason, None, None, tool_calls=True).why_invalid()
        assert f"native tool_calls, finish_reason={shown}:" in why
        assert len(why) < 400
    assert "finish_reason=None:" in Completion(None, None, None, None, tool_calls=True).why_invalid()
