"""Telemetry in trace.json and timeline.html: samples drawn as counters, null samples as gaps (never the
last value), the probe's sources in the panel, and a server outage drawn."""

from __future__ import annotations

import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from asyncroll import events as ev
from asyncroll.outputs.timeline import timeline_data, write_timeline
from tests.export_checks import check_trace_format, chromium_page, load_trace, named_threads, page_data
from tests.synthetic_runs import make_run, trajectory


def telemetry_events() -> list[ev.Event]:
    probe = ev.ResourceProbe(
        t=-0.1,
        interval_s=0.2,
        sources=[
            ev.SourceStatus(source="server_metrics", available=True, collection_s=0.01),
            ev.SourceStatus(
                source="nvml", available=False, reason="NVML not installed (pip install '.[telemetry]')"
            ),
        ],
    )
    samples = [
        ev.ResourceSample(
            t=0.1 * i,
            seq=i,
            server_running=float(i % 3),
            server_waiting=None if i == 2 else 1.0,
            kv_cache_usage=0.25 * i,
            nulls={"gpu_util_pct": "missing"},
        )
        for i in range(4)
    ]
    return [probe, *samples, *trajectory("a", 0, 0.0, worker=0)]


def test_telemetry_samples_become_counters_and_the_panel_says_why_not(tmp_path: Path) -> None:
    summary = {
        "telemetry": {
            "samples": 4,
            "nulls": {"gpu_util_pct": {"missing": 4}},
            "values": {"server_running": {"n": 4, "mean": 0.75, "max": 2.0}},
        },
        "resources": {
            "sampled_starvation_s": 0.05,
            "sampled_starvation_fraction_of_coverage": 0.1,
            "sampled_starvation_coverage_s": 0.5,
            "server_coverage_fraction": 0.8,
        },
        "makespan_s": 0.6,
    }
    run = make_run(tmp_path, telemetry_events(), summary=summary)
    trace = load_trace(run)
    body = check_trace_format(trace)
    procs = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert procs[5] == "telemetry"
    series: dict[str, list[float]] = defaultdict(list)
    for e in body:
        if e["ph"] == "C" and e["pid"] == 5:
            series[e["name"]].append(e["args"]["value"])
    assert series == {
        "server requests running": [0.0, 1.0, 2.0, 0.0],
        # equal values are not repeated, except after a null sample: the value is drawn anew past the gap
        "server requests waiting": [1.0, 1.0],
        "server KV-cache usage": [0.0, 0.25, 0.5, 0.75],
    }
    [gap] = [e for e in body if e["ph"] == "X" and e["pid"] == 5]  # the null sample is a "no data" slice
    assert gap["name"] == "no data (missing)" and gap["args"] == {
        "field": "server_waiting",
        "samples": 1,
        "reasons": ["missing"],
    }
    assert (gap["ts"], gap["dur"]) == (300_000, 100_000)  # from the null sample to the next value
    probe = next(e for e in body if e["name"] == "telemetry probe")
    assert probe["args"]["available"] == ["server_metrics"] and probe["args"]["nvml"].startswith(
        "unavailable: NVML"
    )
    assert trace["metadata"]["resource_samples"] == 4
    data = timeline_data(run)
    assert data["telemetry"]["sources"] == [
        ["server_metrics", "available", ""],
        ["nvml", "unavailable", "NVML not installed (pip install '.[telemetry]')"],
    ]
    lines = dict(data["telemetry"]["lines"])
    assert lines["samples"] == "4" and lines["null values"] == 'gpu_util_pct: {"missing": 4}'
    # was "mean server_running": '{"n": 4, "mean": 0.75, "max": 2.0}', a label over a JSON object
    assert lines["server_running"] == "mean 0.75, max 2, n 4"
    assert (
        lines["drawn as counters"]
        == "server requests running, server requests waiting, server KV-cache usage"
    )
    assert len(data["counters"]) == 6
    # a counter's colour follows its name: "server requests running" is the 4th colour in every run's page
    # (it was the counter's place on the page, which changes with the counters a run has)
    colours = dict(zip([label for label, _ in data["counters"]], data["counter_colours"], strict=True))
    assert colours["server requests running"] == 3 and colours["CPU queue depth"] == 0
    assert len(set(data["counter_colours"])) == 6
    assert dict(data["header"])["sampled starvation"] == (
        "0.05 s = 10.0% of 0.5 s covered by server samples (coverage 80.0% of the 0.6 s makespan)"
    )


def outage_events() -> list[ev.Event]:
    """A server that dies at 0.3 s (metrics unreadable, circuit open) and is back at 0.7 s; a request of
    trajectory "a" waited for it."""
    error = "server_metrics: GET http://127.0.0.1:1/metrics: ConnectError: [Errno 111] Connection refused"
    samples = []
    for i in range(10):
        t = round(0.1 * i, 6)
        if 3 <= i < 7:
            nulls = dict.fromkeys(("server_running", "server_waiting", "generation_tokens_per_s"), "error")
            samples.append(ev.ResourceSample(t=t, seq=i, nulls=nulls, errors=[error]))
        else:
            samples.append(
                ev.ResourceSample(
                    t=t, seq=i, server_running=4.0, server_waiting=0.0, generation_tokens_per_s=160.0
                )
            )
    request = [
        ev.TrajectoryStarted(t=0.25, id="a", index=0, prompt_chars=5, active=1),
        ev.ModelEnqueued(t=0.25, id="a", request_id=1, turn=0, outstanding=1),
        ev.ModelStarted(t=0.25, id="a", request_id=1, turn=0, inflight=1, queued_s=0.0),
        ev.ModelRetrying(t=0.3, id="a", turn=0, attempt=1, kind="transport", delay_s=0.01, error="x"),
        ev.ServerUnavailable(t=0.3, failures=2, reason="transport: ConnectError: refused", opened=1),
        ev.ModelPaused(t=0.7, id="a", turn=0, attempt=2, waited_s=0.39),
        ev.ServerAvailable(t=0.7, paused_s=0.4, probes=8),
        ev.ModelFinished(t=0.8, id="a", request_id=1, turn=0, latency_s=0.55, action="final"),
        ev.TrajectoryFinished(t=0.8, id="a", status="completed", turns=1, tool_calls=0, duration_s=0.55),
    ]
    probe = ev.ResourceProbe(
        t=-0.1, interval_s=0.1, sources=[ev.SourceStatus(source="server_metrics", available=True)]
    )
    return [probe, *samples, *request]


OUTAGE_SUMMARY = {
    "makespan_s": 0.9,
    "model": {
        "circuit": {
            "opened": 1,
            "paused_s": 0.4,
            "open_at_end": False,
            "requests_waited": 1,
            "request_wait_s": 0.39,
        }
    },
}


def test_null_samples_are_gaps_never_the_last_value_and_an_outage_is_drawn(tmp_path: Path) -> None:
    run = make_run(tmp_path, outage_events(), summary=OUTAGE_SUMMARY)
    trace = load_trace(run)
    body = check_trace_format(trace)  # the wait nests inside its request; the gaps on their own threads
    assert trace["metadata"]["unknown_events"] == {}
    points = [(e["ts"], e["args"]["value"]) for e in body if e["name"] == "server requests running"]
    assert points == [(100_000, 4.0), (800_000, 4.0)]  # nothing between 0.3 s and 0.7 s claims 4 requests
    gaps = {named_threads(trace)[(5, e["tid"])]: e for e in body if e["ph"] == "X" and e["pid"] == 5}
    assert set(gaps) == {
        "no data: server requests running",
        "no data: server requests waiting",
        "no data: server generation tokens/s",
    }
    gap = gaps["no data: server requests running"]
    assert gap["name"] == "no data (error)" and (gap["ts"], gap["dur"]) == (400_000, 400_000)
    assert gap["args"]["samples"] == 4 and "Connection refused" in gap["args"]["error"]
    outage = next(e for e in body if e["name"] == "server unavailable: admission paused")
    assert (outage["pid"], outage["ts"], outage["dur"]) == (4, 400_000, 400_000)
    assert outage["args"].items() >= {"failures": 2, "paused_s": 0.4, "probes": 8}.items()
    wait = next(e for e in body if e["name"] == "waiting for the server")
    request = next(e for e in body if e["name"] == "model turn 0" and e["pid"] == 1)
    assert wait["tid"] == request["tid"] and (wait["ts"], wait["dur"]) == (410_000, 390_000)

    data = timeline_data(run)
    running = dict(data["counters"])["server requests running"]
    assert running == [[100_000, 4.0], [400_000, None], [800_000, 4.0]]  # the line breaks at 0.3 s
    lines = dict(data["telemetry"]["lines"])
    assert lines["gaps (lines broken)"].startswith("server requests running: 1 (0.4 s; error)")
    assert dict(data["header"])["server unavailable"] == (
        "once, admission paused 0.4 s in the measured window; 1 request waited 0.39 s for it"
        " (inside model latency)"
    )
    assert {data["cats"][s[3]] for s in data["spans"]} >= {"circuit"}


@pytest.mark.timeout(60)
@pytest.mark.skipif(
    shutil.which("chromium") is None, reason="chromium is not installed (.ci/run installs it)"
)
def test_a_page_with_gaps_and_an_outage_draws_in_headless_chromium(tmp_path: Path) -> None:
    page = write_timeline(make_run(tmp_path, outage_events(), summary=OUTAGE_SUMMARY))
    attrs, console = chromium_page(page, tmp_path)
    assert console == [] and "error" not in attrs, attrs
    assert attrs["counters"] == str(len(page_data(page.read_text())["counters"]))


def test_small_and_large_telemetry_values_keep_their_significant_digits(tmp_path: Path) -> None:
    """A KV-cache usage of 0.02% (a small model on a large GPU) read 'mean 0, max 0' in the telemetry panel,
    a measured value drawn as zero; a rate read to the thousandth of a token ('mean 2,298.506')."""
    samples = [ev.ResourceSample(t=0.1 * i, seq=i, kv_cache_usage=0.0002 * (i + 1)) for i in range(2)]
    summary = {
        "telemetry": {
            "samples": 2,
            "values": {
                "kv_cache_usage": {"n": 2, "mean": 0.0003, "max": 0.0004},
                "prompt_tokens_per_s": {"n": 2, "mean": 2298.506, "max": 4172.72},
            },
        },
        "throughput": {"completed_per_wall_hour": 33629.327967},
    }
    data = timeline_data(make_run(tmp_path, [*samples, *trajectory("a", 0, 0.0, worker=0)], summary=summary))
    lines = dict(data["telemetry"]["lines"])
    assert lines["kv_cache_usage"] == "mean 0.0003, max 0.0004, n 2"
    assert lines["prompt_tokens_per_s"] == "mean 2,298.5, max 4,172.7, n 2"
    assert dict(data["header"])["throughput"] == "33,629.3 completed / wall hour"
