"""The experiment's one figure: three panels, a line per pair, medians marked; PNG and PDF.

Panels: completions per allocated GPU-hour, sampled model starvation (fraction of covered time), and
client + worker CPU-seconds per completion. The x axis is the arm (baseline first); each complete pair
is one grey line joining its arms' values (named ``p<n>`` up to 8 pairs), each arm's median a black bar;
under each arm other than the baseline, its mean change from the baseline with its 95% t interval and the
verdict REPORT.md reads off it (better, worse, no evidence of a change, no verdict);
the y axis starts at 0 (the three metrics are never negative), so a change of 1% looks like one; a footer
names the machine (:func:`~asyncroll.experiment.machines.machine_caption`). A panel
whose metric is unknown for every pair says "unknown" instead of drawing nothing ("no complete pair" when
none is); a value that is a ratio over a measured 0 (CPU-s per completion of an arm that completed
nothing) is named "undefined", as the report names it, never "unknown". matplotlib is the ``figures``
extra, imported only here.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from asyncroll.errors import UsageError
from asyncroll.experiment.machines import machine_caption
from asyncroll.experiment.report_markdown import policy_label

PANELS = (
    ("completed_per_gpu_hour", "completions per allocated GPU-hour", "higher is better"),
    (
        "sampled_starvation_fraction",
        "sampled model starvation\n(fraction of covered time)",
        "lower is better",
    ),
    ("cpu_s_per_completion", "client + worker CPU-s per completion", "lower is better"),
)


def require_matplotlib() -> None:
    """Refuse (UsageError naming the extra) unless matplotlib can be imported: checked before anything
    of a report is written, so a missing extra leaves no half-written report behind."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("the figure needs matplotlib: pip install 'asyncroll[figures]'") from None


Values = list[float | None]

#: The panel's note of unknown or undefined pairs: at most this many characters a line and this many lines
#: (12 in wide at 7 pt: a third of the figure). One line naming every pair ran far past its panel, and
#: matplotlib's constrained layout gave up ('axes sizes collapsed to zero'), leaving the notes off the page.
NOTE_WIDTH = 48
NOTE_LINES = 4
#: Each pair's line is labelled with its number (``p3``) up to this many pairs; past it, the labels at the
#: last arm's tick are printed over each other, so none is drawn (REPORT.md names each pair's ratio).
PAIR_LABELS = 8
#: Inches a line of a tick takes at 10 pt (matplotlib's line spacing, 1.2).
TICK_LINE_IN = 10 * 1.2 / 72
#: Half the width of a median's bar, in arms (an arm's tick is 1 from the next).
MEDIAN_HALF_WIDTH = 0.18
#: Points between two pair names at one arm (their font is 7 pt).
LABEL_GAP = 8.0
#: An arm's name on its tick: at most this many characters a line (a policy label is up to about 30).
TICK_WIDTH = 30


def pair_values(
    complete: list[dict[str, Any]], arms: list[str], key: str
) -> tuple[list[tuple[int, Values]], list[tuple[int, Values]]]:
    """Each complete pair's values of ``key``, one per arm: ``(pairs with every value, pairs with an
    unknown one)``. The second kind is drawn as its known points and named as unknown, never dropped
    silently (the medians count every known value)."""
    lines: list[tuple[int, Values]] = []
    partial: list[tuple[int, Values]] = []
    for pair in complete:
        ys: Values = [pair["arms"][a]["metrics"].get(key) for a in arms]
        (partial if any(y is None for y in ys) else lines).append((pair["pair"], ys))
    return lines, partial


def unknown_note(
    partial: list[tuple[int, Values]], arms: list[str], undefined: Mapping[tuple[int, str], str] | None = None
) -> str:
    """``"unknown: p3 (fifo); p5 (fifo, asyncroll)"``: which pairs' values the panel could not draw.

    ``undefined`` maps (pair number, arm) to why that arm's null value is a ratio over a measured 0
    (``"completed = 0"``): such a value is named undefined, as the report names it, never unknown."""
    why = undefined or {}
    groups: dict[str, list[str]] = {}
    for number, ys in partial:
        by_reason: dict[str, list[str]] = {}
        for arm, y in zip(arms, ys, strict=True):
            if y is None:
                reason = why.get((number, arm))
                by_reason.setdefault("unknown" if reason is None else f"undefined ({reason})", []).append(arm)
        for reason, named in by_reason.items():
            groups.setdefault(reason, []).append(f"p{number} ({', '.join(named)})")
    order = sorted(groups, key=lambda reason: reason != "unknown")  # unknown first, as before
    return "; ".join(f"{reason}: " + "; ".join(groups[reason]) for reason in order)


def fit_note(note: str) -> str:
    """``note`` (from :func:`unknown_note`) broken into lines of :data:`NOTE_WIDTH` between its entries; past
    :data:`NOTE_LINES` lines the rest are counted, not named (REPORT.md's medians table names each pair).
    An entry longer than a line (a pair of long arm names) is broken within, as a tick's name is."""
    entries = note.split("; ")
    pieces = [f"{entry};" for entry in entries[:-1]] + entries[-1:]
    lines: list[str] = []
    for k, piece in enumerate(pieces):
        parts = textwrap.wrap(piece, NOTE_WIDTH, break_on_hyphens=False)
        if lines and len(lines[-1]) + 1 + len(piece) <= NOTE_WIDTH:
            lines[-1] += f" {piece}"
        elif len(lines) + len(parts) < NOTE_LINES or (
            len(lines) < NOTE_LINES and len(" ".join(pieces[k:])) <= NOTE_WIDTH
        ):
            lines.extend(parts)
        else:  # the last line says how many are left
            lines.append(f"… and {len(pieces) - k} more (REPORT.md names each)")
            break
    return "\n".join(lines)


def tick_width(arms: int) -> int:
    """Characters a line of a tick may take when ``arms`` ticks share a panel: :data:`TICK_WIDTH` for two,
    less for more (three arms' unbroken policy labels ran into each other, unreadable)."""
    return TICK_WIDTH if arms <= 2 else max(6, 48 // arms)  # at 8 pt (:func:`tick_size`)


def tick_size(arms: int) -> float:
    """The tick labels' font size in points: matplotlib's 10 for two arms, 8 for more."""
    return 10.0 if arms <= 2 else 8.0


def tick_label(arm: str, policy: str, width: int = TICK_WIDTH, verdict: str | None = None) -> str:
    """An arm's x tick: its name, broken every ``width`` characters (arm names have no length limit and no
    spaces; a 60-character one collapsed the layout as a long note did), over its policy, broken so too,
    over the panel's verdict on it against the baseline (:func:`verdict_line`), if any."""
    return "\n".join(
        [
            *textwrap.wrap(arm, width, break_on_hyphens=False),
            *textwrap.wrap(f"({policy})", width, break_on_hyphens=False),
            *(line for part in (verdict or "").splitlines() for line in textwrap.wrap(part, width)),
        ]
    )


def verdict_line(agg: dict[str, Any], arm: str, key: str) -> str | None:
    """The panel's verdict on ``arm`` against the baseline, as REPORT.md's paired table reads it: the
    mean change with its 95% t interval over the word (``+4.55% [+3.14%, +5.96%]`` / ``better``);
    ``baseline`` under the baseline; None for a report without verdicts."""
    from asyncroll.experiment.verdict import change_text

    if arm == agg["baseline"]:
        return "baseline"
    v = agg.get("verdicts", {}).get(arm, {}).get("metrics", {}).get(key)
    if v is None:
        return None
    if v["mean"] is None or v["low"] is None:
        return str(v["verdict"])
    return f"{change_text(v).split(' (')[0]}\n{v['verdict']}"


def undefined_values(complete: list[dict[str, Any]], arms: list[str], key: str) -> dict[tuple[int, str], str]:
    """(pair number, arm) → ``"<count> = 0"`` for each null value of ``key`` that is a ratio over a
    measured 0 (the report's ``UNDEFINED_WHEN_ZERO``), so the figure says "undefined" where it does."""
    from asyncroll.experiment.report import UNDEFINED_WHEN_ZERO

    count = UNDEFINED_WHEN_ZERO.get(key)
    out: dict[tuple[int, str], str] = {}
    for pair in complete:
        for arm in arms:
            entry = pair["arms"][arm]
            if count is not None and entry["metrics"].get(key) is None and entry["counts"].get(count) == 0:
                out[pair["pair"], arm] = f"{count} = 0"
    return out


def spread(positions: list[float], gap: float) -> list[float]:
    """``positions`` (of labels, in one unit) moved apart to at least ``gap`` each, each run of labels
    that would overlap centred on where its labels were (in the order given; the result is too)."""
    order = sorted(range(len(positions)), key=lambda i: positions[i])
    blocks: list[tuple[float, list[int]]] = []  # a run of labels: its first one's position, its labels
    for i in order:
        blocks.append((positions[i], [i]))
        while len(blocks) > 1 and blocks[-2][0] + len(blocks[-2][1]) * gap > blocks[-1][0]:
            members = blocks[-2][1] + blocks.pop()[1]
            centre = sum(positions[m] for m in members) / len(members)
            blocks[-1] = (centre - (len(members) - 1) * gap / 2, members)
    out = list(positions)
    for start, members in blocks:
        for k, m in enumerate(members):
            out[m] = start + k * gap
    return out


def place_labels(fig: Any, labels: list[tuple[Any, str, float, float | None]]) -> None:
    """Each pair's name right of its line's last point, past the median's bar, the names of one panel at
    least :data:`LABEL_GAP` points apart (lines ending at one value named them over each other,
    unreadable); a name moved off its point is still beside it, in the run of names its neighbours make."""
    per_point = fig.dpi / 72.0
    for ax in {id(a): a for a, *_ in labels}.values():
        mine = [(text, x, y) for a, text, x, y in labels if a is ax and y is not None]
        at = [float(ax.transData.transform((x, y))[1]) / per_point for _, x, y in mine]
        for (text, x, y), was, now in zip(mine, at, spread(at, LABEL_GAP), strict=True):
            note = ax.annotate(
                text,
                (x + MEDIAN_HALF_WIDTH, y),  # past the median's bar, which hid the name of a line under it
                xytext=(3, now - was),
                textcoords="offset points",
                fontsize=7,
                color="0.4",
                va="center",
                annotation_clip=False,
            )
            note.set_in_layout(False)  # placed on this layout: it must not change it


def y_limits(top: float) -> tuple[float, float]:
    """A panel's y range for values from 0 to ``top``: from 0 (a margin below, so that a point at 0 is not
    cut in half) to a fifth above ``top``, where the legend sits clear of the lines (all 0: up to 1)."""
    high = top if top > 0 else 1.0
    return -0.03 * high, 1.2 * high


def draw(comparison: dict[str, Any], agg: dict[str, Any], stem: Path) -> list[Path]:
    """Write ``stem``.png and ``stem``.pdf; returns both paths."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms: list[str] = [agg["baseline"], *[a for a in agg["arms"] if a != agg["baseline"]]]
    complete = [p for p in comparison["pairs"] if p.get("complete")]
    ticks = {
        key: [
            tick_label(a, policy_label(agg, a), tick_width(len(arms)), verdict_line(agg, a, key))
            for a in arms
        ]
        for key, _, _ in PANELS
    }
    tallest = max(label.count("\n") + 1 for labels in ticks.values() for label in labels)
    # a tick's lines beyond the first five each make the figure taller: they took the panels' height
    height = 4.2 + max(0, tallest - 5) * TICK_LINE_IN * tick_size(len(arms)) / 10
    fig, axes = plt.subplots(1, 3, figsize=(12, height), constrained_layout=True)
    labels: list[tuple[Any, str, float, float | None]] = []  # each pair's name at its last point
    xs = list(range(len(arms)))
    for ax, (key, label, direction) in zip(axes, PANELS, strict=True):
        drawn = False
        lines, partial = pair_values(complete, arms, key)
        undefined = undefined_values(complete, arms, key)
        for _, ys in partial:  # a line needs every arm: the known points alone, hollow
            known = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
            if known:
                ax.plot(*zip(*known, strict=True), "o", mfc="none", color="0.55", ms=4, zorder=2)
                drawn = True
        ax.set_xlabel(direction, fontsize=8, color="0.35")
        if partial:  # under the panel's x label: inside the axes it ran over the lowest points
            ax.annotate(
                fit_note(unknown_note(partial, arms, undefined)),
                (0.5, 0),
                xycoords=ax.xaxis.label,
                xytext=(0, -2),
                textcoords="offset points",
                fontsize=7,
                color="firebrick",
                ha="center",
                va="top",
            )
        for number, ys in lines:
            ax.plot(xs, ys, "-o", color="0.55", lw=1.2, ms=4, zorder=2)
            drawn = True
            if len(lines) <= PAIR_LABELS:  # 20 labels at one tick are unreadable however placed
                labels.append((ax, f"p{number}", xs[-1], ys[-1]))
        labelled = False
        for x, arm in zip(xs, arms, strict=True):
            med = agg["medians"][arm].get(key)
            if med is not None:  # the first bar drawn carries the legend's label (the baseline's may be null)
                ax.hlines(
                    med,
                    x - MEDIAN_HALF_WIDTH,
                    x + MEDIAN_HALF_WIDTH,
                    colors="black",
                    lw=2.5,
                    zorder=3,
                    label=None if labelled else "median",
                )
                labelled = True
        if not drawn:
            every = set(undefined.values())
            all_undefined = complete and len(undefined) == len(complete) * len(arms) and len(every) == 1
            ax.text(
                0.5,
                0.5,
                f"undefined\n({every.pop()} in every complete pair)"
                if all_undefined
                else "unknown\n(not measured in any complete pair)"
                if complete
                else "no complete pair\n(each has a failed or unfinished arm)",
                ha="center",
                va="center",
                transform=ax.transAxes,
                fontsize=10,
                color="firebrick",
            )
            ax.set_yticks([])
        ax.set_xticks(xs, ticks[key], fontsize=tick_size(len(arms)))
        ax.set_xlim(-0.5, len(arms) - 0.5)
        ax.set_title(label, fontsize=10)
        ax.grid(axis="y", color="0.9")
        if drawn:
            ax.legend(loc="upper left", fontsize=7, frameon=False)
            if ax.dataLim.y0 >= 0:  # from 0: a 1% change must not fill the panel as a 100% one does
                ax.set_ylim(*y_limits(ax.dataLim.y1))
    fig.suptitle(
        f"{agg['experiment']}: {agg['pairs_complete']} complete pair(s), one line per pair, bars = medians; "
        "under each arm, its mean change from the baseline [95% t] and the verdict",
        fontsize=11,
    )
    fig.supxlabel(machine_caption(agg.get("machines")), fontsize=7, color="0.35")  # where it was measured
    fig.canvas.draw()  # the layout settles the axes' sizes: the labels are spaced in points on it
    place_labels(fig, labels)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    for path in paths:  # no creation date in the PDF: the same comparison draws the same bytes
        fig.savefig(path, dpi=150, metadata={"CreationDate": None} if path.suffix == ".pdf" else None)
    plt.close(fig)
    return paths
