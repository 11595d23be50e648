"""The inference server's own view of its load: its vLLM or SGLang ``/metrics`` read at a probe and then
once per sample. What an exposition holds, and when a quantity is missing or invalid, is
:mod:`asyncroll.telemetry.exposition`'s (which names are read, per flavour).

A server that reports exactly one model, not ``--model``, at the probe is read under that name, with a
note (``model_filter_note``): vLLM and SGLang label the requests for a LoRA adapter, or for a second
served name, with the base model's first served name. Counters are turned into per-second rates by
:class:`~asyncroll.telemetry.counter_rate.CounterRate`, series by series: each good series advances, and
a series that was invalid or absent keeps its last good reading, so its next increase spans the gap. A
counter that falls to at most half its last reading was reset (a restarted server's counter starts again
near zero); one that falls by less makes its quantity invalid (no rate), never a huge one.

The server is not trusted to be well behaved. A ``GET`` reads at most :data:`MAX_METRICS_BYTES` of body
(after content decoding, so a gzip bomb stops there too) within a whole-exchange deadline a little above
the per-phase timeout (``request_deadline_s``: a body trickled byte by byte resets httpx's per-phase
timers forever); see :mod:`asyncroll.http_read`. Up to :data:`MAX_REDIRECTS` redirects are followed
within that deadline, each capped the same way; a GET the server hung up on or reset without an answer
(a kept-alive connection it closed as the request went out) is sent once more. The body is decoded and
parsed in a thread (:func:`asyncio.to_thread`), never on the event loop, so a large exposition does not
stall the run (the thread still shares the GIL with the loop: MEASUREMENT.md, "Observer cost").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from asyncroll.backends.http_errors import describe_transport_error, few_names
from asyncroll.http_proxy import client_settings, environment_problem
from asyncroll.http_read import ResponseTooLarge, body_text, read_bounded, request_deadline_s
from asyncroll.telemetry.counter_rate import CounterRate
from asyncroll.telemetry.exposition import (
    NAMES,
    SGLANG,
    VLLM,
    MetricNames,
    NullReason,
    ServerReading,
    detect_flavor,
    parse_metrics,
    sample_name,
)

if TYPE_CHECKING:
    import httpx

FlavorSetting = Literal["auto", "vllm", "sglang"]

#: The most of a ``/metrics`` body read, after content decoding. A real vLLM exposition is ~100 KB (two
#: engines, a dozen histograms of ~30 buckets; ``bench/telemetry.py``); a body past 16 MiB is not an
#: exposition worth parsing but a server gone wrong, or a compression bomb.
MAX_METRICS_BYTES = 16 << 20
#: The least a whole ``GET`` may run past its per-phase timeout (``http_read.request_deadline_s``).
DEADLINE_MARGIN_S = 0.5
#: The most redirects one ``GET`` follows (Prometheus follows them too; 3xx is no metrics page).
MAX_REDIRECTS = 5


@dataclass(slots=True)
class ServerSample:
    """What one ``/metrics`` read contributes to a ``resource_sample``."""

    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    prompt_tokens_per_s: float | None = None
    generation_tokens_per_s: float | None = None
    counter_resets: int = 0
    nulls: dict[str, NullReason] = field(default_factory=dict)
    error: str | None = None


class MetricsUnavailable(Exception):
    """The metrics source cannot be used; the message says why (for the probe's ``reason``)."""


#: Why a vLLM ``/metrics`` can lack its engine's metrics: only the process's and HTTP's are left.
NO_STATS_HINT = " (vLLM serves none with --disable-log-stats, as RL frameworks often start it)"


def _probe_reading(
    url: str, text: str, names: MetricNames | None, model: str | None
) -> tuple[MetricNames, ServerReading]:
    """The names to read (``names``, else detected) and the probe's reading; raises
    :class:`MetricsUnavailable`. Synchronous: run in a thread, as every scan of a body is."""
    if names is None:
        found = detect_flavor(text)
        if found is None:
            raise MetricsUnavailable(
                f"GET {url}: no vLLM ({VLLM.running}) or SGLang ({SGLANG.running}) metrics in the response"
                f"{NO_STATS_HINT}"
            )
        names = NAMES[found]
    elif not any(sample_name(line) == names.running for line in text.splitlines()):
        served = detect_flavor(text)  # the other server's names: the declared kind is not the server's
        if served is not None and served != names.flavor:
            other = NAMES[served]
            label = "vLLM" if served == "vllm" else "SGLang"
            hint = f", which has {label}'s ({other.running}): read them with --server-kind {served}"
        else:
            hint = NO_STATS_HINT if names is VLLM else ""
        raise MetricsUnavailable(f"GET {url}: no {names.running} in the response{hint}")
    return names, parse_metrics(text, names, model)


class ServerMetricsSource:
    """``GET`` a Prometheus endpoint of a vLLM or SGLang server and read it (see the module docstring)."""

    name = "server_metrics"

    def __init__(
        self, url: str, *, flavor: FlavorSetting = "auto", model: str | None, timeout: float
    ) -> None:
        self.url = url
        self.setting = flavor
        self.model = model
        self.timeout = timeout
        self.names: MetricNames | None = None if flavor == "auto" else NAMES[flavor]
        self._client: httpx.AsyncClient | None = None
        self._prompt = CounterRate()
        self._generation = CounterRate()

    @property
    def deadline_s(self) -> float:
        """The longest one sample's ``GET`` can take (its parse, in a thread, comes after)."""
        return request_deadline_s(self.timeout, DEADLINE_MARGIN_S)

    async def _get(self, limit_s: float) -> bytes:
        """The body of one ``GET``: ``limit_s`` per phase, :func:`request_deadline_s` for the whole
        exchange, at most :data:`MAX_METRICS_BYTES` decoded. Any failure is :class:`MetricsUnavailable`."""
        import httpx

        if self._client is None:
            # No connection limit: the deadline cancels into httpcore's pool, which can leak a slot of a
            # connection not yet open (encode/httpcore#1093; see asyncroll.http_read).
            # (and no environment proxy for a server on this machine: asyncroll.http_proxy)
            try:
                self._client = httpx.AsyncClient(
                    limits=httpx.Limits(max_connections=None), **client_settings(self.url)
                )
            # the environment's proxy (InvalidURL: one httpx cannot parse) or CA file
            except (ImportError, ValueError, OSError, httpx.InvalidURL) as exc:
                problem = environment_problem(exc)
                if problem is None:
                    raise
                raise MetricsUnavailable(f"GET {self.url}: {problem}") from exc
        deadline = request_deadline_s(limit_s, DEADLINE_MARGIN_S)
        try:
            async with asyncio.timeout(deadline):  # the whole exchange, redirects and the retry included
                try:
                    response, body = await self._follow(limit_s, deadline)
                except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
                    # Most likely a kept-alive connection the server closed (or reset) as the GET went out
                    # (uvicorn closes one idle for 5 s); httpx drops it: the GET, safe to repeat, goes anew.
                    response, body = await self._follow(limit_s, deadline)
        except httpx.TimeoutException as exc:
            raise MetricsUnavailable(f"GET {self.url}: no response within {limit_s:g} s") from exc
        except TimeoutError as exc:  # every phase in time, the whole exchange not: a trickle
            raise MetricsUnavailable(f"GET {self.url}: no complete response within {deadline:g} s") from exc
        except ResponseTooLarge as exc:
            raise MetricsUnavailable(
                f"GET {self.url}: {exc}; a Prometheus exposition is ~100 KB, so this is no metrics page"
            ) from exc
        except httpx.TransportError as exc:  # no answer: its words, and what to do about a TLS failure
            raise MetricsUnavailable(f"GET {self.url}: {describe_transport_error(exc)}") from exc
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise MetricsUnavailable(f"GET {self.url}: {type(exc).__name__}: {exc}") from exc
        if response.next_request is not None:
            raise MetricsUnavailable(f"GET {self.url}: more than {MAX_REDIRECTS} redirects")
        if response.status_code == 404:
            raise MetricsUnavailable(
                f"GET {self.url}: HTTP 404: the server exposes no Prometheus metrics there "
                "(transformers serve has none; SGLang needs --enable-metrics)"
            )
        if response.status_code != 200:
            raise MetricsUnavailable(f"GET {self.url}: HTTP {response.status_code}")
        return body

    async def _follow(self, limit_s: float, deadline_s: float) -> tuple[httpx.Response, bytes]:
        """``GET`` the URL, following up to :data:`MAX_REDIRECTS` redirects (a Starlette mount answers
        ``/metrics`` with 307 to ``/metrics/``), each hop's body capped as the last one's is (httpx's own
        following reads a redirect's whole body). The caller bounds all the hops by ``deadline_s`` too."""
        assert self._client is not None
        request = self._client.build_request("GET", self.url, timeout=limit_s)
        for _ in range(MAX_REDIRECTS + 1):
            response, body = await read_bounded(
                self._client, request, limit_bytes=MAX_METRICS_BYTES, deadline_s=deadline_s
            )
            if response.next_request is None:
                break
            request = response.next_request
        return response, body

    async def probe(self, limit_s: float) -> dict[str, Any]:
        """Fetch once before the clock starts (``limit_s`` per phase); fixes the flavour.
        Raises :class:`MetricsUnavailable`."""
        body = await self._get(limit_s)
        names, reading = await asyncio.to_thread(
            lambda: _probe_reading(self.url, body_text(body), self.names, self.model)
        )
        self.names = names
        note: str | None = None
        if reading.nulls.get("running") == "missing" and reading.other_models:
            if len(reading.other_models) > 1:
                raise MetricsUnavailable(
                    f"GET {self.url}: no series for model_name={self.model!r}; the server reports "
                    f"{few_names(reading.other_models)} (check --model)"
                )
            # One model served, under another name: vLLM and SGLang count the requests for a LoRA adapter,
            # or for a second --served-model-name, under the first served name of the base model.
            served = reading.other_models[0]
            note = (
                f"no series for model_name={self.model!r}; the server reports only {served[:100]!r} (the "
                "name it counts a LoRA adapter's or a second served name's requests under): read instead"
            )
            self.model = served
            reading = await asyncio.to_thread(lambda: parse_metrics(body_text(body), names, served))
        detail: dict[str, Any] = {
            "url": self.url,
            "flavor": names.flavor,
            "flavor_setting": self.setting,
            # a label read instead is the server's: bounded (a long served path keeps its 1,000 characters)
            "model_filter": None if self.model is None else self.model[:1_000],
            "kv_cache_metric": reading.kv_cache_metric,
            "missing_at_probe": sorted(reading.nulls),
        }
        if note is not None:
            detail["model_filter_note"] = note
        if reading.other_models:
            # the server's words, bounded: a receipt would keep a megabyte label, or thousands, whole
            detail["other_models"] = [model[:100] for model in reading.other_models[:10]]
        return detail

    async def read(self, now: Callable[[], float]) -> ServerSample:
        """One sample: fetch, parse, turn counters into rates. Never raises for a bad server. The rates'
        time is ``now()`` as the ``GET`` went out, as Prometheus stamps a scrape: the server reads its
        counters as it handles the request, before its body travels (RESULTS.md, the meters table: on a
        loaded loopback run 0.7-12.7 ms after the ``GET`` began, 1.3-46.5 ms before the body arrived)."""
        at = now()
        try:
            body = await self._get(self.timeout)
        except MetricsUnavailable as exc:
            return ServerSample(error=str(exc))
        names = self.names
        assert names is not None, "read() before a successful probe()"
        reading = await asyncio.to_thread(lambda: parse_metrics(body_text(body), names, self.model))
        nulls = dict(reading.nulls)
        prompt = self._prompt.update(reading.prompt_tokens, at, complete="prompt_tokens" not in nulls)
        generation = self._generation.update(
            reading.generation_tokens, at, complete="generation_tokens" not in nulls
        )
        for key, update in (("prompt_tokens", prompt), ("generation_tokens", generation)):
            if update.fell:
                nulls[key] = "invalid"
        return ServerSample(
            running=reading.running,
            waiting=reading.waiting,
            kv_cache_usage=reading.kv_cache_usage,
            prompt_tokens_per_s=prompt.rate,
            generation_tokens_per_s=generation.rate,
            counter_resets=prompt.resets + generation.resets,
            nulls=nulls,
        )

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()
