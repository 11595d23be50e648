"""timeline.html: one self-contained file whose embedded data parses back and cannot be broken out of,
down-sampled past its limits with notes that say so, its script run in Node against a DOM stand-in
(zoom, pan, hover) and the page drawn in headless Chromium."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from asyncroll import events as ev
from asyncroll.outputs import timeline
from asyncroll.outputs.activity_model import Series
from asyncroll.outputs.timeline import timeline_data, write_timeline
from tests.conftest import invoke
from tests.export_checks import chromium_page, page_data
from tests.synthetic_runs import (
    RUN,
    SMOKE,
    SUMMARY,
    broken_events,
    make_run,
    normal_events,
    timeout_events,
    trajectory,
)


def test_timeline_is_self_contained(tmp_path: Path) -> None:
    run = make_run(tmp_path, normal_events() + timeout_events(), summary=SUMMARY, run=RUN)
    html = write_timeline(run).read_text()
    assert html.startswith("<!doctype html>") and html.rstrip().endswith("</html>")
    assert html.count("<canvas") == 2 and html.count("<script") == 2 and html.count("</script>") == 2
    for remote in ("http://", "https://", "src=", "<link", "@import", "url("):
        assert remote not in html
    data = page_data(html)
    assert data == json.loads(json.dumps(timeline_data(run)))
    header = dict(data["header"])
    assert header["policy"] == "asyncroll" and header["makespan"] == "0.6 s"
    assert header["reorders"] == "1 of 3 scheduler decisions" and "18,000" in header["throughput"]
    assert data["telemetry"]["sources"] == [] and "no telemetry probe recorded" in data["telemetry"]["note"]
    assert [r[0] for r in data["rows"]][:4] == ["a", "slow", "b", "c"]  # in order of start
    states = {data["states"][s[4]] for s in data["spans"]}
    assert states == {"ok", "failed"} and data["bars"] == []
    assert data["notes"][0] == f"{len(data['spans'])} of {len(data['spans'])} spans drawn individually."


def test_timeline_escapes_script_breakout(tmp_path: Path) -> None:
    nasty = "</script><script>alert(1)</script>&<!--"
    run = make_run(tmp_path, trajectory(nasty, 0, 0.0, worker=0))
    html = write_timeline(run).read_text()
    assert html.count("</script>") == 2 and "alert(1)</" not in html and "<!--" not in html
    assert page_data(html)["rows"][0][0] == nasty


def test_timeline_with_no_summary(tmp_path: Path) -> None:
    run = make_run(tmp_path, broken_events())
    data = timeline_data(run)
    header = dict(data["header"])
    assert header["sampled starvation"] == "unknown (no resources section in summary.json)"
    assert header["completions"] == "unknown of unknown completed, unknown failed"
    assert header["status"] == "interrupted"  # no run.json: the measurement_finished event says it
    assert {data["states"][s[4]] for s in data["spans"]} == {"ok", "incomplete"}
    assert [data["strings"][i[4]] for i in data["instants"]].count("add (unmatched end)") == 2


def test_the_status_line_names_the_status_once(tmp_path: Path) -> None:
    """An interrupted run's header read "interrupted (interrupted by SIGINT)"."""
    for i, (error, shown) in enumerate(
        [("interrupted by SIGINT", "interrupted (by SIGINT)"), ("server down", "interrupted (server down)")]
    ):
        (tmp_path / str(i)).mkdir()
        run = make_run(tmp_path / str(i), broken_events(), run={"status": "interrupted", "error": error})
        assert dict(timeline_data(run)["header"])["status"] == shown


def test_the_completions_line_counts_the_problems_never_started(tmp_path: Path) -> None:
    """A run stopped before it started any trajectory read "0 of 0 completed" for a workload of 200."""
    counts = {"trajectories": 0, "completed": 0, "failed": 0}
    for i, (problems, shown) in enumerate(
        [
            (200, "0 of 0 completed, 0 failed, 200 of the workload's 200 never started"),
            (0, "0 of 0 completed, 0 failed"),
        ]
    ):
        (tmp_path / str(i)).mkdir()
        receipt = {"status": "failed", "workload": {"problems": problems}}
        run = make_run(tmp_path / str(i), broken_events(), run=receipt, summary={"counts": counts})
        assert dict(timeline_data(run)["header"])["completions"] == shown


def test_timeline_downsamples_large_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeline, "MAX_SPANS", 10)
    events = [e for i in range(6) for e in trajectory(f"t{i}", i, 0.2 * i, worker=i % 2)]
    data = timeline_data(make_run(tmp_path, [*events, *timeout_events()]))
    cats = [data["cats"][s[3]] for s in data["spans"]]
    assert cats == ["trajectory"] * 7 + ["cpu"] * 2  # every trajectory span, then the failed ones
    assert data["total_spans"] > 10 and data["bars"]
    bars = data["bars"]
    assert sum(c[5] for c in bars) == data["total_spans"] - 9  # every other span is in exactly one bar
    assert all(0 <= c[1] <= c[2] and 1 <= c[6] <= 100 and data["states"][c[4]] == "ok" for c in bars)
    monkeypatch.setattr(timeline, "MAX_BARS", 1)  # cannot be met: stops at one bar per row and kind
    merged = timeline_data(tmp_path / "run")["bars"]
    assert len(merged) == len({(c[0], c[3]) for c in bars}) < len(bars)
    assert any(n.startswith("Down-sampled:") for n in data["notes"])
    assert data["notes"][0] == f"9 of {data['total_spans']} spans drawn individually."
    assert "Trajectory spans and failed, cancelled and incomplete spans stay exact." in data["notes"][1]
    monkeypatch.setattr(timeline, "BUCKETS", 1)  # a gap of the whole run (> 1 s): in ms, not 1.23e+03
    gap = next(n for n in timeline_data(tmp_path / "run")["notes"] if n.startswith("Down-sampled:"))
    assert re.search(r"gaps under [1-9][\d,]* ms", gap) and "e+" not in gap, gap


def test_the_downsampling_note_says_what_was_merged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the limit even trajectory spans and failed ones are merged: the note must not call them exact;
    a thinned counter line is named."""
    monkeypatch.setattr(timeline, "MAX_SPANS", 2)  # 7 trajectory spans: over the limit on their own
    monkeypatch.setattr(timeline, "MAX_COUNTER_POINTS", 4)
    events = [e for i in range(6) for e in trajectory(f"t{i}", i, 0.2 * i, worker=i % 2)]
    data = timeline_data(make_run(tmp_path, [*events, *timeout_events()]))
    cats = [data["cats"][s[3]] for s in data["spans"]]
    assert len(cats) == 2  # 2 of the 3 failed spans (a trajectory, its job's two), up to the limit
    merged = {data["cats"][c[3]] for c in data["bars"]}
    assert "trajectory" in merged and any(data["states"][c[4]] != "ok" for c in data["bars"])
    note = next(n for n in data["notes"] if n.startswith("Down-sampled:"))
    exact = "failed, cancelled and incomplete spans stay exact (the first 2; 1 more"
    assert f"Trajectory spans are in them too; {exact}" in note
    thinned = next(n for n in data["notes"] if n.startswith("Counters thinned"))
    assert "CPU queue depth (" in thinned and "model requests outstanding (" in thinned


#: The page's data and script read from its file, and a DOM just large enough to draw it (``ctx``: the
#: canvas context each harness defines), for Node.
PAGE = r"""
const html = require("fs").readFileSync(process.argv[2], "utf8");
const data = html.match(/<script type="application\/json" id="data">([\s\S]*?)<\/script>/)[1];
const code = html.match(/<script>([\s\S]*?)<\/script>/)[1];
"""
DOM = r"""
const els = {};
const mk = (id) => ({id, textContent: id === "data" ? data : "", style: {}, dataset: {}, kids: [], on: {},
  append(...c) { this.kids.push(...c); }, addEventListener(type, f) { this.on[type] = f; },
  getContext: () => ctx,
  getBoundingClientRect: () => ({left: 0, top: 0, width: 1200}), parentElement: {clientWidth: 1200}});
global.document = {getElementById: (id) => (els[id] ||= mk(id)), createElement: mk, body: mk("body")};
global.window = mk("window");
"""

NODE_HARNESS = (
    PAGE
    + r"""
const ctx = new Proxy({measureText: (t) => ({width: 6 * String(t).length})},
  {get: (t, k) => (k in t ? t[k] : () => undefined), set: (t, k, v) => ((t[k] = v), true)});
"""
    + DOM
    + r"""
global.window.devicePixelRatio = 2;
global.location = {hash: ""};
global.requestAnimationFrame = (f) => f();
new Function(code)();
const text = (e) => e.textContent + e.kids.map(text).join("");
const D = JSON.parse(data), out = {rendered: document.body.dataset.rendered};
out.tele = text(els.tele);
out.hdr = text(els.hdr);
const s = D.spans.find((s) => s[3] !== 0), mid = (s[1] + s[2] / 2) / 1e6;  // hover an inner span (rows 16 px)
const [W0, W1] = D.window, x = 180 + ((mid - W0) / (W1 - W0)) * 1020;  // the page opens on the window
els.tl.on.mousemove({clientX: x, clientY: s[0] * 16 + 8});
out.tip = els.tip.textContent;
for (let i = 0; i < 10; i++) els.tl.on.wheel({deltaY: -200, clientX: x, preventDefault() {}});
out.zoomed = document.body.dataset.rendered;
els.ct.on.mousedown({clientX: 600}); window.on.mousemove({clientX: 500}); window.on.mouseup();
els.tl.on.dblclick();
out.reset = document.body.dataset.rendered;
out.view = document.body.dataset.view;
els.ball.on.click();
out.whole = document.body.dataset.view;
console.log(JSON.stringify(out));
"""
)


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_timeline_script_runs(tmp_path: Path) -> None:
    """Runs the page's script in Node against a minimal DOM/canvas stand-in, then zooms, hovers and pans."""
    run = make_run(tmp_path, normal_events() + broken_events(), summary=SUMMARY, run=RUN)
    page = write_timeline(run)
    harness = tmp_path / "harness.js"
    harness.write_text(NODE_HARNESS)
    proc = subprocess.run(["node", str(harness), str(page)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    data = page_data(page.read_text())
    assert out["rendered"] == out["reset"] == str(len(data["spans"]))
    assert out["view"] == "{:.6f}-{:.6f}".format(*data["window"]) and data["window"][0] == 0.5
    assert out["whole"] == f"0.000000-{data['t1'] - data['t0']:.6f}"
    assert 0 < int(out["zoomed"]) < len(data["spans"])
    assert out["tip"].startswith("a\nmodel queue (model queue)\nstart ")
    assert out["tele"].startswith("no telemetry probe recorded") and "asyncroll" in out["hdr"]
    assert out["tele"].endswith("drawn as countersnone (no sample carried a value)")


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed (not installed here)")
def test_timeline_renders_in_headless_chromium(tmp_path: Path) -> None:
    page = write_timeline(make_run(tmp_path, normal_events(), summary=SUMMARY, run=RUN))
    cmd = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    match = re.search(r'<body[^>]*data-rendered="(\d+)"', proc.stdout)
    assert match, proc.stderr[-2000:]
    assert int(match.group(1)) == len(page_data(page.read_text())["spans"])


def test_many_trajectories_put_shared_tracks_on_top(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeline, "SHARED_FIRST_ABOVE", 2)
    data = timeline_data(make_run(tmp_path, normal_events()))  # 3 trajectory rows > 2
    labels = [r[0] for r in data["rows"]]
    assert labels == ["worker 0", "worker 1", "request slot 0", "scheduler", "a", "b", "c"]
    traj_rows = {s[0] for s in data["spans"] if data["cats"][s[3]] == "trajectory"}
    assert traj_rows == {4, 5, 6}  # spans follow their rows
    assert {i[0] for i in data["instants"] if data["strings"][i[2]] == "reorder"} == {3}


def test_thinning_a_long_counter_keeps_its_gaps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeline, "MAX_COUNTER_POINTS", 8)
    series = Series()
    for i in range(40):
        series.append(i / 10, None if i == 20 else float(i % 5))
    out = timeline._thin(series, 0.0)
    assert len(out) < len(series) and [2_000_000, None] in out
    assert out[out.index([2_000_000, None]) + 1][0] > 2_000_000  # the next point comes after the gap


@pytest.mark.timeout(120)
@pytest.mark.skipif(
    shutil.which("chromium") is None, reason="chromium is not installed (.ci/run installs it)"
)
def test_thin_rows_label_every_group_even_right_below_a_one_row_group(tmp_path: Path) -> None:
    """With ~1,000 rows (3 px each) the shared tracks sit on top and the one-row scheduler group is
    followed at once by the trajectories: that label used to be skipped as overlapping."""
    events = [e for i in range(1000) for e in trajectory(f"t{i}", i, i * 0.01, worker=i % 2)]
    page = write_timeline(make_run(tmp_path, events))
    attrs, console = chromium_page(page, tmp_path)
    assert console == [] and "error" not in attrs, attrs
    assert int(attrs["rows"]) > 888  # thin rows: group labels, not row labels
    assert "trajectories" in attrs["labels"].split("|"), attrs["labels"]


def test_a_simulated_runs_page_says_its_times_are_simulated(tmp_path: Path) -> None:
    """run.json marks a simulation; its page read like a measured run's ("completed / wall hour", a
    makespan in seconds, nothing saying the clock was virtual), so a what-if run passed for a real one."""
    out = tmp_path / "sim"
    done = invoke("simulate", "--workload", SMOKE, "--output", out)
    assert done.exit_code == 0, done.output
    header = dict(page_data((out / "timeline.html").read_text())["header"])
    assert header["clock"].startswith("virtual: a simulation")
    assert header["throughput"].endswith(" completed / simulated hour")
    measured = dict(timeline_data(make_run(tmp_path, normal_events(), summary=SUMMARY, run=RUN))["header"])
    assert "clock" not in measured and measured["throughput"].endswith(" completed / wall hour")


def test_a_span_on_a_row_of_several_trajectories_names_its_trajectory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past MAX_TRAJECTORY_ROWS a row holds several trajectories ("trajectories 1-2"): a hovered span
    said only "failed", so which trajectory failed was nowhere on the page."""
    monkeypatch.setattr(timeline, "MAX_TRAJECTORY_ROWS", 2)
    data = timeline_data(make_run(tmp_path, normal_events() + timeout_events()))  # 4 trajectories
    assert [r[0] for r in data["rows"][:2]] == ["trajectories 1-2", "trajectories 3-4"]
    labels = {data["strings"][s[5]] for s in data["spans"] if s[0] < 2}
    assert {"slow: failed", "a: completed", "slow: spin_ms (failed)", "a: model turn 0"} <= labels
    monkeypatch.setattr(timeline, "MAX_TRAJECTORY_ROWS", 4_000)
    alone = timeline_data(tmp_path / "run")  # one trajectory a row: its row names it
    assert "failed" in {alone["strings"][s[5]] for s in alone["spans"]}


def test_thinned_reorder_markers_cover_the_whole_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_INSTANTS the page kept the *first* reorders and dropped the rest: a 10k-trajectory run
    under the pressure policy (21,013 reorders) showed none in its last 20 s, as if the policy had stopped
    reordering in the batch's tail, while the page said the reorders were "thinned"."""
    monkeypatch.setattr(timeline, "MAX_INSTANTS", 10)
    events = [e for i in range(40) for e in trajectory(f"t{i}", i, i * 1.0, worker=i % 2, reordered=True)]
    data = timeline_data(make_run(tmp_path, events))
    kept = sorted(i[1] / 1e6 for i in data["instants"] if data["strings"][i[2]] == "reorder")
    assert len(data["instants"]) == 10 and len(kept) == 10
    assert kept[0] < 4.0 and kept[-1] > 36.0  # from the start of the run to its end
    assert max(b - a for a, b in itertools.pairwise(kept)) <= 5.0  # evenly: every 4th
    note = "10 of 40 markers drawn: scheduler reorders thinned evenly over the run (10 of 40)."
    assert note in data["notes"]


AXIS_HARNESS = (
    PAGE
    + r"""
let texts = [], edges = [];  // each text, and each tick label's left and right edge (6 px a character)
const ctx = new Proxy({fillText: (t, x) => { texts.push(String(t));
  if (/ s$/.test(String(t))) edges.push([x - 3 * String(t).length, x + 3 * String(t).length]); },
  measureText: (t) => ({width: 6 * String(t).length})},
  {get: (t, k) => (k in t ? t[k] : () => {}), set: (t, k, v) => ((t[k] = v), true)});
"""
    + DOM
    + r"""
global.location = {hash: ""};
global.requestAnimationFrame = (f) => f();
const ticks = () => texts.filter((t) => / s$/.test(t));
new Function(code)();
const out = {opened: ticks(), edges};
for (let i = 0; i < 60; i++) els.tl.on.wheel({deltaY: -200, clientX: 700, preventDefault() {}});
texts = []; window.on.resize(); out.zoomed = ticks(); out.view = document.body.dataset.view;
console.log(JSON.stringify(out));
"""
)


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
@pytest.mark.parametrize("length", [0.0, 0.12])
def test_time_axis_ticks_are_distinct(tmp_path: Path, length: float) -> None:
    """A run of no length (a simulation of 0 ms turns opens on a 1 µs window) and any run zoomed in to the
    page's 1 µs limit drew ticks 0.1 µs apart labelled to the microsecond: "0 s 0 s 0 s ... 0.000001 s"."""
    events = trajectory("a", 0, 0.0, worker=0) if length else normal_events()[:1]
    page = write_timeline(make_run(tmp_path, events))
    harness = tmp_path / "axis.js"
    harness.write_text(AXIS_HARNESS)
    proc = subprocess.run(["node", str(harness), str(page)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    view = [float(t) for t in out["view"].split("-")]
    assert view[1] - view[0] < 2e-6  # zoomed in to the limit
    for ticks in (out["opened"], out["zoomed"]):
        assert ticks and len(ticks) == len(set(ticks)), ticks
    # every label whole between the row labels (180 px) and the canvas's right edge (1,200 px): one
    # centred on a tick near the right edge was cut in half
    assert all(left >= 180 and right <= 1200 for left, right in out["edges"]), out["edges"]


LABELS_HARNESS = (
    PAGE
    + r"""
let edges = [];  // each tick label's left and right edge in this frame (6 px a character)
const ctx = new Proxy({fillText: (t, x) => { const n = String(t).length;
  if (/ s$/.test(String(t))) edges.push([x - 3 * n, x + 3 * n, String(t)]); },
  measureText: (t) => ({width: 6 * String(t).length})},
  {get: (t, k) => (k in t ? t[k] : () => {}), set: (t, k, v) => ((t[k] = v), true)});
"""
    + DOM
    + r"""
global.location = {hash: ""};
global.requestAnimationFrame = (f) => f();
new Function(code)();
const frames = [edges];
for (let i = 0; i < 70; i++) {
  edges = []; els.tl.on.wheel({deltaY: -200, clientX: 700, preventDefault() {}});
  edges = []; window.on.resize(); frames.push(edges); }  // drawn again: at the zoom limit a wheel does not
console.log(JSON.stringify(frames));
"""
)


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_a_long_runs_axis_labels_do_not_overlap(tmp_path: Path) -> None:
    """A 30-hour run zoomed in labels its ticks '52277.387805 s': up to 17 ticks of 14 characters drawn 60
    px apart on a 1,200 px page ran into each other at every zoom level, unreadable. Ticks are spaced for
    their labels, and a label pushed in at an edge is left out where it would cover its neighbour's."""
    events = trajectory("a", 0, 0.0, worker=0) + trajectory("b", 1, 108000.0, worker=1)
    page = write_timeline(make_run(tmp_path, events))
    harness = tmp_path / "labels.js"
    harness.write_text(LABELS_HARNESS)
    proc = subprocess.run(["node", str(harness), str(page)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    frames = json.loads(proc.stdout)
    assert frames[0][-1][2] == "100000 s" and all(len(e[2]) >= 14 for e in frames[-1]), frames[-1]
    for labels in frames:
        assert labels  # still an axis (one tick at the 1 µs zoom limit)
        ordered = sorted(labels)
        for (_, right, a), (left, _, b) in itertools.pairwise(ordered):
            assert right <= left, (a, b, labels)


HOVER_HARNESS = (
    PAGE
    + r"""
const ctx = new Proxy({measureText: (t) => ({width: 6 * String(t).length})},
  {get: (t, k) => (k in t ? t[k] : () => undefined), set: (t, k, v) => ((t[k] = v), true)});
"""
    + DOM
    + r"""
global.location = {hash: ""};
global.requestAnimationFrame = (f) => f();
new Function(code)();
const D = JSON.parse(data), [W0, W1] = D.window, tips = [];
for (const s of D.spans.filter((s) => s[3] !== 0)) {  // each inner span, hovered at its middle (rows 16 px)
  const mid = (s[1] + s[2] / 2) / 1e6, x = 180 + ((mid - W0) / (W1 - W0)) * 1020;
  els.tl.on.mousemove({clientX: x, clientY: s[0] * 16 + 8}); tips.push(els.tip.textContent); }
console.log(JSON.stringify(tips));
"""
)


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_a_long_spans_tooltip_gives_its_duration_in_seconds(tmp_path: Path) -> None:
    """A model request of 57 minutes was 'duration 3442132.416 ms' in its tooltip, beside a start and an
    axis in seconds; a span of a second or more says seconds, a shorter one milliseconds."""
    events: list[ev.Event] = [
        ev.TrajectoryStarted(t=0.0, id="a", index=0, prompt_chars=10, active=1),
        ev.ModelEnqueued(t=0.0, id="a", request_id=1, turn=0, outstanding=1),
        ev.ModelStarted(t=0.0005, id="a", request_id=1, turn=0, inflight=1, queued_s=0.0005),
        ev.ModelFinished(t=3442.1329, id="a", request_id=1, turn=0, latency_s=3442.1324, action="final"),
        ev.TrajectoryFinished(
            t=3442.1329, id="a", status="completed", turns=1, tool_calls=0, duration_s=3442.1329
        ),
    ]
    page = write_timeline(make_run(tmp_path, events))
    harness = tmp_path / "hover.js"
    harness.write_text(HOVER_HARNESS)
    proc = subprocess.run(["node", str(harness), str(page)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    tips = json.loads(proc.stdout)
    assert any("start 0.0005 s, duration 3442.1324 s" in tip for tip in tips), tips
    assert any("start 0 s, duration 0.5 ms" in tip for tip in tips), tips  # the queue wait


def _palette(html: str, name: str) -> dict[str, str]:
    """One colour table of the page's script: ``const NAME = {key: "#rrggbb", ...}`` or ``[...]``."""
    body = re.search(rf"const {name} = [{{\[](.*?)[}}\]];", html, re.S)
    assert body, name
    pairs = re.findall(r'(\w+): "(#[0-9a-f]{3,6})"', body.group(1))
    if pairs:
        return dict(pairs)
    return {str(i): c for i, c in enumerate(re.findall(r'"(#[0-9a-f]{6})"', body.group(1)))}


def test_counter_colours_mean_nothing_else_on_the_page() -> None:
    """The counter lanes had the span and marker colours: CPU queue depth was the orange of "incomplete (no
    end)", model requests outstanding the blue of "model", active trajectories the green of "cpu", GPU memory
    the cyan of "telemetry probe", each pair side by side in the one legend. Every counter has a colour of its
    own, far (RGB distance 60) from every colour that means something else."""
    html = (Path(timeline.__file__).parent / "timeline.html").read_text()
    others = {f"{t}.{k}": c for t in ("CAT", "ST", "TRAJ", "INST") for k, c in _palette(html, t).items()}
    others.pop("INST.measurement")  # the dashed line marking measurement start, in no legend
    counters = list(_palette(html, "COUNTER").values())
    assert len(set(counters)) == len(counters) >= len(timeline.COUNTER_COLOURS)

    def rgb(c: str) -> tuple[int, ...]:
        return tuple(int(c[i : i + 2], 16) for i in (1, 3, 5))

    def far(a: str, b: str) -> bool:
        return sum((x - y) ** 2 for x, y in zip(rgb(a), rgb(b), strict=True)) ** 0.5 >= 60

    near = [(k, c, o) for c in counters for k, o in others.items() if not far(c, o)]
    near += [(a, b, "") for a, b in itertools.combinations(counters, 2) if not far(a, b)]
    assert not near


def test_legend_colours_of_different_meanings_are_apart() -> None:
    """An incomplete trajectory's row (pale orange) had nearly the colour of a "model queue" span drawn on
    it (RGB distance 32): the waits of a trajectory left unfinished vanished into its row. Colours of
    different meanings are at least 45 apart; a trajectory row done is the trajectory span's colour, and
    an unmatched span is one colour wherever it is drawn."""
    html = (Path(timeline.__file__).parent / "timeline.html").read_text()
    colours = {f"{t}.{k}": c for t in ("CAT", "ST", "TRAJ", "INST") for k, c in _palette(html, t).items()}
    same = {("CAT.trajectory", "TRAJ.ok"), ("ST.unmatched", "TRAJ.unmatched")}

    def distance(a: str, b: str) -> float:
        full = ["#" + "".join(d * 2 for d in c[1:]) if len(c) == 4 else c for c in (a, b)]  # "#000"
        rgb = [[int(c[i : i + 2], 16) for i in (1, 3, 5)] for c in full]
        return sum((x - y) ** 2 for x, y in zip(*rgb, strict=True)) ** 0.5

    near = [
        (a, b, round(distance(colours[a], colours[b])))
        for a, b in itertools.combinations(colours, 2)
        if (a, b) not in same and distance(colours[a], colours[b]) < 45
    ]
    assert not near


LABEL_HARNESS = (
    PAGE
    + r"""
const texts = [];
const ctx = new Proxy({fillText: (t) => { texts.push(String(t)); },
  measureText: (t) => ({width: 6 * String(t).length})},
  {get: (t, k) => (k in t ? t[k] : () => {}), set: (t, k, v) => ((t[k] = v), true)});
"""
    + DOM
    + r"""
global.location = {hash: ""};
global.requestAnimationFrame = (f) => f();
new Function(code)();
console.log(JSON.stringify(texts.filter((t) => t.startsWith("max "))));
"""
)


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_a_counters_maximum_is_written_with_its_significant_digits(tmp_path: Path) -> None:
    """A counter lane's label gave its maximum to three decimals: a KV-cache usage peaking at 0.0004 read
    "max 0" over a line drawn to the top of its lane; a token rate "max 3950.864"."""
    page = write_timeline(make_run(tmp_path, normal_events()))
    data = page_data(page.read_text())
    data["counters"] = [
        ["server KV-cache usage", [[0, 0.0002], [10, 0.0004]]],
        ["tokens", [[0, 3950.864]]],
        ["CPU queue depth", [[0, 12345]]],  # a count: four significant digits read "max 12350"
    ]
    data["counter_colours"] = [5, 6, 7]
    page.write_text(
        re.sub(
            r'(id="data">).*?(</script>)',
            lambda m: m[1] + json.dumps(data) + m[2],
            page.read_text(),
            flags=re.S,
        )
    )
    harness = tmp_path / "labels.js"
    harness.write_text(LABEL_HARNESS)
    proc = subprocess.run(["node", str(harness), str(page)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["max 0.0004", "max 3951", "max 12345"]


def test_the_header_names_the_rule_the_policy_ran(tmp_path: Path) -> None:
    """`--policy asyncroll` names a pressure rule that has changed over time; the run's summary line says
    'policy asyncroll (asyncroll_repair)', the page's header said 'asyncroll' alone. A run.json written before
    the rule was recorded (policy_canonical 'asyncroll') is shown as it is."""
    for canonical, shown in (
        ("asyncroll_repair", "asyncroll (asyncroll_repair)"),
        ("asyncroll", "asyncroll"),
    ):
        run_json = json.loads(json.dumps(RUN))
        run_json["config"]["policy_canonical"] = canonical
        (tmp_path / canonical).mkdir()
        data = timeline_data(make_run(tmp_path / canonical, normal_events(), summary=SUMMARY, run=run_json))
        assert dict(data["header"])["policy"] == shown


LEGEND_HARNESS = (
    PAGE
    + r"""
const ctx = new Proxy({measureText: (t) => ({width: 6 * String(t).length})},
  {get: (t, k) => (k in t ? t[k] : () => {}), set: (t, k, v) => ((t[k] = v), true)});
"""
    + DOM
    + r"""
global.location = {hash: ""};
global.requestAnimationFrame = (f) => f();
new Function(code)();
const keys = els.legend.kids.map((k) => [k.className, k.kids.map((c) => c.className || c.textContent)]);
console.log(JSON.stringify(keys));
"""
)


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_each_legend_key_keeps_its_swatch_beside_its_label(tmp_path: Path) -> None:
    """The legend was a flat run of swatches and labels: at 800 px a line ended on a swatch whose label began
    the next line ('CPU queue depth ■' / 'model requests outstanding'), a colour read as the wrong label's.
    Each key is one element that does not wrap."""
    page = write_timeline(make_run(tmp_path, normal_events(), summary=SUMMARY, run=RUN))
    html = page.read_text()
    assert ".key{white-space:nowrap}" in html
    harness = tmp_path / "legend.js"
    harness.write_text(LEGEND_HARNESS)
    proc = subprocess.run(["node", str(harness), str(page)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    keys = json.loads(proc.stdout)
    assert len(keys) > 10 and all(cls == "key" and kids[0] == "sw" and len(kids) == 2 for cls, kids in keys)
    assert ["key", ["sw", "CPU queue depth"]] in keys


def test_a_run_stopped_before_its_measurement_opens_on_a_readable_window(tmp_path: Path) -> None:
    """A run whose warm-up failed (or a Ctrl-C during start-up) has only its workers' ready markers, 30 µs
    apart: the page opened on those 30 µs, its axis 15 ticks from '-8.263018 s' to '-8.262988 s'. It opens
    on a second from the first marker, the whole run still one click away."""
    events: list[ev.Event] = [
        ev.WorkerReady(t=-8.263018, worker=0, pid=1, generation=0, startup_s=0.1),
        ev.WorkerReady(t=-8.262988, worker=1, pid=2, generation=0, startup_s=0.1),
    ]
    data = timeline_data(make_run(tmp_path, events, run={"status": "failed", "error": "warm-up failed"}))
    assert data["window"] == [0.0, 1.0]
    assert round(data["t1"] - data["t0"], 6) == 0.00003  # "whole run" is still the 30 µs


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (1.85, "1,850 ms"),
        (0.1, "100 ms"),
        (0.0025, "2.5 ms"),
        (0.001, "1 ms"),
        (4e-5, "40 µs"),
        (1e-9, "1 µs"),
    ],
)
def test_the_downsampling_gap_is_said_in_a_unit_that_fits(seconds: float, text: str) -> None:
    """A simulation of near-zero makespan said 'gaps under 1e-06 ms'."""
    assert timeline.gap_text(seconds) == text
