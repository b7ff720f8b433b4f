"""The report's per-stage section, from ``raw/stages.json``: where a streamed token's time
goes, a request's path to its first token, and what the network adds; and their stacked-bar
plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inferwire.transports.timing import REQUEST_STAGES

from .results import STAGES_RAW, records
from .tables import ms, table

STAGE_NAMES = ("serialize", "write", "network", "parse")


def section(raw_dir: Path) -> str:
    """The report's per-stage section ("" if the run has none)."""
    results = records(raw_dir / STAGES_RAW)
    if not results:
        return ""
    stage_rows = []
    for r in results:
        if r["op"] != "stages":
            continue
        us = r["stages_us"]
        stage_rows.append(
            [f"`{r['transport']}`", f"`{r['codec']}`"]
            + [f"{us[name]:,.1f} us" for name in (*STAGE_NAMES, "end_to_end")]
            + [f"{(us['serialize'] + us['parse']) / us['end_to_end']:.0%}"]
        )
    request_rows = []
    for r in results:
        if r["op"] != "stages" or not r.get("request_stages_us"):
            continue
        us = r["request_stages_us"]
        request_rows.append(
            [f"`{r['transport']}`", f"`{r['codec']}`"]
            + [f"{us[name]:,.1f}" for name in REQUEST_STAGES]
            + [f"{sum(us.values()):,.1f}"]
        )
    wan = {(r["transport"], r["path"], r["pattern"]): r for r in results if r["op"] == "wan-share"}
    wan_rows = []
    for (transport, path, pattern), proxied in sorted(wan.items()):
        if path != "proxied":
            continue
        direct = wan.get((transport, "direct", pattern))
        if direct is None:
            continue
        share = 1 - direct["median_s"] / proxied["median_s"]
        wan_rows.append(
            [
                f"`{transport}`",
                pattern,
                str(proxied["tokens"]),
                ms(direct["median_s"]),
                ms(proxied["median_s"]),
                f"{share:.0%}",
            ]
        )
    first = next((r for r in results if r["op"] == "stages"), {})
    wan_first = next((r for r in results if r["op"] == "wan-share"), {})
    text = "\n".join(
        [
            "## Per-stage time of a streamed token",
            "",
            f"One `{first.get('workload', '?')}` stream per transport x codec, the service paced "
            f"at {first.get('decode_ms', '?')} ms per token so the reader keeps up. Medians per "
            "chunk from the server's stamps and the client's (one host, one monotonic clock): "
            "*serialize* (server encode), *write* (until the socket write returned), *network* "
            "(written to bytes received, loopback and the reader's wake-up), *parse* (client "
            "decode), *produced to decoded*. gRPC reports a message as written only when it "
            "asks for the next one, so for gRPC read *write + network* together. On two hosts "
            "the clocks differ: only the per-side stages (serialize, write, parse) carry over, "
            "and the network share must come from the round-trip time instead.",
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
            "The same runs, the request's own path in microseconds: the client encodes and "
            "writes it, the server has it whole and parses it, the service produces the first "
            "chunk (no prefill here), and that chunk goes back. Times on one host and one "
            "monotonic clock; gRPC serializes and sends in the background, so for gRPC "
            "*client serialize* is only building the message and *network to server* "
            "includes the rest.",
            "",
            "![request stages](plots/request_stages.png)",
            "",
            table(["transport", "codec", *REQUEST_STAGES, "total"], request_rows),
            "",
            "### What the network adds (WAN-delay proxy)",
            "",
            f"{wan_first.get('tokens', '?')} tokens at {wan_first.get('compute_ms_per_token', '?')}"
            " ms of compute each, direct and through the proxy at "
            f"{next((r['one_way_delay_ms'] for r in wan.values() if r['path'] == 'proxied'), '?')}"
            " ms one way: as one stream, and as one request per token. *network share*: "
            "1 - direct / proxied. Median of 3.",
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
    ax.set_ylabel("microseconds (median)")
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
