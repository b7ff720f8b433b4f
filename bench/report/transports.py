"""The report's transports section and target rows, from ``raw/transports.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from . import figures, spread
from .figures import Panel, Plot, Series
from .results import TRANSPORTS_RAW
from .tables import table as _table

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TRANSPORT_TARGET = 3.0
HTTP2_UNARY_TARGET = 2.5
"""Issue 15's tighter target for a small unary call over ``http2`` (what bounds it: _NOTES)."""
ECHO_TARGET = 3.0
"""``tcp`` small unary round trip over a raw echo of the same bytes on the same loop."""
WEBSOCKET_STREAM_TARGET = 1.5
"""Issue 32: a token stream over ``websocket`` (a message per chunk, on a session: a kept
connection, as ``tcp``'s is) costs at most this much per token as over ``tcp``, each codec
measured."""
TRANSPORT_ORDER = (
    "tcp",
    "http1",
    "http1-new-connection",
    "http2",
    "grpc",
    "websocket",
    "websocket-new-connection",
)
PLOT_NAME: Final = "transports"
HATCHES: Final = ("", "//", "..", "xx", "\\\\", "++")
"""One per codec, so the bars stay apart in grey print."""


@dataclass(frozen=True, slots=True)
class TransportResult:
    transport: str
    codec: str
    op: str
    median_s: float
    iqr_s: float
    per: int
    """Round trips (unary) or tokens (stream) in one timed call."""
    vs_tcp: float
    correct: bool
    info: dict[str, Any] = field(default_factory=dict)
    """The benchmark's whole ``extra_info`` (each figure's repeats, when the run has them)."""

    def vs_tcp_cell(self) -> str:
        return spread.cell(self.info, "vs_tcp", self.vs_tcp, lambda v: f"{v:.2f}x")

    def ratio_cell(self, key: str) -> str:
        """``key`` of ``extra_info`` as a ratio with its range over repeats, "" if absent."""
        value = self.info.get(key)
        if not isinstance(value, (int, float)):
            return ""
        return spread.cell(self.info, key, float(value), lambda v: f"{v:.2f}x")

    @property
    def per_item_s(self) -> float:
        return self.median_s / self.per

    @property
    def spread(self) -> float:
        return self.iqr_s / self.median_s if self.median_s else 0.0


def load(path: Path) -> list[TransportResult]:
    raw = json.loads(path.read_text())
    out = []
    for bench in raw["benchmarks"]:
        info = bench["extra_info"]
        out.append(
            TransportResult(
                transport=info["transport"],
                codec=info["codec"],
                op=info["op"],
                median_s=bench["stats"]["median"],
                iqr_s=bench["stats"]["iqr"],
                per=info["calls"] if info["op"] == "unary" else info["tokens"],
                vs_tcp=info["vs_tcp"],
                correct=info["correct"],
                info=info,
            )
        )
    return out


def _us(seconds: float) -> str:
    micro = seconds * 1e6
    return f"{micro:,.1f} us" if micro < 100 else f"{micro:,.0f} us"


def _order(result: TransportResult) -> tuple[int, str]:
    position = (
        TRANSPORT_ORDER.index(result.transport) if result.transport in TRANSPORT_ORDER else 99
    )
    return position, result.codec


def target_rows(results: list[TransportResult]) -> list[list[str]]:
    rows = []
    for op, what in (("stream", "per-token cost"), ("unary", "small unary round trip")):
        for result in sorted(results, key=_order):
            websocket = op == "stream" and result.transport == "websocket"
            if result.op != op or not (websocket or result.transport in ("http1", "http2", "grpc")):
                continue
            if op == "stream" and result.codec != "orjson" and result.transport == "http1":
                continue  # the SSE row is the one the target names for http1
            target = TRANSPORT_TARGET
            if op == "unary" and result.transport == "http2":
                target = HTTP2_UNARY_TARGET
            if websocket:
                target = WEBSOCKET_STREAM_TARGET
            verdict = "met" if result.vs_tcp <= target else "**missed**"
            rows.append(
                [
                    f"`{result.transport}` {what} vs `tcp` (`{result.codec}`)",
                    "paired ratio, same codec",
                    result.vs_tcp_cell(),
                    f"<= {target:g}x",
                    verdict,
                ]
            )
    for result in _echo_results(results):
        vs_echo = result.info["vs_echo"]
        rows.append(
            [
                f"`tcp` small unary round trip vs a raw {result.info.get('echo_loop', '?')} echo "
                f"of the same bytes (`{result.codec}`)",
                "paired ratio, same loop",
                result.ratio_cell("vs_echo"),
                f"<= {ECHO_TARGET:.0f}x",
                "met" if vs_echo <= ECHO_TARGET else "**missed**",
            ]
        )
    return rows


def _echo_results(results: list[TransportResult]) -> list[TransportResult]:
    """The ``tcp`` unary results that carry the raw echo comparison, by codec."""
    found = [r for r in results if r.op == "unary" and r.transport == "tcp" and "vs_echo" in r.info]
    return sorted(found, key=_order)


def _loops_line(results: list[TransportResult]) -> str:
    """Which event loops the run's clients and servers ran on (a run made before they were
    recorded says nothing)."""
    clients = sorted({str(r.info["loop"]) for r in results if "loop" in r.info})
    servers = sorted({str(r.info["server_loop"]) for r in results if "server_loop" in r.info})
    if not clients and not servers:
        return ""
    return (
        f"Event loop: the client on {', '.join(clients) or '?'}, the servers on "
        f"{', '.join(servers) or '?'} (each result records both)."
    )


def _floors(results: list[TransportResult]) -> list[str]:
    """The table of what lies under ``tcp``: a raw echo of its bytes, and asyncio's loop."""
    found = _echo_results(results)
    if not found:
        return []
    rows = [
        [
            f"`{r.codec}`",
            _us(r.per_item_s),
            f"{r.info.get('echo_request_bytes', '?')} / {r.info.get('echo_response_bytes', '?')}",
            r.ratio_cell("vs_echo"),
            r.ratio_cell("vs_echo_cpu") or "n/a",
            r.ratio_cell("asyncio_vs_uvloop") or "n/a",
        ]
        for r in found
    ]
    return [
        "### Under `tcp`: a raw echo, and the event loop",
        "",
        "*vs echo*: our `tcp` small unary round trip over a raw echo of the same request and "
        "response byte counts on the same loop (asyncio Protocol callbacks on both ends, the "
        "server its own process pinned like ours, no framing or codec; "
        "`bench/procs/echo_server.py`): what the framing, the codec and the stream "
        "machinery add. *vs echo, CPU*: the same pairs in CPU time, the client's thread "
        "plus the server process (a busy machine's waits for a core, which stretch both "
        "sides of a wall-clock pair alike and pull it towards 1, are left out). "
        "*asyncio vs uvloop*: the same `tcp` round trip with client and server "
        "on asyncio's loop over both on uvloop. Both paired ratios. What lies between `tcp` "
        "and the echo is mostly asyncio's streams on both ends (a StreamReader wake-up and a "
        "task step per request, a `readexactly` per field), more than the codec for the "
        "binary codecs: served from Protocol callbacks with the same codec work, the same "
        "exchange took 25-30% less server CPU (`msgpack`, `protobuf`; an experiment "
        "outside this suite).",
        "",
        _table(
            [
                "codec",
                "tcp unary",
                "bytes (request / response)",
                "vs echo",
                "vs echo, CPU",
                "asyncio vs uvloop",
            ],
            rows,
        ),
        "",
    ]


# Under the transports tables. The http2 figures come from the profile written up in the
# docstring of inferwire.transports.http2 (issue 15); they are instruction counts, which the
# noise of a shared machine does not move, not timings.
_NOTES = (
    "Notes. With no pacing the model outruns the wire: `tcp`, `http1` and `http2` write "
    "every chunk that is due in one write (one HTTP/2 DATA frame), while `grpc` here sends one "
    "message per chunk, as a server-streaming RPC of `TokenChunk` does (`Generate`); each gRPC "
    "message costs a trip through grpcio's completion queue and the event loop on both ends "
    "(cProfile: about four loop callbacks per message), which is what bounds its per-token "
    "figure. `GenerateBatched`, one message per batch of due chunks like the other transports' "
    "one write, and the bare grpcio floor are measured in the gRPC section below "
    "(`bench/bench_grpc.py`). "
    "A small unary call over `http2` is bounded by h2 being pure Python: each end handles one "
    "HEADERS and one DATA frame out and in per call. Callgrind counts of one call, both ends, "
    "on uvloop: 1.87 M instructions against 0.34 M for `tcp` (5.5x) before HPACK encoding and "
    "decoding and h2's field checks were remembered across calls (they were a third of h2's "
    "part, repeated on the same fields every call), 1.28 M (3.8x) after, and 1.23 M (3.6x) "
    "once h2 no longer formatted every frame it received for its trace log (whatever the "
    "logger: 5% of a call's CPU time). What is left is h2's "
    "frame and stream machinery (hyperframe frame objects, the stream state machine, "
    "flow-control windows, per-frame serialization: about 55% of both ends' time), not the "
    "socket (one write a call at each end, as `tcp`). Over `grpc` a unary call pays the "
    "per-call setup of grpcio's asyncio API."
)


_WEBSOCKET_NOTES = (
    "`websocket` (issue 32): the chat request as one text message on `/v1/chat/completions`, "
    "each chunk one message back (text JSON for `orjson`, binary for the others, the codec "
    "named by the subprotocol), then `[DONE]`; streams run on a session "
    "(`?session=1`: the connection kept for the next stream, as `tcp`'s is), and each chunk "
    "costs a frame of its own (a 2-byte header here) and a message for the client to take "
    "apart, where `tcp` carries a batch of due chunks as one piece. The unary rows are an "
    "infer request a message on a kept connection (`websocket-new-connection`: a connection, "
    "handshake and close each, the setup cost). Server and client run websockets' Sans-I/O "
    "protocol under asyncio streams; the client parses the server's plain data frames itself "
    "(`transports/websocket.py` and `websocket_wire.py` say why)."
)


def section(results: list[TransportResult]) -> str:
    parts = [
        "## Transports",
        "",
        "Server in its own process on loopback, pinned to one core, the client in the "
        "benchmark's process on the other (unpinned, the kernel's per-process choice of one "
        "core or two moved the grpc ratios by up to 37% between repeats), no pacing "
        "(prefill and decode time zero): serialization and transport alone. *unary*: a small "
        "infer request (one 1x16 FP32 tensor) and its echo, per round trip on a kept-alive "
        "connection (`http1-new-connection`: a new connection each). *stream*: one whole "
        "`stream-256` response, shown per token. *vs tcp*: the paired ratio against the `tcp` "
        "floor with the same codec (back-to-back runs in alternating order).",
        "",
    ]
    loops_line = _loops_line(results)
    if loops_line:
        parts += [loops_line, ""]
    for op, title in (("stream", "Streaming, per token"), ("unary", "Unary round trip")):
        picture = figures.link(plot_data(results)) if op == "stream" else []
        rows = [
            [
                f"`{r.transport}`",
                f"`{r.codec}`",
                _us(r.per_item_s),
                f"±{r.spread:.0%}",
                r.vs_tcp_cell(),
                "yes" if r.correct else "**no**",
            ]
            for r in sorted(results, key=_order)
            if r.op == op
        ]
        if rows:
            parts += [
                f"### {title}",
                "",
                *picture,
                _table(["transport", "codec", "median", "spread", "vs tcp", "correct"], rows),
                "",
            ]
    parts += [_NOTES, ""]
    if any(r.transport.startswith("websocket") for r in results):
        parts += [_WEBSOCKET_NOTES, ""]
    parts += _floors(results)
    return "\n".join(parts)


def render_parts(path: Path) -> tuple[list[list[str]], str]:
    """Target rows and the section, or nothing when the run has no transport results."""
    if not path.exists():
        return [], ""
    results = load(path)
    return target_rows(results), section(results)


def plot_data(results: list[TransportResult]) -> Plot | None:
    """Per-token cost of a whole stream by transport x codec (None without stream results)."""
    stream = sorted((r for r in results if r.op == "stream"), key=_order)
    if not stream:
        return None
    codecs = sorted({r.codec for r in stream})
    series = tuple(
        Series(
            label=codec,
            x=tuple(r.transport for r in stream if r.codec == codec),
            y=tuple(r.per_item_s * 1e6 for r in stream if r.codec == codec),
        )
        for codec in codecs
    )
    workloads = sorted({str(r.info.get("workload", "?")) for r in stream})
    return Plot(
        name=PLOT_NAME,
        title=f"Streaming cost per token by transport and codec ({', '.join(workloads)})",
        alt="median time per token of a streamed response, by transport and codec",
        x_label="transport",
        y_label="median time per token, us (log scale)",
        panels=(Panel(title="", series=series),),
    )


def _draw(figure: Figure, plot: Plot) -> None:
    figure.set_layout_engine("constrained")
    ax = figure.subplots()
    (panel,) = plot.panels
    transports = list(dict.fromkeys(str(x) for s in panel.series for x in s.x))
    width = 0.8 / len(panel.series)
    for index, series in enumerate(panel.series):
        offset = (index - (len(panel.series) - 1) / 2) * width
        positions = [transports.index(str(x)) + offset for x in series.x]
        bars = ax.bar(
            positions,
            series.y,
            width,
            label=series.label,
            color=figures.style(index)[0],
            hatch=HATCHES[index % len(HATCHES)],
            edgecolor="white",
            linewidth=0.5,
        )
        ax.bar_label(bars, labels=[f"{v:.3g}" for v in series.y], fontsize=7, padding=2)
    values = [y for s in panel.series for y in s.y]
    figures.log_axis(ax, "y", min(values), max(values))
    ax.set_ylim(min(values) / 2, max(values) * 2)  # room under the shortest, over the tallest
    ax.set_xticks(range(len(transports)), transports)
    ax.set_xlabel(plot.x_label)
    ax.set_ylabel(plot.y_label)
    ax.grid(axis="x", visible=False)
    ax.legend(title="codec", loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)


def plot(raw_dir: Path, out_dir: Path) -> list[Path]:
    """``plots/transports.png`` and its data (nothing without stream results)."""
    path = raw_dir / TRANSPORTS_RAW
    data = plot_data(load(path)) if path.exists() else None
    if data is None:
        return []
    return figures.save(out_dir, data, _draw, (7.5, 4.5))
