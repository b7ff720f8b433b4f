"""The HTML report's section on where a point's time went (:mod:`inferwire.load.html_report`)."""

from __future__ import annotations

import html
from typing import Any, Final

from .reports import SOURCES

_CLIENT_LABELS: Final = (
    ("lag", "generator lag"),
    ("pool_wait", "wait for a connection"),
    ("connect", "connect (TCP, TLS)"),
    ("write", "request write"),
    ("wait_head", "wait for the response head"),
    ("first_event", "head to first token event"),
    ("parse", "client parse, all events"),
)
_SPLIT_LABELS: Final = (
    ("queue", "server queue"),
    ("prefill", "prefill"),
    ("decode", "decode"),
    ("inference", "model (prefill + decode)"),
    ("outside", "outside the engine"),
)


def _cell(value: Any) -> str:
    if value is None:
        return "<td>-</td>"
    if isinstance(value, float):
        return f"<td>{value:.4g}</td>"
    return f"<td>{html.escape(str(value))}</td>"


def _row(label: str, source: str, summary: dict[str, Any] | None) -> str:
    summary = summary or {}
    values = [summary.get(k) for k in ("p50_ms", "p90_ms", "p99_ms", "mean_ms", "count")]
    return (
        f"<tr><td>{html.escape(label)}</td><td>{html.escape(source)}</td>"
        + "".join(_cell(v) for v in values)
        + "</tr>"
    )


def section(attribution: dict[str, Any]) -> str:
    """The section: the split's line, a table of stages with the source of each, the
    sources' states and their notes."""
    rows = [
        _row(label, "client", attribution["client"].get(stage))
        for stage, label in _CLIENT_LABELS
        if stage in attribution["client"]
    ]
    per_request = attribution["per_request"]
    sources = "+".join(sorted(per_request["sources"])) or "-"
    rows += [
        _row(label, sources, per_request.get(stage))
        for stage, label in _SPLIT_LABELS
        if per_request.get(stage)
    ]
    prom = attribution["sources"].get("prometheus", {})
    for stage, found in (prom.get("stages") or {}).items():
        label = f"{stage} ({found.get('family', '')})"
        rows.append(_row(label, f"prometheus {prom.get('engine', '')}", found))
    states = "".join(
        f"<li><b>{html.escape(name)}</b>: {html.escape(str(state.get('state')))}"
        + "".join(f"; {html.escape(note)}" for note in state.get("notes") or [])
        + "</li>"
        for name in SOURCES
        if (state := attribution["sources"].get(name)) is not None
    )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in attribution.get("notes") or [])
    head = "<tr><th>stage</th><th>source</th><th>P50 ms</th><th>P90 ms</th><th>P99 ms</th>"
    head += "<th>mean ms</th><th>count</th></tr>"
    return (
        '<section class="split"><h3>Where the time went</h3>'
        f"<p>{html.escape(attribution['text'])}</p>"
        f"<table>{head}{''.join(rows)}</table>"
        f"<ul>{states}{notes}</ul></section>"
    )
