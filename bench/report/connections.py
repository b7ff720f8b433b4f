"""The report's connection setup section, from ``raw/connections.json``: new vs reused
connections, and the connections one user session opens."""

from __future__ import annotations

from pathlib import Path

from .results import CONNECTIONS_RAW, records
from .tables import ms, table


def section(raw_dir: Path) -> str:
    """The report's connection setup section ("" if the run has none)."""
    results = records(raw_dir / CONNECTIONS_RAW)
    if not results:
        return ""
    setup = {
        (r["transport"], r["concurrency"], r["tls"], r["delay_ms"], r["mode"]): r
        for r in results
        if r["op"] == "connection-setup"
    }
    rows = []
    for (transport, concurrency, tls, delay, mode), new in sorted(setup.items()):
        if mode != "new":
            continue
        reused = setup.get((transport, concurrency, tls, delay, "reused"))
        if reused is None:
            continue
        cut = 1 - reused["median_s"] / new["median_s"]
        rows.append(
            [
                f"`{transport}`",
                str(concurrency),
                "TLS" if tls else "plain",
                f"{delay} ms",
                ms(new["median_s"]),
                ms(reused["median_s"]),
                f"{cut:.0%}",
                "yes" if new["correct"] and reused["correct"] else "**no**",
            ]
        )
    sessions = [r for r in results if r["op"] == "session-connections"]
    session_rows = [
        [f"`{r['transport']}`", r["mode"], str(r["requests"]), str(r["connections"])]
        for r in sessions
    ]
    text = "\n".join(
        [
            "## Connection setup",
            "",
            "One round: *concurrency* clients each make one small infer request at once. *new*: "
            "each request on a connection of its own (TCP, TLS, HTTP/2 preface or gRPC channel "
            "setup), closed after; *reused*: on a connection opened before timing. *one-way "
            "delay*: through the WAN-delay proxy. *saved*: 1 - reused / new. Median of 5 rounds.",
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
