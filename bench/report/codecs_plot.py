"""The codec tables as a picture (``plots/codecs.png``): one panel per workload, each codec's
time per chunk against its bytes per chunk (per message for the one-message workloads), encode
and decode, from the same results and in the same order as the tables."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

from inferwire import workloads

from . import figures
from .figures import Panel, Plot, Series
from .results import Result

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME: Final = "codecs"
OPS: Final = ("encode", "decode")
COLUMNS: Final = 4


def plot_data(results: Sequence[Result]) -> Plot | None:
    """The picture's data (None when the run timed no codec)."""
    by_key = {(r.codec, r.workload, r.op): r for r in results}
    panels = []
    for workload in workloads.names():
        codecs = [r.codec for r in results if r.workload == workload and r.op == "encode"]
        per = "chunk" if workloads.get(workload).kind == "stream" else "message"
        series = [
            Series(
                label=codec,
                kind=op,
                x=(r.wire_bytes / r.messages,),
                y=(r.median_s / r.messages * 1e6,),
            )
            for codec in codecs
            for op in OPS
            if (r := by_key.get((codec, workload, op))) is not None
        ]
        if series:
            panels.append(Panel(title=f"{workload} (per {per})", series=tuple(series)))
    if not panels:
        return None
    return Plot(
        name=NAME,
        title="Codec time against bytes on the wire, per chunk (per message: embeddings, tensors)",
        alt="codec time per chunk against bytes per chunk, per workload",
        x_label="bytes per chunk or message (log scale)",
        y_label="median time per chunk or message, us (log scale)",
        panels=tuple(panels),
    )


def _rows(plot: Plot) -> int:
    return math.ceil((len(plot.panels) + 1) / COLUMNS)  # a slot left for the legend


def _draw(figure: Figure, plot: Plot) -> None:
    from matplotlib.lines import Line2D

    rows = _rows(plot)
    height_in = figure.get_figheight()
    # fixed margins, in inches: constrained layout measures every tick label of every panel,
    # seconds for this many
    grid = figure.add_gridspec(
        rows,
        COLUMNS,
        left=0.07,
        right=0.99,
        top=1 - 0.7 / height_in,
        bottom=0.55 / height_in,
        hspace=0.45,
        wspace=0.22,
    )
    codecs = list(dict.fromkeys(s.label for p in plot.panels for s in p.series))
    styles = {codec: figures.style(i) for i, codec in enumerate(codecs)}
    for index, panel in enumerate(plot.panels):
        ax = figure.add_subplot(grid[index // COLUMNS, index % COLUMNS])
        for series in panel.series:
            colour, marker = styles[series.label]
            ax.plot(
                series.x,
                series.y,
                linestyle="",
                marker=marker,
                markersize=6,
                markerfacecolor=colour if series.kind == OPS[0] else "none",
                markeredgecolor=colour,
                markeredgewidth=1.1,
                zorder=3,
            )
        xs = [float(x) for s in panel.series for x in s.x]
        ys = [y for s in panel.series for y in s.y]
        figures.log_axis(ax, "x", min(xs), max(xs))
        figures.log_axis(ax, "y", min(ys), max(ys))
        ax.set_title(panel.title)
    figure.supxlabel(plot.x_label, y=0.15 / height_in, va="bottom")
    figure.supylabel(plot.y_label, x=0.005, ha="left")
    last = len(plot.panels)
    legend_ax = figure.add_subplot(grid[last // COLUMNS, last % COLUMNS :])
    legend_ax.axis("off")
    handles = [
        Line2D([], [], linestyle="", marker=styles[c][1], color=styles[c][0], label=c)
        for c in codecs
    ] + [
        Line2D([], [], linestyle="", marker="o", color="#444444", label=f"{OPS[0]}: filled"),
        Line2D(
            [],
            [],
            linestyle="",
            marker="o",
            color="#444444",
            fillstyle="none",
            label=f"{OPS[1]}: hollow",
        ),
    ]
    legend_ax.legend(
        handles=handles, loc="center", ncol=max(1, COLUMNS - last % COLUMNS), frameon=False
    )


def plot(results: Sequence[Result], out_dir: Path) -> list[Path]:
    """``plots/codecs.png`` and its data (nothing when the run timed no codec)."""
    data = plot_data(results)
    if data is None:
        return []
    return figures.save(out_dir, data, _draw, (12.0, 2.5 * _rows(data) + 1.25))
