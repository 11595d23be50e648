"""Checks of the server URLs and the API key a run is given, before anything starts, and the one way
a URL is shown in a message (its password masked)."""

from __future__ import annotations

import re
from urllib.parse import unquote_plus, urlsplit


def http_url_problem(url: str) -> str | None:
    """Why ``url`` is not a usable http(s) URL of a server (None: it is). ``127.0.0.1:8000`` without a
    scheme would otherwise get as far as the first request and fail there with a misleading error."""
    if url != url.strip():
        return "has leading or trailing whitespace"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number in 0-65535
    except ValueError as exc:
        if masked_url(url) != url:  # a password with an unescaped '#', '/' or '?': the error quotes it
            return _CREDENTIALS
        return f"not a valid URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "must be an http:// or https:// URL (e.g. http://127.0.0.1:8000)"
    if not parts.hostname:
        return "names no host (e.g. http://127.0.0.1:8000)"
    if parts.netloc.endswith(":"):  # http://127.0.0.1: is port 80 to httpx: a port left out by mistake
        return "has an empty port after its ':' (e.g. http://127.0.0.1:8000)"
    if parts.port == 0:  # a port to listen on (any free one), never one to connect to
        return "has port 0, where no server listens (serve-sim --port 0 prints the port it chose)"
    if parts.username is not None or parts.password is not None:
        return _CREDENTIALS
    if _query_credentials(url):
        return _QUERY_CREDENTIALS
    return None


#: Query parameters that carry a credential: a gateway's ``?token=``, ``?api_key=``, ``?accessToken=``, a
#: signed URL's ``X-Amz-Signature``, an Azure Functions key's ``?code=``, a ``?jwt=`` (the name
#: lower-cased, ``-`` and a camelCase break read as ``_``).
_CREDENTIAL_PARAM = re.compile(
    r"(?:^|_)(?:token|key|apikey|secret|password|passwd|pwd|auth|sig|signature|credentials?|jwt)$|^code$"
)


def _credential_param(name: str) -> bool:
    words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", unquote_plus(name).strip())  # accessToken: access_Token
    return _CREDENTIAL_PARAM.search(words.lower().replace("-", "_")) is not None


def _query_credentials(url: str) -> bool:
    """Whether ``url``'s query has a parameter named as a credential (:data:`_CREDENTIAL_PARAM`)."""
    query = url.partition("?")[2].partition("#")[0]
    return any(_credential_param(part.partition("=")[0]) for part in re.split("[&;]", query) if part)


_KEY_ADVICE = (
    "a server's API key goes in an environment variable named by --api-key-env, sent as "
    "'Authorization: Bearer'; only the variable's name is recorded"
)
_CREDENTIALS = (
    "carries credentials (user:password@), which run.json would keep in its command and config: "
    f"not accepted ({_KEY_ADVICE})"
)
_QUERY_CREDENTIALS = (
    "carries a credential in its query (a token, key, secret, password, signature, jwt or code "
    f"parameter), which run.json would keep in its command and config: not accepted ({_KEY_ADVICE})"
)
#: What a refused ``--metrics-url`` says instead of :data:`_KEY_ADVICE`: its scrape sends no key.
METRICS_KEY_ADVICE = (
    "the /metrics scrape sends no key: give a URL that serves the metrics without one, as vLLM's and "
    "SGLang's do"
)


def metrics_url_problem(url: str) -> str | None:
    """:func:`http_url_problem` for a ``--metrics-url``, whose refusal for a credential does not advise
    ``--api-key-env``: telemetry's scrape sends no key."""
    problem = http_url_problem(url)
    return None if problem is None else problem.replace(_KEY_ADVICE, METRICS_KEY_ADVICE)


#: The ends of an OpenAI API URL that are no server root: an SDK's base_url, a curl example's whole URL.
_API_PATHS = ("/v1", "/v1/chat/completions", "/v1/completions", "/v1/models")


def not_a_root(endpoint: str) -> bool:
    """Whether ``endpoint`` is an OpenAI API URL under a server's root (``…/v1``, ``…/v1/chat/completions``)
    or carries a query or fragment: asyncroll requests ``/v1/chat/completions`` under the root."""
    return endpoint.rstrip("/").endswith(_API_PATHS) or "?" in endpoint or "#" in endpoint


def api_key_problem(key: str | None) -> str | None:
    """Why the value of ``--api-key-env``'s variable cannot be sent as ``Authorization: Bearer KEY``
    (None: it can). Never shows the key: a value h11 refuses (a newline read with it from a file) made
    every request fail with ``Illegal header value b'Bearer …'``, the key written into every output."""
    if not key:
        return "that environment variable is not set or empty"
    if key != key.strip():
        return "its value has leading or trailing whitespace (a newline read with it from a file?)"
    if not all("!" <= c <= "~" for c in key):
        return (
            "its value holds a character an API key cannot have in an HTTP header (only visible ASCII: "
            "no spaces, control characters or non-ASCII letters)"
        )
    return None


def masked_url(url: str) -> str:
    """``url`` with the password of its ``user:password@`` part, if any, shown as ``***`` (for messages and
    run.json), and the value of a query parameter named as a credential (``?token=***``); a user name given
    alone is masked whole (``http://TOKEN@proxy``: many proxies and gateways
    take a token there). A URL without a scheme (a proxy variable's
    ``me:pw@proxy:3128``, which httpx takes as http://), one whose password holds an unescaped ``#``, ``/``
    or ``?`` (where urlsplit ends the host: a port that is no number) and one urlsplit cannot read (an
    unclosed ``[``) are masked up to their last ``@``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    try:
        parts = urlsplit(url if sep else f"http://{url}")
        parts.port  # noqa: B018 - raises ValueError on a port that is no number: the host ended early
        cut = parts.netloc.rfind("@")  # rest starts with the netloc
    except ValueError:
        cut = rest.rfind("@")
    if cut < 0:
        return _masked_query(url)
    user, colon, _ = rest[:cut].partition(":")
    masked = f"{scheme}{sep}{user}:***{rest[cut:]}" if colon else f"{scheme}{sep}***{rest[cut:]}"
    return _masked_query(masked)


def _masked_query(url: str) -> str:
    """``url`` with the value of each query parameter named as a credential shown as ``***``."""
    head, mark, rest = url.partition("?")
    if not mark:
        return url
    query, hash_mark, fragment = rest.partition("#")
    parts = re.split("([&;])", query)
    for i, part in enumerate(parts):
        name, equals, _ = part.partition("=")
        if equals and _credential_param(name):
            parts[i] = f"{name}=***"
    return f"{head}?{''.join(parts)}{hash_mark}{fragment}"
