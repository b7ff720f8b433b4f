"""The load section's picture (``plots/load_cdf.png``): the latency CDFs of the open-loop runs,
a panel per metric and a line per run, drawn only from what each run recorded."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from . import figures
from .figures import Panel, Plot, Series
from .results import LOAD_RAW, infos

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from matplotlib.typing import LineStyleType

PLOT_NAME: Final = "load_cdf"
CDF_METRICS: Final = (
    ("ttft", "TTFT"),
    ("tpot", "TPOT"),
    ("itl_per_token", "ITL per token"),
    ("e2e", "E2E latency"),
)
"""The CDFs drawn, as the HTML report of ``inferwire load`` draws them."""
RECORDED: Final = "recorded CDF"
"""A series from the CDF points the run recorded (its HDR histogram read at every percent and
61 points of the tail)."""
FROM_PERCENTILES: Final = "percentiles only"
"""A series from P50 / P90 / P99 / P99.9 alone: a run from before the CDFs were recorded."""
_PERCENTILES: Final = ((0.5, "p50_ms"), (0.9, "p90_ms"), (0.99, "p99_ms"), (0.999, "p99_9_ms"))
LINESTYLES: Final[tuple[LineStyleType, ...]] = ("-", "--", ":", "-.")
"""One per transport, so the lines stay apart in grey print."""
LINE_WIDTH: Final = 1.4


def cdf_points(metric: Mapping[str, Any]) -> tuple[list[list[float]], str]:
    """A metric's CDF as ``[value_ms, fraction]`` points and where they come from: the recorded
    CDF, else its percentiles (what is recorded; nothing is drawn between them)."""
    recorded = metric.get("cdf") or []
    if recorded:
        return [[float(v), float(f)] for v, f in recorded], RECORDED
    found = [[float(metric[k]), q] for q, k in _PERCENTILES if metric.get(k) is not None]
    return found, FROM_PERCENTILES


def plot_data(runs: list[dict[str, Any]]) -> Plot | None:
    """The latency CDFs of the open-loop runs, a panel per metric and a line per run (None
    without runs)."""
    one_codec = len({r["codec"] for r in runs}) == 1
    panels = []
    for name, title in CDF_METRICS:
        series = []
        for run in runs:
            points, source = cdf_points(run.get(name) or {})
            if points:
                series.append(
                    Series(
                        label=run["transport"]
                        if one_codec
                        else f"{run['transport']} / {run['codec']}",
                        kind=source,
                        x=tuple(p[0] for p in points),
                        y=tuple(p[1] for p in points),
                    )
                )
        if series:
            panels.append(Panel(title=title, series=tuple(series)))
    if not panels:
        return None
    codecs = sorted({str(r["codec"]) for r in runs})
    return Plot(
        name=PLOT_NAME,
        title=f"Latency CDFs of the open-loop runs ({', '.join(codecs)}), by transport",
        alt="latency CDFs of the open-loop runs: TTFT, TPOT, ITL and E2E by transport",
        x_label="ms",
        y_label="fraction of values at most x",
        panels=tuple(panels),
    )


def caption(plot: Plot | None) -> list[str]:
    if plot is None:
        return []
    sources = {s.kind for p in plot.panels for s in p.series}
    said = (
        "a step at each point of the run's recorded CDF (its HDR histogram, to 3 significant "
        "digits, read at every percent and on through the tail to P99.999)"
    )
    if FROM_PERCENTILES in sources:
        said = (
            "a step at each point the run recorded: its CDF where it has one, else only its "
            "P50, P90, P99 and P99.9 (nothing drawn below P50 or between them)"
        )
    return [f"The latency distributions of these runs, one line per transport: {said}.", ""]


def _draw(figure: Figure, plot: Plot) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    # fixed margins (in inches, for the title, the axis labels and the legend): constrained
    # layout would draw the figure twice
    width_in, height_in = figure.get_size_inches()
    axes = figure.subplots(
        1,
        len(plot.panels),
        squeeze=False,
        gridspec_kw={
            "left": 0.75 / width_in,
            "right": 1 - 0.15 / width_in,
            "top": 1 - 0.6 / height_in,
            "bottom": 0.95 / height_in,
            "wspace": 0.25,
        },
    )[0]
    labels = list(dict.fromkeys(s.label for p in plot.panels for s in p.series))
    styles = {
        label: (figures.style(i)[0], LINESTYLES[i % len(LINESTYLES)])
        for i, label in enumerate(labels)
    }
    for ax, panel in zip(axes, plot.panels, strict=True):
        for series in panel.series:
            colour, linestyle = styles[series.label]
            ax.plot(
                series.x,
                series.y,
                drawstyle="steps-post",
                color=colour,
                linestyle=linestyle,
                linewidth=LINE_WIDTH,
            )
        ax.set_title(panel.title)
        ax.set_xlabel(plot.x_label)
        ax.set_ylim(0, 1.02)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4))
    axes[0].set_ylabel(plot.y_label)
    handles = [
        Line2D([], [], color=colour, linestyle=linestyle, linewidth=LINE_WIDTH, label=label)
        for label, (colour, linestyle) in styles.items()
    ]
    figure.legend(
        handles=handles,
        loc="lower center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=len(labels),
        frameon=False,
    )


def plot(raw_dir: Path, out_dir: Path) -> list[Path]:
    """``plots/load_cdf.png`` and its data (nothing without open-loop runs)."""
    data = plot_data([i for i in infos(raw_dir / LOAD_RAW) if i.get("op") == "load"])
    if data is None:
        return []
    return figures.save(out_dir, data, _draw, (11.0, 3.5))
