"""What a run's outputs say that stderr must say too, once it ended: a telemetry source it asked for and
went without, event loop stalls and stops of the process, a server still down (or never reached), a
replay whose decode length was not fixed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from asyncroll.errors import SERVER_DOWN_SAID


def warn_telemetry(summary: dict[str, Any] | None) -> None:
    """Say on stderr which telemetry source the run asked for (``--metrics-url``, a declared server's
    ``/metrics``, ``--nvml-device``) was unavailable, and why: a run that measured without it must not
    look like one that measured with it (the reason is also in summary.json's ``telemetry.sources``)."""
    sources = ((summary or {}).get("telemetry") or {}).get("sources") or {}
    for name, status in sources.items():
        if not status.get("available"):
            typer.echo(
                f"warning: telemetry: {name} unavailable ({status.get('reason')}): this run has no {name} "
                "values (summary.json: telemetry.sources)",
                err=True,
            )


def warn_loop_stalls(summary: dict[str, Any] | None) -> None:
    """Say on stderr that the client's event loop stalled for a good part of the run (summary.json's
    ``event_loop``): for that long admission, dispatch and the reading of responses waited for the loop,
    and the queue waits and latencies measured include it, whatever the policy did. A stop of the whole
    process (job control: ``stopped_s``) is said apart, from half a second on: it is no stall."""
    from asyncroll.outputs.pauses import STALLED_WARNING_FRACTION, STALLED_WARNING_S

    loop = (summary or {}).get("event_loop") or {}
    stopped, stopped_fraction = loop.get("stopped_s"), loop.get("stopped_fraction_of_makespan")
    if isinstance(stopped, (int, float)) and stopped >= STALLED_WARNING_S:
        share = f" ({100 * stopped_fraction:.0f}% of the makespan)" if stopped_fraction is not None else ""
        typer.echo(
            f"warning: the process was stopped (job control: Ctrl-Z, SIGSTOP) {loop.get('stops')} time(s), "
            f"for {stopped:.3f} s in all{share}: the makespan and the completed-per-hour rate include that "
            "time, and so do the queue waits and latencies that spanned it (summary.json: event_loop)",
            err=True,
        )
    fraction, stalled = loop.get("fraction_of_makespan"), loop.get("stalled_s")
    if not isinstance(fraction, (int, float)) or not isinstance(stalled, (int, float)):
        return
    if fraction < STALLED_WARNING_FRACTION or stalled < STALLED_WARNING_S:
        return
    typer.echo(
        f"warning: the client's event loop stalled {loop.get('stalls')} time(s), {stalled:.3f} s in all "
        f"({100 * fraction:.0f}% of the makespan; longest {loop.get('longest_stall_s'):.3f} s): meanwhile "
        "admission, dispatch and the reading of responses waited for the loop (a blocking call in the "
        "client, more work than the loop could run, or no CPU to spare for it), and queue waits and "
        "latencies include that time (summary.json: event_loop)",
        err=True,
    )


def written_summary(output: Path) -> dict[str, Any] | None:
    """The run's summary.json as written (an interrupted run's outcome carries none), or None."""
    from asyncroll.json_depth import read_json_object

    return read_json_object(output / "summary.json")  # None: not written (stopped before it)


def warn_server_down(summary: dict[str, Any] | None, error: str | None = None) -> None:
    """Say on stderr that the HTTP server was still unavailable when the run ended: a run whose every
    trajectory failed at the outage ends ``complete`` (exit 0) with nothing else saying so
    (summary.json's ``model.circuit.open_at_end``). A run whose every model request failed, the circuit
    never open (fewer failures than ``--circuit-failures``, or it off), is said too, also when a stop cut
    the requests still running (kind ``cancelled``). ``error``: the run's own, printed after this; one
    that is the outage (``--server-down-timeout`` ran out) says it already, and better: the warning's
    "trajectories that failed at the outage" were, there, cut by the run's failure, not failed."""
    model = (summary or {}).get("model") or {}
    circuit = model.get("circuit") or {}
    failed = model.get("failed") or {}
    if circuit.get("open_at_end"):
        if error is not None and SERVER_DOWN_SAID in error:
            return
        paused = circuit.get("paused_s")
        seconds = f"{paused:.3f} s" if isinstance(paused, (int, float)) else "an unknown time"
        # a stop during the outage may have come before any trajectory failed at it: not said to have
        none_failed = ((summary or {}).get("counts") or {}).get("failed") == 0
        told = (
            "no trajectory failed (summary.json: model.circuit)"
            if none_failed
            else "trajectories that failed at the outage are counted failed (summary.json: model.circuit, "
            "model.failed)"
        )
        typer.echo(
            f"warning: the server was still unavailable when the run ended (admission paused "
            f"{circuit.get('opened')} time(s), {seconds} in all): {told}",
            err=True,
        )
    # only failures of reaching the server: replies it gave (invalid actions, a scripted backend's own
    # failures) say it is up; the requests a stop cut (cancelled) and those a script's error step failed
    # (``--replay``: no request sent) say nothing either way
    elif (ended := _unanswered(failed, model.get("scripted_failures"))) and not model.get("finished"):
        if not set(ended) <= {"transport", "timeout", "http_status"}:
            return
        kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(ended.items()))
        # every one answered with an error status (a 400 for a --max-tokens past the served context): the
        # server is up, and its answer is the trajectories' error
        statuses = ", ".join(f"{code} ×{n}" for code, n in (model.get("failed_statuses") or {}).items())
        ask = (
            "the server answered each with an error status" + (f" ({statuses})" if statuses else "")
            if set(ended) == {"http_status"}
            else "is the server up?"
        )
        typer.echo(
            f"warning: no model request succeeded ({sum(ended.values())} failed: {kinds}): {ask} "
            "(results.jsonl: each trajectory's error)",
            err=True,
        )


def _unanswered(failed: dict[str, int], scripted: dict[str, int] | None) -> dict[str, int]:
    """The failed requests by kind less those a stop cut and those a script failed (summary.json's
    ``model.scripted_failures``; none in a summary written before it)."""
    left = {k: n - (scripted or {}).get(k, 0) for k, n in failed.items() if k != "cancelled"}
    return {k: n for k, n in left.items() if n > 0}


def warn_replay_length_unfixed(output: Path) -> None:
    """Say on stderr that a replay's decode length was not fixed: on a server probed as ``generic`` (one
    naming no engine, e.g. an older ``transformers serve``) ``max_tokens`` is an upper bound only, and a
    reply that ended early reads as ``finish_reason stop`` with nothing else saying so (run.json:
    ``backend.replay_fixed_length``)."""
    from asyncroll.json_depth import read_json_object

    backend = (read_json_object(output / "run.json") or {}).get("backend")
    if not isinstance(backend, dict):
        return  # no receipt to read: the run's own error says why
    fixed = backend.get("replay_fixed_length")
    if backend.get("mode") == "replay" and isinstance(fixed, str) and fixed.startswith("none"):
        typer.echo(
            f"warning: --replay: the decode length was not fixed on this server (kind "
            f"{backend.get('server_kind')}, {backend.get('server_kind_source')}): max_tokens is an upper "
            "bound only, so replies may be shorter than scripted; declare --server-kind "
            "vllm|sglang|transformers if it is one of them",
            err=True,
        )
