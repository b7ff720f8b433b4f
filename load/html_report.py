"""The one-page HTML report of ``inferwire load``, drawn from its JSON report alone (what
``--out`` writes): the run's parameters and machine, a table of every point's metrics, and per
point the latency CDFs and the inter-token latency over time, as inline SVG made with
matplotlib. No JavaScript, nothing fetched: the file is the whole report.

A value the JSON does not hold is shown as "-", never made up; a point with no latencies (all
failed) gets its table column and empty plots that say so.
"""

from __future__ import annotations

import html
import io
import math
from collections.abc import Callable, Sequence
from typing import Any, Final

import matplotlib as mpl
from matplotlib import ticker
from matplotlib.figure import Figure

from . import metrics, workload_page
from .attribution import page as attribution_page
from .stream_content import TOKENS_PER_CHUNK_BINS

MISSING: Final = "-"
CDF_PLOTS: Final = (
    ("ttft", "TTFT"),
    ("tpot", "TPOT"),
    ("itl_per_token", "ITL per token"),
    ("e2e", "E2E latency"),
)
LATENCY_ROWS: Final = (
    ("ttft", "TTFT"),
    ("ttfot", "TTFOT (to the first output token)"),
    ("tpot", "TPOT"),
    ("itl_per_chunk", "ITL per chunk"),
    ("itl_per_token", "ITL per token"),
    ("e2e", "E2E latency"),
    ("send_lag", "send lag"),
    ("queue_wait", "queue wait"),
    ("client_parse", "client parse time an event"),
)
PERCENTILE_COLUMNS: Final = ("p50", "p90", "p99")
_RC: Final[dict[str, Any]] = {
    "svg.fonttype": "none",  # text stays text: smaller, and the page's font draws it
    "svg.hashsalt": "inferwire-load",  # the same JSON gives the same page
    "font.size": 9.0,
    "font.family": "sans-serif",
}
_STYLE: Final = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1150px;
       color: #222; font-size: 14px; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
h3 { font-size: 1.05em; margin: 1.2em 0 0.3em; }
table { border-collapse: collapse; margin: 0.4em 0; }
td, th { padding: 2px 8px; border-bottom: 1px solid #e4e4e4; text-align: right; }
th { background: #f4f4f4; } td.name, th.name { text-align: left; }
tr.group td { background: #fafafa; font-weight: 600; text-align: left; }
.kv td { text-align: left; max-width: 30em; overflow-wrap: anywhere; }
.kv td:first-child { color: #555; }
.meta { display: flex; gap: 2em; flex-wrap: wrap; align-items: flex-start; }
figure { margin: 0.5em 0; } figcaption { color: #555; font-size: 0.9em; }
.note { color: #666; font-size: 0.9em; } .bad { color: #b00020; }
svg { max-width: 100%; height: auto; }
"""


def render(report: dict[str, Any]) -> str:
    """The page for ``report``, a JSON report of ``inferwire load`` as a dict."""
    points: list[dict[str, Any]] = list(report.get("points") or [])
    title = f"inferwire load, {report.get('started') or 'undated'}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_esc(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{_esc(title)}</h1>",
        '<p class="note">Latencies are timed from each request\'s intended send time '
        "(definitions: <code>python -m pydoc inferwire.load.load_command</code>); "
        "a value the report does not hold shows as -.</p>",
        '<div class="meta">',
        _key_values("Parameters", report.get("parameters")),
        "<div>",
        _key_values("Machine", report.get("machine")),
        _key_values("Versions", report.get("versions")),
        "</div></div>",
        "<h2>Points</h2>",
        _points_table(points) if points else "<p>No points.</p>",
    ]
    for index, point in enumerate(points):
        parts.append(f'<h2 id="point-{index}">Point {index}: {_esc(_point_label(point))}</h2>')
        errors = point.get("error_examples") or {}
        if errors:
            items = "".join(
                f"<li><code>{_esc(name)}</code>: {_esc(example or '(no message)')}</li>"
                for name, example in errors.items()
            )
            parts.append(f'<ul class="bad">{items}</ul>')
        with mpl.rc_context(_RC):  # type: ignore[arg-type]
            cdf, timeline = _cdf_svg(point), _timeline_svg(point)
        if isinstance(point.get("attribution"), dict):  # a split run's parts: their own
            parts.append(attribution_page.section(point["attribution"]))
        parts.append(workload_page.section(point))
        parts.append(_figure("cdf", index, cdf, _CDF_CAPTION))
        parts.append(_figure("timeline", index, timeline, _timeline_caption(point)))
    parts.append("</body></html>\n")
    return "\n".join(parts)


_CDF_CAPTION: Final = (
    "Latency CDFs (log x axis), from the HDR histograms (values within 0.1%); dotted: P50 and P99."
)


def _timeline_caption(point: dict[str, Any]) -> str:
    width = _get(point, "timeline", "bucket_s")
    each = MISSING if width is None else f"{width:g} s"
    return (
        f"Inter-token latency over the point (P50 and P99 of the per-token gaps that ended in "
        f"each {each} bucket, left axis) and output tokens delivered per second (right axis)."
    )


def _figure(kind: str, index: int, svg: str, caption: str) -> str:
    return (
        f'<figure class="{kind}" data-point="{index}">{svg}'
        f"<figcaption>{_esc(caption)}</figcaption></figure>"
    )


# -- tables -----------------------------------------------------------------------------------


def _key_values(title: str, values: Any) -> str:
    rows = ""
    if isinstance(values, dict):
        rows = "".join(
            f"<tr><td>{_esc(key)}</td><td>{_esc(_plain(value))}</td></tr>"
            for key, value in values.items()
        )
    body = rows or f"<tr><td>{MISSING}</td></tr>"
    return f'<div><h3>{_esc(title)}</h3><table class="kv">{body}</table></div>'


def _plain(value: Any) -> str:
    if value is None:
        return MISSING
    if isinstance(value, dict):  # empty: present, and empty
        return ", ".join(f"{k} {_plain(v)}" for k, v in value.items()) or "none"
    if isinstance(value, list):
        return ", ".join(_plain(v) for v in value) or "none"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


Row = tuple[str, str, Callable[[dict[str, Any]], str]]


def _rows() -> list[Row | str]:
    """The table's rows: (label, data-metric key, cell text of a point), or a group title."""
    rows: list[Row | str] = [
        "Load",
        ("rate, req/s", "rate_rps", lambda p: _number(_get(p, "rate_rps"))),
        ("concurrency cap", "concurrency", _cap),
        ("offered rate, req/s", "offered_rate_rps", lambda p: _number(p.get("offered_rate_rps"))),
        (
            "requests scheduled",
            "requests_scheduled",
            lambda p: _number(p.get("requests_scheduled")),
        ),
        ("completed", "requests_completed", lambda p: _number(p.get("requests_completed"))),
        ("failed", "requests_failed", lambda p: _number(p.get("requests_failed"))),
        ("errors", "errors", _errors),
        ("output tokens counted by", "token_count", _token_count),
    ]
    for name, label in LATENCY_ROWS:
        rows.append(f"{label}, ms")
        for percentile in PERCENTILE_COLUMNS:
            key = f"{name}.{percentile}_ms"
            rows.append((percentile.upper(), key, _latency(name, f"{percentile}_ms")))
    rows += [
        "Throughput",
        ("requests, req/s", "request_throughput_rps", _from("request_throughput_rps")),
        (
            "output tokens, tok/s",
            "output_token_throughput_tps",
            _from("output_token_throughput_tps"),
        ),
        ("goodput, req/s", "goodput_rps", _from("goodput_rps")),
        ("max in flight", "max_in_flight", _from("max_in_flight")),
        ("input tokens, tok/s", "input_token_throughput_tps", _from("input_token_throughput_tps")),
        ("inputs, /s", "input_throughput_ips", _from("input_throughput_ips")),
        "What the streams carried",
        ("reasoning tokens", "reasoning_tokens", _from("reasoning_tokens")),
        ("reasoning tokens counted by", "reasoning_token_count", _counts("reasoning_token_count")),
        ("tool calls", "tool_calls", _from("tool_calls")),
        ("chunk tokens counted by", "chunk_token_count", _counts("chunk_token_count")),
        *(
            (f"chunks of {name} tokens", f"tokens_per_chunk.{name}", _per_chunk(name))
            for name, _, _ in TOKENS_PER_CHUNK_BINS
        ),
        "Integrity",
        ("verified", "integrity.verified", lambda p: _number(_get(p, "integrity", "verified"))),
        ("lost, duplicated, reordered, truncated, altered", "integrity.violations", _violations),
        "CPU",
        ("client s / 1k tokens", "client_cpu_s_per_1k_tokens", _from("client_cpu_s_per_1k_tokens")),
        ("server s / 1k tokens", "server_cpu_s_per_1k_tokens", _from("server_cpu_s_per_1k_tokens")),
    ]
    return rows


def _points_table(points: Sequence[dict[str, Any]]) -> str:
    head = "".join(f"<th>point {i}</th>" for i in range(len(points)))
    lines = [f'<table class="points"><tr><th class="name">metric</th>{head}</tr>']
    for row in _rows():
        if isinstance(row, str):
            lines.append(f'<tr class="group"><td colspan="{len(points) + 1}">{_esc(row)}</td></tr>')
            continue
        label, key, cell = row
        cells = "".join(
            f'<td data-metric="{key}" data-point="{i}">{_esc(cell(p))}</td>'
            for i, p in enumerate(points)
        )
        lines.append(f'<tr><td class="name">{_esc(label)}</td>{cells}</tr>')
    lines.append("</table>")
    return "\n".join(lines)


def _from(key: str) -> Callable[[dict[str, Any]], str]:
    return lambda point: _number(point.get(key))


def _latency(name: str, key: str) -> Callable[[dict[str, Any]], str]:
    return lambda point: _number(_get(point, name, key))


def _cap(point: dict[str, Any]) -> str:
    if "concurrency" not in point:
        return MISSING
    return "none" if point["concurrency"] is None else _number(point["concurrency"])


def _errors(point: dict[str, Any]) -> str:
    errors = point.get("errors")
    if not isinstance(errors, dict):
        return MISSING
    return ", ".join(f"{n} {name}" for name, n in errors.items()) or "none"


def _token_count(point: dict[str, Any]) -> str:
    """How the output tokens were counted, by how many requests (usage, tokenizer, chunks)."""
    counted = point.get("token_count")
    if not isinstance(counted, dict) or not counted:
        return MISSING
    return ", ".join(f"{how} {n}" for how, n in counted.items())


def _counts(key: str) -> Callable[[dict[str, Any]], str]:
    """A mapping of ways of counting to how many requests each counted ("none": no request
    was counted, e.g. none reasoned)."""

    def cell(point: dict[str, Any]) -> str:
        counted = point.get(key)
        if not isinstance(counted, dict):
            return MISSING
        return ", ".join(f"{how} {n}" for how, n in counted.items()) or "none"

    return cell


def _per_chunk(name: str) -> Callable[[dict[str, Any]], str]:
    return lambda point: _number(_get(point, "tokens_per_chunk", name))


def _violations(point: dict[str, Any]) -> str:
    integrity = point.get("integrity")
    if not isinstance(integrity, dict):
        return MISSING
    if not all(kind in integrity for kind, _ in metrics.INTEGRITY_KINDS):
        return MISSING
    return _number(metrics.integrity_violations(integrity))


def _number(value: Any) -> str:
    """Integers whole; other numbers to 4 significant digits or better, without exponents."""
    if value is None or isinstance(value, bool):
        return MISSING if value is None else str(value)
    if isinstance(value, str):
        return value  # "inf"
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, float) or not math.isfinite(value):
        return MISSING
    magnitude = abs(value)
    decimals = 3 if magnitude < 10 else 2 if magnitude < 100 else 1 if magnitude < 1000 else 0
    return f"{value:.{decimals}f}"


def _get(mapping: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(mapping, dict) or key not in mapping:
            return None
        mapping = mapping[key]
    return mapping


def _point_label(point: dict[str, Any]) -> str:
    rate = _get(point, "rate_rps")
    cap = point.get("concurrency")
    shown = f"{rate:g}" if isinstance(rate, float) else MISSING if rate is None else str(rate)
    label = f"rate {shown} req/s"
    return label + (f", cap {cap}" if cap is not None else ", no cap")


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


# -- plots ------------------------------------------------------------------------------------


def _cdf_svg(point: dict[str, Any]) -> str:
    figure = Figure(figsize=(11.0, 2.7), layout="constrained")
    axes = figure.subplots(1, len(CDF_PLOTS))
    for ax, (name, label) in zip(axes, CDF_PLOTS, strict=True):
        cdf = _get(point, name, "cdf") or []
        count = _get(point, name, "count")
        ax.set_title(f"{label} ({_number(count)} values)", fontsize=9)
        ax.set_xlabel("ms")
        ax.set_ylim(0, 1.02)
        ax.grid(True, which="major", color="#dddddd", linewidth=0.6)
        if not cdf:
            _no_data(ax)
            ax.set_xticks([])  # no range of values to mark
            continue
        values_ms = [max(v, 1e-3) for v, _ in cdf]  # a log axis has no 0
        fractions = [f for _, f in cdf]
        ax.plot(values_ms, fractions, drawstyle="steps-post", color="#1f5fa8", linewidth=1.3)
        _log_x(ax, values_ms[0], values_ms[-1])
        for percentile, style in (("p50", ":"), ("p99", ":")):
            value = _get(point, name, f"{percentile}_ms")
            if value:
                ax.axvline(value, color="#999999", linestyle=style, linewidth=0.9)
    axes[0].set_ylabel("fraction of values at most x")
    return _svg(figure)


def _timeline_svg(point: dict[str, Any]) -> str:
    timeline = _get(point, "timeline")
    figure = Figure(figsize=(11.0, 2.9), layout="constrained")
    ax = figure.subplots()
    ax.set_xlabel("s after the point's first intended send")
    ax.set_ylabel("inter-token latency, ms")
    ax.grid(True, color="#dddddd", linewidth=0.6)
    width_s = _get(timeline, "bucket_s")
    p50 = _get(timeline, "itl_p50_ms")
    p99 = _get(timeline, "itl_p99_ms")
    tokens = _get(timeline, "tokens")
    if not width_s or not isinstance(p50, list) or not isinstance(p99, list):
        _no_data(ax)
        return _svg(figure)
    starts_s = [i * width_s for i in range(len(p50))]
    edges_s = [*starts_s, len(p50) * width_s]
    if any(v is not None for v in p50):
        ax.stairs(_nan(p99), edges_s, color="#c0392b", linewidth=1.2, label="ITL P99")
        ax.stairs(_nan(p50), edges_s, color="#1f5fa8", linewidth=1.4, label="ITL P50")
        shown = [v for v in (*p50, *p99) if v]
        if shown:  # log: P50 and P99 are often a decade or more apart
            ax.set_yscale("log")
            ax.set_ylim(min(shown) / 1.3, max(shown) * 1.3)
            ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:.4g}"))
            ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncol=2, fontsize=8, frameon=False)
    else:
        _no_data(ax, "no inter-token gaps")
    ax.set_xlim(0, edges_s[-1])
    if isinstance(tokens, list) and len(tokens) == len(p50):
        right = ax.twinx()
        right.stairs([t / width_s for t in tokens], edges_s, fill=True, color="#2e8b57", alpha=0.15)
        right.set_ylabel("output tokens/s", color="#2e8b57")
        right.set_ylim(bottom=0)
        ax.set_zorder(right.get_zorder() + 1)  # the lines over the filled throughput
        ax.patch.set_visible(False)
    return _svg(figure)


def _log_x(ax: Any, low: float, high: float) -> None:
    """A log x axis with plain tick labels: 1-2-5 steps over a wide range, evenly spaced
    ones over a narrow one (where a log axis has no decade to label)."""
    ax.set_xscale("log")
    low, high = low / 1.05, high * 1.05
    ax.set_xlim(low, high)
    if high / low >= 8:
        locator: Any = ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=12)
    else:
        locator = ticker.MaxNLocator(nbins=4, min_n_ticks=3)
    ticks = [t for t in locator.tick_values(low, high) if low <= t <= high and t > 0]
    if len(ticks) > 7:  # many decades: every other one
        ticks = [t for t in ticks if math.log10(t) % 1 == 0] or ticks[::2]
    ax.xaxis.set_major_locator(ticker.FixedLocator(ticks))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:.4g}"))
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())


def _nan(values: Sequence[float | None]) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]


def _no_data(ax: Any, text: str = "no values") -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="#888888")


def _svg(figure: Figure) -> str:
    out = io.StringIO()
    figure.savefig(out, format="svg", metadata={"Date": None})
    text = out.getvalue()
    return text[text.index("<svg") :]  # the XML declaration and DOCTYPE are not for HTML
