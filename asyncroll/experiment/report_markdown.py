"""REPORT.md's text, from the aggregate ``asyncroll report`` computed (``report.py``): tables only of
numbers in aggregate.json, "unknown" for a value not measured, "undefined" with its reason for a ratio
that has none."""

from __future__ import annotations

from typing import Any

from asyncroll.experiment.gates import comparison_text
from asyncroll.experiment.machines import machine_lines
from asyncroll.experiment.receipts import one_line
from asyncroll.experiment.verdict import cell as verdict_cell
from asyncroll.experiment.verdict import markdown_lines as verdict_lines


def fmt(value: Any, spec: str | None = None) -> str:
    """A value as the report prints it: four significant digits by default, a large one whole with
    thousands separators (67,050 completions per hour, not 6.705e+04)."""
    if value is None:
        return "unknown"
    if isinstance(value, float):
        return format(value, spec) if spec is not None else _number(value)
    return str(value)


def _number(x: float, sign: str = "") -> str:
    # whole wherever four significant digits would take an exponent: from 1e4 as rounded (9,999.7 too);
    # "z": a value that rounds to zero is 0, never "-0"
    short = format(x, f"{sign}z.4g")
    return format(x, f"{sign}z,.0f") if "e+" in short else short


def _interval(d: dict[str, Any], percent: bool = True) -> str:
    """A mean with its interval and ``n`` (the pairs it rests on), or why there is none."""

    def num(x: float) -> str:
        return f"{x:+z,.2f}%" if percent else _number(x, "+")  # -0.001% is +0.00%, not -0.00%

    note = d.get("note")
    if d["mean"] is None:
        return note if note and note.startswith("undefined") else f"unknown ({note})"
    if d["low"] is None:
        return f"{num(d['mean'])} (n={d['n']}; no interval: {note})"
    return f"{num(d['mean'])} [{num(d['low'])}, {num(d['high'])}] (n={d['n']}" + (
        f"; {note})" if note else ")"
    )


def _ratio(r: float) -> str:
    """A pair's ratio to four decimals; one so small that they round it to 0.0000 (a starvation of 3 s
    cut to 0.1 ms) with four significant digits, since only a ratio of 0 is written 0."""
    text = format(r, ".4f")
    return format(r, ".4g") if r != 0 and float(text) == 0 else text


def _per_pair(d: dict[str, Any]) -> str:
    """Each complete pair's ratio, named by its pair number (``p3 1.1000``): once a pair with a failed
    arm is excluded, a ratio's position is no longer its pair's number."""
    ratios = d["ratios"]
    notes = d.get("pair_notes") or [None] * len(ratios)
    numbers = d.get("pair_numbers") or list(range(1, len(ratios) + 1))
    cells = [
        f"p{k} " + (_ratio(r) if r is not None else (n or "unknown"))
        for k, r, n in zip(numbers, ratios, notes, strict=True)
    ]
    return ", ".join(cells) or "none"


def _observed(gate: dict[str, Any]) -> str:
    """A gate's observed value, or its verdict's note: undefined (over a count of 0) or unknown."""
    return fmt(gate["observed"]) if gate["observed"] is not None else str(gate.get("note") or "unknown")


def _rate(pooled: dict[str, Any], rate: str) -> str:
    value = pooled.get(rate)
    return fmt(value) if value is not None else pooled.get("notes", {}).get(rate, "unknown")


def _rate_of(pooled: dict[str, Any], rate: str, num: str, den: str) -> str:
    """A pooled rate with the counts it rests on (``0.5 (3 / 6)``); when neither count was measured, the
    rate's note alone says so (not ``unknown (… not measured) (unknown / unknown)``)."""
    t = pooled["totals"]
    if t.get(num) is None and t.get(den) is None:
        return _rate(pooled, rate)
    return f"{_rate(pooled, rate)} ({fmt(t.get(num), '.0f')} / {fmt(t.get(den), '.0f')})"


def _run_order(agg: dict[str, Any]) -> list[str]:
    """The order each pair ran its arms in, and a warning when every complete pair ran in one order: an
    effect of the position (drift, warm-up) is then in every paired change, not balanced out."""
    orders = agg.get("orders") or []
    if not orders:
        return []
    line = (
        "Order of the arms in each pair (as run, or planned): "
        + "; ".join(f"p{o['pair']} {' → '.join(o['order'])}" for o in orders)
        + "."
    )
    complete = {o["pair"] for o in orders} & set(agg.get("complete_pairs", []))
    ran = {tuple(o["order"]) for o in orders if o["pair"] in complete}
    if len(complete) > 1 and len(ran) == 1:
        line += (
            " **Every complete pair ran in the same order**: an effect of the position (drift, warm-up)"
            " is in every paired change, not balanced out."
        )
    return [line, ""]


def _intervals(agg: dict[str, Any]) -> list[str]:
    """How the intervals were computed (aggregate.json's ``bootstrap``; absent in an older one: unsaid)."""
    boot = agg.get("bootstrap")
    if not isinstance(boot, dict):
        return []
    return [
        'Intervals are 95%: "t" is Student\'s t over the pairs (n − 1 degrees of freedom), "bootstrap" a '
        f"bootstrap of the mean ({boot.get('method')}; {boot.get('resamples'):,} resamples, seed "
        f"{boot.get('seed')}). A t interval that spans 0 is no evidence of a change either way; one that "
        "excludes 0 is evidence for that metric alone (many are shown: at 95%, one in twenty of them "
        "excludes 0 by chance).",
        "",
    ]


def policy_label(agg: dict[str, Any], arm: str) -> str:
    """``asyncroll = asyncroll_repair``: an arm's policy and, when the name differs from it, the rule its
    runs ran (from their summaries; ``asyncroll`` names the default rule of its version, which summaries
    written before they named the rule leave unsaid: ``asyncroll = rule not recorded``). An arm none of
    whose runs completed has no summary to name it: ``asyncroll; no run completed``."""
    policy = agg["policies"][arm]
    recorded = agg.get("policy_rules", {}).get(arm, [])
    rules = [r for r in recorded if r != policy]
    if not recorded and agg.get("complete_runs", {}).get(arm) == 0:  # an aggregate.json before: unknown
        return f"{policy}; no run completed"
    if not recorded and policy == "asyncroll":
        rules = ["rule not recorded"]
    return f"{policy} = {' / '.join(rules)}" if rules else policy


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
        f"({policy_label(agg, base)}). Protocol fingerprint `{(agg['fingerprint'] or 'unknown')[:16]}`.",
        "",
        *(
            [f"**Older than the experiment:** {agg['older_than_experiment']}", ""]
            if "older_than_experiment" in agg
            else []
        ),
        'Every number below is computed by `asyncroll report` from `comparison.json`; "unknown" marks a '
        'metric the run could not measure (never a zero), "undefined" a ratio of measured values whose '
        "denominator is 0 (a baseline of 0: the % change is undefined, the difference is not). Only "
        "complete pairs enter medians and paired statistics; n is the number of pairs a statistic rests "
        "on, and any pair it leaves out is named.",
        "",
        *_intervals(agg),
        *(
            [
                "**No complete pair**: every pair has a failed or unfinished arm (listed under Failures), so "
                "no median, paired statistic or pooled rate below could be computed (an arm's completed runs "
                "keep their own summaries).",
                "",
            ]
            if agg["pairs_complete"] == 0
            else []
        ),
        *_run_order(agg),
        "Server versions seen in the arms' logs (and answered to their clients' GET /version): "
        + (
            "; ".join(
                f"{k} {', '.join(v)}" + (" (**differs between arms**)" if len(v) > 1 else "")
                for k, v in agg["server_versions"].items()
            )
            or "none parsed"
        )
        + ".",
        "",
        *machine_lines(agg.get("machines"), agg.get("settings")),
        *(verdict_lines(agg) if "verdicts" in agg else []),
        "## Stages",
        "",
        "| stage | status | gates |",
        "|---|---|---|",
    ]
    for stage, state in agg["stages"].items():
        gates = "; ".join(
            f"{g['metric']}[{g['arm']}] = {comparison_text(g, _observed(g))}: "
            f"{'pass' if g['passed'] else 'FAIL'}"
            for g in state.get("gates", [])
        )
        out.append(f"| {stage} | {state.get('status')} | {gates or '-'} |")
    out += [
        "",
        "## Per-policy medians (complete pairs)",
        "",
        "| metric | " + " | ".join(f"{a} ({policy_label(agg, a)})" for a in arms) + " |",
        "|---|" + "---|" * len(arms),
    ]
    complete = agg["pairs_complete"]
    for key, label in labels.items():
        cells = []
        for a in arms:
            n = agg.get("median_n", {}).get(a, {}).get(key, complete)
            value = agg["medians"][a][key]
            note = agg.get("median_notes", {}).get(a, {}).get(key)
            left = agg.get("median_left_out", {}).get(a, {}).get(key)
            cells.append(
                ("no complete pair" if not complete else note if value is None and note else fmt(value))
                + (
                    f" (n={n} of {complete}{f': {left}' if left else ''})"
                    if value is not None and n < complete
                    else ""
                )
            )
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    for arm, per_metric in agg["paired"].items():
        out += [
            "",
            f"## Paired: {arm} vs {base}",
            "",
            "| metric | ratio per pair | mean % change [95% t] | mean % change [95% bootstrap] "
            f"| mean difference, {arm} − {base} [95% t] | verdict |",
            "|---|---|---|---|---|---|",
        ]
        for key, d in per_metric.items():
            out.append(
                f"| {labels[key]} | {_per_pair(d)} | {_interval(d['mean_percent_change_t95'])} "
                f"| {_interval(d['mean_percent_change_bootstrap95'])} "
                f"| {_interval(d['mean_difference_t95'], percent=False)} | {verdict_cell(agg, arm, key)} |"
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
            f"| {arm} | {_rate(p, 'completion_rate')} | {_rate(p, 'completed_per_gpu_hour')} "
            f"| {_rate(p, 'cpu_s_per_completion')} | {_rate(p, 'activation_rate')} |"
        )
    out += [
        "",
        "## Quality (sums over complete pairs)",
        "",
        "| arm | exact accuracy (correct / graded) | first-pass rate (passed / evaluated) |",
        "|---|---|---|",
    ]
    for arm in arms:
        p = agg["pooled"][arm]
        out.append(
            f"| {arm} | {_rate_of(p, 'accuracy_exact', 'correct', 'graded')} "
            f"| {_rate_of(p, 'pass_rate_first', 'passed_first', 'evaluated')} |"
        )
    out += [
        "",
        "## Failures",
        "",
        "Trajectory counts are sums over the complete pairs, like the rates above: a pair with a failed "
        "or unfinished arm counts in none of its arms. Every failed and unfinished arm is listed below. "
        "The client's event loop stalled: seconds it was held (summary.json's event_loop), in which "
        "admission, dispatch and the reading of responses waited for it, whatever the policy; unknown for a "
        "run that did not watch it. The client's process stopped: seconds it was stopped by job control "
        "(Ctrl-Z, SIGSTOP; not counted as stalls), which its makespan and latencies hold; unknown for a "
        "client that did not tell stops apart.",
        "",
        "| arm | failed trajectories | max_turns | model failures | worker restarts "
        "| client event loop stalled, s | client process stopped, s |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm in arms:
        t = agg["pooled"][arm]["totals"]
        out.append(
            f"| {arm} | {fmt(t.get('failed'), '.0f')} | {fmt(t.get('max_turns'), '.0f')} "
            f"| {fmt(t.get('model_failures'), '.0f')} | {fmt(t.get('worker_restarts'), '.0f')} "
            f"| {fmt(t.get('loop_stalled_s'))} | {fmt(t.get('process_stopped_s'))} |"
        )
    out += ["", "Failed arms (kept, never re-run):", ""]
    out += [f"- `{f['id']}`: {one_line(f.get('error'))}" for f in agg["failed_arms"]] or ["- none"]
    # interrupted (Ctrl-C, the deadline, a busy GPU or server port) or never reached: not failures;
    # --resume runs them, unless a stage failed its gate: the experiment stopped there for good
    unfinished = agg["unfinished_arms"]
    gate = next((s for s, state in agg["stages"].items() if state.get("status") == "failed"), None)
    if unfinished:
        out += [
            "",
            f"Arms not run (stage {gate} failed its gate; `--resume` does not run them):"
            if gate is not None
            else "Unfinished arms (not failed; `--resume` runs them):",
            "",
        ]
        for f in unfinished:
            out.append(
                f"- `{f['id']}`: {f['status']}" + (f": {one_line(f['error'])}" if f.get("error") else "")
            )
    out.append("")
    return "\n".join(out)
