"""Which of the environment's HTTP settings a client of a server should take: none of its proxies for a
server on this machine.

httpx (as requests) sends a request through ``http_proxy``/``https_proxy``/``all_proxy`` unless
``no_proxy`` names the host — a loopback host included. Set on many clusters (for pip), such a proxy
got every request to a vLLM on ``127.0.0.1``: a proxy on another host cannot reach this machine's
loopback (its own is another), so each failed as ``ConnectError`` or the proxy's 502/503 while the
server was up, and a ``socks5://`` one failed the run at once (httpx needs ``socksio`` for it). As
Go's and Ruby's HTTP clients and browsers do, a loopback host — ``localhost``, ``*.localhost``,
``127.0.0.0/8`` (Debian's ``127.0.1.1`` too, and IPv4-mapped: ``::ffff:127.0.0.1``), ``::1`` — is
reached directly, and so is an unspecified address (``0.0.0.0``, what vLLM prints it listens on), which
also means this machine. Any other host keeps the environment's
proxy and CA settings; :func:`environment_proxy` names the proxy it then goes through, for messages.
"""

from __future__ import annotations

import ipaddress
import os
import urllib.request
from typing import Any
from urllib.parse import urlsplit


def on_this_machine(url: str) -> bool:
    """Whether ``url``'s host is this machine: ``localhost`` (or a name under it), a loopback or an
    unspecified IP address."""
    try:
        host = (urlsplit(url).hostname or "").rstrip(".").lower()
    except ValueError:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1 (Python < 3.13 says not loopback)
    return address.is_loopback or address.is_unspecified


def environment_proxy(url: str) -> str | None:
    """The proxy the environment sends requests to ``url`` through, with the variable that names it
    (``"http://proxy:3128, from http_proxy"``, its password masked), or None: none is set, ``no_proxy``
    names the host, or the host is this machine (:func:`client_settings`). Read as httpx reads it
    (urllib's ``getproxies``: the lower-case variable first, ``all_proxy`` for any scheme; ``no_proxy``
    as :func:`proxies_in_play` reads it: urllib's reading of ``.domain`` and ``*`` differs)."""
    from asyncroll.url_checks import masked_url

    try:
        if not proxies_in_play(url):
            return None
        proxies = urllib.request.getproxies()
        for key in (urlsplit(url).scheme, "all"):
            proxy = proxies.get(key)
            if proxy:
                name = f"{key}_proxy" if os.environ.get(f"{key}_proxy") else f"{key}_proxy".upper()
                return f"{masked_url(proxy)}, from {name}"
    except ValueError:
        return None
    return None


def proxies_in_play(url: str) -> bool:
    """Whether an ``httpx`` client of the server at ``url`` takes the environment's proxy variables
    (``http_proxy``, ``https_proxy``, ``all_proxy``: it opens a transport for each, whatever the host): a
    server not on this machine while one is set and ``no_proxy`` does not name it. A client given a
    transport of its own takes none."""
    if on_this_machine(url):
        return False
    proxies = urllib.request.getproxies()
    return any(proxies.get(key) for key in ("http", "https", "all")) and not _httpx_goes_direct(url)


def _httpx_goes_direct(url: str) -> bool:
    """Whether a client httpx makes from the environment sends requests to ``url`` directly, though a
    proxy variable is set: ``no_proxy`` names the host (the common cluster setup: the GPU nodes in it).
    Asked of httpx itself, whose reading of ``no_proxy`` (``*``, suffixes, IPs; no CIDR ranges) urllib's
    differs from, through its routing (not public API: anything unexpected reads as not direct)."""
    import httpx

    try:
        with httpx.Client() as client:
            return bool(client._transport_for_url(httpx.URL(url)) is client._transport)
    # a proxy httpx refuses (the client's own making then says so), unreadable CA files, or httpx changed
    except (AttributeError, ImportError, OSError, ValueError, httpx.InvalidURL):
        return False


def proxy_problem(exc: Exception) -> str | None:
    """What to do where httpx cannot make a client because of a proxy the environment names (httpx
    opens a transport for each proxy variable set, whichever server the client is for): a SOCKS one
    wants ``socksio`` (an ImportError), one of another scheme (``ftp://``) is refused (a ValueError);
    ``no_proxy`` does not go around either. None: no proxy the environment names explains ``exc``."""
    from asyncroll.url_checks import masked_url

    usable = ("http", "https", "socks5", "socks5h")  # a proxy without a scheme is taken as http://
    socks = isinstance(exc, ImportError)
    unreadable = type(exc).__name__ == "InvalidURL"  # httpx's, raised for a proxy URL it cannot parse

    def refused(proxy: str) -> bool:  # httpx before 0.28 (the floor is 0.27) knows no socks5h either
        if unreadable:
            return not _readable_by_httpx(proxy)
        scheme = proxy.split("://")[0].lower() if "://" in proxy else "http"
        return scheme not in usable or f"'{scheme}://" in str(exc)

    found = [
        (key, proxy)
        for key, proxy in urllib.request.getproxies().items()
        if key in ("http", "https", "all")  # those httpx reads
        and (proxy.startswith("socks") if socks else refused(proxy))
    ]
    if not found:
        return None
    key, proxy = found[0]
    name = f"{key}_proxy" if os.environ.get(f"{key}_proxy") else f"{key}_proxy".upper()
    what = (
        "is a SOCKS proxy, which needs the socksio package (pip install 'httpx[socks]')"
        if socks
        else "is no URL httpx can read (a '#', '/', '?' or '@' in its user name or password must be "
        "%-escaped: %23, %2F, %3F, %40): fix it"
        if unreadable
        else "is no http://, https:// or socks5:// URL: fix it"
    )
    # httpx opens a transport for every proxy variable as it makes the client, whatever the host: a
    # no_proxy naming the server's host (what this said to set) leaves the same error
    head = f"the environment's proxy {masked_url(proxy)}, from {name}, {what}, "
    return head + (
        f"or unset it for this command (env -u {name} asyncroll ...; no_proxy cannot go around it: httpx "
        "opens every proxy named)"
    )


def _readable_by_httpx(proxy: str) -> bool:
    """Whether httpx reads ``proxy`` as a URL (its words for one it cannot quote part of the password:
    ``Invalid port: 'se'`` for ``http://me:se#cret@host``, so they are never shown)."""
    import httpx

    try:
        httpx.URL(proxy if "://" in proxy else f"http://{proxy}")
    except (httpx.InvalidURL, ValueError):
        return False
    return True


def environment_problem(exc: Exception) -> str | None:
    """What to do where httpx cannot make a client because of the environment's settings: a
    proxy (:func:`proxy_problem`), or ``SSL_CERT_FILE``/``SSL_CERT_DIR`` that cannot be read as CA
    certificates (an OSError; httpx reads them for any client that takes the environment's settings).
    None: nothing in the environment explains ``exc``."""
    if not isinstance(exc, OSError):
        return proxy_problem(exc)
    name = next((n for n in ("SSL_CERT_FILE", "SSL_CERT_DIR") if os.environ.get(n)), None)
    if name is None:
        return None
    why = exc.strerror or str(exc)
    value = os.environ[name]
    return f"the environment's {name}={value} cannot be read as CA certificates ({why}): fix or unset it"


def client_settings(url: str) -> dict[str, Any]:
    """Keyword arguments for an ``httpx`` client of the server at ``url``: for one on this machine, the
    environment's proxies off (``trust_env=False``) and, for ``https``, its CA settings
    (``SSL_CERT_FILE``, ``SSL_CERT_DIR``) kept; for any other, nothing (the environment's settings
    stand)."""
    if not on_this_machine(url):
        return {}
    settings: dict[str, Any] = {"trust_env": False}
    if urlsplit(url).scheme == "https":
        import httpx

        settings["verify"] = httpx.create_ssl_context(trust_env=True)
    return settings
