"""``/metrics`` as real servers serve it, beyond one plainly named model on a plain 200. Real loopback servers
(``tests.metrics_loopback.MetricsServer``), no timing assertions."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
import ssl
import struct
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from asyncroll.events import ResourceProbe, ResourceSample
from asyncroll.telemetry.server_metrics import (
    MAX_REDIRECTS,
    NO_STATS_HINT,
    FlavorSetting,
    MetricsUnavailable,
    ServerMetricsSource,
)
from tests.conftest import tool_problem
from tests.loopback import LoopbackServer
from tests.metrics_loopback import MetricsServer, idle_vllm, real_clock_run


def _redirect(handler: BaseHTTPRequestHandler, location: str) -> None:
    handler.send_response(307)
    handler.send_header("Location", location)
    handler.send_header("Content-Length", "0")
    handler.end_headers()


@pytest.mark.timeout(30)
def test_a_metrics_url_that_redirects_is_followed() -> None:
    """A Starlette ``app.mount("/metrics", make_asgi_app())`` (prometheus_client's own FastAPI recipe)
    answers ``GET /metrics`` with ``307 Location: /metrics/``: the source was unavailable ("HTTP 307")
    for the whole run, where Prometheus follows the redirect."""

    def mounted(handler: BaseHTTPRequestHandler, n: int, closing: threading.Event) -> bool:
        if handler.path == "/metrics":
            _redirect(handler, "/metrics/")
            return True
        return False  # /metrics/: the exposition

    # every other scrape is the redirect: the pages are the 1st, 2nd and 3rd exposition
    with MetricsServer(lambda n: idle_vllm(n // 2), mounted) as server:

        async def go() -> tuple[dict[str, object], list[float | None]]:
            source = ServerMetricsSource(server.url, flavor="auto", model="sim", timeout=5.0)
            times = iter((0.0, 1.0))
            try:
                detail = await source.probe(5.0)
                reads = [await source.read(lambda: next(times)) for _ in range(2)]
            finally:
                await source.aclose()
            assert [r.error for r in reads] == [None, None]
            return detail, [r.prompt_tokens_per_s for r in reads]

        detail, rates = asyncio.run(go())
    assert detail["flavor"] == "vllm"
    assert rates == [None, 100.0]  # expositions 2 and 3, 1 s apart
    assert server.scrapes == 6  # each GET: the redirect, then the page


async def probe_detail(url: str) -> dict[str, Any]:
    """What the probe of ``url`` (vLLM's names, ``--model sim``) records for the run."""
    source = ServerMetricsSource(url, flavor="vllm", model="sim", timeout=5.0)
    try:
        return await source.probe(5.0)
    finally:
        await source.aclose()


async def probe_refusal(url: str, flavor: FlavorSetting) -> str:
    """Why the probe of ``url`` refuses the source (it must)."""
    source = ServerMetricsSource(url, flavor=flavor, model="sim", timeout=5.0)
    try:
        with pytest.raises(MetricsUnavailable) as caught:
            await source.probe(5.0)
    finally:
        await source.aclose()
    return str(caught.value)


@pytest.mark.timeout(30)
def test_a_redirect_loop_is_unavailable_with_its_reason() -> None:
    def loop(handler: BaseHTTPRequestHandler, n: int, closing: threading.Event) -> bool:
        _redirect(handler, f"/metrics/{n}")
        return True

    with MetricsServer(idle_vllm, loop) as server:
        message = asyncio.run(probe_refusal(server.url, "vllm"))
    assert message == f"GET {server.url}: more than {MAX_REDIRECTS} redirects"
    assert server.scrapes == MAX_REDIRECTS + 1


def lora_vllm(n: int) -> tuple[int, str]:
    """vLLM serving adapters of one base model: every series is labelled with the base model's served
    name, whichever adapter the requests named (vllm-project/vllm#10504)."""
    labels = 'engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"'
    return 200, (
        'vllm:lora_requests_info{max_lora="1",running_lora_adapters="sql-lora",'
        'waiting_lora_adapters=""} 1.0\n'
        f"vllm:num_requests_running{{{labels}}} 2.0\n"
        f"vllm:num_requests_waiting{{{labels}}} 0.0\n"
        f"vllm:kv_cache_usage_perc{{{labels}}} 0.25\n"
        f"vllm:generation_tokens_total{{{labels}}} {10.0 * n}\n"
    )


@pytest.mark.timeout(60)
def test_a_lora_adapter_as_model_reads_the_only_model_the_server_reports(tmp_path: Path) -> None:
    """``--model sql-lora`` (a LoRA adapter): the server's series all name the base model. The source was
    unavailable for the whole run, its reason telling to "check --model", which was right."""
    with MetricsServer(lora_vllm) as server:
        _, capture, summary = real_clock_run(
            tmp_path, [tool_problem("p1", model_ms=5, cpu_ms=50)], metrics_url=server.url, model="sql-lora"
        )
    [status] = capture.of(ResourceProbe)[0].sources
    assert status.available and status.reason is None
    assert status.detail["model_filter"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert "model_name='sql-lora'" in status.detail["model_filter_note"]
    samples = capture.of(ResourceSample)
    assert samples and all((s.server_running, s.kv_cache_usage) == (2.0, 0.25) for s in samples)
    source = summary["telemetry"]["sources"]["server_metrics"]
    assert source["available"] and source["model_filter_note"] == status.detail["model_filter_note"]


def test_a_model_with_invalid_series_is_not_taken_for_another_model() -> None:
    """``--model sim`` has a series, NaN at the probe: that is no reason to read the other model's."""

    def nan_sim(n: int) -> tuple[int, str]:
        return 200, (
            'vllm:num_requests_running{model_name="sim"} NaN\n'
            'vllm:num_requests_running{model_name="other"} 3\n'
            'vllm:num_requests_waiting{model_name="sim"} 0\n'
        )

    with MetricsServer(nan_sim) as server:
        detail = asyncio.run(probe_detail(server.url))
    assert detail["model_filter"] == "sim" and "model_filter_note" not in detail
    assert detail["other_models"] == ["other"]


@pytest.mark.timeout(30)
def test_the_model_names_a_server_labels_its_metrics_with_are_quoted_bounded() -> None:
    """The ``model_name`` labels of other models were copied whole into the probe's refusal and into
    ``other_models`` (summary.json, run.json): a server's megabyte label, or thousands of them, whole."""
    huge, many = "m" * 1_000_000, [f"model-{i}" for i in range(50)]

    def labelled(names: list[str]) -> Any:
        lines = "".join(f'vllm:num_requests_running{{model_name="{n}"}} 1\n' for n in names)
        return lambda n: (200, lines + 'vllm:num_requests_waiting{model_name="sim"} 0\n')

    with MetricsServer(labelled([huge, *many])) as server:
        message = asyncio.run(probe_refusal(server.url, "vllm"))
    assert len(message) < 2_000 and f"'{'m' * 100}', 'model-0'" in message and "and 41 more" in message
    with MetricsServer(labelled(["sim", huge, *many])) as server:
        detail = asyncio.run(probe_detail(server.url))
    assert detail["other_models"] == [name[:100] for name in sorted([huge, *many])[:10]]


@pytest.mark.timeout(30)
def test_the_one_other_model_read_instead_is_recorded_bounded() -> None:
    """A server whose one ``model_name`` label is not --model is read under it (a LoRA adapter's name):
    the receipt's ``model_filter`` held that label whole, a megabyte one a megabyte in run.json and
    summary.json, though ``other_models`` and the note quote it bounded."""
    huge = "m" * 1_000_000
    lines = f'vllm:num_requests_running{{model_name="{huge}"}} 1\n'
    lines += f'vllm:num_requests_waiting{{model_name="{huge}"}} 0\n'
    with MetricsServer(lambda n: (200, lines)) as server:
        detail = asyncio.run(probe_detail(server.url))
    assert "read instead" in detail["model_filter_note"]
    assert detail["model_filter"] == huge[:1_000]
    assert len(json.dumps(detail)) < 3_000


def test_a_vllm_without_log_stats_is_named_as_the_likely_cause() -> None:
    """vLLM started with ``--disable-log-stats`` (verl and other RL frameworks start it so) serves only
    the process's and HTTP's metrics at ``/metrics``: "no vllm:num_requests_running" left the user to
    guess why."""
    bare = (
        "# HELP python_gc_objects_collected_total Objects collected during gc\n"
        "# TYPE python_gc_objects_collected_total counter\n"
        'python_gc_objects_collected_total{generation="0"} 2265.0\n'
        'http_requests_total{handler="/v1/chat/completions",method="POST",status="2xx"} 12.0\n'
    )
    with MetricsServer(lambda n: (200, bare)) as server:
        declared = asyncio.run(probe_refusal(server.url, "vllm"))
        detected = asyncio.run(probe_refusal(server.url, "auto"))
    assert declared == f"GET {server.url}: no vllm:num_requests_running in the response{NO_STATS_HINT}"
    assert detected.endswith(f"metrics in the response{NO_STATS_HINT}")
    assert "--disable-log-stats" in NO_STATS_HINT


@pytest.mark.timeout(30)
def test_a_404_at_metrics_names_the_servers_that_serve_none_there() -> None:
    """transformers serve has no ``/metrics`` and SGLang serves one only with ``--enable-metrics``: the
    probe's reason says so, where a bare "HTTP 404" left the user to guess."""
    with MetricsServer(lambda n: (404, '{"detail":"Not Found"}')) as server:
        message = asyncio.run(probe_refusal(server.url, "auto"))
    assert message == (
        f"GET {server.url}: HTTP 404: the server exposes no Prometheus metrics there "
        "(transformers serve has none; SGLang needs --enable-metrics)"
    )


class _ClosesIdleConnections(BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive; a request that comes on a connection already used is the one the server's
    keep-alive timer closed the connection under (uvicorn, vLLM's and SGLang's server, closes one idle
    for 5 s): it gets no answer, the connection is closed."""

    protocol_version = "HTTP/1.1"
    served: list[int] = []  # noqa: RUF012 - per test, reset by it
    reset = False  # close with a TCP reset rather than a FIN

    def do_GET(self) -> None:
        self.requests = getattr(self, "requests", 0) + 1
        if self.requests > 1:
            if self.reset:  # closed before socketserver's shutdown() could send a FIN
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.rfile.close()
                self.wfile.close()
                self.connection.close()
            self.close_connection = True
            return
        _, body = idle_vllm(len(self.served) + 1)
        self.served.append(self.client_address[1])
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        return None


@pytest.mark.timeout(30)
@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
def test_a_kept_alive_connection_closed_under_a_request_is_retried_on_a_new_one(
    reset: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sample whose GET goes out on a kept-alive connection as the server closes it (reproduced with
    uvicorn: a 1 s keep-alive and samples 1.003 s apart failed 6 of 20, "Server disconnected without
    sending a response", or a ReadError for a reset) was an error sample; a GET is safe to send again,
    on a new connection."""
    monkeypatch.setattr(_ClosesIdleConnections, "served", [])
    monkeypatch.setattr(_ClosesIdleConnections, "reset", reset)
    with LoopbackServer(_ClosesIdleConnections) as server:

        async def go() -> list[str | None]:
            source = ServerMetricsSource(server.url + "/metrics", flavor="vllm", model="sim", timeout=5.0)
            times = iter((0.0, 1.0, 2.0))
            try:
                await source.probe(5.0)
                return [(await source.read(lambda: next(times))).error for _ in range(3)]
            finally:
                await source.aclose()

        errors = asyncio.run(go())
    assert errors == [None, None, None]
    assert len(set(_ClosesIdleConnections.served)) == 4  # each answered GET on a connection of its own


@pytest.mark.timeout(30)
def test_an_https_metrics_url_with_an_untrusted_certificate_says_to_name_its_ca(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As the model requests say it (SSL_CERT_FILE); the scrape's warning was OpenSSL's words alone."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    tls = Path(__file__).parent / "fixtures" / "tls"
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls / "self_signed.pem", tls / "self_signed.key")
    with MetricsServer(idle_vllm) as server:
        server._server.socket = context.wrap_socket(server._server.socket, server_side=True)
        url = server.url.replace("http://", "https://")
        message = asyncio.run(probe_refusal(url, "vllm"))
    assert message.startswith(f"GET {url}: ConnectError: [SSL: CERTIFICATE_VERIFY_FAILED]"), message
    assert "name the CA certificate that signed it with SSL_CERT_FILE=PATH" in message, message


@pytest.mark.timeout(30)
def test_a_socks_proxy_without_socksio_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scrape's warning was 'ImportError: Using SOCKS proxy, but the 'socksio' package is not
    installed', naming neither the variable nor the way around it."""
    if importlib.util.find_spec("socksio") is not None:
        pytest.skip("socksio is installed: httpx can use the SOCKS proxy")
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        for variable in (name, name.upper()):
            monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("all_proxy", "socks5://127.0.0.1:1")
    url = "http://192.0.2.1:8000/metrics"
    assert asyncio.run(probe_refusal(url, "vllm")) == (
        f"GET {url}: the environment's proxy socks5://127.0.0.1:1, from all_proxy, is a SOCKS proxy, which "
        "needs the socksio package (pip install 'httpx[socks]'), or unset it for this command (env -u "
        "all_proxy asyncroll ...; no_proxy cannot go around it: httpx opens every proxy named)"
    )


@pytest.mark.timeout(30)
def test_a_proxy_httpx_cannot_read_is_named_without_its_password(monkeypatch: pytest.MonkeyPatch) -> None:
    """A '#' left unescaped in a proxy's password: the scrape's warning was httpx's 'InvalidURL: Invalid
    port: 'se'', the password's start, naming neither the proxy nor its variable."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        for variable in (name, name.upper()):
            monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("http_proxy", "http://me:se#cret@127.0.0.1:1")
    url = "http://192.0.2.1:8000/metrics"
    message = asyncio.run(probe_refusal(url, "vllm"))
    assert message.startswith(
        f"GET {url}: the environment's proxy http://me:***@127.0.0.1:1, from http_proxy, is no URL httpx "
        "can read"
    ), message
    assert "se#cret" not in message and "'se'" not in message
