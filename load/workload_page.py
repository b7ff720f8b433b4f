"""The HTML report's section on a point's workload (:mod:`inferwire.load.html_report`): its
conversations by turn (:mod:`.conversations`) and its prefix cache, expected beside the
server's (:mod:`.prefix_cache`). Empty for a point that has neither."""

from __future__ import annotations

import html
from typing import Any


def _cell(value: Any, *, share: bool = False) -> str:
    if value is None:
        return "<td>-</td>"
    if share:
        return f"<td>{value:.1%}</td>"
    if isinstance(value, float):
        return f"<td>{value:.4g}</td>"
    return f"<td>{html.escape(str(value))}</td>"


def _conversations(found: dict[str, Any]) -> str:
    header = (
        "<tr><th>turn</th><th>requests</th><th>completed</th><th>TTFT P50 ms</th>"
        "<th>TTFT P99 ms</th><th>E2E P50 ms</th><th>E2E P99 ms</th>"
        "<th>input tokens, mean</th><th>input tokens, max</th></tr>"
    )
    rows = "".join(
        "<tr>"
        + "".join(
            _cell(v)
            for v in (
                turn["turn"],
                turn["requests"],
                turn["completed"],
                turn["ttft"]["p50_ms"],
                turn["ttft"]["p99_ms"],
                turn["e2e"]["p50_ms"],
                turn["e2e"]["p99_ms"],
                turn["input_tokens"]["mean"],
                turn["input_tokens"]["max"],
            )
        )
        + "</tr>"
        for turn in found["by_turn"]
    )
    reasons = ", ".join(f"{n} ({why})" for why, n in found["not_sent_because"].items())
    summary = (
        f"{found['conversations_whole']} of {found['conversations']} conversations whole;"
        f" {found['turns_sent']} of {found['turns_planned']} turns sent"
        + (f"; not sent: {reasons}" if reasons else "")
        + f"; think time {found['think_time_s']} s"
    )
    return (
        f"<h3>Conversations</h3><p>{html.escape(summary)}</p>"
        f'<table class="conversations">{header}{rows}</table>'
    )


def _prefix_cache(found: dict[str, Any]) -> str:
    server = found.get("server") or {}
    rows = [
        ("expected hit rate", _cell(found.get("expected_hit_rate"), share=True)),
        ("expected hit tokens", _cell(found.get("expected_hit_tokens"))),
        ("input tokens", _cell(found.get("input_tokens"))),
        ("shared by", _cell(found.get("shared_by"))),
        ("the server's hit rate", _cell(server.get("hit_rate"), share=True)),
        ("the server's figures", _cell(", ".join(server.get("families", [])) or None)),
    ]
    body = "".join(f"<tr><td>{html.escape(label)}</td>{cell}</tr>" for label, cell in rows)
    note = found.get("assumes")
    return f'<h3>Prefix cache</h3><table class="kv">{body}</table>' + (
        f'<p class="note">Expected assumes {html.escape(note)}.</p>' if note else ""
    )


def section(point: dict[str, Any]) -> str:
    """The point's workload section, or "" when it has no conversations and no prefix cache
    figures."""
    parts = []
    if isinstance(point.get("conversations"), dict):
        parts.append(_conversations(point["conversations"]))
    if isinstance(point.get("prefix_cache"), dict):
        parts.append(_prefix_cache(point["prefix_cache"]))
    return "\n".join(parts)
