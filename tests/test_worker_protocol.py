"""The worker's pipe protocol without a process: messages round-trip through their frames, decoding refuses
globals and garbage, and the child module a worker runs imports nothing heavy."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from asyncroll.workers import JobReply, JobRequest, ProtocolError, Ready, StartupFailed
from asyncroll.workers.protocol import Message, decode, encode, frame, frame_in_slices


def test_messages_round_trip_through_frames() -> None:
    messages: list[Message] = [
        JobRequest(7, "add", {"a": 1, "b": 2.5}),
        JobReply(7, True, {"x": [1, 2], 3: None}, None, 1.0, 2.0, 1.0, 0.5, 1e-5),
        Ready(123, ["add", "/x.py::f"], 0.25),
        StartupFailed("boom"),
    ]
    for message in messages:
        data = encode(message)
        assert int.from_bytes(data[:4], "big") == len(data) - 4
        assert decode(data[4:]) == message


def test_decode_refuses_globals_and_garbage() -> None:
    with pytest.raises(ProtocolError, match="global"):
        decode(pickle.dumps(("reply", Path("/etc"))))
    with pytest.raises(ProtocolError):
        decode(b"not a pickle")
    with pytest.raises(ProtocolError, match="fields"):
        decode(frame(pickle.dumps(("failed", "a", "b")))[4:])


def test_child_module_imports_stay_light() -> None:
    code = (
        "import sys, asyncroll.workers.child; "
        "print(sorted(m for m in ('asyncio', 'psutil', 'pydantic', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30)
    assert out.stdout.strip() == "[]"


def test_a_request_framed_in_slices_decodes_as_encoded_whole() -> None:
    tests = [{"input": str(i), "output": "x" * (i % 7)} for i in range(5000)]
    for arguments in ({"code": "c", "tests": tests, "none": [], "n": 3}, {"few": [1]}, {}):
        request = JobRequest(9, "lcb_evaluate", arguments, 0.5, {"passed": 1}, None, True)
        parts: list[bytes] = []
        pauses = sum(1 for _ in frame_in_slices(request, parts))
        data = b"".join(parts)
        assert pauses >= sum(len(v) > 0 for v in arguments.values() if isinstance(v, list))  # a pause a slice
        assert int.from_bytes(data[:4], "big") == len(data) - 4
        assert decode(data[4:]) == decode(encode(request)[4:]) == request
    parts = []
    for _ in frame_in_slices(JobRequest(1, "t", {"a": list(range(10))}), parts):
        pass
    parts[-1] = pickle.dumps({"not": "a list"})
    with pytest.raises(ProtocolError, match="not a list"):
        decode(b"".join(parts[1:]))


@pytest.mark.parametrize(
    "slices", [((),), (("a", "2"),), (("a", -1),), (("a", 1, 2),), ("a",), ((["a"], 0),), ((b"a", 0),)]
)
def test_a_sliced_request_with_a_malformed_slice_list_is_a_protocol_error(slices: tuple[object, ...]) -> None:
    """A ``job*`` frame's slice list is read from the pipe: a malformed one is the protocol's error (the
    worker reports it as such), not a ValueError or TypeError from unpacking it."""
    head = pickle.dumps(("job*", 1, "t", {"a": None}, None, None, None, False, None, None, slices))
    job = ("job*", 1, "t", {"a": None}, None, None, None, False, None, None, ())
    assert decode(pickle.dumps(job)) is not None
    with pytest.raises(ProtocolError, match="names its slices"):
        decode(head)
