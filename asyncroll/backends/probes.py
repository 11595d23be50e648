"""The HTTP backend's probes of a server, each a bounded ``GET`` (:mod:`asyncroll.http_read`): what kind
of server it is (``/v1/models``, once at start), which version of its engine (``/version``, once at start,
best effort), and whether a server that stopped answering is back (``/health``, while the circuit is
open). A trickling or endless answer cannot hold any of them up."""

from __future__ import annotations

import json

import httpx

from asyncroll.backends.http_errors import (
    KEY_REFUSED,
    describe_transport_error,
    few_names,
    key_refused,
    server_text,
)
from asyncroll.config import ServerKind
from asyncroll.errors import ModelError
from asyncroll.http_proxy import environment_proxy
from asyncroll.http_read import MAX_PROBE_BYTES, ResponseTooLarge, read_bounded, request_deadline_s


class NotReady(ModelError):
    """The probe's answer from a server not ready yet (408, 429, 5xx), with its headers: a retry waits
    what its ``retry-after`` asks, as a turn's does."""

    def __init__(
        self, message: str, *, status: int | None = None, headers: httpx.Headers | None = None
    ) -> None:
        super().__init__("http_status", message, status=status)
        self.headers = headers


KIND_FROM_OWNER: dict[str, ServerKind] = {"vllm": "vllm", "sglang": "sglang"}


async def get_bounded(client: httpx.AsyncClient, path: str, limit_s: float) -> tuple[httpx.Response, bytes]:
    """``GET path`` with a per-phase limit, a whole-exchange deadline and a body cap."""
    request = client.build_request("GET", path, timeout=limit_s)
    deadline = request_deadline_s(limit_s)
    return await read_bounded(client, request, limit_bytes=MAX_PROBE_BYTES, deadline_s=deadline)


async def probe_kind(
    client: httpx.AsyncClient, endpoint: str, request_timeout: float
) -> tuple[ServerKind, str]:
    """``GET /v1/models``: vLLM and SGLang name themselves in ``owned_by``, ``transformers serve`` by a
    ``status`` of each model; anything else is generic.
    Returns the kind and how it was found, for the receipt.

    Only an unreachable server, one that answered a transient error (408, 429, 5xx: starting up,
    overloaded — no word on what it is), or one that refused the request's key (401, 403: it would
    refuse every chat request too) is an error here (:class:`ModelError`); a server without a usable
    model list is generic, and the receipt says why."""
    limit = min(10.0, request_timeout)
    try:
        response, body = await get_bounded(client, "/v1/models", limit)
    except (httpx.TransportError, TimeoutError) as exc:  # no answer: unreachable, or never complete
        why = (
            describe_transport_error(exc)
            if isinstance(exc, httpx.TransportError)
            else f"no complete answer within {request_deadline_s(limit):g}s"
        )
        proxy = environment_proxy(endpoint)
        via = "" if proxy is None else f", through the environment's proxy {proxy}"
        raise ModelError(
            "transport",
            f"cannot probe the server kind at {endpoint}/v1/models ({why}{via}); check that the server runs "
            "at --endpoint, or declare its kind with --server-kind vllm|sglang|transformers|generic to "
            "skip the probe",
        ) from exc
    except (ResponseTooLarge, httpx.HTTPError) as exc:  # it answered, but not readably
        return "generic", f"probed: /v1/models answered unreadably ({type(exc).__name__}: {exc})"
    if response.status_code in (408, 429) or response.status_code >= 500:  # not ready, or overloaded
        # not an answer about its model list: "generic" would drop --replay's fixed decode length
        raise NotReady(
            f"cannot probe the server kind at {endpoint}/v1/models: it answered HTTP {response.status_code} "
            f"({server_text(body, 200, client.headers)!r}), which says nothing of what it is; retry once "
            "the server is ready, or declare its kind with --server-kind vllm|sglang|transformers|generic "
            "to skip the probe",
            status=response.status_code,
            headers=response.headers,
        )
    if response.status_code in KEY_REFUSED:  # the key: every chat request would be refused as well
        raise ModelError(
            "http_status",
            f"the server at {endpoint} refused GET /v1/models: HTTP {response.status_code} "
            f"({server_text(body, 200, client.headers)!r}); {key_refused(client.headers)}",
            status=response.status_code,
        )
    try:
        models = json.loads(body)["data"]
        owners = {str(m.get("owned_by", "")) for m in models}
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return "generic", f"probed: /v1/models answered HTTP {response.status_code} without a model list"
    for owner, kind in KIND_FROM_OWNER.items():
        if owner in owners:
            return kind, f"probed: /v1/models owned_by={owner!r}"
    if models and all(_transformers_status(m) for m in models):
        return "transformers", "probed: /v1/models gives each model a status.value loaded|unloaded"
    return (
        "generic",
        f"probed: /v1/models owned_by={few_names(sorted(owners))} names no engine, nor a status per model",
    )


#: Server kinds whose engine answers ``GET /version`` with ``{"version": "..."}`` (vLLM, SGLang; serve-sim,
#: which stands in for vLLM, too).
VERSIONED_KINDS = ("vllm", "sglang")
#: The longest version string recorded (a server's answer is not trusted to be short).
MAX_VERSION_CHARS = 100


async def probe_version(
    client: httpx.AsyncClient, kind: ServerKind, request_timeout: float
) -> tuple[str | None, str]:
    """The engine's own version and how it was found, or None and why not, for run.json: a comparison of
    runs against "vllm" says nothing of which vLLM. Best effort and once, before the clock: whatever the
    server answers (no route, an error, no answer at all), the run goes on."""
    if kind not in VERSIONED_KINDS:
        return None, f"not asked: a {kind} server has no GET /version"
    limit = min(5.0, request_timeout)
    try:
        response, body = await get_bounded(client, "/version", limit)
    except httpx.HTTPError as exc:
        return None, f"GET /version: {describe_transport_error(exc)}"
    except TimeoutError:
        return None, f"GET /version: no complete answer within {request_deadline_s(limit):g}s"
    except ResponseTooLarge as exc:
        return None, f"GET /version: {exc}"
    if response.status_code != 200:
        return None, f"GET /version: HTTP {response.status_code}"
    try:
        version = json.loads(body)["version"]
    except (ValueError, KeyError, TypeError, RecursionError):
        version = None
    # not printable: a control character, or a lone surrogate ("\\ud800": run.json would be no standard JSON)
    if not isinstance(version, str) or not version.strip() or not version.strip().isprintable():
        return None, "GET /version: HTTP 200 without a version string"
    return version.strip()[:MAX_VERSION_CHARS], "GET /version"


def _transformers_status(model: object) -> bool:
    """``transformers serve`` (5.x) names no engine in ``owned_by`` (a local model is ``local``, a Hub one
    its organisation) but lists each model with ``"status": {"value": "loaded"|"unloaded"}``, a field of
    its own (OpenAI's list has none)."""
    status = model.get("status") if isinstance(model, dict) else None
    return isinstance(status, dict) and status.get("value") in ("loaded", "unloaded")


async def healthy(client: httpx.AsyncClient, request_timeout: float) -> tuple[bool, str]:
    """``GET /health`` answers 200 (vLLM, SGLang, serve-sim). A server without that route (404, 405 or
    501: it did answer) is asked ``GET /v1/models`` instead, which every OpenAI-compatible server has.
    Returns whether the server is up, and what the last ``GET`` got (for the error of a server that
    stays down)."""
    limit = min(5.0, request_timeout)
    got = "no probe"
    for path in ("/health", "/v1/models"):
        try:
            response, _ = await get_bounded(client, path, limit)
        except httpx.HTTPError as exc:
            return False, f"GET {path}: {describe_transport_error(exc)}"
        except TimeoutError:  # a trickling answer: the server is not healthy
            return False, f"GET {path}: no complete answer within {request_deadline_s(limit):g}s"
        except ResponseTooLarge as exc:
            return False, f"GET {path}: {exc}"
        got = f"GET {path}: HTTP {response.status_code}"
        if response.status_code == 200:
            return True, got
        if response.status_code not in (404, 405, 501):
            return False, got
    return False, got
