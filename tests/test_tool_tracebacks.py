"""A failed tool call's traceback goes to the worker log: its error text (``ExcType: message``, what the
trajectory and the model get) says neither the file nor the line, and nothing else did."""

from __future__ import annotations

import io
import os
import select
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from asyncroll.workers import JobReply, JobRequest, ToolSpec, child
from asyncroll.workers.protocol import decode, encode
from tests.worker_processes import job, real_process, run, started

TOOL = """import os, sys


def helper(table):
    return table["missing"]


def lookup(x):
    print("looking up", x)
    return helper({})


def hide_stderr(path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    os.dup2(fd, 2)
    raise ValueError("with fd 2 elsewhere")


class Broken(dict):
    def items(self):
        raise RuntimeError("no items")


def unencodable():
    return Broken()


def fine():
    return 1
"""


@real_process
def test_a_failed_call_leaves_its_traceback_in_the_worker_log(tmp_path: Path) -> None:
    tool = tmp_path / "lookups.py"
    tool.write_text(TOOL)
    log = tmp_path / "worker-0.log"
    elsewhere = tmp_path / "elsewhere.txt"

    async def main() -> None:
        names = ("lookup", "hide_stderr", "unencodable", "fine")
        worker = await started(*(ToolSpec(name, tool) for name in names), log_path=log)
        failed = (await worker.call(job(1, f"{tool}::lookup", x=7), 5)).reply
        assert (failed.ok, failed.error) == (False, "KeyError: 'missing'")  # the error text is unchanged
        hidden = (await worker.call(job(2, f"{tool}::hide_stderr", path=str(elsewhere)), 5)).reply
        assert hidden.error == "ValueError: with fd 2 elsewhere"
        broken = (await worker.call(job(3, f"{tool}::unencodable"), 5)).reply
        assert broken.error == "its result could not be encoded: RuntimeError: no items"
        assert (await worker.call(job(4, f"{tool}::fine"), 5)).reply.value == 1
        await worker.aclose()

    run(main())
    text = log.read_text()
    first = text.index(
        f"asyncroll worker: job 1 ({tool}::lookup) failed:\nTraceback (most recent call last):"
    )
    assert text.index("looking up 7") < first  # the tool's own print first
    assert f'File "{tool}", line 10, in lookup' in text and f'File "{tool}", line 5, in helper' in text
    assert "KeyError: 'missing'" in text and "in run_job" not in text  # from the tool's frame down
    assert f"job 2 ({tool}::hide_stderr) failed:" in text  # in the log, not where the tool left fd 2
    assert "Traceback" not in elsewhere.read_text()
    assert f"job 3 ({tool}::unencodable) returned a result that could not be encoded:" in text
    assert "RuntimeError: no items" in text and "job 4" not in text


def _serve(
    tools: dict[str, Callable[..., Any]],
    names: list[str],
    monkeypatch: pytest.MonkeyPatch,
    pipe: tuple[int, int],
) -> list[JobReply]:
    """Jobs through the worker's own ``serve`` loop, in this process, replying on ``pipe``: its replies."""

    class Kept:  # fds 0-2 as they are: the test process's own (pytest captures them)
        def restore(self) -> None:
            pass

    monkeypatch.setattr(child, "Baseline", Kept)
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # whatever a tool puts there is undone after the test
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    stream = io.BytesIO(b"".join(encode(JobRequest(i, name, {})) for i, name in enumerate(names)))
    reply_r, reply_w = pipe
    with os.fdopen(reply_r, "rb") as replies, os.fdopen(reply_w, "wb") as out:
        assert child.serve(stream, out.fileno(), tools) == 0
        out.close()
        frames = replies.read()
    out_replies: list[JobReply] = []
    while frames:
        size = int.from_bytes(frames[:4], "big")
        reply = decode(frames[4 : 4 + size])
        assert isinstance(reply, JobReply)
        out_replies.append(reply)
        frames = frames[4 + size :]
    return out_replies


def test_a_tool_that_replaced_stderr_and_failed_leaves_the_worker_serving(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Before a failure's traceback is logged, the worker flushes ``sys.stdout`` and ``sys.stderr``: a
    tool's stand-in whose flush raised ``SystemExit`` ended the worker after the reply, and the next call
    (another trajectory's, perhaps) failed as one that lost its worker."""

    class Quitting:
        def write(self, text: str) -> int:
            return len(text)

        def flush(self) -> None:
            raise SystemExit(3)

    def replace() -> None:
        sys.stderr = Quitting()
        raise ValueError("stderr replaced")

    tools: dict[str, Callable[..., Any]] = {"replace": replace, "fine": lambda: 1}
    replies = _serve(tools, ["replace", "fine"], monkeypatch, os.pipe())
    assert [(r.ok, r.error) for r in replies] == [(False, "ValueError: stderr replaced"), (True, None)]
    assert "job 0 (replace) failed:\nTraceback" in capfd.readouterr().err


def test_a_failed_calls_traceback_is_formatted_before_its_reply_goes(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Formatting runs the chained exceptions' ``__str__`` (tool code) and walks the whole chain: done
    after the reply, a ``__str__`` that hung (or a chain of thousands) held the worker outside any job's
    timeout, and the next job sent to it waited and timed out in its place."""
    reply_sent: list[bool] = []
    reply_r, reply_w = os.pipe()

    class Context(Exception):
        def __str__(self) -> str:  # only the traceback reads it: the error text names the last exception
            reply_sent.append(bool(select.select([reply_r], [], [], 0)[0]))
            return "the context"

    def chained() -> None:
        try:
            raise Context()
        except Context:
            raise ValueError("the last")  # noqa: B904 - its context is the point

    (reply,) = _serve({"chained": chained}, ["chained"], monkeypatch, (reply_r, reply_w))
    assert (reply.ok, reply.error) == (False, "ValueError: the last")
    assert reply_sent == [False]
    assert "the context" in capfd.readouterr().err
