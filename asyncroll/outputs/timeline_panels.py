"""The text panels of ``timeline.html``: the header lines and the telemetry section.

Both are label/value pairs read from ``run.json`` (or the final status about to be written to it),
``summary.json`` and the run's :class:`~asyncroll.outputs.activity_model.Activity`; every field is
optional (the files evolve separately) and a missing value reads "unknown", never zero.
"""

from __future__ import annotations

import json
from typing import Any

from asyncroll.floats import left_to_right_sum
from asyncroll.outputs.activity_model import RESOURCE_LABELS, Activity


def _sub(d: Any, key: str) -> dict[str, Any]:
    value = d.get(key) if isinstance(d, dict) else None
    return value if isinstance(value, dict) else {}


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "unknown"
    if isinstance(value, float):
        # three decimals, one past 1,000 (no rate to the thousandth), three significant digits below 0.1:
        # a measured 0.0004 read 0, a value drawn as zero
        if 0 < abs(value) < 0.1:
            return f"{value:.3g}" + unit
        return f"{value:,.{1 if abs(value) >= 1000 else 3}f}".rstrip("0").rstrip(".") + unit
    return (f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)) + unit


def _never_started(counts: dict[str, Any], workload: dict[str, Any]) -> str:
    """``, 200 of the workload's 200 never started``: a run stopped before it started them all read
    "0 of 0 completed", as if its workload were empty (``counts.trajectories`` counts those started)."""
    started, problems = counts.get("trajectories"), workload.get("problems")
    if not isinstance(started, int) or not isinstance(problems, int) or problems <= started:
        return ""
    return f", {problems - started:,} of the workload's {problems:,} never started"


def _status(status: Any, error: str | None) -> str:
    """``interrupted (by SIGINT)``, not ``interrupted (interrupted by SIGINT)``: an error that starts by
    naming the status says it once."""
    shown = _fmt(status)
    if not error:
        return shown
    if isinstance(status, str) and error.startswith(f"{status} "):
        error = error[len(status) + 1 :]
    return f"{shown} ({error})"


def header_lines(a: Activity, run: dict[str, Any], summary: dict[str, Any]) -> list[list[str]]:
    """Label/value pairs for the page header; every field is optional (summaries evolve separately)."""
    config, counts, sched = _sub(run, "config"), _sub(summary, "counts"), _sub(summary, "scheduler")

    def pick(key: str) -> Any:
        for source in (config, _sub(summary, "limits"), a.run):
            if source.get(key) is not None:
                return source[key]
        return None

    status = run.get("status")  # exports run before the receipt is final: then the events know better
    if status in (None, "preparing", "running") and a.run.get("status"):
        status = a.run["status"]
    error = str(run["error"])[:300] if run.get("error") else None
    makespan = summary.get("makespan_s", a.run.get("makespan_s"))
    simulated = run.get("simulated") is True  # run.json marks a simulation: its times are not measured
    per_hour = " completed / simulated hour" if simulated else " completed / wall hour"
    limits = (
        f"active {_fmt(pick('max_active_trajectories'))}"
        f" · inflight {_fmt(pick('max_inflight_model_requests'))}"
        f" · CPU workers {_fmt(pick('cpu_workers'))}"
    )
    clock = [["clock", "virtual: a simulation (asyncroll simulate), no process or server ran"]]
    return [
        ["status", _status(status, error)],
        *(clock if simulated else []),
        ["policy", _policy(config.get("policy") or summary.get("policy") or a.run.get("policy"), config)],
        ["limits", limits],
        [
            "completions",
            f"{_fmt(counts.get('completed'))} of {_fmt(counts.get('trajectories'))} completed, "
            f"{_fmt(counts.get('failed'))} failed" + _never_started(counts, _sub(run, "workload")),
        ],
        [
            "throughput",
            _fmt(_sub(summary, "throughput").get("completed_per_wall_hour"), per_hour),
        ],
        ["makespan", _fmt(makespan, " s")],
        ["reorders", f"{_fmt(sched.get('reorders'))} of {_fmt(sched.get('decisions'))} scheduler decisions"],
        ["sampled starvation", _starvation(_sub(summary, "resources"), makespan)],
        *_circuit(_sub(_sub(summary, "model"), "circuit"), a),
        *_stalls(_sub(summary, "event_loop")),
    ]


def _policy(name: Any, config: dict[str, Any]) -> str:
    """The policy as given, with the rule it ran where that is another name (``asyncroll``'s pressure rule,
    a deprecated alias's policy), as the run's summary line says it: ``asyncroll (asyncroll_repair)``."""
    rule = config.get("policy_canonical")
    return _fmt(name) + (f" ({rule})" if name and isinstance(rule, str) and rule != name else "")


def _circuit(circuit: dict[str, Any], a: Activity) -> list[list[str]]:
    """A header line when the inference server was unavailable (the HTTP backend's circuit opened)."""
    opened = circuit.get("opened")
    if not isinstance(opened, int) or not opened:
        drawn = sum(1 for s in a.spans if s.cat == "circuit" and s.track == ("scheduler", 0))
        return [["server unavailable", f"{_times(drawn)} (scheduler row)"]] if drawn else []
    text = f"{_times(opened)}, admission paused {_fmt(circuit.get('paused_s'), ' s')} in the measured window"
    if circuit.get("open_at_end"):
        text += " (still unavailable at its end)"
    waited = circuit.get("requests_waited")
    if waited:
        text += (
            f"; {_fmt(waited)} request{'s' if waited != 1 else ''} waited"
            f" {_fmt(circuit.get('request_wait_s'), ' s')} for it (inside model latency)"
        )
    return [["server unavailable", text]]


def _stalls(loop: dict[str, Any]) -> list[list[str]]:
    """A header line when the client's event loop stalled (``loop_stalled``): all waited for it; another
    when the process was stopped (``process_stopped``: job control)."""
    stalls, stops = loop.get("stalls"), loop.get("stops")
    lines = []
    if isinstance(stops, int) and stops:
        lines.append(
            [
                "process stopped",
                f"{_times(stops)}, {_fmt(loop.get('stopped_s'), ' s')} in the measured window (job control: "
                "Ctrl-Z, SIGSTOP; scheduler row): inside the makespan, no stall of the event loop",
            ]
        )
    if not isinstance(stalls, int) or not stalls:
        return lines
    return [
        *lines,
        [
            "event loop stalled",
            f"{_times(stalls)}, {_fmt(loop.get('stalled_s'), ' s')} in the measured window (longest "
            f"{_fmt(loop.get('longest_stall_s'), ' s')}; scheduler row): admission, dispatch and reading "
            "waited for it",
        ],
    ]


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n:,} times"


def _pct(x: Any) -> str:
    return "unknown" if not isinstance(x, int | float) else f"{100 * x:.1f}%"


def _starvation(res: dict[str, Any], makespan: Any) -> str:
    """Sampled model starvation with the coverage it was measured on, or why it is unknown."""
    if not res:
        return "unknown (no resources section in summary.json)"
    seconds = res.get("sampled_starvation_s")
    if seconds is None:
        return f"unknown: {res.get('sampled_starvation_reason') or 'no covered server window'}"
    covered = res.get("sampled_starvation_coverage_s")
    return (
        f"{_fmt(seconds, ' s')} = {_pct(res.get('sampled_starvation_fraction_of_coverage'))} of"
        f" {_fmt(covered, ' s')} covered by server samples"
        f" (coverage {_pct(res.get('server_coverage_fraction'))} of the {_fmt(makespan, ' s')} makespan)"
    )


def telemetry_panel(a: Activity, run: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    """Which telemetry sources were available, and why not: from the run's ``resource_probe`` event (or the
    receipt's copy), plus the sample counts and null reasons of ``summary.json``."""
    receipt, tele = _sub(run, "telemetry"), _sub(summary, "telemetry")
    probed = a.telemetry_sources
    if probed is None and isinstance(receipt.get("sources"), list):
        probed = [s for s in receipt["sources"] if isinstance(s, dict)]
    sources = [
        [
            str(s.get("source")),
            "available" if s.get("available") else "unavailable",
            "" if s.get("available") else str(s.get("reason") or "no reason recorded"),
        ]
        for s in probed or []
    ]
    note = receipt.get("note") or tele.get("note")
    if not sources and not note:
        note = "no telemetry probe recorded in this run (an older run, or it stopped before the probe)"
    if receipt.get("requested") is False:
        note = "telemetry off (--no-telemetry)"
    lines = [["samples", _fmt(tele.get("samples", a.resource_samples))]]
    if tele.get("interval_s") is not None:
        lines.append(["interval", _fmt(tele["interval_s"], " s")])
    for name, detail in _sub(tele, "sources").items():  # what the probe learned of each source
        for key, value in (detail if isinstance(detail, dict) else {}).items():
            if value is None:  # e.g. no reason for an available source
                continue
            text = json.dumps(value)[:200] if isinstance(value, list | dict) else _fmt(value)
            lines.append([f"{name}.{key}", text])
    for name, value in _sub(tele, "values").items():  # {n, mean, max} of the samples with a value
        shown = [
            f"{k} {_fmt(value[k])}" for k in ("mean", "max", "n") if isinstance(value, dict) and k in value
        ]
        lines.append([name, ", ".join(shown) or json.dumps(value)[:200]])
    if tele.get("counter_resets"):
        lines.append(["counter resets", _fmt(tele["counter_resets"])])
    nulls = tele.get("nulls")
    if isinstance(nulls, dict) and nulls:
        lines.append(
            ["null values", "; ".join(f"{k}: {json.dumps(v)}" for k, v in list(nulls.items())[:12])[:400]]
        )
    if tele.get("errors"):
        lines.append(["sampling errors", _fmt(tele["errors"])])
    drawn = [RESOURCE_LABELS[k] for k in RESOURCE_LABELS if a.counters.get(k)]
    lines.append(["drawn as counters", ", ".join(drawn) or "none (no sample carried a value)"])
    if a.counter_gaps:
        parts = []
        for name in RESOURCE_LABELS:
            gaps = [g for g in a.counter_gaps if g.name == name]
            if gaps:
                seconds = left_to_right_sum(g.end - g.start for g in gaps)
                reasons = sorted({r for g in gaps for r in g.reasons})
                parts.append(f"{RESOURCE_LABELS[name]}: {len(gaps)} ({seconds:.3g} s; {', '.join(reasons)})")
        lines.append(["gaps (lines broken)", "; ".join(parts)[:400]])
    return {"sources": sources, "note": note, "lines": lines[:60]}
