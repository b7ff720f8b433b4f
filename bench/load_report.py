"""Report sections for the load generator (``raw/load.json``) and the peers comparison
(``raw/peers.json``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inferwire.bench.procs import peer_servers as peers

from .tables import table as _table

LOAD_RAW = "load.json"
PEERS_RAW = "peers.json"
CAPACITY_TARGET_RPS = 5000.0
CAPACITY_LAG_MS = 1.0
PEER_TARGET = 1.5


def _infos(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [bench["extra_info"] for bench in json.loads(path.read_text())["benchmarks"]]


def _load_average(value: Any) -> float:
    """The 1-minute load average (recorded as the triple os.getloadavg gives)."""
    return float(value[0] if isinstance(value, (list, tuple)) else value)


def _pcts(metric: dict[str, Any]) -> str:
    return f"{metric['p50_ms']:.1f} / {metric['p99_ms']:.1f} / {metric['p99_9_ms']:.1f}"


def capacity_target_row(raw_dir: Path) -> list[list[str]]:
    points = [i for i in _infos(raw_dir / LOAD_RAW) if i.get("target") == "null"]
    at = [p for p in points if p["rate_rps"] >= CAPACITY_TARGET_RPS]
    if not at:
        return []
    best = min(at, key=lambda p: (p["rate_rps"], p["send_lag_ms"]["p99_ms"]))
    candidates = [p for p in at if p["rate_rps"] == best["rate_rps"]]
    best = min(candidates, key=lambda p: p["send_lag_ms"]["p99_ms"])
    lag = best["send_lag_ms"]["p99_ms"]
    ok = best["achieved_rps"] >= 0.98 * CAPACITY_TARGET_RPS and lag < CAPACITY_LAG_MS
    return [
        [
            "the load generator is not the bottleneck",
            f"{best['rate_rps']:,.0f} req/s scheduled (cap {best['concurrency'] or 'none'}), "
            f"load average {_load_average(best['load_average']):.1f}",
            f"{best['achieved_rps']:,.0f} req/s, P99 lag {lag:.2f} ms",
            f">= {CAPACITY_TARGET_RPS:,.0f} req/s, P99 lag < {CAPACITY_LAG_MS:g} ms",
            "met" if ok else "**missed**",
        ]
    ]


def load_section(raw_dir: Path) -> str:
    infos = _infos(raw_dir / LOAD_RAW)
    runs = [i for i in infos if i.get("op") == "load"]
    capacity = [i for i in infos if i.get("target") == "null"]
    if not runs and not capacity:
        return ""
    parts = ["## Load (open loop)", ""]
    if runs:
        first = runs[0]
        slo = first["slo"]
        parts += [
            f"`inferwire load`: Poisson arrivals at {first['rate_rps']:g} requests/s for "
            f"{first['duration_s']:.0f} s, `{first['workload']}`, codec `{first['codec']}`, the "
            f"service paced at {first['prefill_ms']:g} ms prefill and {first['decode_ms']:g} ms "
            "per token. Latency is timed from each request's *intended* send time. Columns are "
            "P50 / P99 / P99.9 in ms. TTFT: time to first token; TPOT: (E2E - TTFT) / (tokens "
            "- 1); ITL: the gap before each token (a chunk of n tokens counts n times its gap / "
            f"n); goodput: requests/s meeting TTFT <= {slo['ttft_ms']} ms and TPOT <= "
            f"{slo['tpot_ms']} ms. CPU: seconds per 1,000 output tokens.",
            "",
            _table(
                [
                    "transport",
                    "TTFT",
                    "TPOT",
                    "ITL",
                    "E2E",
                    "req/s",
                    "tokens/s",
                    "goodput",
                    "errors",
                    "server CPU",
                    "client CPU",
                ],
                [
                    [
                        f"`{r['transport']}`",
                        _pcts(r["ttft"]),
                        _pcts(r["tpot"]),
                        _pcts(r["itl_per_token"]),
                        _pcts(r["e2e"]),
                        f"{r['request_throughput_rps']:.1f}",
                        f"{r['output_token_throughput_tps']:,.0f}",
                        f"{r['goodput_rps']:.1f}" if r["goodput_rps"] is not None else "-",
                        str(r["requests_failed"]),
                        f"{r['server_cpu_s_per_1k_tokens']:.3f} s"
                        if r["server_cpu_s_per_1k_tokens"] is not None
                        else "-",
                        f"{r['client_cpu_s_per_1k_tokens']:.3f} s",
                    ]
                    for r in runs
                ],
            ),
            "",
        ]
    if capacity:
        parts += [
            "The generator alone, against a no-op target: the rate it sustains on one core and "
            "how late it sends (the lag between intended and actual send time; other load on "
            "the machine shows here first, so the load average is recorded).",
            "",
            _table(
                [
                    "scheduled req/s",
                    "cap",
                    "achieved req/s",
                    "lag P50",
                    "lag P99",
                    "lag P99.9",
                    "CPU us/request",
                    "load average",
                ],
                [
                    [
                        f"{c['rate_rps']:,.0f}",
                        str(c["concurrency"] or "none"),
                        f"{c['achieved_rps']:,.0f}",
                        f"{c['send_lag_ms']['p50_ms']:.2f} ms",
                        f"{c['send_lag_ms']['p99_ms']:.2f} ms",
                        f"{c['send_lag_ms']['p99_9_ms']:.2f} ms",
                        f"{c['client_cpu_us_per_request']:.0f}",
                        f"{_load_average(c['load_average']):.1f}",
                    ]
                    for c in capacity
                ],
            ),
            "",
        ]
    return "\n".join(parts)


def peer_target_rows(raw_dir: Path) -> list[list[str]]:
    path = raw_dir / PEERS_RAW
    if not path.exists():
        return []
    out = []
    for row in peers.rows(path):
        if row.baseline is None or row.ratio_tokens_per_server_cpu_s is None:
            continue
        ratio = row.ratio_tokens_per_server_cpu_s
        out.append(
            [
                f"`{row.baseline}` vs {row.stack} ({row.protocol})",
                "tokens per server CPU-second, paired",
                f"{ratio:.2f}x",
                f">= {PEER_TARGET:g}x",
                "met" if ratio >= PEER_TARGET else "**missed**",
            ]
        )
    return out


def peers_section(raw_dir: Path) -> str:
    path = raw_dir / PEERS_RAW
    if not path.exists():
        return ""
    table = peers.rows(path)
    if not table:
        return ""
    return "\n".join(
        [
            "## Against what users deploy instead",
            "",
            "The same SSE token stream (`stream-256`, `orjson`, no pacing, 16 streams at once) "
            "from our servers and from Starlette's `StreamingResponse` under uvicorn (HTTP/1.1, "
            "httptools) and Hypercorn (HTTP/2, h2c). Each server is pinned to one core and the "
            "client to the other. *per core*: output tokens per CPU-second of the server "
            "process. *gap*: time between successive chunks at the client, P50 / P99 in us. "
            "Notes: Hypercorn buffers a stream's output and sends it in frames of up to 16 KiB, "
            "so its tokens arrive in bursts (see its P99 gap and TPOT); ours write every chunk "
            "that is due at once, so a paced stream is not delayed.",
            "",
            _table(
                [
                    "server",
                    "protocol",
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
                        f"{r.tokens_per_s:,.0f}",
                        f"{r.tokens_per_server_cpu_s:,.0f}",
                        f"{r.itl_p50_us:,.1f} / {r.itl_p99_us:,.1f}",
                        f"{r.tpot_mean_us:,.1f} us",
                        f"{r.ratio_tokens_per_server_cpu_s:.2f}x"
                        if r.ratio_tokens_per_server_cpu_s is not None
                        else "",
                        "yes" if r.correct else "**no**",
                    ]
                    for r in table
                ],
            ),
            "",
        ]
    )
