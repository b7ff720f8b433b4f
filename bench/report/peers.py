"""The report's peers section, from ``raw/peers.json``: our servers beside the servers users
deploy instead, and the target rows of that comparison."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from . import figures, spread
from .figures import Panel, Plot, Series
from .results import PEERS_RAW
from .tables import table as _table

if TYPE_CHECKING:
    from matplotlib.figure import Figure

GROUP: Final = "peers"
"""The ``benchmark.group`` of bench_peers.py's results."""
PEER_TARGET = 1.5
"""The target of a peer whose result does not record its own (runs made before granian's)."""
GRANIAN: Final = "granian"
PLOT_NAME: Final = "peers"
OURS: Final = "ours"
PEER: Final = "what users deploy"


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One server of the peers table; see bench_peers.py for how each figure is measured."""

    server: str
    stack: str
    protocol: str
    tokens_per_s: float
    tokens_per_server_cpu_s: float
    itl_p50_us: float
    itl_p99_us: float
    itl_p999_us: float
    tpot_mean_us: float
    server_cpu_utilization: float
    client_cpu_utilization: float
    correct: bool
    baseline: str | None = None
    """For a peer: the inferwire server it is compared with."""
    ratio_tokens_per_server_cpu_s: float | None = None
    """Baseline / this server, tokens per server CPU-second (the 1.5x target)."""
    ratio_tokens_per_s: float | None = None
    info: dict[str, Any] | None = None
    """The benchmark's whole ``extra_info`` (each figure's repeats, when the run has them)."""
    server_loop: str = ""
    """The event loop the server announced it ran on ("" in a run made before it was recorded);
    for a peer, its baseline's is ``baseline_server_loop``."""
    baseline_server_loop: str = ""
    client_loop: str = ""

    def loops_cell(self) -> str:
        """Where this server's figures (and for a peer, its ratio's baseline) ran."""
        if self.baseline is None or self.baseline_server_loop in ("", self.server_loop):
            return self.server_loop or "?"
        return f"{self.server_loop} (ours: {self.baseline_server_loop})"

    @property
    def target_ratio(self) -> float:
        """The ratio this peer's run held it to: 1.5x against the Python stacks, 1.0x against
        granian's Rust one."""
        return float((self.info or {}).get("target_ratio", PEER_TARGET))

    def ratio_cell(self) -> str:
        ratio = self.ratio_tokens_per_server_cpu_s
        if ratio is None:
            return ""
        return spread.cell(self.info or {}, "ratio_tokens_per_server_cpu_s", ratio, _x)


def _x(value: float) -> str:
    return f"{value:.2f}x"


def rows(results_json_path: str | Path) -> list[Row]:
    """The peers table from a pytest-benchmark JSON file of bench_peers.py (other benchmarks
    in the file are skipped), in the order they ran."""
    raw: dict[str, Any] = json.loads(Path(results_json_path).read_text())
    table = []
    for bench in raw.get("benchmarks", []):
        if bench.get("group") != GROUP:
            continue
        info = bench["extra_info"]
        table.append(
            Row(
                server=info["server"],
                stack=info["stack"],
                protocol=info["protocol"],
                tokens_per_s=info["tokens_per_s"],
                tokens_per_server_cpu_s=info["tokens_per_server_cpu_s"],
                itl_p50_us=info["itl_p50_us"],
                itl_p99_us=info["itl_p99_us"],
                itl_p999_us=info["itl_p999_us"],
                tpot_mean_us=info["tpot_mean_us"],
                server_cpu_utilization=info["server_cpu_utilization"],
                client_cpu_utilization=info["client_cpu_utilization"],
                correct=info["correct"],
                baseline=info.get("baseline"),
                ratio_tokens_per_server_cpu_s=info.get("ratio_tokens_per_server_cpu_s"),
                ratio_tokens_per_s=info.get("ratio_tokens_per_s"),
                info=info,
                server_loop=info.get("server_loop", ""),
                baseline_server_loop=info.get("baseline_server_loop", ""),
                client_loop=info.get("loop", ""),
            )
        )
    return table


def target_rows(raw_dir: Path) -> list[list[str]]:
    path = raw_dir / PEERS_RAW
    if not path.exists():
        return []
    out = []
    for row in rows(path):
        if row.baseline is None or row.ratio_tokens_per_server_cpu_s is None:
            continue
        ratio, target = row.ratio_tokens_per_server_cpu_s, row.target_ratio
        out.append(
            [
                f"`{row.baseline}` vs {row.stack} ({row.protocol}, {row.loops_cell()})",
                "tokens per server CPU-second, paired",
                row.ratio_cell(),
                f">= {target:g}x",
                "met" if ratio >= target else "**missed**",
            ]
        )
    return out


def section(raw_dir: Path) -> str:
    """The report's peers section ("" if the run has none)."""
    path = raw_dir / PEERS_RAW
    if not path.exists():
        return ""
    table = rows(path)
    if not table:
        return ""
    client_loops = sorted({r.client_loop for r in table if r.client_loop})
    # granian's words only when its rows are there: a run without them reads as it always did
    granian = any(r.stack.startswith(GRANIAN) for r in table)
    stacks = (
        "uvicorn (HTTP/1.1, httptools), Hypercorn (HTTP/2, h2c) and granian (its Rust HTTP/1.1 "
        "and HTTP/2, h2c; ASGI, one worker)"
        if granian
        else "uvicorn (HTTP/1.1, httptools) and Hypercorn (HTTP/2, h2c)"
    )
    counted = (
        " (granian's two: its main process and the worker it forks, every thread, Rust's too)"
        if granian
        else ""
    )
    granian_note = (
        " The target against granian is 1.0x, not 1.5x: its HTTP is Rust, and only the app in "
        "front of it is Python."
        if granian
        else ""
    )
    return "\n".join(
        [
            "## Against what users deploy instead",
            "",
            "The same SSE token stream (`stream-256`, `orjson`, no pacing, 16 streams at once) "
            f"from our servers and from Starlette's `StreamingResponse` under {stacks}, each as "
            "users deploy it: on uvloop when "
            "it is installed, ours on the same loop (*loop*: the one each server said it ran; "
            f"the client's: {', '.join(client_loops) or 'not recorded'}). Each server is pinned "
            "to one core and the client to the other. *per core*: output tokens per CPU-second "
            f"of the server process{counted}. "
            "*gap*: time between successive chunks at the client, P50 / P99 in us. "
            "Notes: Hypercorn buffers a stream's output and sends it in frames of up to 16 KiB, "
            "so its tokens arrive in bursts (see its P99 gap and TPOT); ours write every chunk "
            f"that is due at once, so a paced stream is not delayed.{granian_note}",
            "",
            *figures.link(plot_data(table)),
            _table(
                [
                    "server",
                    "protocol",
                    "loop",
                    "tokens/s",
                    "per core",
                    "gap P50 / P99",
                    "TPOT",
                    "vs ours",
                    "correct",
                ],
                [
                    [
                        f"`{r.server}`",
                        r.protocol,
                        r.loops_cell(),
                        f"{r.tokens_per_s:,.0f}",
                        f"{r.tokens_per_server_cpu_s:,.0f}",
                        f"{r.itl_p50_us:,.1f} / {r.itl_p99_us:,.1f}",
                        f"{r.tpot_mean_us:,.1f} us",
                        r.ratio_cell(),
                        "yes" if r.correct else "**no**",
                    ]
                    for r in table
                ],
            ),
            "",
        ]
    )


def plot_data(table: list[Row]) -> Plot | None:
    """Tokens per server CPU-second of each server, ours and the peers, in the table's order
    (None without any)."""
    if not table:
        return None
    series = tuple(
        Series(
            label=f"{r.server} ({r.protocol})",
            kind=OURS if r.baseline is None else PEER,
            x=(r.server,),
            y=(r.tokens_per_server_cpu_s,),
        )
        for r in table
    )
    return Plot(
        name=PLOT_NAME,
        title="Output tokens per CPU-second of the server process",
        alt="tokens per server CPU-second, our servers beside the servers users deploy",
        x_label="output tokens per server CPU-second (more is better)",
        y_label="server (protocol)",
        panels=(Panel(title="", series=series),),
    )


def _draw(figure: Figure, plot: Plot) -> None:
    figure.set_layout_engine("constrained")
    ax = figure.subplots()
    (panel,) = plot.panels
    kinds = list(dict.fromkeys(s.kind for s in panel.series))
    labelled: set[str] = set()
    for position, series in enumerate(panel.series):
        index = kinds.index(series.kind)
        bars = ax.barh(
            [position],
            series.y,
            0.6,
            label=series.kind if series.kind not in labelled else None,
            color=figures.style(index)[0],
            hatch="" if index == 0 else "//",
            edgecolor="white",
        )
        labelled.add(series.kind)
        ax.bar_label(bars, labels=[f"{v:,.0f}" for v in series.y], fontsize=8, padding=3)
    ax.set_yticks(range(len(panel.series)), [s.label for s in panel.series])
    ax.invert_yaxis()  # the table's order, top down
    ax.set_xlim(0, max(y for s in panel.series for y in s.y) * 1.25)  # room for the labels
    ax.xaxis.set_major_formatter(lambda v, _: figures.short_number(v))
    ax.set_xlabel(plot.x_label)
    ax.grid(axis="y", visible=False)
    ax.legend(loc="best", frameon=False)


def plot(raw_dir: Path, out_dir: Path) -> list[Path]:
    """``plots/peers.png`` and its data (nothing without peers results)."""
    path = raw_dir / PEERS_RAW
    data = plot_data(rows(path)) if path.exists() else None
    if data is None:
        return []
    servers = len(data.panels[0].series)
    return figures.save(out_dir, data, _draw, (7.5, 1.4 + 0.45 * servers))
