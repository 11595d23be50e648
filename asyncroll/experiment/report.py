"""``asyncroll report``: every published number of an experiment, computed from ``comparison.json``.

Writes ``aggregate.json`` (machine-readable) and ``REPORT.md``: the stages and their gate verdicts,
per-policy medians, paired ratios, the paired mean % change with a t and a seeded bootstrap interval,
pooled rates, quality and failure tables. A value that was not measured is written "unknown", never 0.
``--figure`` adds the three-panel figure (``figure.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from asyncroll.errors import UsageError
from asyncroll.experiment.stats import median, paired_change
from asyncroll.outputs.receipt import write_json_atomic


def load_comparison(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None
    if not isinstance(data, dict) or data.get("kind") != "asyncroll.comparison":
        raise UsageError(f"{path}: not a comparison.json (kind asyncroll.comparison expected)")
    for key in ("arms", "baseline", "pairs", "metrics", "policies"):
        if key not in data:
            raise UsageError(f"{path}: missing field {key!r}")
    return data


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def aggregate(comparison: dict[str, Any]) -> dict[str, Any]:
    """Medians, paired statistics, pooled rates, quality and failures from comparison.json alone."""
    arms: list[str] = comparison["arms"]
    baseline: str = comparison["baseline"]
    pairs = comparison["pairs"]
    complete = [p for p in pairs if p.get("complete")]
    seed = int(comparison.get("seed", 0))
    resamples = int(comparison.get("bootstrap_resamples", 10_000))
    keys = [m["key"] for m in comparison["metrics"]]

    def values(arm: str, key: str, rows: list[dict[str, Any]]) -> list[float | None]:
        return [p["arms"].get(arm, {}).get("metrics", {}).get(key) for p in rows]

    medians = {arm: {k: median(values(arm, k, complete)) for k in keys} for arm in arms}
    paired: dict[str, dict[str, Any]] = {}
    for arm in arms:
        if arm == baseline:
            continue
        paired[arm] = {
            k: paired_change(
                values(baseline, k, complete), values(arm, k, complete), seed=seed, resamples=resamples
            )
            for k in keys
        }
    pooled: dict[str, dict[str, Any]] = {}
    for arm in arms:
        totals: dict[str, float] = {}
        unknown: set[str] = set()
        for p in complete:
            for name, value in p["arms"][arm]["counts"].items():
                if value is None:
                    unknown.add(name)
                else:
                    totals[name] = totals.get(name, 0.0) + value
        for name in unknown:
            totals.pop(name, None)
        t = totals.get
        pooled[arm] = {
            "pairs": len(complete),
            "totals": totals,
            "completion_rate": _ratio(t("completed", 0.0), t("trajectories", 0.0)),
            "accuracy_exact": _ratio(t("correct", 0.0), t("graded", 0.0)),
            "pass_rate_first": _ratio(t("passed_first", 0.0), t("evaluated", 0.0)),
            "activation_rate": _ratio(t("reorders", 0.0), t("eligible_decisions", 0.0)),
            "completed_per_gpu_hour": None
            if "allocated_gpu_hours" not in totals
            else _ratio(t("completed", 0.0), t("allocated_gpu_hours", 0.0)),
            "cpu_s_per_completion": None
            if "total_cpu_s" not in totals
            else _ratio(t("total_cpu_s", 0.0), t("completed", 0.0)),
        }
    failures = [
        {"pair": p["pair"], "arm": arm, "id": a["id"], "status": a["status"], "error": a.get("error")}
        for p in pairs
        for arm, a in p["arms"].items()
        if a["status"] != "complete"
    ]
    return {
        "experiment": comparison.get("experiment"),
        "experiment_status": comparison.get("experiment_status"),
        "stop_reason": comparison.get("stop_reason"),
        "fingerprint": comparison.get("fingerprint"),
        "baseline": baseline,
        "arms": arms,
        "policies": comparison["policies"],
        "pairs_total": len(pairs),
        "pairs_complete": len(complete),
        "bootstrap": {"seed": seed, "resamples": resamples, "method": "percentile, pairs resampled"},
        "medians": medians,
        "paired": paired,
        "pooled": pooled,
        "failures": failures,
        "failed_arms": comparison.get("failed_arms", []),
        "server_versions": comparison.get("server_versions", {}),
        "stages": comparison.get("stages", {}),
        "metrics": comparison["metrics"],
    }


def fmt(value: Any, spec: str = ".4g") -> str:
    if value is None:
        return "unknown"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def _interval(d: dict[str, Any]) -> str:
    if d["mean"] is None:
        return f"unknown ({d['note']})"
    if d["low"] is None:
        return f"{d['mean']:+.2f}% (no interval: {d['note']})"
    note = f" ({d['note']})" if d.get("note") else ""
    return f"{d['mean']:+.2f}% [{d['low']:+.2f}%, {d['high']:+.2f}%]{note}"


def markdown(agg: dict[str, Any]) -> str:
    """REPORT.md: tables only of numbers in aggregate.json."""
    arms, base = agg["arms"], agg["baseline"]
    labels = {m["key"]: m["label"] for m in agg["metrics"]}
    out = [
        f"# Experiment report: {agg['experiment']}",
        "",
        f"Status: **{agg['experiment_status']}**"
        + (f" ({agg['stop_reason']})" if agg["stop_reason"] else "")
        + f". Pairs complete: {agg['pairs_complete']} of {agg['pairs_total']}. Baseline: `{base}` "
        f"({agg['policies'][base]}). Protocol fingerprint `{(agg['fingerprint'] or 'unknown')[:16]}`.",
        "",
        'Every number below is computed by `asyncroll report` from `comparison.json`; "unknown" marks a '
        "metric the run could not measure (never a zero). Only complete pairs enter medians and paired "
        "statistics.",
        "",
        "Server versions seen in the arms' logs: "
        + (
            "; ".join(
                f"{k} {', '.join(v)}" + (" (**differs between arms**)" if len(v) > 1 else "")
                for k, v in agg["server_versions"].items()
            )
            or "none parsed"
        )
        + ".",
        "",
        "## Stages",
        "",
        "| stage | status | gates |",
        "|---|---|---|",
    ]
    for stage, state in agg["stages"].items():
        gates = "; ".join(
            f"{g['metric']}[{g['arm']}] = {fmt(g['observed'])} {g['op']} {g['value']:g}: "
            f"{'pass' if g['passed'] else 'FAIL'}"
            for g in state.get("gates", [])
        )
        out.append(f"| {stage} | {state.get('status')} | {gates or '-'} |")
    out += [
        "",
        "## Per-policy medians (complete pairs)",
        "",
        "| metric | " + " | ".join(f"{a} ({agg['policies'][a]})" for a in arms) + " |",
        "|---|" + "---|" * len(arms),
    ]
    for key, label in labels.items():
        out.append(f"| {label} | " + " | ".join(fmt(agg["medians"][a][key]) for a in arms) + " |")
    for arm, per_metric in agg["paired"].items():
        out += [
            "",
            f"## Paired: {arm} vs {base}",
            "",
            "| metric | ratio per pair | mean % change [95% t] | mean % change [95% bootstrap] |",
            "|---|---|---|---|",
        ]
        for key, d in per_metric.items():
            ratios = ", ".join(fmt(r, ".4f") for r in d["ratios"]) or "none"
            out.append(
                f"| {labels[key]} | {ratios} | {_interval(d['mean_percent_change_t95'])} "
                f"| {_interval(d['mean_percent_change_bootstrap95'])} |"
            )
    out += [
        "",
        "## Pooled rates (sums over complete pairs)",
        "",
        "| arm | completion rate | completions per GPU-hour | CPU-s per completion | activation rate |",
        "|---|---|---|---|---|",
    ]
    for arm in arms:
        p = agg["pooled"][arm]
        out.append(
            f"| {arm} | {fmt(p['completion_rate'])} | {fmt(p['completed_per_gpu_hour'])} "
            f"| {fmt(p['cpu_s_per_completion'])} | {fmt(p['activation_rate'])} |"
        )
    out += [
        "",
        "## Quality",
        "",
        "| arm | exact accuracy (correct / graded) | first-pass rate (passed / evaluated) |",
        "|---|---|---|",
    ]
    for arm in arms:
        p, t = agg["pooled"][arm], agg["pooled"][arm]["totals"]
        out.append(
            f"| {arm} | {fmt(p['accuracy_exact'])} ({fmt(t.get('correct'), '.0f')} / "
            f"{fmt(t.get('graded'), '.0f')}) "
            f"| {fmt(p['pass_rate_first'])} ({fmt(t.get('passed_first'), '.0f')} / "
            f"{fmt(t.get('evaluated'), '.0f')}) |"
        )
    out += [
        "",
        "## Failures",
        "",
        "| arm | failed trajectories | max_turns | model failures | worker restarts |",
        "|---|---|---|---|---|",
    ]
    for arm in arms:
        t = agg["pooled"][arm]["totals"]
        out.append(
            f"| {arm} | {fmt(t.get('failed'), '.0f')} | {fmt(t.get('max_turns'), '.0f')} "
            f"| {fmt(t.get('model_failures'), '.0f')} | {fmt(t.get('worker_restarts'), '.0f')} |"
        )
    out += ["", "Failed or unfinished arms (kept, never re-run):", ""]
    rows = agg["failed_arms"] + [f for f in agg["failures"] if f["status"] != "failed"]
    if not rows:
        out.append("- none")
    for f in rows:
        error = (f.get("error") or f.get("status") or "").splitlines()
        out.append(f"- `{f['id']}`: {error[0] if error else 'unknown'}")
    out.append("")
    return "\n".join(out)


def write_report(comparison_path: Path, output: Path, *, figure: bool) -> list[Path]:
    """Write REPORT.md and aggregate.json (and the figure) into ``output``; returns the files written.

    A report is derived from ``comparison.json`` alone, so writing it again (after ``--resume`` added
    pairs) replaces its own files, and removes a figure an earlier call drew that this one does not: a
    folder never pairs a new report with an old figure. Nothing else in ``output`` is touched."""
    comparison = load_comparison(comparison_path)
    agg = aggregate(comparison)
    output.mkdir(parents=True, exist_ok=True)
    written = [output / "aggregate.json", output / "REPORT.md"]
    write_json_atomic(written[0], agg)
    text = markdown(agg)
    if figure:
        from asyncroll.experiment.figure import draw

        files = draw(comparison, agg, output / "figure")
        written += files
        text += f"\n![three panels]({files[0].name})\n"
    written[1].write_text(text, encoding="utf-8")
    for stale in (output / "figure.png", output / "figure.pdf"):
        if stale not in written:
            stale.unlink(missing_ok=True)
    return written
