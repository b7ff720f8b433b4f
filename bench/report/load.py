"""The report's load section, from ``raw/load.json``: the open-loop runs per transport, the
generator's own capacity, and its target row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from . import figures, load_plot, spread
from .results import LOAD_RAW, infos
from .tables import table as _table

CAPACITY_TARGET_RPS = 5000.0
CAPACITY_LAG_MS = 1.0


def _load_average(value: Any) -> float:
    """The 1-minute load average (recorded as the triple os.getloadavg gives)."""
    return float(value[0] if isinstance(value, (list, tuple)) else value)


def _pcts(metric: dict[str, Any]) -> str:
    return f"{metric['p50_ms']:.1f} / {metric['p99_ms']:.1f} / {metric['p99_9_ms']:.1f}"


def capacity_target_row(raw_dir: Path) -> list[list[str]]:
    """The target row, judged on the uncapped point on uvloop (the loop ``inferwire load`` runs
    on when it is installed) at the lowest rate of at least the target; none without one (a
    run from before the loop was recorded ran asyncio's)."""
    points = [
        i
        for i in infos(raw_dir / LOAD_RAW)
        if i.get("target") == "null"
        and i.get("loop") == "uvloop"
        and i.get("concurrency") is None
        and i.get("scheduling", "normal") == "normal"  # as a user runs it, not ahead of others
        and i["rate_rps"] >= CAPACITY_TARGET_RPS
    ]
    if not points:
        return []
    best = min(points, key=lambda p: p["rate_rps"])
    lag = best["send_lag_ms"]["p99_ms"]
    ok = best["achieved_rps"] >= 0.98 * CAPACITY_TARGET_RPS and lag < CAPACITY_LAG_MS
    lag_cell = spread.cell(best, "send_lag_ms.p99_ms", lag, lambda v: f"{v:.2f}")
    core = best.get("pinned_core")
    return [
        [
            "the load generator is not the bottleneck",
            f"{best['rate_rps']:,.0f} req/s scheduled, uncapped, uvloop, "
            + (f"pinned to core {core}" if core is not None else "not pinned")
            + f", load average {_load_average(best['load_average']):.1f}",
            f"{best['achieved_rps']:,.0f} req/s, P99 lag {lag_cell} ms",
            f">= {CAPACITY_TARGET_RPS:,.0f} req/s, P99 lag < {CAPACITY_LAG_MS:g} ms",
            "met" if ok else "**missed**",
        ]
    ]


def section(raw_dir: Path) -> str:
    """The report's load section ("" if the run has none)."""
    recorded = infos(raw_dir / LOAD_RAW)
    runs = [i for i in recorded if i.get("op") == "load"]
    capacity = [i for i in recorded if i.get("target") == "null"]
    by_loop = [i for i in recorded if i.get("target") == "null-loops"]
    by_live = [i for i in recorded if i.get("target") == "null-live-metrics"]
    by_feature = [i for i in recorded if i.get("target") == "null-api-features"]
    if not runs and not capacity and not by_loop and not by_live and not by_feature:
        return ""
    parts = ["## Load (open loop)", ""]
    if runs:
        first = runs[0]
        slo = first["slo"]
        picture = load_plot.plot_data(runs)
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
            *figures.link(picture),
            *load_plot.caption(picture),
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
            "The generator alone, against a no-op target: the rate it sustains on one core (the "
            "process pinned to it) and how late it sends (the lag between intended and actual "
            "send time; other load on the machine shows here first, so the load average is "
            "recorded). *fifo*: the same point under SCHED_FIFO, run ahead of every other "
            "process on the core: what lag is left is the generator's own (not a target: a "
            "user's generator runs as *normal*). Each row is the median of "
            f"{capacity[0].get('trials', 1)} trial(s) of {capacity[0].get('trial_s', 0):g} s "
            "by P99 lag (every trial's P99 in the last column).",
            "",
            _table(
                [
                    "loop",
                    "scheduling",
                    "scheduled req/s",
                    "cap",
                    "achieved req/s",
                    "lag P50",
                    "lag P99",
                    "lag P99.9",
                    "CPU us/request",
                    "load average",
                    "P99 lag per trial",
                ],
                [
                    [
                        c.get("loop", "asyncio"),
                        c.get("scheduling", "normal"),
                        f"{c['rate_rps']:,.0f}",
                        str(c["concurrency"] or "none"),
                        f"{c['achieved_rps']:,.0f}",
                        f"{c['send_lag_ms']['p50_ms']:.2f} ms",
                        f"{c['send_lag_ms']['p99_ms']:.2f} ms",
                        f"{c['send_lag_ms']['p99_9_ms']:.2f} ms",
                        f"{c['client_cpu_us_per_request']:.0f}",
                        f"{_load_average(c['load_average']):.1f}",
                        " / ".join(f"{v:.2f}" for v in c.get("trial_p99_lag_ms", [])),
                    ]
                    for c in capacity
                ],
            ),
            "",
        ]
    parts += _loops(by_loop)
    parts += _live_metrics(by_live)
    parts += _features(by_feature)
    parts += _agreement(raw_dir)
    return "\n".join(parts)


def _live_metrics(by_live: list[dict[str, Any]]) -> list[str]:
    """What ``--metrics-port`` costs the generator (bench_generator_live_metrics), when the run
    has it."""
    if not by_live:
        return []
    rows = [
        [
            str(info["chunks_per_request"]),
            f"{info['rate_rps']:,.0f}",
            f"{info['modes']['off']['client_cpu_us_per_request']:.1f}",
            f"{info['modes']['on']['client_cpu_us_per_request']:.1f}",
            f"{info['live_cpu_us_per_request_added']:+.1f}",
            spread.cell(
                info,
                "live_cpu_per_request_vs_off",
                info["live_cpu_per_request_vs_off"],
                lambda v: f"{v:.3f}x",
            ),
            f"{info['modes']['on']['send_lag_ms']['p99_ms']:.2f} ms",
            f"{info['scrape_cpu_us']:.0f}",
        ]
        for info in by_live
    ]
    return [
        "What the live metrics cost the generator (`inferwire load --metrics-port`): the same "
        f"uncapped points on uvloop with them off and on, {by_live[0]['pairs']} alternating "
        "pair(s) of trials on one pinned core, against no-op streams of the chunks given; "
        "the CPU per request of each mode's median trial, and the paired difference and ratio "
        "(on / off, the median over the pairs). A scrape's exposition costs its own CPU once "
        "per scrape, not per request (every 15 s by Prometheus' default).",
        "",
        _table(
            [
                "chunks a request",
                "req/s",
                "CPU us/request off",
                "on",
                "added (paired)",
                "on / off (paired)",
                "lag P99 on",
                "CPU us a scrape",
            ],
            rows,
        ),
        "",
    ]


FEATURES: Final = {
    "token-ids": "two tokens a chunk, counted by token ids",
    "running-usage": "two tokens a chunk, counted by the running usage",
    "reasoning": "a quarter of the tokens reasoning first",
    "tool-call": "one tool call in as many fragments",
    "responses": "the Responses event stream (`--api openai-responses`)",
    "conversation": "two-turn conversations (`--turns 2`)",
}


def _features(by_feature: list[dict[str, Any]]) -> list[str]:
    """What each of ``inferwire load``'s stream and workload features costs the generator per
    request (bench_generator_features), when the run has it."""
    if not by_feature:
        return []
    info = by_feature[0]
    rows = [
        [
            FEATURES.get(name, name),
            f"{shown['plain_cpu_us_per_request']:.1f}",
            f"{shown['cpu_us_per_request']:.1f}",
            f"{shown['cpu_per_request_vs_plain']:.2f}x",
        ]
        for name, shown in info["features"].items()
    ]
    draws = info["draw_us_per_prompt"]
    return [
        "What each feature costs the generator (`inferwire load --api`), against the plain "
        f"stream of as many tokens ({info['tokens_per_request']} a request, one a chunk) at "
        f"{info['rate_rps']:,.0f} requests/s, uncapped on uvloop: {info['pairs']} alternating "
        "pair(s) of trials on one pinned core against no-op streams whose events are parsed "
        "from their bytes by the API's own reader; the median CPU per request of each and the "
        "paired ratio (the median over the pairs). Two tokens a chunk is half the events. "
        "Shared prefixes and a trace replay add nothing per request in the loop: their prompts "
        f"are made before the run, {draws['none']:.0f} us a synthetic prompt of 128 tokens, "
        f"{draws['prefix']:.0f} us with 8 shared prefixes of 512 tokens, {draws['trace']:.0f} us "
        "a prompt of the bundled Mooncake sample (its lengths and hash blocks). With every "
        "feature off, the generator's ceiling is the table above.",
        "",
        _table(["feature", "CPU us/request plain", "with it", "with / plain (paired)"], rows),
        "",
    ]


def _agreement(raw_dir: Path) -> list[str]:
    """A pointer to ``load-agreement.md`` (``make compare-guidellm``) with its two verdicts,
    when the run has one."""
    raw_path = raw_dir / "load-agreement.json"
    if not raw_path.is_file():
        return []
    from .load_agreement_figures import guidellm_row, inferwire_row, verdicts

    raw = json.loads(raw_path.read_text())
    ours = [inferwire_row(r) for r in raw["runs"] if r["tool"] == "inferwire"]
    theirs = [guidellm_row(r) for r in raw["runs"] if r["tool"] == "guidellm"]
    v = verdicts(ours, theirs)
    return [
        "### Beside guidellm, on one server",
        "",
        f"[load-agreement.md](load-agreement.md) (`make compare-guidellm`, run {raw['started']}):"
        f" TPOT P50 {'agrees' if v['tpot_agrees'] else 'disagrees'} ({v['tpot_gap']:+.3f} ms "
        f"against a tolerance of {v['tpot_noise']:.3f}); TTFT P50 "
        f"{'agrees' if v['ttft_agrees'] else 'disagrees'} ({v['ttft_gap']:+.1f} ms, of which "
        f"{v['clock']:.1f} ms is the tools' different clocks), the gap taken apart there with a "
        "relay's timestamps.",
        "",
    ]


def _loops(by_loop: list[dict[str, Any]]) -> list[str]:
    """The uvloop-against-asyncio table (bench_generator_loops), when the run has it."""
    if not by_loop:
        return []
    rows = []
    for info in by_loop:
        for loop, loop_figures in info["loops"].items():
            lag = loop_figures["send_lag_ms"]
            rows.append(
                [
                    loop,
                    f"{info['rate_rps']:,.0f}",
                    f"{loop_figures['achieved_rps']:,.0f}",
                    f"{lag['p50_ms']:.2f} ms",
                    f"{lag['p99_ms']:.2f} ms",
                    f"{loop_figures['client_cpu_us_per_request']:.0f}",
                    f"{loop_figures['client_cpu_share']:.0%}",
                    " / ".join(f"{v:.2f}" for v in info["trial_p99_lag_ms"][loop]),
                    spread.cell(
                        info,
                        "asyncio_cpu_per_request_vs_uvloop",
                        info["asyncio_cpu_per_request_vs_uvloop"],
                        lambda v: f"{v:.2f}x",
                    )
                    if loop == "asyncio"
                    else "",
                ]
            )
    return [
        "What uvloop buys the generator: the same uncapped points on uvloop and on asyncio's own "
        f"loop, {by_loop[0]['pairs']} alternating pair(s) of trials on one pinned core; each "
        "row is its loop's median trial by P99 lag, and the last column the paired ratio of "
        "CPU per request (asyncio / uvloop, the median over the pairs).",
        "",
        _table(
            [
                "loop",
                "scheduled req/s",
                "achieved req/s",
                "lag P50",
                "lag P99",
                "CPU us/request",
                "CPU share",
                "P99 lag per trial",
                "CPU per request vs uvloop",
            ],
            rows,
        ),
        "",
    ]
