"""Whether another process holds the port an arm's server is about to bind, before that server starts.

A neighbour's server (another experiment on the machine, a user's own vLLM) may take a fixed
``server.port`` after the pre-flight, between two arms. It is not the arm's failure: nothing was measured,
so the arm is cut (``interrupted_by: "port_busy"``) and ``--resume`` runs it once the port is free.

The port is probed as the server will bind it (``SO_REUSEADDR``, so a connection of an earlier arm's
server in ``TIME_WAIT`` does not count): that finds a socket that only binds it, as vLLM reserves its
port before it loads its model and listens only then, which a connection attempt is refused by; one
that set ``SO_REUSEADDR`` itself (vLLM's does), which that bind goes beside, is found by a bind without it
that nothing in the socket table explains. A
connection is tried as well (a host that is not this machine's cannot be bound, but a server there still
answers the probes). The holder is named where the system's socket table shows it: a socket that only
binds is not listed there. Only a port held before the server starts is checked here: a server that dies
while starting, or another process that takes the port after the check, fails the arm as before.
"""

from __future__ import annotations

import errno
import socket

import psutil

from asyncroll.experiment.listener import addresses, holder
from asyncroll.experiment.server import port_in_use

#: A socket that binds the port and does not listen: the system lists none such with its holder.
BOUND_ONLY = (
    "a socket that is bound but does not listen (a server reserving it, such as a vLLM still loading "
    "its model)"
)


def port_busy(host: str, port: int, *, fixed: bool = True) -> str | None:
    """Who holds ``host:port`` now, in a message naming the port (None: nothing does). ``fixed``: the port
    is the config's ``server.port``, not one picked free for the arm."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    bound_elsewhere = False
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except OSError as exc:  # another error (a host that is not this machine's): the server will say
        bound_elsewhere = exc.errno == errno.EADDRINUSE
    if not bound_elsewhere:
        bound_elsewhere = reserved(family, host, port)
    listening = port_in_use(host, port)
    if not (bound_elsewhere or listening):
        return None
    field = "server.port" if fixed else "the port picked for this arm"
    if not bound_elsewhere:  # not this machine's address: a server answers there
        who = "a server that already accepts connections there"
    else:
        who = holder(port, addresses(host, port)) if listening else BOUND_ONLY
    return f"{field}: {host}:{port} is held by {who}"


def reserved(family: int, host: str, port: int) -> bool:
    """Bound by a socket that set ``SO_REUSEADDR`` (vLLM reserves its port so, with ``SO_REUSEPORT``), which
    the probe above binds beside (Linux lets two such sockets bind while neither listens): a bind without
    it is refused, and no socket the system lists there explains that (a connection in TIME_WAIT, which
    refuses it too, is listed; a socket that only binds is not). Unknown (the table unreadable): not held."""
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, port))
        return False
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            return False
    try:
        listed = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return False
    return not any(conn.laddr and conn.laddr.port == port for conn in listed)
