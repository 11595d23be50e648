"""``/metrics`` over HTTP as real servers answer it, beyond a plain 200. Real loopback servers
(``tests.test_telemetry.MetricsServer``), no timing assertions."""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler

import pytest

from asyncroll.telemetry.server_metrics import MAX_REDIRECTS, MetricsUnavailable, ServerMetricsSource
from tests.test_telemetry import MetricsServer, idle_vllm


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


@pytest.mark.timeout(30)
def test_a_redirect_loop_is_unavailable_with_its_reason() -> None:
    def loop(handler: BaseHTTPRequestHandler, n: int, closing: threading.Event) -> bool:
        _redirect(handler, f"/metrics/{n}")
        return True

    with MetricsServer(idle_vllm, loop) as server:

        async def go() -> str:
            source = ServerMetricsSource(server.url, flavor="vllm", model="sim", timeout=5.0)
            try:
                with pytest.raises(MetricsUnavailable) as caught:
                    await source.probe(5.0)
            finally:
                await source.aclose()
            return str(caught.value)

        message = asyncio.run(go())
    assert message == f"GET {server.url}: more than {MAX_REDIRECTS} redirects"
    assert server.scrapes == MAX_REDIRECTS + 1
