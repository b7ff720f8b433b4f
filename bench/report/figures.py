"""The report's plots as data first: a :class:`Plot` holds exactly the series a picture shows,
built from the raw JSON; :func:`save` draws it to ``plots/NAME.png`` and writes it beside the
picture as ``plots/NAME.json``.

A PNG's bytes move with matplotlib's version and the machine's fonts, so what a rebuild of
``results/`` must reproduce byte for byte is the JSON (``tests/bench/test_results_rebuild.py``);
the PNG is drawn from that same object, so the two cannot disagree. matplotlib is imported only
to draw: the rest of the report reads raw files without it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.axis import Axis
    from matplotlib.figure import Figure
    from matplotlib.ticker import Locator
    from matplotlib.typing import RcKeyType

PLOTS_DIR: Final = "plots"
DATA_SUFFIX: Final = ".json"
MAX_TICKS: Final = 5
DPI: Final = 150
"""Fine enough for print at the figures' sizes (7-12 in wide)."""
_RC: Final[dict[RcKeyType, Any]] = {
    "font.size": 9,
    "axes.titlesize": 9,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "figure.titlesize": 11,
    "axes.grid": True,
    "grid.color": "#dddddd",
    "grid.linewidth": 0.6,
    "axes.axisbelow": True,
}
STYLES: Final = (
    ("#1f77b4", "o"),
    ("#ff7f0e", "s"),
    ("#2ca02c", "D"),
    ("#d62728", "^"),
    ("#9467bd", "v"),
    ("#8c564b", "P"),
    ("#e377c2", "X"),
    ("#7f7f7f", "<"),
    ("#bcbd22", ">"),
    ("#17becf", "*"),
    ("#000000", "h"),
    ("#393b79", "p"),
)
"""A (colour, marker) per series, in order: the markers tell the series apart in grey print."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Series:
    """One line, set of bars or set of points of a panel."""

    label: str
    x: tuple[float | str, ...]
    """Numbers, or category names for bars."""
    y: tuple[float, ...]
    kind: str = ""
    """What the series is within its label's group (``encode``, ``recorded CDF``), if any."""
    y_low: tuple[float, ...] = ()
    """With ``y_high``: each point's range (drawn as error bars), when it has one."""
    y_high: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Panel:
    title: str
    series: tuple[Series, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Plot:
    """A picture of the report: ``plots/{name}.png``, its data ``plots/{name}.json``."""

    name: str
    title: str
    alt: str
    """The README's alt text for it."""
    x_label: str
    y_label: str
    panels: tuple[Panel, ...]


def style(index: int) -> tuple[str, str]:
    """The colour and marker of the ``index``-th series (cycling past the last)."""
    return STYLES[index % len(STYLES)]


def link(plot: Plot | None) -> list[str]:
    """The README lines that show ``plot``: none when the run has no data for it."""
    if plot is None:
        return []
    return [f"![{plot.alt}]({PLOTS_DIR}/{plot.name}.png)", ""]


def data_text(plot: Plot) -> str:
    """What ``plots/{name}.json`` holds: the plot as JSON, the same text for the same data."""
    return json.dumps(asdict(plot), indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def write_data(out_dir: Path, plot: Plot) -> Path:
    """``plots/{name}.json`` alone, for a picture drawn elsewhere (:mod:`.plots`)."""
    path = out_dir / PLOTS_DIR / f"{plot.name}{DATA_SUFFIX}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data_text(plot))
    return path


def save(
    out_dir: Path,
    plot: Plot,
    draw: Callable[[Figure, Plot], None],
    size_in: tuple[float, float],
) -> list[Path]:
    """Draw ``plot`` with ``draw`` on a figure of ``size_in`` inches (``draw`` sets its layout)
    to ``plots/{name}.png``, and write its data beside it; both paths."""
    import matplotlib as mpl
    from matplotlib.figure import Figure

    path = out_dir / PLOTS_DIR / f"{plot.name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    with mpl.rc_context(_RC):
        figure = Figure(figsize=size_in)
        draw(figure, plot)
        figure.suptitle(plot.title)
        # no version or date in the file: the same data and matplotlib give the same bytes
        figure.savefig(path, dpi=DPI, metadata={"Software": None})
    return [path, write_data(out_dir, plot)]


def short_number(value: float) -> str:
    """A tick label: 3 significant digits, thousands as k and millions as M."""
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def log_axis(ax: Axes, which: Literal["x", "y"], low: float, high: float) -> None:
    """A log axis of ``ax`` from ``low`` to ``high`` (both > 0, padded a little) with at most
    :data:`MAX_TICKS` plain tick labels: 1-2-3-5 steps, or 1-2-5, or powers of ten, the finest
    that fits; evenly spaced ones over a range narrower than a step. Few labels keep a small
    panel readable, and drawing fast: matplotlib measures every label it draws."""
    from matplotlib import ticker

    low, high = low / 1.4, high * 1.4
    ticks: list[float] = []
    for subs in ((1.0, 2.0, 3.0, 5.0), (1.0, 2.0, 5.0), (1.0,)):  # the finest that fits
        ticks = _ticks(ticker.LogLocator(base=10, subs=subs, numticks=30), low, high)
        if len(ticks) <= MAX_TICKS:
            break
    if len(ticks) < 2:  # narrower than a step
        ticks = _ticks(ticker.MaxNLocator(nbins=3, min_n_ticks=2), low, high)
    axis: Axis
    if which == "x":
        ax.set_xscale("log")
        ax.set_xlim(low, high)
        axis = ax.xaxis
    else:
        ax.set_yscale("log")
        ax.set_ylim(low, high)
        axis = ax.yaxis
    axis.set_major_locator(ticker.FixedLocator(ticks))
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: short_number(v)))
    axis.set_minor_locator(ticker.NullLocator())


def _ticks(locator: Locator, low: float, high: float) -> list[float]:
    return [t for t in locator.tick_values(low, high) if low <= t <= high and t > 0]
