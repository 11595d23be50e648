"""The process limit behind an error, named in its message: on a shared cluster or a CI box a low
``ulimit -n`` (open files) or ``ulimit -u`` (processes and threads of the user) refuses a worker, a
thread or a sweep's cell process with ``EMFILE``, ``EAGAIN`` or "can't start new thread", and a low
``ulimit -v`` (address space) fails an allocation or the import of a compiled module (``MemoryError``,
``ENOMEM``, "failed to map segment from shared object"), whose text alone does not say which limit to
raise."""

from __future__ import annotations

import contextlib
import errno
import resource


def limit_note(exc: BaseException) -> str:
    """`` (this process may hold 16 open files: ulimit -n)`` for an error that a limit of this process
    explains, else ``""``."""
    if isinstance(exc, OSError) and exc.errno == errno.EMFILE:
        return f" (this process may hold {_soft(resource.RLIMIT_NOFILE)} open files: ulimit -n)"
    no_thread = isinstance(exc, RuntimeError) and "can't start new thread" in str(exc)
    no_process = isinstance(exc, OSError) and exc.errno == errno.EAGAIN
    if (no_thread or no_process) and hasattr(resource, "RLIMIT_NPROC"):
        soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
        if soft != resource.RLIM_INFINITY:  # else a transient shortage of the kernel's, not a limit
            return f" (this user may run {soft} processes and threads: ulimit -u)"
    no_memory = (
        isinstance(exc, MemoryError)
        or (isinstance(exc, OSError) and exc.errno == errno.ENOMEM)
        or (isinstance(exc, ImportError) and "failed to map segment" in str(exc))
    )
    if no_memory and hasattr(resource, "RLIMIT_AS"):
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:  # else the machine's memory ran out: no limit of ours to name
            return f" (this process may use {soft / 2**20:,.0f} MiB of address space: ulimit -v)"
    return ""


def _soft(which: int) -> str:
    soft = resource.getrlimit(which)[0]
    return "unlimited" if soft == resource.RLIM_INFINITY else str(soft)


#: Below this address-space limit (``ulimit -v``) ``run`` and ``simulate`` warn before they start.
LOW_ADDRESS_SPACE = 2 << 30


def address_space_warning() -> str | None:
    """What to say before a run under a low ``ulimit -v``, else None. The run's threads, worker pool and
    numerical libraries reserve far more address space than they use (a glibc malloc arena per thread,
    OpenBLAS's buffers): under about 700 MiB a run hung in its start-up, OpenBLAS retrying for ever an
    allocation the limit refused, holding the interpreter so that SIGTERM could not stop it."""
    if not hasattr(resource, "RLIMIT_AS"):
        return None
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft == resource.RLIM_INFINITY or soft >= LOW_ADDRESS_SPACE:
        return None
    return (
        f"warning: this process may use {soft / 2**20:,.0f} MiB of address space (ulimit -v): its threads, "
        "workers and numerical libraries reserve far more than they use, and under about 1 GiB a run can "
        "fail, or hang where OpenBLAS retries an allocation the limit refuses (then only SIGKILL stops "
        "it); limit memory with a cgroup instead (systemd-run --user --scope -p MemoryMax=...)"
    )


#: Open files a run holds besides its model connections, per worker (its pipes and process handle) and in
#: all (its output files, the event loop's, against a server the client's own): an estimate with room to
#: spare. Measured on a scripted run: 5 a worker and 14 besides (1 worker started under ``ulimit -n`` 19,
#: 8 under 54, 12 under 74); 4 a worker left 64 workers short of their soft limit, raised to 320.
FILES_PER_WORKER = 6
FILES_BESIDES = 64
#: A scripted run's files besides its workers': no connection pools (it warned of 72 files that 2 workers
#: needed where 24 were enough).
FILES_BESIDES_SCRIPTED = 16


def open_files_for(inflight: int, workers: int, connections: int | None = None) -> str | None:
    """Lets a run hold its workers' pipes and, against a server, a connection per request in flight
    (``inflight``; 0 for a scripted run), or ``connections`` where given (those its client may keep open):
    raises the soft open-files limit (``ulimit -n``) towards what they and ``workers`` need, as far as the
    hard limit allows, and returns a warning
    where the hard limit is below that, else None. Under a common
    ``ulimit -n 1024`` a run with 1,024 requests in flight had requests past it fail mid-run as transport
    errors ('Too many open files'), which opened the circuit as if the server were down, and the
    trajectories they were for failed."""
    needed = (
        (inflight if connections is None else connections)
        + FILES_PER_WORKER * workers
        + (FILES_BESIDES if inflight else FILES_BESIDES_SCRIPTED)
    )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return None
    target = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            target = soft
    if target >= needed:
        return None
    if not inflight:  # a scripted run: its workers' pipes alone
        return (
            f"warning: {workers} worker(s) need about {needed} open files, but this process may hold "
            f"{target} (ulimit -n, its hard limit {_soft_hard(hard)}): workers past it cannot start ('Too "
            "many open files'); raise ulimit -n or lower --cpu-workers"
        )
    return (
        f"warning: {inflight} model requests in flight and {workers} worker(s) need about {needed} open "
        f"files, but this process may hold {target} (ulimit -n, its hard limit {_soft_hard(hard)}): "
        "requests past it fail as transport errors ('Too many open files') and open the circuit as if the "
        "server were down; raise ulimit -n or lower --max-inflight-model-requests"
    )


#: The open files a server raises its soft limit to (vLLM's API server does the same with 65,535): a
#: connection per request a client has in flight, whatever the batch holds.
SERVER_OPEN_FILES = 65535


def open_files_for_server(target: int = SERVER_OPEN_FILES) -> int:
    """Raise the soft open-files limit (``ulimit -n``) towards ``target``, as far as the hard limit
    allows, as a server does that must take a connection per request its clients have in flight (under a
    common ``ulimit -n 1024`` a client with 1,024 in flight ran serve-sim out of descriptors). Returns the
    soft limit now in force; never lowers it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft
    wanted = target if hard == resource.RLIM_INFINITY else min(hard, target)
    if wanted > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
    return soft


def _soft_hard(limit: int) -> str:
    return "unlimited" if limit == resource.RLIM_INFINITY else str(limit)
