"""Descriptors 0, 1 and 2 held open from the command's first instant.

A process started with one of them closed (``2>&-``, ``<&-``, a supervisor that closes them) hands that
number to the next file it opens, and whatever writes to the standard descriptor then writes into that
file: a run started with stderr closed had its event loop's epoll handle as descriptor 2, and an output
file, a worker's pipe or a socket could as well take it, where a C library's message, a signal handler's
``os.write(2, …)`` or a child inheriting descriptor 2 would land. A closed one is opened on ``/dev/null``
(inheritable, as the standard descriptors are); ``sys.stdin`` / ``sys.stdout`` / ``sys.stderr`` stay as
Python made them (None for a closed one), so nothing the command says is written anywhere.
"""

from __future__ import annotations

import os


def hold_standard_fds() -> None:
    """Open ``/dev/null`` on each of descriptors 0, 1 and 2 that is closed (where it can be opened)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            try:
                held = os.open(os.devnull, os.O_RDWR)  # the lowest free number: ``fd``, those below are open
            except OSError:  # no /dev/null (a bare chroot): left closed, as the command was started
                return
            os.set_inheritable(held, True)
