"""Whose server answered the readiness probe: the socket listening on the endpoint's port must be one of
the arm's own server (its process, a descendant, or what it detached carrying its origin).

A port chosen by ``free_port`` is released before the server binds it, and a real server loads its model
for tens of seconds before it listens; meanwhile another process (a neighbour's experiment, a user's own
vLLM serving the same model name) may hold that port and answer the probes, and the arm would measure it.

A port can also be shared: vLLM binds with ``SO_REUSEPORT``, so a second vLLM of the same user binds the
same address and port beside the first, both listen, and the kernel spreads connections between them. Our
own listener being there is then not enough: another process listening beside it (at the same address, or
a more specific one, which the kernel prefers) fails the check too.

Each process's own sockets are read (``Process.net_connections``, ``connections`` before psutil 6.0),
which needs no root for our own processes. The system-wide socket table (root on some systems) is used,
where it can be read, to name the process that holds the port instead, and to find one that shares it.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

import psutil

from asyncroll.experiment.orphans import carrying, origin_of
from asyncroll.proctree import descendants

#: Addresses a listening socket answers every local address of its family on.
WILDCARDS = frozenset({"0.0.0.0", "::", ""})
#: Where a connection to a wildcard address goes: the kernel sends it to loopback.
LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1"}


class ForeignListener(Exception):
    """Another process than the server holds the port (the message says which, where it can be seen);
    ``shared``: the server listens there too, beside it (both bound with ``SO_REUSEPORT``)."""

    def __init__(self, holder: str, shared: bool = False) -> None:
        super().__init__(holder)
        self.shared = shared


def inet_sockets(proc: psutil.Process) -> list[Any]:
    """``proc``'s TCP/UDP sockets, under the name this psutil gives the call."""
    method = getattr(proc, "net_connections", None) or proc.connections
    return list(method(kind="inet"))


def addresses(host: str, port: int) -> set[str]:
    """The addresses ``host`` names (what a probe of it may reach), ``host`` itself where it resolves not;
    a wildcard host's loopback too (``server.host: 0.0.0.0`` with a server that binds 127.0.0.1)."""
    try:
        found = {str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    except OSError:
        found = set()
    found.add(host.strip("[]"))
    return found | {LOOPBACK[a] for a in found if a in LOOPBACK}


def _listens(conn: Any, port: int, where: set[str]) -> bool:
    laddr = conn.laddr
    return bool(
        conn.status == psutil.CONN_LISTEN and laddr and laddr.port == port and laddr.ip in where | WILDCARDS
    )


def describe(pid: int) -> str:
    """``pid 123 (python3: python -m … serve-sim --port 8000)``, as much of it as can be read."""
    try:
        proc = psutil.Process(pid)
        name = proc.name()
        with contextlib.suppress(psutil.Error):
            line = " ".join(proc.cmdline())[:200]
            if line:
                name = f"{name}: {line}"
        return f"pid {pid} ({name})"
    except psutil.Error:
        return f"pid {pid}"


def owner(leader: int, origin: str | None, host: str, port: int) -> dict[str, Any]:
    """Which of the server's processes listens on ``host:port``: ``{"verified": True, "pid", "name",
    "address"}``; ``{"verified": False, "why"}`` where this platform cannot tell. Raises
    :class:`ForeignListener` when none of them does (then another process answered the probe)."""
    where = addresses(host, port)
    try:
        tree = [psutil.Process(leader), *descendants(leader)]
    except psutil.NoSuchProcess:
        tree = []
    try:
        # what it detached (``setsid -f``, a launcher that daemonizes) is only looked for if needed
        found = _listener(tree, port, where) or _listener(carrying(origin), port, where)
    except (psutil.AccessDenied, NotImplementedError) as exc:
        why = f"{type(exc).__name__}: {exc}".rstrip(": ")
        return {"verified": False, "why": f"this platform does not tell which process holds a socket ({why})"}
    if found is None:
        raise ForeignListener(holder(port, where))
    beside = _beside(leader, origin, port, where, found["address"].rsplit(":", 1)[0].strip("[]"))
    if beside:
        raise ForeignListener(beside, shared=True)
    return found


def _listener(procs: list[psutil.Process], port: int, where: set[str]) -> dict[str, Any] | None:
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
            for conn in inet_sockets(proc):
                if _listens(conn, port, where):
                    ip = f"[{conn.laddr.ip}]" if ":" in conn.laddr.ip else conn.laddr.ip
                    return {"verified": True, "pid": proc.pid, "name": proc.name(), "address": f"{ip}:{port}"}
    return None


def _beside(leader: int, origin: str | None, port: int, where: set[str], mine: str) -> str:
    """Other processes listening on the port beside the server's socket at ``mine`` (the same address, or a
    more specific one than our wildcard), as the system-wide table shows them; "" when none is seen."""
    try:
        table = psutil.net_connections(kind="inet")
    except (psutil.Error, NotImplementedError, OSError):
        return ""
    pids = {
        c.pid
        for c in table
        if c.pid is not None
        and _listens(c, port, where)
        and (c.laddr.ip == mine or (mine in WILDCARDS and c.laddr.ip not in WILDCARDS))
    }
    return ", ".join(describe(p) for p in sorted(pids) if not _ours(p, leader, origin))


def _ours(pid: int, leader: int, origin: str | None) -> bool:
    """``pid`` is the server's: its leader, a descendant, or what it detached (carrying its origin)."""
    try:
        proc = psutil.Process(pid)
        if pid == leader or any(p.pid == leader for p in proc.parents()):
            return True
    except psutil.Error:
        return True  # gone since the table was read: it holds nothing now
    return origin is not None and origin_of(pid) == origin


def holder(port: int, where: set[str]) -> str:
    """Who holds the port, as well as can be seen: the system-wide table where it can be read, else each
    process this user may look at."""
    try:
        table = psutil.net_connections(kind="inet")
    except (psutil.Error, NotImplementedError, OSError):
        table = None
    if table is not None:
        pids = {c.pid for c in table if _listens(c, port, where)}
        seen = sorted(p for p in pids if p is not None)
        if seen:
            return ", ".join(describe(p) for p in seen)
        if pids:
            return "a process this user cannot see (another user's, or the system's)"
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, NotImplementedError):
            if any(_listens(c, port, where) for c in inet_sockets(proc)):
                return describe(proc.pid)
    return "a process this user cannot see (another user's, or the system's)"
