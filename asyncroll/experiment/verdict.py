"""The report's answer to "did this policy help?": for each arm against the baseline, each metric that has
a better direction read off its 95% t interval of the paired change, and one headline metric that answers.

A change is **better** or **worse** only when its interval lies wholly on one side of 0; an interval that
spans 0 is *no evidence of a change* (either way: not evidence of no change), and a metric without an
interval (fewer than two pairs with values, a value never measured) has *no verdict*; an interval of
[0, 0] (both arms never starved) is *the same in every pair*. The % change is
read where it is defined; where a baseline of 0 leaves it undefined (no starvation in the baseline's run),
the mean difference is read instead. Where the bootstrap interval is trustworthy (about ten pairs or
more) and lies on another side of 0, the verdict says so. The headline is completions per allocated
GPU-hour, the measure the experiment is for, or completions per wall hour where no arm declared a dedicated
GPU. The other metrics are secondary: many are read at once, so at 95% one in twenty excludes 0 by chance.
"""

from __future__ import annotations

from typing import Any

from asyncroll.experiment.stats import Interval, percentile_bootstrap_coverage

#: The headline metrics, in order of preference: the first one measured answers.
HEADLINES = ("completed_per_gpu_hour", "completed_per_wall_hour")

BETTER, WORSE, NO_EVIDENCE, NO_VERDICT = "better", "worse", "no evidence of a change", "no verdict"
#: Every pair's change exactly 0 (both arms never starved, say): an interval of [0, 0], not "no evidence".
SAME = "the same in every pair"


def _interval(d: dict[str, Any] | None) -> Interval | None:
    if not isinstance(d, dict):
        return None
    return Interval(d.get("n", 0), d.get("mean"), d.get("low"), d.get("high"), d.get("note"))


def _trusted(n: int) -> bool:
    """Whether a percentile bootstrap over ``n`` pairs is worth setting beside the t interval: below about
    ten pairs it covers the mean far less often than its 95% (the report then says to read the t
    interval), and its disagreement would be noise."""
    return n >= 2 and percentile_bootstrap_coverage(n) >= 0.90


def read(paired: dict[str, Any], higher_is_better: bool) -> dict[str, Any]:
    """One metric's verdict from its paired statistics (``stats.paired_change``'s record)."""
    pct = _interval(paired.get("mean_percent_change_t95"))
    diff = _interval(paired.get("mean_difference_t95"))
    boot = _interval(paired.get("mean_percent_change_bootstrap95"))
    scale, used = "percent", pct
    if (pct is None or pct.mean is None) and diff is not None and diff.low is not None:
        scale, used, boot = "difference", diff, None  # % undefined over a baseline of 0: the difference
    out: dict[str, Any] = {"verdict": NO_VERDICT, "scale": scale, "n": 0, "mean": None, "low": None}
    out |= {"high": None, "why": None, "bootstrap_disagrees": False}
    if used is None:
        return out | {"why": "no paired statistics"}
    out |= {"n": used.n, "mean": used.mean, "low": used.low, "high": used.high}
    if used.low is None or used.high is None:
        return out | {"why": used.note or "no interval"}
    side = 1 if used.low > 0 else -1 if used.high < 0 else 0
    if used.low == used.high == 0:
        out["verdict"] = SAME
    elif side == 0:
        out["verdict"] = NO_EVIDENCE
    else:
        out["verdict"] = BETTER if (side > 0) == higher_is_better else WORSE
    if boot is not None and boot.low is not None and boot.high is not None and _trusted(boot.n):
        boot_side = 1 if boot.low > 0 else -1 if boot.high < 0 else 0
        out["bootstrap_disagrees"] = boot_side != side
    return out


def verdicts(agg: dict[str, Any]) -> dict[str, Any]:
    """Per arm other than the baseline: its headline metric and every directed metric's verdict."""
    directed = {
        m["key"]: m["higher_is_better"] for m in agg["metrics"] if m.get("higher_is_better") is not None
    }
    out: dict[str, Any] = {}
    for arm, per_metric in agg["paired"].items():
        metrics = {k: read(per_metric[k], up) for k, up in directed.items() if k in per_metric}
        measured = [k for k in HEADLINES if k in metrics and metrics[k]["n"] > 0]
        headline = measured[0] if measured else next((k for k in HEADLINES if k in metrics), None)
        out[arm] = {"headline": headline, "metrics": metrics}
    return out


def _signed(x: float, scale: str) -> str:
    return f"{x:+z,.2f}%" if scale == "percent" else f"{x:+z,.4g}"


def change_text(v: dict[str, Any]) -> str:
    """``+4.60% [+2.90%, +6.30%] (n=10)``, or why there is no interval."""
    if v["mean"] is None:
        why = str(v["why"])
        return why if why.startswith(("undefined", "unknown")) else f"unknown ({why})"
    unit = "" if v["scale"] == "percent" else " (mean difference: the % change is undefined)"
    if v["low"] is None:
        return f"{_signed(v['mean'], v['scale'])}{unit} (n={v['n']}; {v['why']})"
    return (
        f"{_signed(v['mean'], v['scale'])} [{_signed(v['low'], v['scale'])}, "
        f"{_signed(v['high'], v['scale'])}]{unit} (n={v['n']})"
    )


def cell(agg: dict[str, Any], arm: str, key: str) -> str:
    """The paired table's verdict column: the word, and whether the bootstrap interval disagrees; ``-``
    for a metric with no better direction (the activation rate, telemetry coverage)."""
    v = agg.get("verdicts", {}).get(arm, {}).get("metrics", {}).get(key)
    if v is None:
        return "-"
    word = v["verdict"]
    text = f"**{word}**" if word in (BETTER, WORSE) else word
    if v["scale"] == "difference":
        text += " (on the difference)"
    return text + ("; the bootstrap interval does not agree" if v["bootstrap_disagrees"] else "")


def _named(agg: dict[str, Any], arm: str) -> str:
    policy = agg["policies"].get(arm)
    return f"`{arm}`" + (f" ({policy})" if policy and policy != arm else "")


def headline(agg: dict[str, Any], arm: str, labels: dict[str, str]) -> str:
    """One sentence: the arm's verdict on its headline metric."""
    versus = f"{_named(agg, arm)} vs {_named(agg, agg['baseline'])}"
    record = agg["verdicts"][arm]
    key = record["headline"]
    if key is None:
        return f"{versus}: **no verdict** (no throughput metric compared)"
    v = record["metrics"][key]
    word = v["verdict"]
    if word == NO_VERDICT:
        return f"{versus}: **no verdict**: {labels[key]} {change_text(v)}"
    if word == SAME:
        return f"{versus}: **{word}**: {labels[key]} {change_text(v)}"
    side = "spans 0" if word == NO_EVIDENCE else "excludes 0"
    return (
        f"{versus}: **{word}**: {labels[key]} {change_text(v)}, a 95% t interval over the complete pairs "
        f"that {side}" + ("; the bootstrap interval does not agree" if v["bootstrap_disagrees"] else "")
    )


def markdown_lines(agg: dict[str, Any]) -> list[str]:
    """REPORT.md's "Did it help?" section."""
    if not agg["paired"]:
        return []
    labels = {m["key"]: m["label"] for m in agg["metrics"]}
    out = ["## Did it help?", ""]
    if agg["pairs_complete"] == 0:
        return [*out, "No verdict: no complete pair.", ""]
    out += [f"- {headline(agg, arm, labels)}." for arm in agg["verdicts"]]
    return [
        *out,
        "",
        "A verdict is read off the 95% t interval of the paired change: **better** or **worse** only when "
        "it excludes 0; one that spans 0 is no evidence either way (not evidence of no change); one of "
        "[0, 0] means every pair changed by exactly 0. The "
        "headline is the throughput the experiment is for (completions per GPU-hour; per wall hour where no "
        "arm declared a dedicated GPU). Each metric's verdict is in the last column of its arm's paired "
        "table; they are secondary: with so many read at once, one in twenty excludes 0 by chance. Where a "
        "baseline of 0 leaves the % change undefined, the mean difference is read.",
        "",
    ]


def console_lines(agg: dict[str, Any]) -> list[str]:
    """What ``asyncroll report`` prints after the files it wrote: each arm's headline, without markup."""
    if not agg["paired"] or agg["pairs_complete"] == 0:
        return ["no verdict: no complete pair"] if agg["paired"] else []
    labels = {m["key"]: m["label"] for m in agg["metrics"]}
    return [headline(agg, arm, labels).replace("**", "").replace("`", "") for arm in agg["verdicts"]]
