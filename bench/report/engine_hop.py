"""The real-stack parts of the report's engine section: a request's stages through client ->
frontend -> engine (and the C4, C9, C10 rows they judge), and the hop codec sweep with its
plot."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from . import spread
from .engine_records import fmt_ms, fmt_pct, fmt_x, one, records
from .engine_verdicts import Split, c4_cpu_verdict, c4_verdict, c9_verdict, c10_verdict
from .tables import table

SPLIT_STAGES: Final = ("compute", "scheduling", "serialization", "engine_loop", "network")
SPLIT_LABELS: Final = {
    "compute": "compute",
    "scheduling": "scheduling + queueing",
    "serialization": "serialization",
    "engine_loop": "engine loop beyond its steps",
    "network": "network + transport",
}
SERIALIZATION_PARTS: Final = ("engine_encode", "hop_decode", "response_encode", "client_decode")


# -- the per-stage split (C4, C9, C10) --------------------------------------------------------


def split_of(info: Mapping[str, Any]) -> Split:
    return Split.of(info["shares"])


def split_rows(raw_dir: Path) -> dict[str, list[str]] | None:
    """The C4, C9, C10 rows from the run through the engine (None without one)."""
    found = records(raw_dir, "engine-stages")
    if not found:
        return None
    info = max(found, key=lambda i: i["shares"]["serialization"])  # the verdict's cell
    low = min(found, key=lambda i: i["shares"]["serialization"])
    split = split_of(info)
    conditions = (
        f"client (http1 SSE, `{info['frontend_codec']}`) -> frontend -> engine (hop codecs "
        f"{', '.join(sorted({'`' + i['hop_codec'] + '`' for i in found}))}; "
        f"`{info['policy']}` batching, default step model) at {info['rate_rps']:g} req/s, "
        f"{info['requests']} requests; each stage's total over the requests / their total E2E"
    )
    shares = "; ".join(
        f"`{i['hop_codec']}` hop: "
        + ", ".join(
            f"{SPLIT_LABELS[s]} {spread.cell(i, f'shares.{s}', i['shares'][s], fmt_pct)}"
            for s in _stages_of(i)
        )
        for i in found
    )
    serialization = (
        f"serialization {fmt_pct(low['shares']['serialization'])} (`{low['hop_codec']}` hop) to "
        f"{fmt_pct(info['shares']['serialization'])} (`{info['hop_codec']}`) of a request's E2E"
    )
    c4 = [conditions, serialization, c4_verdict(split)]
    sweep = one(raw_dir, "hop-sweep")
    if sweep is not None:
        outcomes = sweep_outcomes(sweep)
        at_top = {codec: o.serialization_share for codec, o in outcomes.items()}
        c4[0] += (
            "; and of the frontend's CPU in the hop codec sweep at each codec's peak tokens/s "
            f"({sweep['max_tokens']} tokens a request, a fast engine, the frontend's own counter)"
        )
        c4[1] += "; of the frontend's CPU: " + ", ".join(
            f"`{codec}` hop {fmt_pct(o.serialization_share)} at {o.peak_rps:g} req/s"
            for codec, o in outcomes.items()
        )
        c4[2] += "; of the frontend's CPU at high throughput: " + c4_cpu_verdict(at_top)
    return {
        "C4": c4,
        "C9": [
            conditions,
            f"serialization + network {fmt_pct(split.serialization + split.network)} "
            f"(`{info['hop_codec']}` hop); {shares}",
            c9_verdict(split),
        ],
        "C10": [conditions, shares, c10_verdict(split)],
    }


def _stages_of(info: Mapping[str, Any]) -> tuple[str, ...]:
    """The stages a run recorded: a run from before the engine loop was a stage of its own
    holds it inside "network"."""
    return tuple(s for s in SPLIT_STAGES if s in info["shares"])


def _stage_cell(info: Mapping[str, Any], stage: str) -> str:
    if stage not in info["shares"]:
        return "-"
    share = spread.cell(info, f"shares.{stage}", info["shares"][stage], fmt_pct)
    return f"{fmt_ms(info['stages_ms'][stage])} ({share})"


def _stages_table(found: list[dict[str, Any]]) -> str:
    rows = [
        [
            f"`{i['hop_codec']}`",
            f"{i['rate_rps']:g}",
            str(i["requests"]),
            *(_stage_cell(i, s) for s in SPLIT_STAGES),
            " / ".join(f"{i['serialization_ms'][p]:.2f}" for p in SERIALIZATION_PARTS),
            fmt_ms(i["e2e_ms"]),
        ]
        for i in found
    ]
    return table(
        [
            "hop codec",
            "req/s",
            "requests",
            *(f"{SPLIT_LABELS[s]} ms (share)" for s in SPLIT_STAGES),
            "engine encode / hop decode / response encode / client decode ms",
            "E2E ms",
        ],
        rows,
    )


# -- the hop codec sweep ----------------------------------------------------------------------


LIMITS: Final = (
    ("fell_short", "fell short of the offered tokens"),
    ("frontend_core_busy", "the frontend's core was busy"),
    ("other_core_busy", "the engine + load generator core was busy"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepOutcome:
    """What one hop codec's sweep shows."""

    peak_tokens_s: float
    peak_rps: float
    limit_rps: float | None
    """The lowest offered rate at which a limit was reached (:data:`LIMITS`)."""
    limits: tuple[str, ...]
    """What was reached there, as :data:`LIMITS` says it."""
    us_per_token: float
    """The frontend's CPU per token at the peak."""
    serialization_share: float
    serialization_share_isolated: float | None

    @property
    def core_tokens_s(self) -> float:
        """Tokens/s one frontend core would carry at the peak's CPU per token (an
        extrapolation: per-token cost still falls as the rate rises)."""
        return 1e6 / self.us_per_token if self.us_per_token else 0.0


def sweep_outcomes(info: Mapping[str, Any]) -> dict[str, SweepOutcome]:
    out = {}
    for codec, points in info["points"].items():
        ordered = sorted(points.values(), key=lambda p: p["rate_rps"])
        peak = max(ordered, key=lambda p: p["tokens_s"])
        limited = [p for p in ordered if any(p.get(key) for key, _ in LIMITS)]
        first = limited[0] if limited else None
        out[codec] = SweepOutcome(
            peak_tokens_s=peak["tokens_s"],
            peak_rps=peak["rate_rps"],
            limit_rps=first["rate_rps"] if first else None,
            limits=tuple(text for key, text in LIMITS if first and first.get(key)),
            us_per_token=peak["frontend_cpu_us_per_token"],
            serialization_share=peak["serialization_share"],
            serialization_share_isolated=peak.get("serialization_share_isolated"),
        )
    return out


def _limit_cell(p: Mapping[str, Any]) -> str:
    names = {"fell_short": "short", "frontend_core_busy": "frontend", "other_core_busy": "other"}
    return ", ".join(name for key, name in names.items() if p.get(key))


def _sweep_table(info: Mapping[str, Any]) -> str:
    rows = []
    for codec, points in info["points"].items():
        for key, p in sorted(points.items(), key=lambda kv: kv[1]["rate_rps"]):
            path = f"points.{codec}.{key}"
            isolated = p.get("serialization_share_isolated")
            rows.append(
                [
                    f"`{codec}`",
                    f"{p['rate_rps']:g}",
                    spread.cell(info, f"{path}.tokens_s", p["tokens_s"], "{:,.0f}".format)
                    + f" ({p['tokens_s_min']:,.0f}-{p['tokens_s_max']:,.0f})",
                    f"{p['frontend_cpu_cores']:.2f}",
                    f"{p.get('engine_cpu_cores', 0.0):.2f} + {p.get('client_cpu_cores', 0.0):.2f}",
                    f"{p['frontend_cpu_us_per_token']:.1f}",
                    f"{p['hop_decode_us_per_chunk']:.1f}",
                    fmt_pct(p["serialization_share"])
                    + (f" / {fmt_pct(isolated)}" if isolated is not None else ""),
                    _limit_cell(p),
                    str(p["failed"]),
                ]
            )
    return table(
        [
            "hop codec",
            "offered req/s",
            "tokens/s (trials' range)",
            "frontend CPU (cores)",
            "engine + load generator CPU (cores)",
            "frontend CPU us/token",
            "hop decode us/chunk (counter)",
            "serialization share of frontend CPU (counter / isolated)",
            "limit reached",
            "failed",
        ],
        rows,
    )


def _pinning(info: Mapping[str, Any]) -> str:
    pinned = info.get("pinned")
    if not pinned:
        return "no core pinning (fewer than two cores)"
    return (
        f"the frontend pinned to core {pinned['frontend']}, the engine and the load generator "
        f"to core {pinned['engine_and_client']}"
    )


def _sweep_summary(info: Mapping[str, Any]) -> str:
    outcomes = sweep_outcomes(info)
    json_codec = info.get("json_hop", "orjson")
    base = outcomes.get(json_codec)
    parts = []
    for codec, o in outcomes.items():
        if o.limit_rps is not None:
            limit = f"from {o.limit_rps:g} req/s {' and '.join(o.limits)}"
        else:
            limit = "no limit reached in the sweep"
        isolated = (
            f" ({fmt_pct(o.serialization_share_isolated)} with the isolated costs)"
            if o.serialization_share_isolated is not None
            else ""
        )
        vs = ""
        if base is not None and codec != json_codec and o.us_per_token:
            vs = (
                f"; {fmt_x(base.us_per_token / o.us_per_token)} the tokens a frontend core "
                f"carries over the `{json_codec}` hop"
            )
        parts.append(
            f"`{codec}`: peak {o.peak_tokens_s:,.0f} tokens/s at {o.peak_rps:g} req/s ({limit}); "
            f"there {o.us_per_token:.1f} us of frontend CPU a token, "
            f"{fmt_pct(o.serialization_share)} of it serialization{isolated}, so one frontend core "
            f"would carry about {o.core_tokens_s:,.0f} tokens/s{vs}"
        )
    return "\n".join(f"- {part}." for part in parts)


def plot(raw_dir: Path, out_dir: Path) -> list[Path]:
    """Tokens/s against offered rate per hop codec (PNG), median with the trials' range."""
    info = one(raw_dir, "hop-sweep")
    if info is None:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for codec, points in info["points"].items():
        ordered = sorted(points.values(), key=lambda p: p["rate_rps"])
        rates = [p["rate_rps"] for p in ordered]
        medians = [p["tokens_s"] for p in ordered]
        low = [p["tokens_s"] - p["tokens_s_min"] for p in ordered]
        high = [p["tokens_s_max"] - p["tokens_s"] for p in ordered]
        ax.errorbar(rates, medians, yerr=[low, high], marker="o", capsize=3, label=codec)
    ax.set_xlabel("offered rate (requests/s)")
    ax.set_ylabel("output tokens/s (median of trials)")
    ax.set_title(
        f"Frontend ({info['frontend_transport']} SSE, {info['frontend_codec']}) by hop codec"
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out_dir / "plots" / "engine_sweep.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def stages_section(raw_dir: Path) -> list[str]:
    """The stages table with what it measured (none without the stage runs)."""
    out: list[str] = []
    stages = records(raw_dir, "engine-stages")
    if stages:
        first = stages[0]
        out += [
            "### A request's stages through client -> frontend -> engine",
            "",
            f"Open loop at {first['rate_rps']:g} req/s, {first['requests']} requests per hop "
            f"codec, frontend http1 SSE (`{first['frontend_codec']}`), `{first['policy']}` "
            "batching. Per request: *compute* the engine's prefill and decode compute for it; "
            "*scheduling + queueing* its wait before admission and its time in the batch while "
            "others' work ran; *serialization* engine encode + frontend hop decode + frontend "
            "response encode + client decode; *engine loop beyond its steps* the engine "
            "process's own time for it outside its modelled steps and its encode (C10 counts "
            "it as scheduling); *network + transport* the rest of its E2E. "
            "Milliseconds are medians over requests; a share is the stage's total over the "
            "requests / their total E2E (the shares add up to 100%; the verdicts read them). "
            f"{first.get('method', '')}",
            "",
            _stages_table(stages),
            "",
        ]
    return out


def sweep_section(raw_dir: Path) -> list[str]:
    """The sweep's summary, plot and table (none without the sweep)."""
    out: list[str] = []
    sweep = one(raw_dir, "hop-sweep")
    if sweep is not None:
        out += [
            "### Tokens/s by hop codec as the offered rate rises",
            "",
            f"Frontend `{sweep['frontend_transport']}` SSE (`{sweep['frontend_codec']}` to the "
            f"client), engine `{sweep['policy']}` at step scale {sweep['step_scale']:g} (so the "
            f"engine's modelled steps do not limit), {sweep['max_tokens']} tokens a request; "
            "offered rates rising, every codec once per trial in a rotated order within each "
            f"rate ({sweep['trials']} trials of {sweep['trial_s']:g} s; each cell the median "
            f"trial, tokens/s with the trials' range). CPU from psutil on each pid; "
            f"{_pinning(sweep)}. {sweep.get('serialization_method', '')} *Limit reached*: *short* "
            f"when tokens/s stayed under {sweep['saturation_gain']:.0%} of the offered tokens, "
            f"*frontend* when the frontend used {sweep['saturation_cores']:g} core, *other* "
            f"when the engine and the load generator together did (the sweep stops at the "
            "first rate where every codec reached one). A point short of its offered tokens "
            "with neither core full is limited by what the process CPU times do not show (the "
            "machine's other processes on those cores, wake-up latency). Per-token CPU falls "
            "as the rate rises (more chunks per read and write), so the one-core figures "
            "below are extrapolations from each codec's peak.",
            "",
            _sweep_summary(sweep),
            "",
            "![tokens/s by hop codec](plots/engine_sweep.png)",
            "",
            _sweep_table(sweep),
            "",
        ]
    return out
