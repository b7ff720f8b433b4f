"""The icicle plot of ``inferwire trace report --plot``: where a request's time to its first
token goes, and where a token's goes.

One panel each. The top row is the whole (the sum of the stages' means); the middle row splits
it by who spends it (client, network, server, in the order the request meets them); the bottom
row by stage. Widths are the stages' means, so the rows add up, and each box is labelled with
its stage and its mean where it is wide enough (the table has the percentiles). A stage whose
mean is below zero (a derived network stage of spans not on one clock, see :mod:`.stages`; the
table marks it) is drawn with no width.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from .stages import SIDE, Breakdown, StageRow

COLOURS: Final = {"client": "#4c78a8", "network": "#b0b0b0", "server": "#f58518"}


def _groups(rows: Sequence[StageRow]) -> list[tuple[str, float]]:
    """Consecutive stages of one side, merged: (side, width)."""
    groups: list[tuple[str, float]] = []
    for row in rows:
        side = SIDE[row.stage]
        if groups and groups[-1][0] == side:
            groups[-1] = (side, groups[-1][1] + row.mean_ns)
        else:
            groups.append((side, row.mean_ns))
    return groups


def _box(
    ax: Any, x: float, width: float, level: int, colour: str, label: str, total: float
) -> None:
    ax.barh(level, width, left=x, height=0.92, color=colour, edgecolor="white", linewidth=1.0)
    if width >= total * 0.06:
        ax.text(x + width / 2, level, label, ha="center", va="center", fontsize=7.5, wrap=True)


def _icicle(ax: Any, rows: Sequence[StageRow], title: str) -> None:
    rows = [replace(row, mean_ns=max(row.mean_ns, 0.0)) for row in rows]
    total = sum(row.mean_ns for row in rows)
    if not rows or total <= 0:
        ax.set_axis_off()
        ax.set_title(f"{title}: no spans")
        return
    scale = 1e3 if total < 1e6 else 1e6
    unit = "us" if scale == 1e3 else "ms"
    _box(ax, 0.0, total / scale, 2, "#6f6f6f", f"{title}: {total / scale:.3g} {unit}", 0)
    x = 0.0
    for side, width in _groups(rows):
        _box(ax, x, width / scale, 1, COLOURS[side], side, total / scale)
        x += width / scale
    x = 0.0
    for row in rows:
        colour = COLOURS[SIDE[row.stage]]
        label = f"{row.stage}\n{row.mean_ns / scale:.3g} {unit} ({row.share:.0%})"
        _box(ax, x, row.mean_ns / scale, 0, colour, label, total / scale)
        x += row.mean_ns / scale
    ax.set_xlim(0, total / scale)
    ax.set_ylim(-0.5, 2.5)
    ax.set_yticks([0, 1, 2], ["stage", "side", "whole"])
    ax.set_xlabel(f"mean time, {unit}")
    ax.invert_yaxis()
    for spine in ("top", "right", "left"):
        ax.spines[spine].set_visible(False)


def plot(result: Breakdown, out: Path) -> Path:
    """Draw the two icicles of ``result`` into ``out`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(11, 5.2))
    _icicle(top, result.request, "a request, to its first token")
    _icicle(bottom, result.token, "a token")
    figure.suptitle(f"where the time goes ({result.traces} traces, means)", fontsize=10)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return out
