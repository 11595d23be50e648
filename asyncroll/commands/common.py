"""What every command shares: the option shorthand, a usage error, stdout that outlives its reader
(:func:`say`), the run warnings and the compact summary line."""

from __future__ import annotations

import codecs
import contextlib
import errno
import os
import shlex
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import typer

Opt = typer.Option
_stdout_lost: list[bool] = []  # once stdout's reader has gone (say)

#: ``--policy`` help, shared by ``run`` and ``simulate`` (the registry in asyncroll.policies is the truth).
POLICY_HELP = (
    "sync | fifo (the default) | tool_first | gpu_first (deprecated alias) | asyncroll (the "
    "pressure-aware policy: asyncroll_repair); for comparison: asyncroll_chain, asyncroll_critical, "
    "asyncroll_balanced, asyncroll_unlock, asyncroll_seed, asyncroll_guarded"
)


def warn_sync_active(policy: str, given: Iterable[str], active: int) -> None:
    """``--policy sync`` runs one trajectory at a time: an active limit given above 1 is said to do
    nothing (run.json's ``config.limits`` records the 1 in effect)."""
    if policy == "sync" and "max_active_trajectories" in given and active > 1:
        typer.echo(
            f"warning: --policy sync runs one trajectory at a time: --max-active-trajectories {active} has "
            "no effect",
            err=True,
        )


def warn_inflight_past_active(policy: str, given: Iterable[str], inflight: int, active: int) -> None:
    """An inflight limit given above the active one (one, under ``sync``) said to do nothing: a trajectory
    has at most one model request at a time, so no more than the active trajectories are ever in flight
    (the summary's model capacity is the smaller of the two)."""
    in_effect = 1 if policy == "sync" else active
    if "max_inflight_model_requests" in set(given) and inflight > in_effect:
        above = "--policy sync's one" if policy == "sync" else f"--max-active-trajectories {active}"
        typer.echo(
            f"warning: --max-inflight-model-requests {inflight} has no effect above {above}: a trajectory "
            f"has one model request at a time at most, so {in_effect} at most are ever in flight",
            err=True,
        )


def note_workers_past_cpus(workers: int) -> None:
    """Say on stderr when a run has more tool workers than CPUs it may use (its affinity mask, its cgroup's
    CPU quota: a cpuset, ``docker --cpus``): CPU-bound tools then take turns on them, and their execute
    times include the wait for a CPU. Tools that sleep or wait on I/O are not slowed, so it is no error."""
    from asyncroll.cpus import usable_cpus

    cpus = usable_cpus()
    if workers > cpus:
        typer.echo(
            f"note: --cpu-workers {workers}, but this process may use {cpus} CPU(s) (affinity mask, cgroup "
            "quota): CPU-bound tools take turns on them, and their execute times include the wait for a CPU",
            err=True,
        )


#: Settings only a code evaluation (``lcb_evaluate``) reads: config field → flag.
EVALUATOR_SETTINGS = {
    "test_timeout": "--test-timeout",
    "evaluation_timeout": "--evaluation-timeout",
    "test_memory_mb": "--test-memory-mb",
    "allow_weak_isolation": "--allow-weak-isolation",
}


def warn_no_evaluations(given: Iterable[str], tools: Iterable[str]) -> None:
    """The evaluator's settings among ``given`` said to do nothing when no problem of the workload
    evaluates code (no ``lcb_evaluate``): a flag that silently does nothing misleads."""
    from asyncroll.workload.models import EVALUATOR_TOOL

    given = set(given)  # read once: an iterator would be spent by the first setting's test
    unread = [flag for key, flag in EVALUATOR_SETTINGS.items() if key in given]
    if unread and EVALUATOR_TOOL not in set(tools):
        verb = "has" if len(unread) == 1 else "have"
        typer.echo(
            f"warning: {', '.join(unread)} {verb} no effect: no problem of the workload evaluates code "
            f"({EVALUATOR_TOOL})",
            err=True,
        )


def warn_no_telemetry_source(cfg: Any) -> None:
    """``--telemetry-interval`` said to do nothing when the run samples no telemetry source (no
    ``--metrics-url``, no declared vLLM/SGLang server, no ``--nvml-device``): run.json would record an
    interval nothing was sampled at."""
    if "telemetry_interval" not in cfg.model_fields_set:
        return
    from asyncroll.telemetry import REQUESTED_BY
    from asyncroll.telemetry.sampler import metrics_url

    if cfg.telemetry and metrics_url(cfg) is None and cfg.nvml_device is None:
        typer.echo(
            f"warning: --telemetry-interval has no effect: no telemetry source is sampled ({REQUESTED_BY})",
            err=True,
        )


def warn_replay_structured(cfg: Any) -> None:
    """``--structured-output``/``--no-structured-output`` said to do nothing with ``--replay``: a replay
    sends no response_format (its actions are the script's; run.json's ``backend.structured_output``)."""
    if cfg.replay and "structured_output" in cfg.model_fields_set:
        switch = "--structured-output" if cfg.structured_output else "--no-structured-output"
        typer.echo(
            f"warning: {switch} has no effect with --replay (a replay sends no response_format: its "
            "actions are the workload's scripted ones)",
            err=True,
        )


#: HTTP settings read only by a mechanism another setting can turn off: config field → (flag, the
#: setting that turns it off, its value then, what is then never done).
UNREAD_WHEN_OFF = {
    "retry_max_delay": ("--retry-max-delay", "max_retries", 0, "no request is retried"),
    "server_down_timeout": ("--server-down-timeout", "circuit_failures", 0, "the circuit never opens"),
}


def warn_mechanism_off(cfg: Any) -> None:
    """``--retry-max-delay`` said to do nothing without retries (``--max-retries 0``, the default) and
    ``--server-down-timeout`` without a circuit (``--circuit-failures 0``): run.json would record a
    setting that nothing read."""
    for name, (flag, switch, off, why) in UNREAD_WHEN_OFF.items():
        if name in cfg.model_fields_set and getattr(cfg, switch) == off:
            typer.echo(
                f"warning: {flag} has no effect with --{switch.replace('_', '-')} {off} ({why})", err=True
            )


def note_limit_past(limit: int | None, count: int, done: str) -> None:
    """Say so when the workload held fewer problems than ``--limit`` asked for (``done``: what became of
    them, ``run``), as the converters say it: a protocol that names a batch size should not find out from
    the summary's count later."""
    if limit is not None and count < limit:
        typer.echo(
            f"note: --limit {limit} asked for more problems than the workload holds: {count} {done}",
            err=True,
        )


def open_files_for_requests(cfg: Any) -> None:
    """Before a run: room under ``ulimit -n`` for its workers' pipes and, against a server, a connection per
    request in flight (:func:`asyncroll.process_limits.open_files_for`), said on stderr where the hard limit
    leaves none. A trajectory has one request in flight at a time: no more than the active ones are. The
    HTTP backend's pools (one per :data:`~asyncroll.backends.transport.POOL_SHARE` of the inflight limit)
    each keep alive as many connections as they held at once, up to one more than an even split of those
    in flight: 750 for 600 in flight over 250 pools (tests/test_transport_pools.py)."""
    from asyncroll.process_limits import open_files_for

    limits = cfg.limits
    inflight = connections = 0
    if cfg.backend != "scripted":
        from asyncroll.backends.transport import POOL_SHARE

        most = limits.max_inflight_model_requests
        inflight = min(most, limits.max_active_trajectories)
        connections = min(most, inflight + -(-most // POOL_SHARE))
    warning = open_files_for(inflight, cfg.limits.cpu_workers, connections)
    if warning is not None:
        typer.echo(warning, err=True)


def warn_low_address_space() -> None:
    """Said before a run or simulation starts (a hang in its start-up would leave nothing said): a low
    ``ulimit -v`` (:func:`asyncroll.process_limits.address_space_warning`)."""
    from asyncroll.process_limits import address_space_warning

    if (warning := address_space_warning()) is not None:
        typer.echo(warning, err=True)


def warn_weak_isolation(isolation: dict[str, Any] | None) -> None:
    """Say on stderr which sandbox layers a run of untrusted code goes without, when
    ``--allow-weak-isolation`` (or a config file's ``allow_weak_isolation``) let it start without them."""
    if isolation and isolation.get("weak"):
        typer.echo(
            "warning: untrusted code runs with weak isolation (--allow-weak-isolation): missing "
            f"{', '.join(isolation['missing'])}; why each is missing: run.json, isolation.untrusted_code",
            err=True,
        )


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``error: message`` on stderr and return the exit to raise (2: a usage error)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def say(text: str) -> None:
    """``text`` on stdout. A reader that has gone (``| head -1`` once head has exited, a ``tee`` that
    ended), or a stdout on a full disk, silences stdout for the rest of the command instead of ending it
    there with a ``BrokenPipeError`` or ``OSError``: what it still has to do, and to say on stderr (a
    run's error), is done and said; it then exits 1, as click's own commands do on a broken pipe
    (:func:`stdout_lost`, ``cli.main``). A stdout closed before the command started (``>&-``: Python has
    no ``sys.stdout`` then) is one too: the output asked for goes nowhere."""
    if _stdout_lost:
        return
    if sys.stdout is None:
        _stdout_lost.append(True)
        return
    try:
        _echo_whole(text)
    except OSError:  # EPIPE; ENOSPC (> /dev/full, a file on a full disk)
        _stdout_lost.append(True)
        try:  # what is still buffered, and the interpreter's last flush, go nowhere instead of failing
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):  # a stdout with no descriptor of its own
            pass


def _echo_whole(text: str) -> None:
    """``typer.echo(text)``, but a short write is not taken for a whole one: a reader that leaves while a
    write waits for room in the pipe (``asyncroll schema | head -1``: 90 kB) makes the buffered stdout
    return a short count, which the text layer drops with the rest of the text, unsaid. The rest is
    written again here, and fails as a reader that had gone before does (EPIPE)."""
    stream = sys.stdout
    buffer = getattr(stream, "buffer", None)
    if buffer is None:  # a stream of text alone (or none: stdout closed): as typer writes it
        typer.echo(text)
        return
    stream.flush()
    rest = memoryview(stdout_bytes(f"{text}\n", stream.encoding))
    while rest:
        written = buffer.write(rest)
        rest = rest[written or len(rest) :]  # None or 0 (no room, non-blocking): as the text layer did
    buffer.flush()


def _bytes_or_escape(exc: UnicodeError) -> tuple[str | bytes, int]:
    """An encoding error handler: a byte Python decoded with ``surrogateescape`` (a file name that is not
    UTF-8, given as an argument) is that byte again; anything else the encoding cannot hold is its
    backslash escape."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    char = exc.object[exc.start]
    if 0xDC80 <= ord(char) <= 0xDCFF:
        return bytes([ord(char) - 0xDC00]), exc.start + 1
    return char.encode("ascii", "backslashreplace").decode("ascii"), exc.start + 1


codecs.register_error("asyncroll_bytes_or_escape", _bytes_or_escape)


def stdout_bytes(text: str, encoding: str | None) -> bytes:
    """``text`` as stdout's bytes. An ASCII stdout (``LC_ALL=C`` with UTF-8 mode off) gets UTF-8, as click
    writes to one (the ×, ÷, → and … of the help pages and reports were a UnicodeEncodeError); a name given
    as a path keeps its bytes, under a locale whose stdout is strict (en_US.UTF-8) too."""
    encoding = encoding or "utf-8"
    if codecs.lookup(encoding).name == "ascii":
        encoding = "utf-8"
    return text.encode(encoding, "asyncroll_bytes_or_escape")


def stderr_keeps_paths() -> None:
    """stderr writes a path as it was given, as :func:`say` does on stdout: an argument Python decoded with
    ``surrogateescape`` (any non-ASCII name under an ASCII locale, a non-UTF-8 byte under a UTF-8 one) is
    its bytes again, where click wrote a '?' per byte (an ASCII stderr, which click writes UTF-8 to) or
    Python the escape ``\\udce9``. Anything else the encoding cannot hold stays backslash-escaped."""
    stream = sys.stderr
    if stream is None or not hasattr(stream, "reconfigure"):  # closed (`2>&-`), or replaced by a caller
        return
    encoding = stream.encoding or "utf-8"
    if codecs.lookup(encoding).name == "ascii":
        encoding = "utf-8"  # as click writes to an ASCII stream
    with contextlib.suppress(OSError, ValueError, LookupError):
        stream.reconfigure(encoding=encoding, errors="asyncroll_bytes_or_escape")


class _StderrOrNothing:
    """``sys.stderr``, but a write or flush that fails (its reader gone: ``2>&1 | head -2`` once head has
    exited; a full disk) points descriptor 2 at ``/dev/null`` instead of raising, as Python's documented
    recipe for a broken pipe does: a message is not the command, which goes on and exits with its own
    code (2 for a validation error whose lines did not all arrive, not 1 from a ``BrokenPipeError``)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            written = self._stream.write(text)
        except BlockingIOError:  # a non-blocking stderr that is full for now: its reader is still there
            raise
        except OSError:
            self._silence()
            return len(text)
        return len(text) if written is None else int(written)  # a stand-in's write may return nothing

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BlockingIOError:
            raise
        except OSError:
            self._silence()

    def _silence(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # a stderr with no descriptor of its own
            fd = self._stream.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, fd)
            finally:
                os.close(devnull)
        with contextlib.suppress(OSError, ValueError):  # what was buffered goes there
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:  # encoding, errors, isatty, fileno, reconfigure: the stream's
        return getattr(self._stream, name)


def stderr_may_go() -> None:
    """A reader of stderr that goes away silences stderr for the rest of the command
    (:class:`_StderrOrNothing`)."""
    if sys.stderr is not None and not isinstance(sys.stderr, _StderrOrNothing):
        sys.stderr = _StderrOrNothing(sys.stderr)


def stdout_lost() -> bool:
    """Whether :func:`say` found stdout's reader gone during this command."""
    return bool(_stdout_lost)


def _per_hour(rate: float | None) -> str:
    """One decimal, two significant digits below 1: days-long trajectories' 0.042 an hour is no "0.0"."""
    return "n/a" if rate is None else f"{rate:.1f}" if rate >= 1 or rate == 0 else f"{rate:.2g}"


def seconds(value: float, unit: str = "s") -> str:
    """A duration to the millisecond, to the microsecond below one (a run of µs turns: no "0.000s")."""
    return f"{value:.3f}{unit}" if value == 0 or abs(value) >= 0.001 else f"{value:.6f}{unit}"


def print_summary(summary: dict[str, Any] | None, output: Path, *, gone: bool = False) -> None:
    """The run's one summary line and where its files are (``gone``: its directory was removed while it
    ran, whatever is at ``output`` now)."""
    if not summary:
        return
    c, acc, sch = summary["counts"], summary["accuracy"], summary["scheduler"]
    tput = summary["throughput"]["completed_per_wall_hour"]
    exact = "n/a" if acc["exact"] is None else f"{acc['exact']:.3f}"
    makespan = "n/a" if summary["makespan_s"] is None else seconds(summary["makespan_s"])
    if summary.get("clock") == "virtual":  # a simulation: not seconds anybody waited
        makespan += " (virtual clock)"
    evaluated = summary["tools"]["jobs_by_kind"].get("evaluate", 0)
    evaluations = f", code evaluations {evaluated}" if evaluated else ""
    where = f"{output} (no longer there)" if gone or not output.exists() else output  # removed as it ran
    if summary["makespan_s"] is None and not c["trajectories"]:  # it ended before its clock started
        say(f"{summary['status']} before the measurement started: no trajectory ran\noutputs: {where}")
        return
    unfinished = f", {c['unfinished']} unfinished" if c.get("unfinished") else ""  # cut by a stop or failure
    say(
        f"{summary['status']}: {c['completed']}/{c['trajectories']} completed, {c['failed']} failed, "
        f"{c['max_turns']} max_turns{unfinished} | tool calls {summary['tools']['calls']}{evaluations} | "
        f"exact accuracy {exact} (n={acc['denominator']}) | makespan {makespan} | "
        f"{_per_hour(tput)} completed/h | policy {_policy(sch)}: "
        f"{sch['decisions']} decisions, {sch['reorders']} reorders | worker restarts "
        f"{summary['workers']['restarts']}\noutputs: {where}"
    )


def _policy(scheduler: dict[str, Any]) -> str:
    """``asyncroll (asyncroll_repair)``: the name given and, when it differs, the rule it ran."""
    name, rule = scheduler["policy"], scheduler.get("policy_rule")
    return name if rule in (None, name) else f"{name} ({rule})"


def warn_moved(moved_to: Path | None, output: Path) -> None:
    """Say on stderr where a run's files are when its directory was moved while it ran."""
    if moved_to is not None:
        typer.echo(f"note: {output} was moved while the run ran: its files are in {moved_to}", err=True)


def warn_exports(failed: dict[str, str], output: Path, *, gone: bool = False) -> None:
    """Say on stderr which exports were not written (a full disk, say, or skipped by a stop signal), and
    how to write them later (not when the run's directory was removed while it ran, ``gone``: what is at
    ``output`` now, if anything, is not the run's)."""
    from asyncroll.outputs.rundir import skipped as exports_skipped

    for name, why in failed.items():
        skipped = exports_skipped(why)  # a stop signal during the exports
        said = f"was {why}" if skipped else f"was not written ({why})"
        if gone or not (output / "events.jsonl").is_file():  # a directory removed while the run ran
            typer.echo(f"warning: {name} {said}", err=True)
            continue
        # a full disk, a quota, a file size limit: not a descriptor limit (ulimit -n) nor a refusal
        room = any(f"[Errno {e}]" in why for e in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG))
        typer.echo(
            f"warning: {name} {said}; `asyncroll timeline {shlex.quote(str(output))}` writes it from "
            "events.jsonl" + (" once there is room" if room and not skipped else ""),
            err=True,
        )
