"""One readable line for an ``httpx`` transport error, whatever its text; a server's error body as
text, with the API key masked (:func:`server_text`).

Many of httpx's transport errors carry no text at all (``str(ReadError())`` is ``""``: the socket was
reset, or the server closed the connection mid-response), so ``f"{name}: {exc}"`` printed ``ReadError: ``.
:func:`describe_transport_error` names the exception type and falls back, in order, on the text of the
error it was raised from (httpcore's), then on what that type of failure means. Looked up by class name
along the exception's MRO, so this module imports nothing heavy (``--help`` stays fast).
"""

from __future__ import annotations

import errno
import json
from collections.abc import Mapping, Sequence

from asyncroll.process_limits import limit_note

#: What an httpx exception class means, for one that carries no text (most specific names first).
_MEANING = {
    "ConnectTimeout": "no connection within the timeout",
    "ReadTimeout": "no response within the timeout",
    "WriteTimeout": "the request could not be sent within the timeout",
    "PoolTimeout": "no free connection in the pool within the timeout",
    "ConnectError": "cannot connect to the server",
    "ReadError": "the connection was closed or reset while reading the response",
    "WriteError": "the connection was closed or reset while sending the request",
    "RemoteProtocolError": "the server broke the HTTP protocol (e.g. closed the connection mid-response)",
    "LocalProtocolError": "the request broke the HTTP protocol",
    "UnsupportedProtocol": "the URL's scheme is not http:// or https://",
    "ProxyError": "the proxy refused or failed the request",
    "TimeoutException": "timed out",
    "NetworkError": "the network connection failed",
    "TransportError": "the connection failed",
}


#: What to do about a certificate this machine does not trust (``ssl.SSLCertVerificationError``).
_UNTRUSTED = (
    "the server's certificate is not trusted here: name the CA certificate that signed it with "
    "SSL_CERT_FILE=PATH (a self-signed one: that certificate itself), or a folder of them with SSL_CERT_DIR"
)
_NO_TLS = "no TLS at the other end: is it a plain http:// server?"
#: How OpenSSL words a plain-HTTP reply read as a TLS record: 3.0's, and 3.5's (packet length too long).
_PLAIN_REPLY = ("WRONG_VERSION_NUMBER", "packet length too long")


def _tls_hint(exc: BaseException) -> str:
    """What to do about the ``ssl`` error under ``exc`` (httpx's error wraps httpcore's, which wraps it)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        name = type(cause).__name__
        if name == "SSLCertVerificationError":
            return _UNTRUSTED
        if name == "SSLError" and any(sign in str(cause) for sign in _PLAIN_REPLY):
            return _NO_TLS
        cause = cause.__cause__ or cause.__context__
    return ""


def _no_descriptor(exc: BaseException) -> OSError | None:
    """The error under ``exc`` that is this machine's (no descriptor left for the socket: EMFILE, ENFILE),
    not the server's; anyio says 'All connection attempts failed' for it, as for a server that is down."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.errno in (errno.EMFILE, errno.ENFILE):
            return cause
        cause = cause.__cause__ or cause.__context__
    return None


def describe_transport_error(exc: BaseException) -> str:
    """``"ReadError: the connection was closed or reset while reading the response"``, or the error's
    own text where it has one (``"ConnectError: [Errno 111] Connection refused"``); a TLS failure says
    what to do (an untrusted certificate: SSL_CERT_FILE); a socket this process had no descriptor for
    names the limit (ulimit -n)."""
    text = str(exc).strip()
    cause = exc.__cause__ or exc.__context__
    if not text and cause is not None:
        text = str(cause).strip()
    if not text:
        text = next((_MEANING[c.__name__] for c in type(exc).__mro__ if c.__name__ in _MEANING), "")
    text = text or "the connection failed"
    local = _no_descriptor(exc)
    if local is not None:  # ': [Errno 24] Too many open files (this process may hold 64 ...: ulimit -n)'
        text += ("" if str(local) in text else f": {local}") + limit_note(local)
    hint = _tls_hint(exc)
    return f"{type(exc).__name__}: {text}" + (f" ({hint})" if hint else "")


def _key(headers: Mapping[str, str]) -> str:
    """The API key the request carried (``authorization: Bearer KEY``), or ``""``."""
    auth = headers.get("authorization") or ""
    return auth[len("Bearer ") :] if auth.startswith("Bearer ") else ""


def _echoes(key: str) -> list[str]:
    """The forms in which a server's text may hold ``key``: as sent, and JSON-escaped (its ``"`` and
    ``\\``, and its ``/`` as ``\\/``, as PHP's json_encode writes it), longest first; none for no key."""
    if not key:
        return []
    escaped = json.dumps(key)[1:-1]
    return sorted({key, escaped, escaped.replace("/", "\\/")}, key=len, reverse=True)


def _masked(text: str, key: str) -> str:
    for echo in _echoes(key):
        text = text.replace(echo, "***")
    return text


def server_text(body: bytes, limit_chars: int, headers: Mapping[str, str]) -> str:
    """A server's error body as text for a message (at most ``limit_chars``), with the API key the
    request carried (``headers``: the client's, ``authorization: Bearer KEY``) masked, as sent or
    JSON-escaped: a server that echoes the key in its error would otherwise have it written to events,
    results and run.json. Masked before the cut, so that no cut leaves part of it."""
    key = _key(headers)
    room = limit_chars + 2 * len(key)  # a JSON-escaped key is at most twice as long
    text = body[: 4 * room].decode("utf-8", "replace")[:room]  # as http_read.body_text reads it
    return _masked(text, key)[:limit_chars]


def mask_key(text: str, headers: Mapping[str, str]) -> str:
    """``text`` with the API key of ``headers`` (``authorization: Bearer KEY``), as sent or JSON-escaped,
    replaced by ``***``."""
    return _masked(text, _key(headers))


def quoted_body(body: bytes, limit_bytes: int, headers: Mapping[str, str]) -> str:
    """The first ``limit_bytes`` of a body the client could not read (a 2xx that is no completion), as
    its bytes' ``repr``, with the API key masked as :func:`server_text` masks it (before the cut)."""
    echoes = [e.encode("utf-8", "replace") for e in _echoes(_key(headers))]
    head = body[: limit_bytes + 2 * max(map(len, echoes), default=0)]
    for echo in echoes:
        head = head.replace(echo, b"***")
    return repr(head[:limit_bytes])


#: The statuses of a server that wants an API key, or refused the one sent.
KEY_REFUSED = (401, 403)


def key_refused(headers: Mapping[str, str]) -> str:
    """What a 401/403 means for the run: a key is wanted, or the one ``--api-key-env`` gave was refused."""
    if "authorization" in headers:
        return "it refused the API key --api-key-env gave"
    return "it wants an API key: name the environment variable that holds it with --api-key-env"


def few_names(names: Sequence[str], count: int = 10, width: int = 100) -> str:
    """The first ``count`` of names a server gave (a model list's ``owned_by``, the ``model_name`` labels
    of its metrics), each cut to ``width`` characters, and how many more: a receipt or an error that
    quoted them whole would keep a megabyte name, or a list of thousands, whole."""
    more = f" and {len(names) - count:,} more" if len(names) > count else ""
    return f"{[name[:width] for name in names[:count]]!r}{more}"
