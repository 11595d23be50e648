"""Before the clock starts: the warm-up requests (retried like turns, a wrong model failing the run) and
the probes that tell the server's kind from its model list and its engine's version."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import asyncroll
from asyncroll.backends.openai import HttpSettings, OpenAIBackend
from asyncroll.clock import SystemClock
from asyncroll.errors import ModelError
from asyncroll.events import ModelRetrying, TrajectoryStarted
from asyncroll.serve_sim.config import FaultConfig
from tests.hostile_http import HostileServer, json_reply, raw_reply, trickle_json
from tests.http_backend import FINAL, completion, final_problems, http_run, serve, start_and_close


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
    # the engine's version, as SGLang answers GET /version (serve-sim says what it is)
    assert receipt["backend"]["server_version"] == f"asyncroll serve-sim {asyncroll.__version__}"
    assert receipt["backend"]["server_version_source"] == "GET /version"


def _version_of(kind: str, handler: Any) -> tuple[str | None, str]:
    import httpx

    from asyncroll.backends.probes import probe_version

    async def probe() -> tuple[str | None, str]:
        async with httpx.AsyncClient(base_url="http://server", transport=httpx.MockTransport(handler)) as c:
            return await probe_version(c, kind, 30.0)  # type: ignore[arg-type]

    return asyncio.run(probe())


def test_the_engines_version_is_best_effort_and_says_why_it_is_missing() -> None:
    """vLLM and SGLang answer ``GET /version`` with ``{"version": ...}``: recorded (cut to 100 characters);
    any other answer, or none, leaves it null with the reason, and never fails the run; a server of
    another kind is not asked."""
    import httpx

    def answers(response: httpx.Response) -> Any:
        return lambda request: response if request.url.path == "/version" else httpx.Response(500)

    assert _version_of("vllm", answers(httpx.Response(200, json={"version": " 0.11.2 "}))) == (
        "0.11.2",
        "GET /version",
    )
    assert _version_of("sglang", answers(httpx.Response(200, json={"version": "v" * 500})))[0] == "v" * 100
    for reply, why in (
        (httpx.Response(404), "GET /version: HTTP 404"),
        (httpx.Response(200, text="<html/>"), "GET /version: HTTP 200 without a version string"),
        (httpx.Response(200, json={"version": 11}), "GET /version: HTTP 200 without a version string"),
        (httpx.Response(200, json=["0.1"]), "GET /version: HTTP 200 without a version string"),
    ):
        assert _version_of("vllm", answers(reply)) == (None, why)

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    version, why = _version_of("vllm", refused)
    assert version is None and why.startswith("GET /version: ConnectError") and "refused" in why
    for kind in ("generic", "transformers"):
        assert _version_of(kind, refused) == (None, f"not asked: a {kind} server has no GET /version")


def test_an_engine_version_that_is_no_printable_text_is_not_recorded() -> None:
    """A server's ``/version`` answer holding a lone UTF-16 surrogate (``"\\ud800"``) was recorded as it
    was, and run.json written with it is no standard JSON (docs/OUTPUTS.md: every output is, save a path's
    undecodable bytes); a control character or line break in it would be printed as it is. Such an answer
    is no version string: null, and why."""
    import httpx

    for raw in (b'{"version": "0.11\\ud800"}', b'{"version": "0.11\\n\\u001b[2J"}'):
        reply = httpx.Response(200, content=raw, headers={"content-type": "application/json"})
        answer = _version_of("vllm", lambda request, reply=reply: reply)
        assert answer == (None, "GET /version: HTTP 200 without a version string"), (raw, answer)
    unicode = httpx.Response(200, json={"version": "0.11.2+cu128 é"})
    assert _version_of("vllm", lambda request: unicode)[0] == "0.11.2+cu128 é"


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
        backend = await start_and_close(handler)
        return backend.server_kind, backend.describe()["server_kind_source"]

    kind, source = asyncio.run(probe(lambda request: httpx.Response(404, text="Not Found")))
    assert kind == "generic" and "HTTP 404 without a model list" in source
    listed = {"data": [{"id": "m", "owned_by": "huggingface"}]}
    kind, source = asyncio.run(probe(lambda request: httpx.Response(200, json=listed)))
    assert kind == "generic" and "huggingface" in source
    status = {"status": {"value": "unloaded"}}  # transformers serve 5.x: a local model is owned_by "local"
    served = {"data": [{"id": "m", "owned_by": "local", **status}, {"id": "n", "owned_by": "", **status}]}
    kind, source = asyncio.run(probe(lambda request: httpx.Response(200, json=served)))
    assert kind == "transformers" and "status.value loaded|unloaded" in source
    partly = {"data": [{"id": "m", "owned_by": "local", **status}, {"id": "n", "status": "ready"}]}
    kind, source = asyncio.run(probe(lambda request: httpx.Response(200, json=partly)))
    assert kind == "generic" and "names no engine" in source
    # owned_by is the server's: the receipt (run.json's backend.server_kind_source) held a 3 MB one
    # whole, and every one of a 50,000-model list
    huge = {"data": [{"id": "m", "owned_by": "o" * 1_000_000}]}
    kind, source = asyncio.run(probe(lambda request: httpx.Response(200, json=huge)))
    assert kind == "generic" and f"owned_by=[{'o' * 100!r}] names no engine" in source
    many = {"data": [{"id": f"m{i}", "owned_by": f"org{i:05}"} for i in range(5000)]}
    kind, source = asyncio.run(probe(lambda request: httpx.Response(200, json=many)))
    assert kind == "generic" and "'org00009'] and 4,990 more names no engine" in source
    assert len(source) < 400
    deep = b'{"data": ' + b"[" * 100_000  # json raises RecursionError here, not a ValueError
    kind, source = asyncio.run(probe(lambda request: httpx.Response(200, content=deep)))
    assert kind == "generic" and "HTTP 200 without a model list" in source

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(ExceptionGroup) as raised:  # raised inside the run's task group
        asyncio.run(probe(refuse))
    assert raised.group_contains(ModelError, match="or declare its kind with --server-kind")


@pytest.mark.timeout(30)
def test_the_kind_probe_is_retried_as_the_warmup_is() -> None:
    """A server still starting (503 on ``/v1/models``, or no answer yet) failed the run at the probe
    whatever ``--max-retries`` said, though the warm-up after it retries: the probe is retried the same
    way, counted with the warm-up's retries; a refused key is not retried."""
    import httpx

    from asyncroll.backends.retry import RetryPolicy

    def starting(answers: list[httpx.Response | None]) -> Any:
        def handler(request: httpx.Request) -> httpx.Response:
            answer = answers.pop(0) if len(answers) > 1 else answers[0]
            if answer is None:
                raise httpx.ConnectError("connection refused", request=request)
            return answer

        return handler

    vllm = httpx.Response(200, json={"data": [{"id": "m", "owned_by": "vllm"}]})
    loading = httpx.Response(503, text="loading")
    fast = RetryPolicy(2, base_delay=0.001, max_delay=0.001)
    backend = asyncio.run(start_and_close(starting([None, loading, vllm]), retry=fast))
    assert backend.server_kind == "vllm" and backend.warmup_retries == 2
    with pytest.raises(ExceptionGroup) as raised:
        asyncio.run(start_and_close(starting([loading]), retry=fast))
    assert raised.group_contains(ModelError, match=r"HTTP 503 .*\(after 3 attempts\)$")
    with pytest.raises(ExceptionGroup) as raised:  # without --max-retries: the first answer decides
        asyncio.run(start_and_close(starting([loading, vllm])))
    assert raised.group_contains(ModelError, match="HTTP 503")
    refused = httpx.Response(401, text="no key")
    with pytest.raises(ExceptionGroup) as raised:
        asyncio.run(start_and_close(starting([refused, vllm]), retry=fast))
    assert raised.group_contains(ModelError, match=r"HTTP 401 \('no key'\); ")


def test_the_kind_probe_honours_the_servers_retry_after() -> None:
    """The probe's retries waited their backoff whatever a 503 said: a server loading its weights that
    asked for 'retry-after: 30' was asked again at once, as the warm-up's requests and the turns never
    are (docs/SERVERS.md: retried the same way, honouring retry-after)."""
    import httpx

    from asyncroll.backends.openai import HttpSettings, OpenAIBackend
    from asyncroll.backends.retry import RetryPolicy
    from asyncroll.clock import SystemClock

    waits: list[float] = []

    class Waits(SystemClock):
        async def sleep(self, seconds: float) -> None:
            waits.append(seconds)

    answers = [
        httpx.Response(503, headers={"retry-after": "30"}, text="loading"),
        httpx.Response(200, json={"data": [{"id": "m", "owned_by": "vllm"}]}),
    ]
    settings = HttpSettings(
        endpoint="http://server", model="m", inflight=1, retry=RetryPolicy(1, base_delay=0.001, max_delay=60)
    )

    def answer(request: httpx.Request) -> httpx.Response:  # no GET /version (the start's one probe of it)
        return httpx.Response(404) if request.url.path == "/version" else answers.pop(0)

    backend = OpenAIBackend(settings, Waits(), transport=httpx.MockTransport(answer))

    async def start() -> None:
        async with asyncio.TaskGroup() as tg:
            try:
                await backend.start(tg)
            finally:
                await backend.aclose()

    asyncio.run(start())
    assert backend.server_kind == "vllm" and waits == [30.0]


@pytest.mark.timeout(60)
def test_a_trickling_probe_answer_ends_at_its_deadline() -> None:
    """``/v1/models`` (the server-kind probe) and ``/health`` (the down-server probe) had only httpx's
    per-phase timeout, which every trickled byte resets: the run hung before its start, and a down
    server's probe outlived ``--server-down-timeout``."""
    from asyncroll.http_read import request_deadline_s

    settings = HttpSettings(endpoint="", model="m", inflight=1, request_timeout=0.5)
    deadline = request_deadline_s(0.5)
    for path in ("/v1/models", "/health"):
        with HostileServer([json_reply(completion(FINAL))], gets={path: trickle_json}) as server:
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
    unreadable = raw_reply(200, {"content-encoding": "gzip"}, b"not gzip at all")
    with HostileServer([json_reply(completion(FINAL))], gets={"/v1/models": unreadable}) as server:
        backend = OpenAIBackend(HttpSettings(endpoint=server.url, model="m", inflight=1), SystemClock())

        async def probe() -> tuple[str, str]:
            try:
                return await backend._probe_kind(backend._http())
            finally:
                await backend.aclose()

        kind, source = asyncio.run(probe())
    assert kind == "generic" and source.startswith("probed: /v1/models answered unreadably (DecodingError")


@pytest.mark.timeout(60)
def test_a_run_directory_removed_while_the_warmup_fails_still_reports_the_warmups_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run.json names the server also when its start fails, from a ``finally``: with the directory gone
    (removed while the run started, or no room left) that write's own error replaced the warm-up's, so
    the run said "run.json: cannot write" and never why the server was refused."""
    import shutil

    real_warmup = OpenAIBackend.warmup

    async def warmup_after_the_directory_is_removed(self: OpenAIBackend, requests: int) -> int:
        shutil.rmtree(tmp_path / "run0")
        return await real_warmup(self, requests)

    monkeypatch.setattr(OpenAIBackend, "warmup", warmup_after_the_directory_is_removed)
    with serve() as running:
        outcome, capture, out = http_run(
            tmp_path, final_problems(2), running.url, model="gpt-9", warmup_requests=1
        )
    assert outcome.status == "failed" and not capture.of(TrajectoryStarted) and not out.exists()
    assert outcome.error is not None and outcome.error.startswith("warm-up request 1/1 failed: HTTP 404")
    assert "was moved or removed while the run ran" in outcome.error  # said after it
