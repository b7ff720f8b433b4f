"""The report's connection setup section, from ``raw/connections.json``: new vs reused
connections (timed in alternating pairs of rounds, the saving a paired ratio), and the
connections one user session opens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import spread
from .results import CONNECTIONS_RAW, records
from .tables import table


def _ms(value: float) -> str:
    return f"{value:,.1f} ms"


def _pct(value: float) -> str:
    return f"{value:.0%}"


def setup_records(raw_dir: Path) -> list[dict[str, Any]]:
    """The connection-setup benchmarks that timed new and reused in pairs (a run that timed
    them as separate benchmarks has no paired saving, and none of its rows is kept)."""
    return [
        r
        for r in records(raw_dir / CONNECTIONS_RAW)
        if r["op"] == "connection-setup" and "saved" in r
    ]


def section(raw_dir: Path) -> str:
    """The report's connection setup section ("" if the run has none)."""
    results = records(raw_dir / CONNECTIONS_RAW)
    if not results:
        return ""
    setup = sorted(
        setup_records(raw_dir),
        key=lambda r: (r["transport"], r["concurrency"], r["tls"], r["delay_ms"]),
    )
    rows = [
        [
            f"`{r['transport']}`",
            str(r["concurrency"]),
            "TLS" if r["tls"] else "plain",
            f"{r['delay_ms']} ms",
            spread.cell(r, "new_ms", r["new_ms"], _ms),
            spread.cell(r, "reused_ms", r["reused_ms"], _ms),
            spread.cell(r, "saved", r["saved"], _pct),
            "yes" if r["correct"] else "**no**",
        ]
        for r in setup
    ]
    sessions = [r for r in results if r["op"] == "session-connections"]
    session_rows = [
        [f"`{r['transport']}`", r["mode"], str(r["requests"]), str(r["connections"])]
        for r in sessions
    ]
    pairs = setup[0]["pairs"] if setup else "?"
    text = "\n".join(
        [
            "## Connection setup",
            "",
            "One round: *concurrency* clients each make one small infer request at once. *new*: "
            "each request on a connection of its own (TCP, TLS, HTTP/2 preface or gRPC channel "
            "setup), closed after; *reused*: on a connection opened before timing. *one-way "
            "delay*: through the WAN-delay proxy. Each cell is one benchmark whose rounds "
            f"alternate new and reused, in {pairs} pairs after an untimed one (the order "
            "swapped every pair): *new* and *reused* are the medians of each, *saved* the "
            "median over the pairs of 1 - reused / new.",
            "",
            table(
                [
                    "transport",
                    "concurrency",
                    "security",
                    "one-way delay",
                    "new",
                    "reused",
                    "saved",
                    "correct",
                ],
                rows,
            ),
            "",
            "Connections (TCP handshakes) one user session of several requests opens:",
            "",
            table(["transport", "mode", "requests", "connections"], session_rows),
            "",
        ]
    )
    return text
