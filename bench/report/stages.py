"""The report's per-stage section, from ``raw/stages.json``: where a streamed token's time
goes, a request's path to its first token (P50 and P90 over many chunks and requests), and
what the network adds (a paired share); and their stacked-bar plots (of the P50s)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inferwire.transports.timing import REQUEST_STAGES

from . import spread
from .results import STAGES_RAW, records
from .tables import table

STAGE_NAMES = ("serialize", "write", "network", "parse")


def chunk_share(r: dict[str, Any], name: str) -> float:
    """A chunk share of a stages record: the median of the per-chunk shares the suite recorded
    (an older run without them: the same ratio of the P50s)."""
    if name in r.get("shares", {}):
        return float(r["shares"][name])
    us = r["stages_us"]
    decode_us = r["decode_ms"] * 1e3
    codec = us["serialize"] + us["parse"]
    return float(
        {
            "serialize_parse": codec / us["end_to_end"],
            "serialize_parse_with_compute": codec / (us["end_to_end"] + decode_us),
            "transport_with_compute": us["end_to_end"] / (us["end_to_end"] + decode_us),
        }[name]
    )


def span_cells(results: list[dict[str, Any]], path: str, value: Any, fmt: Any) -> str:
    """The lowest and the highest of ``value(record)`` over the records, each with its range
    over the repeats of the run (``spread.cell`` at ``path``)."""
    if not results:
        return "?"
    ranked = sorted(results, key=value)
    low, high = ranked[0], ranked[-1]
    low_text = spread.cell(low, path, value(low), fmt)
    high_text = spread.cell(high, path, value(high), fmt)
    return low_text if high_text == low_text else f"{low_text} to {high_text}"


def _us(value: float) -> str:
    return f"{value:,.1f}"


def _pct(value: float) -> str:
    return f"{value:.0%}"


def _p50_p90(r: dict[str, Any], key: str, name: str) -> str:
    """``P50 / P90`` in microseconds (a run without P90s prints the P50 alone)."""
    p90 = r.get(key.replace("_us", "_p90_us"), {}).get(name)
    text = _us(r[key][name])
    return text if p90 is None else f"{text} / {_us(p90)}"


def _share(r: dict[str, Any]) -> str:
    """Serialize + parse in a chunk's produced-to-decoded time, with its range over repeats."""
    return spread.cell(r, "shares.serialize_parse", chunk_share(r, "serialize_parse"), _pct)


def _ms(value: float) -> str:
    return f"{value:,.1f} ms"


def section(raw_dir: Path) -> str:
    """The report's per-stage section ("" if the run has none)."""
    results = records(raw_dir / STAGES_RAW)
    if not results:
        return ""
    stages = [r for r in results if r["op"] == "stages"]
    stage_rows = [
        [f"`{r['transport']}`", f"`{r['codec']}`"]
        + [_p50_p90(r, "stages_us", name) for name in (*STAGE_NAMES, "end_to_end")]
        + [_share(r)]
        for r in stages
    ]
    request_rows = [
        [f"`{r['transport']}`", f"`{r['codec']}`"]
        + [_p50_p90(r, "request_stages_us", name) for name in REQUEST_STAGES]
        + [_us(sum(r["request_stages_us"].values()))]
        for r in stages
        if r.get("request_stages_us")
    ]
    # paired runs only: a run that timed direct and proxied as two benchmarks has no share
    wan = [r for r in results if r["op"] == "wan-share" and "network_share" in r]
    wan_rows = [
        [
            f"`{r['transport']}`",
            r["pattern"],
            str(r["tokens"]),
            spread.cell(r, "direct_ms", r["direct_ms"], _ms),
            spread.cell(r, "proxied_ms", r["proxied_ms"], _ms),
            spread.cell(r, "network_share", r["network_share"], _pct),
        ]
        for r in sorted(wan, key=lambda r: (r["transport"], r["pattern"]))
    ]
    first = stages[0] if stages else {}
    streams, chunks = first.get("streams", 1), first.get("chunks", "?")
    pooled = first.get("pooled_chunks", chunks)
    wan_first = wan[0] if wan else {}
    text = "\n".join(
        [
            "## Per-stage time of a streamed token",
            "",
            f"Per transport x codec, on one connection, after {first.get('warmup_streams', 0)} "
            f"untimed stream: {streams} `{first.get('workload', '?')}` streams, the service "
            f"paced at {first.get('decode_ms', '?')} ms per token so the reader keeps up, their "
            f"chunks pooled ({pooled} chunks a cell). Each cell is *P50 / P90* in microseconds "
            "over those chunks, from the server's stamps and the client's (one host, one "
            "monotonic clock): *serialize* (server encode), *write* (until the socket write "
            "returned), *network* (written to bytes received, loopback and the reader's "
            "wake-up), *parse* (client decode), *produced to decoded*. *serialize + parse "
            "share*: the median over the chunks of each chunk's own share. gRPC reports a "
            "message as written only when it asks for the next one, so for gRPC read *write + "
            "network* together. On two hosts the clocks differ: only the per-side stages "
            "(serialize, write, parse) carry over, and the network share must come from the "
            "round-trip time instead.",
            "",
            "![stages](plots/stages.png)",
            "",
            table(
                [
                    "transport",
                    "codec",
                    *STAGE_NAMES,
                    "produced to decoded",
                    "serialize + parse share",
                ],
                stage_rows,
            ),
            "",
            "### One request, to its first token",
            "",
            f"The same connections, after {first.get('warmup_requests', 0)} untimed requests: "
            f"{first.get('requests', 1)} short requests "
            f"({first.get('request_tokens', '?')} tokens each) per cell, each sent "
            f"{first.get('idle_gap_ms', 0):g} ms after the previous one ended (an idle "
            "connection), the request's own path to its first chunk as *P50 / P90* in "
            "microseconds over those requests (*total*: the sum of the P50s). The client "
            "encodes and writes the request, the server has it whole and parses it, the "
            "service produces the first chunk (no prefill here), "
            "and that chunk goes back. Times on one host and one monotonic clock. Each side "
            "stamps a write once it returned: when the woken reader runs before the writer is "
            "back (two busy cores), the time moves from the network stage into the stage "
            "before it (*client serialize*, *write*), and the network stage can read negative; "
            "read each write and its network stage together. gRPC serializes and sends in the "
            "background, so for gRPC *client serialize* is only building the message and "
            "*network to server* includes the rest.",
            "",
            "![request stages](plots/request_stages.png)",
            "",
            table(["transport", "codec", *REQUEST_STAGES, "total"], request_rows),
            "",
            "### What the network adds (WAN-delay proxy)",
            "",
            f"{wan_first.get('tokens', '?')} tokens at "
            f"{wan_first.get('compute_ms_per_token', '?')} ms of compute each, direct and "
            f"through the proxy at {wan_first.get('one_way_delay_ms', '?')} ms one way: as one "
            "stream, and as one request per token. Direct and proxied runs alternate in one "
            f"benchmark ({wan_first.get('pairs', '?')} pairs, the order swapped every pair); "
            "*direct* and *proxied* are the medians of each, *network share* the median over "
            "the pairs of 1 - direct / proxied.",
            "",
            table(
                ["transport", "pattern", "tokens", "direct", "proxied", "network share"],
                wan_rows,
            ),
            "",
        ]
    )
    return text


def _stacked(
    results: list[dict[str, Any]], key: str, names: tuple[str, ...], title: str, path: Path
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['transport']}\n{r['codec']}" for r in results]
    fig, ax = plt.subplots(figsize=(max(6, len(results) * 0.8), 4.5))
    bottom = [0.0] * len(results)
    for name in names:
        values = [max(0.0, r[key].get(name, 0.0)) for r in results]
        ax.bar(labels, values, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("microseconds (P50)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot(raw_dir: Path, out_dir: Path) -> list[Path]:
    """Stacked bars per transport x codec: a chunk's stages, and a request's (PNG)."""
    results = [r for r in records(raw_dir / STAGES_RAW) if r["op"] == "stages"]
    if not results:
        return []
    paths = [
        _stacked(
            results,
            "stages_us",
            STAGE_NAMES,
            "Where a streamed token's time goes (per chunk)",
            out_dir / "plots" / "stages.png",
        )
    ]
    with_request = [r for r in results if r.get("request_stages_us")]
    if with_request:
        paths.append(
            _stacked(
                with_request,
                "request_stages_us",
                REQUEST_STAGES,
                "One request to its first token",
                out_dir / "plots" / "request_stages.png",
            )
        )
    return paths
