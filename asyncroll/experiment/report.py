"""``asyncroll report``: every published number of an experiment, computed from ``comparison.json``.

Writes ``aggregate.json`` (machine-readable) and ``REPORT.md``: the stages and their gate verdicts,
per-policy medians, paired ratios, the paired mean % change with a t and a seeded bootstrap interval,
pooled rates, quality and failure tables. A value that was not measured is written "unknown", never 0.
``--figure`` adds the three-panel figure (``figure.py``). A measured value that has no ratio (a baseline
of 0, a rate over 0 events) is written "undefined" with the reason, never "unknown", and every paired
statistic says how many pairs it rests on (``n``) and which it left out.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asyncroll.errors import OutputWriteError, UsageError
from asyncroll.experiment.comparison import (
    COUNTS,
    DENOMINATORS,
    FLOAT_COUNTS,
    METRICS,
    validate_comparison,
)
from asyncroll.experiment.json_file import read_json_file
from asyncroll.experiment.report_markdown import markdown
from asyncroll.experiment.stats import median, paired_change
from asyncroll.experiment.verdict import console_lines, verdicts
from asyncroll.outputs.lines import clear_staged, remove_staged, staging_path

#: Pooled rates: name → (numerator count, denominator count), both summed over the complete pairs.
POOLED_RATES: dict[str, tuple[str, str]] = {
    "completion_rate": ("completed", "trajectories"),
    "accuracy_exact": ("correct", "graded"),
    "pass_rate_first": ("passed_first", "evaluated"),
    "activation_rate": ("reorders", "eligible_decisions"),
    "completed_per_gpu_hour": ("completed", "allocated_gpu_hours"),
    "cpu_s_per_completion": ("total_cpu_s", "completed"),
}


def load_comparison(path: Path) -> dict[str, Any]:
    """comparison.json, checked (types, cross-references, schema version, numbers the statistics can
    take); UsageError in one line. Not UTF-8, not JSON, a key given twice, an integer past Python's digit
    limit or nesting past its recursion limit are refused as the file is read (``read_json_file``)."""
    try:
        data = read_json_file(path, limit=COMPARISON_MAX_BYTES)
    except UsageError as exc:
        receipt = path.parent / "experiment.json"
        if os.path.lexists(path) or not receipt.is_file():
            raise
        raise UsageError(
            f"{exc}; {receipt} is there, and {_why_none(_experiment_beside(path))}; `asyncroll experiment "
            "run --resume` (the same --config and --output) writes it as it ends"
        ) from None
    try:
        validate_comparison(data)
    except ValueError as exc:
        raise UsageError(f"{path}: not a valid comparison.json: {exc}") from None
    return dict(data)


def pooled_totals(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Each count summed over ``rows`` (one arm's entries in the complete pairs); a count that is unknown
    (null or absent) in any of them is left out: a sum with a gap in it is not a total. A sum of integers
    is an integer (written ``3``, not ``3.0``), and so is a whole count of things an older comparison.json
    wrote as a float (``3.0``, before 2026-12-06)."""
    names = {name for row in rows for name in row["counts"]}
    totals: dict[str, float] = {}
    for name in sorted(names):
        values = [row["counts"].get(name) for row in rows]
        if all(v is not None for v in values):
            total = sum(values)
            whole = name not in FLOAT_COUNTS and isinstance(total, float) and total.is_integer()
            totals[name] = int(total) if whole else total
    return totals


def pooled_rates(totals: dict[str, float], pairs: int) -> tuple[dict[str, float | None], dict[str, str]]:
    """Every pooled rate (None when it cannot be computed) and, for each None, why: no complete pair, a
    count that was not measured ("unknown"), or a denominator of 0 ("undefined")."""
    rates: dict[str, float | None] = {}
    notes: dict[str, str] = {}
    for rate, (num, den) in POOLED_RATES.items():
        missing = [name for name in (num, den) if name not in totals]
        if pairs == 0:
            rates[rate] = None
            notes[rate] = "unknown (no complete pair)"
        elif missing:
            rates[rate] = None
            notes[rate] = f"unknown ({' and '.join(missing)} not measured)"
        elif totals[den] <= 0:
            rates[rate] = None
            notes[rate] = f"undefined ({den} = 0)"
        else:
            rates[rate] = totals[num] / totals[den]
    return rates, notes


#: A metric that is a ratio over a count: null in a summary where that count is 0 is *undefined*, not
#: unknown (the activation rate of a run with no eligible decision, e.g. every FIFO arm; the CPU-s per
#: completion and the accuracy of an arm with no completion). Metric key → its count's key.
_COUNT_OF_PATH = {path: key for key, path in COUNTS}
#: comparison.json holds each arm's summary: megabytes for many pairs, never this much
COMPARISON_MAX_BYTES = 256 << 20
UNDEFINED_WHEN_ZERO = {
    m.key: _COUNT_OF_PATH[DENOMINATORS[m.path]]
    for m in METRICS
    if m.path in DENOMINATORS and DENOMINATORS[m.path] in _COUNT_OF_PATH
}


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

    def undefined(key: str, rows: list[dict[str, Any]], *of: str) -> list[str | None]:
        """Per pair, why a null value of ``key`` in one of the arms ``of`` is a ratio over a measured 0."""
        count = UNDEFINED_WHEN_ZERO.get(key)
        out: list[str | None] = []
        for p in rows:
            why = None
            for arm in of:
                a = p["arms"].get(arm, {})
                measured_zero = count is not None and a.get("counts", {}).get(count) == 0
                if measured_zero and a.get("metrics", {}).get(key) is None:
                    why = f"{count} = 0"
            out.append(why)
        return out

    medians = {arm: {k: median(values(arm, k, complete)) for k in keys} for arm in arms}
    median_n = {arm: {k: sum(v is not None for v in values(arm, k, complete)) for k in keys} for arm in arms}
    median_notes = {
        arm: {
            k: f"undefined ({UNDEFINED_WHEN_ZERO[k]} = 0)"
            for k in keys
            if medians[arm][k] is None and complete and all(undefined(k, complete, arm))
        }
        for arm in arms
    }
    median_left_out = {
        arm: {
            k: "; ".join(
                f"pair {p['pair']} " + (f"undefined ({why})" if why else "not measured")
                for p, v, why in zip(
                    complete, values(arm, k, complete), undefined(k, complete, arm), strict=True
                )
                if v is None
            )
            for k in keys
            if medians[arm][k] is not None and median_n[arm][k] < len(complete)
        }
        for arm in arms
    }
    paired: dict[str, dict[str, Any]] = {}
    for arm in arms:
        if arm == baseline:
            continue
        paired[arm] = {
            k: paired_change(
                values(baseline, k, complete),
                values(arm, k, complete),
                seed=seed,
                resamples=resamples,
                undefined_values=undefined(k, complete, baseline, arm),
                numbers=[p["pair"] for p in complete],
            )
            for k in keys
        }
    pooled: dict[str, dict[str, Any]] = {}
    for arm in arms:
        totals = pooled_totals([p["arms"][arm] for p in complete])
        rates, notes = pooled_rates(totals, len(complete))
        pooled[arm] = {"pairs": len(complete), "totals": totals, **rates, "notes": notes}
    orders = [  # the arms in the order each pair ran them (comparison.json's ``order``)
        {"pair": p["pair"], "order": p["order"]}
        for p in pairs
        if isinstance(p.get("order"), list) and all(isinstance(a, str) for a in p["order"])
    ]
    failures = [
        {"pair": p["pair"], "arm": arm, "id": a["id"], "status": a["status"], "error": a.get("error")}
        for p in pairs
        for arm, a in p["arms"].items()
        if a["status"] != "complete"
    ]
    # every stage's arms not finished (interrupted, pending), and any pair's arm so (a comparison.json
    # written before ``unfinished_arms`` lists the pairs' alone)
    unfinished = list(comparison.get("unfinished_arms", []))
    listed = {u["id"] for u in unfinished}
    unfinished += [f for f in failures if f["status"] != "failed" and f["id"] not in listed]
    agg = {
        "experiment": comparison.get("experiment"),
        "experiment_status": comparison.get("experiment_status"),
        "stop_reason": comparison.get("stop_reason"),
        "fingerprint": comparison.get("fingerprint"),
        "baseline": baseline,
        "arms": arms,
        "policies": comparison["policies"],
        # the rules each arm's policy name ran, from its summaries (``asyncroll`` names the default rule)
        "policy_rules": {
            arm: sorted({r for p in pairs if (r := p["arms"].get(arm, {}).get("policy_rule"))})
            for arm in arms
        },
        # each arm's pairs run to completion: none, and its label says it never ran (no rule to name)
        "complete_runs": {
            arm: sum(p["arms"].get(arm, {}).get("status") == "complete" for p in pairs) for arm in arms
        },
        "pairs_total": len(pairs),
        "pairs_complete": len(complete),
        "complete_pairs": [p["pair"] for p in complete],
        "orders": orders,
        "bootstrap": {"seed": seed, "resamples": resamples, "method": "percentile, pairs resampled"},
        "medians": medians,
        "median_n": median_n,
        "median_notes": median_notes,
        "median_left_out": median_left_out,
        "paired": paired,
        "pooled": pooled,
        "failures": failures,
        "failed_arms": comparison.get("failed_arms", []),
        "unfinished_arms": unfinished,
        "server_versions": comparison.get("server_versions", {}),
        "machines": comparison.get("machines"),  # None: a comparison.json written before they were recorded
        "settings": comparison.get("settings"),
        "stages": comparison.get("stages", {}),
        "metrics": comparison["metrics"],
    }
    agg["verdicts"] = verdicts(agg)  # each arm's answer to "did it help?", read off the intervals above
    return agg


def _experiment_beside(comparison_path: Path) -> dict[str, Any] | None:
    """The experiment.json beside ``comparison_path``, or None (absent, unreadable, not an experiment's)."""
    try:
        receipt = read_json_file(comparison_path.parent / "experiment.json", limit=COMPARISON_MAX_BYTES)
    except UsageError:
        return None
    return receipt if isinstance(receipt, dict) and receipt.get("kind") == "asyncroll.experiment" else None


def _why_none(receipt: dict[str, Any] | None) -> str:
    """Why the experiment's last runner left no comparison.json of its own, as far as ``receipt`` (its
    experiment.json; None: unreadable) says. A runner writes comparison.json as it ends, so one still going,
    or killed outright (kill -9, the OOM killer, a reboot), has written none; one that ended (a status
    other than ``running``) tried and failed (a full disk), or the file was removed since."""
    status = None if receipt is None else receipt.get("status")
    if receipt is None or not isinstance(status, str) or status == "running":
        return (
            "its last runner has not written comparison.json (it writes it as it ends: it still runs, or was "
            "killed outright: kill -9, the OOM killer, a reboot)"
        )
    error = receipt.get("error")
    said = f", its error: {error[:300]}" if isinstance(error, str) and error else ""
    return (
        f"its last runner ended ({status[:40]!r}{said}) and could not write comparison.json (a full disk: "
        "its last message said why), or the file was removed since"
    )


def older_than_experiment(comparison_path: Path, comparison: dict[str, Any]) -> str | None:
    """Why ``comparison`` is older than the experiment it is of: experiment.json beside it (of the same
    fingerprint) says another status. A runner writes comparison.json only as it ends, so a resume still
    going, or one killed outright (kill -9, the OOM killer, a reboot), leaves the one before it there while
    experiment.json holds the arms finished since. None when they agree or no such experiment.json is
    there (a comparison.json copied elsewhere, an experiment.json unreadable or of another experiment)."""
    path = comparison_path.parent / "experiment.json"
    receipt = _experiment_beside(comparison_path)
    if receipt is None:
        return None
    fingerprint = receipt.get("fingerprint")
    if not isinstance(fingerprint, dict) or fingerprint.get("sha256") != comparison.get("fingerprint"):
        return None
    status, then = receipt.get("status"), comparison.get("experiment_status")
    if not isinstance(status, str) or status == then:
        return None
    return (
        f"{path} says the experiment is {status[:40]!r}, this comparison.json {then!r}: it is an earlier "
        f"runner's; {_why_none(receipt)}, so arms finished since are not in this report; `asyncroll "
        "experiment run --resume` (the same --config and --output) writes comparison.json again"
    )


def write_report(
    comparison_path: Path,
    output: Path,
    *,
    figure: bool,
    warn: Callable[[str], None] | None = None,
    tell: Callable[[str], None] | None = None,
) -> list[Path]:
    """Write REPORT.md and aggregate.json (and the figure) into ``output``; returns the files written, and
    once they are, gives ``tell`` each arm's verdict on its headline metric (``verdict.console_lines``).

    Everything is computed, then written into a new hidden temporary folder next to ``output``; only
    when all of it succeeded does that folder become ``output`` (one rename), so a refused comparison or
    a failed write leaves no partial report. A report is derived from ``comparison.json`` alone, so
    writing it again into an existing ``output`` (after ``--resume`` added pairs) stages its files in a
    temporary folder inside ``output``, then replaces its own files, each by a rename, and removes a
    figure an earlier call drew that this one does not: a folder never pairs a new report with an old
    figure. A comparison.json older than the experiment.json beside it is reported, and said to be so
    (in REPORT.md, aggregate.json and to ``warn``). One that finds ``output`` made meanwhile (a
    neighbour's report, at once) replaces its files so too, from its staged folder beside it. Nothing
    else in ``output`` is touched."""
    try:
        os.stat(output)
    except FileNotFoundError:
        pass
    except OSError as exc:  # a name too long, a parent that is a file: it cannot be made either
        raise UsageError(f"--output {output}: cannot create: {exc.strerror or exc}") from None
    if output.exists() and not output.is_dir():
        raise UsageError(f"--output {output} is a file, not a directory")
    if output.is_symlink() and not output.exists():  # the staged folder cannot be renamed over it
        target = os.readlink(output)
        raise UsageError(
            f"--output {output} is a symbolic link to {target}, which does not exist: make that folder, or "
            "give another --output"
        )
    if output.is_dir() and not os.path.lexists(output / "aggregate.json"):  # no report was written there
        taken = [n for n in ("REPORT.md", "figure.png", "figure.pdf") if os.path.lexists(output / n)]
        if taken:
            raise UsageError(
                f"--output {output} holds {', '.join(taken)} but no aggregate.json: not a report's folder, "
                "whose files a report replaces (choose another folder)"
            )
    comparison = load_comparison(comparison_path)
    agg = aggregate(comparison)
    if (older := older_than_experiment(comparison_path, comparison)) is not None:
        agg["older_than_experiment"] = older
        if warn is not None:
            warn(f"warning: {older}")
    try:  # the statistics of checked values are finite; if one is not, it is refused, never written
        agg_text = json.dumps(agg, indent=2, allow_nan=False, default=str) + "\n"
    except ValueError:
        raise UsageError(
            f"{comparison_path}: a statistic of these values is not a finite number; no report written"
        ) from None
    text = markdown(agg)
    if figure:
        from asyncroll.experiment.figure import require_matplotlib

        require_matplotlib()
    existing = output.is_dir()
    # next to output (the same file system, so a rename); inside it when it exists (it is writable)
    home = output if existing else output.parent
    try:
        home.mkdir(parents=True, exist_ok=True)
        # the shared per-process staging name: what a killed report left is cleared by the next one
        named = home / (output.name or "report")
        clear_staged(named)
        staging = staging_path(named)
        remove_staged(staging)  # a dead process with this pid left it
        staging.mkdir()
    except OSError as exc:
        raise UsageError(f"--output {output}: cannot create: {exc.strerror or exc}") from None
    try:
        names = ["aggregate.json", "REPORT.md"]
        (staging / names[0]).write_text(agg_text, encoding="utf-8")
        if figure:
            from asyncroll.experiment.figure import draw

            files = draw(comparison, agg, staging / "figure")
            names += [f.name for f in files]
            text += f"\n![three panels]({files[0].name})\n"
        # a path's undecodable bytes (in a failed arm's error) as their escapes, \udce9: the file is UTF-8
        (staging / names[1]).write_text(text, encoding="utf-8", errors="backslashreplace")
        if not existing:
            try:
                staging.rename(output)
            except OSError as exc:  # a neighbour's report of it made the folder meanwhile: replace its files
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not output.is_dir():
                    raise
                existing = True
        if existing:
            for name in names:
                os.replace(staging / name, output / name)
            for stale in ("figure.png", "figure.pdf"):
                if stale not in names:
                    (output / stale).unlink(missing_ok=True)
    except OSError as exc:  # a full disk, say: not a usage error (exit 1)
        raise OutputWriteError(f"--output {output}: cannot write the report: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already when it became output
    if tell is not None:
        for line in console_lines(agg):
            tell(line)
    return [output / name for name in names]
