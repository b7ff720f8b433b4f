"""The report's per-stage section, from ``raw/stages.json``: where a streamed token's time
goes, a request's path to its first token (P50 and P90 over many chunks and requests), and
what the network adds (a paired share); and their stacked-bar plots (of the P50s).

Every stage is a difference of two stamps in causal order on one host's monotonic clock
(:mod:`inferwire.transports.timing`), so none is below zero. A cell below zero in the raw data
is printed flagged, never as a plain duration, with a line under its table that names it: a
fault of that run (its stamps, or two clocks), which the benchmark itself fails on. Flagged,
not refused: the report is built from every suite's file, and one bad cell should neither
stop the rest of it nor pass unseen (as a wrong round trip is a "**no**" in its table). Records
of the older definitions (the network stages from a write call's return, which could read below
zero) are left out, with a line saying so: their stages are not these."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inferwire.transports.timing import REQUEST_STAGES

from . import spread
from .results import STAGES_RAW, records
from .tables import table

STAGE_NAMES = ("serialize", "network", "parse")
"""A chunk's stages: they add up to its produced-to-decoded time."""
CAUSAL_STAGE = "client dispatch"
"""A record has this request stage when its stages are the causal ones (every network stage
from before the sender's write call); a record without it is of the older definitions."""


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
    """``P50 / P90`` in microseconds (a run without P90s prints the P50 alone); flagged if
    either is below zero (see the module docstring)."""
    p50 = r[key][name]
    p90 = r.get(key.replace("_us", "_p90_us"), {}).get(name)
    text = _us(p50) if p90 is None else f"{_us(p50)} / {_us(p90)}"
    if p50 < 0 or (p90 is not None and p90 < 0):
        return f"**below zero: {text}**"
    return text


def causal(r: dict[str, Any]) -> bool:
    """Whether a stages record's stages are the causal ones (:data:`CAUSAL_STAGE`)."""
    return CAUSAL_STAGE in r.get("request_stages_us", {})


def below_zero(results: list[dict[str, Any]], key: str, names: tuple[str, ...]) -> list[str]:
    """``transport/codec stage`` of each cell whose P50 or P90 is below zero, in table order."""
    p90_key = key.replace("_us", "_p90_us")
    return [
        f"`{r['transport']}`/`{r['codec']}` {name}"
        for r in results
        for name in names
        if min(r[key].get(name, 0.0), r.get(p90_key, {}).get(name, 0.0)) < 0
    ]


def _below_zero_note(cells: list[str]) -> list[str]:
    if not cells:
        return []
    return [
        "",
        f"**Below zero, so not a duration:** {', '.join(cells)}. Each stage is a difference of "
        "two stamps in causal order on one clock, so this run's stamps are at fault (or its "
        "processes did not share a clock): re-run `bench_stages` before reading these rows.",
    ]


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
    every_stage = [r for r in results if r["op"] == "stages"]
    stages = [r for r in every_stage if causal(r)]
    older = len(every_stage) - len(stages)
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
            "monotonic clock): *serialize* (server encode), *network* (from just before the "
            "server's write call to the client's read returned: the write call, loopback and "
            "the reader's wake-up), *parse* (client decode), *produced to decoded* (the three "
            "add up to it). *serialize + parse share*: the median over the chunks of each "
            "chunk's own share. A network stage starts before the write call and ends after "
            "the read: stamped in causal order, it cannot read below zero (a stamp taken when "
            "the write returned could, when the woken reader runs before the writer is back). "
            "HTTP/2's framing and any flow-control wait, and gRPC's own framing and sending "
            "(in the background), are in *network* too. On two hosts the clocks differ: only "
            "the per-side stages (serialize, parse) carry over, and the network share must come "
            "from the round-trip time instead.",
            *_older_note(older),
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
            *_below_zero_note(below_zero(stages, "stages_us", (*STAGE_NAMES, "end_to_end"))),
            "",
            "### One request, to its first token",
            "",
            f"The same connections, after {first.get('warmup_requests', 0)} untimed requests: "
            f"{first.get('requests', 1)} short requests "
            f"({first.get('request_tokens', '?')} tokens each) per cell, each sent "
            f"{first.get('idle_gap_ms', 0):g} ms after the previous one ended (an idle "
            "connection), the request's own path to its first chunk as *P50 / P90* in "
            "microseconds over those requests (*total*: the sum of the P50s). The client "
            "encodes the request (*client serialize*), gets it to its write call (*client "
            "dispatch*: the stream's reader set up, the connection taken, the protocol's "
            "request head built), the server reads it whole and parses it, the service "
            "produces the first chunk (no prefill here), the server encodes it, and it goes "
            "back. Times on one host and one monotonic clock; each stage ends where the next "
            "begins, so they add up. Each network stage runs from a stamp taken just before "
            "the sender's write call to one taken after the receiver's read returned, so the "
            "write call is part of it and it cannot read below zero. For gRPC, which frames "
            "and sends in the background, *network to server* includes grpc's serialization "
            "of the request.",
            "",
            "![request stages](plots/request_stages.png)",
            "",
            table(["transport", "codec", *REQUEST_STAGES, "total"], request_rows),
            *_below_zero_note(below_zero(stages, "request_stages_us", REQUEST_STAGES)),
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


def _older_note(count: int) -> list[str]:
    if not count:
        return []
    return [
        "",
        f"{count} {'cell' if count == 1 else 'cells'} of an older run left out: its network "
        "stages ran from a write call's return, which could read below zero; re-run "
        "`bench_stages` for them.",
    ]


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
    results = [r for r in records(raw_dir / STAGES_RAW) if r["op"] == "stages" and causal(r)]
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
