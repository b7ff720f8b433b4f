"""The report's engine section, from ``raw/engine.json`` (``bench/bench_engine.py``): batching
policies at 50 req/s (C8), adaptive against fixed batch sizes (C13), a request's stages through
client -> frontend -> engine, the hop codec sweep and its plot; and the rows of those claims
(verdicts by the rules of :mod:`.engine_verdicts`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from . import spread
from .engine_verdicts import (
    C8_CONTINUOUS_P50_MS,
    C8_PUBLISHED_RATIO,
    C8_STATIC_P50_MS,
    C13_GAIN_HOLDS,
    C13_P99_AFTER_MS,
    C13_P99_BEFORE_MS,
    C13_THROUGHPUT_GAIN,
    BatchFigures,
    Split,
    c4_cpu_verdict,
    c4_verdict,
    c8_verdict,
    c9_verdict,
    c10_verdict,
    c13_verdict,
)
from .results import REPEATS_DIR, infos
from .tables import table

ENGINE_RAW: Final = "engine.json"
SPLIT_STAGES: Final = ("compute", "scheduling", "serialization", "network")
SPLIT_LABELS: Final = {
    "compute": "compute",
    "scheduling": "scheduling + queueing",
    "serialization": "serialization",
    "network": "network + transport",
}
SERIALIZATION_PARTS: Final = ("engine_encode", "hop_decode", "response_encode", "client_decode")
NOT_IN_RUN: Final = ["not in this run", "-", "-"]


def _ms(value: float) -> str:
    return f"{value:,.1f}"


def _pct(value: float) -> str:
    return f"{value:.0%}"


def _x(value: float) -> str:
    return f"{value:.2f}x"


def engine_path(raw_dir: Path) -> Path:
    """The engine suite's file for ``raw_dir``. The suite runs once per ``inferwire bench``
    (its virtual clock gives the same figures in every process), so a later repeat's
    directory (``raw/repeats/<n>/``) has none and reads the run's (``raw/``)."""
    path = raw_dir / ENGINE_RAW
    if not path.exists() and raw_dir.parent.name == REPEATS_DIR:
        return raw_dir.parent.parent / ENGINE_RAW
    return path


def _records(raw_dir: Path, op: str) -> list[dict[str, Any]]:
    return [i for i in infos(engine_path(raw_dir)) if i.get("op") == op]


def _one(raw_dir: Path, op: str) -> dict[str, Any] | None:
    found = _records(raw_dir, op)
    return found[0] if found else None


def step_note(info: Mapping[str, Any]) -> str:
    """What the step model is: its parameters and the measurement the defaults come from."""
    step = info.get("step", {})
    params = ", ".join(f"`{k}` = {v:g}" for k, v in step.get("parameters", {}).items())
    source = step.get("source", "")
    return (
        f"Step model (`inferwire.engine.StepModel`, defaults): {params or '?'}. {source} "
        "Limits: one simulated accelerator, no tensor parallelism, no speculative decoding or "
        "prefix caching; a step's time is the model's formula, not a measured kernel, so "
        "absolute milliseconds follow the step model and only the comparisons between policies "
        "on one trace carry over."
    )


# -- C8 -----------------------------------------------------------------------------------------


def c8_ratio(policies: Mapping[str, Any], metric: str = "ttft") -> float | None:
    """Static's P50 / continuous's P50 of ``metric`` (None when either is missing)."""
    try:
        continuous = float(policies["continuous"][metric]["p50_ms"])
        static = float(policies["static"][metric]["p50_ms"])
    except (KeyError, TypeError):
        return None
    return static / continuous if continuous else None


def _c8_rows(virtual: dict[str, Any] | None, stack: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    if virtual is not None:
        for policy, f in virtual["policies"].items():
            path = f"policies.{policy}"
            rows.append(
                [
                    f"virtual clock, {virtual['requests']:,} requests",
                    f"`{policy}`",
                    *(
                        spread.cell(virtual, f"{path}.{m}.{p}_ms", f[m][f"{p}_ms"], _ms)
                        for m in ("ttft", "e2e")
                        for p in ("p50", "p99")
                    ),
                    _ms(f["tpot"]["p50_ms"]),
                    f"{f['mean_batch']:.1f}",
                    f"{f['throughput_tok_s']:,.0f}",
                ]
            )
    rows.extend(
        [
            f"real stack, {r['window_s']:g} s ({r['requests_completed']} requests)",
            f"`{r['policy']}`",
            *(
                spread.cell(r, f"{m}.{p}_ms", r[m][f"{p}_ms"], _ms)
                for m in ("ttft", "e2e")
                for p in ("p50", "p99")
            ),
            _ms(r["tpot"]["p50_ms"]) if r.get("tpot", {}).get("p50_ms") else "-",
            "-",
            f"{r['output_token_throughput_tps']:,.0f}",
        ]
        for r in sorted(stack, key=lambda r: r["policy"])
    )
    return rows


def c8_row(raw_dir: Path) -> list[str]:
    virtual = _one(raw_dir, "c8-virtual")
    stack = {r["policy"]: r for r in _records(raw_dir, "c8-stack")}
    if virtual is None:
        return NOT_IN_RUN
    policies = virtual["policies"]
    ttft = c8_ratio(policies)
    e2e = c8_ratio(policies, "e2e")
    cont, stat = policies["continuous"], policies["static"]
    measured = (
        f"P50 TTFT continuous {_ms(cont['ttft']['p50_ms'])} ms, static "
        f"{_ms(stat['ttft']['p50_ms'])} ms: static/continuous {_x(ttft or 0)} (published "
        f"{C8_STATIC_P50_MS:g}/{C8_CONTINUOUS_P50_MS:g} ms = {_x(C8_PUBLISHED_RATIO)}); P50 E2E "
        f"{_ms(cont['e2e']['p50_ms'])} vs {_ms(stat['e2e']['p50_ms'])} ms ({_x(e2e or 0)})"
    )
    verdict = c8_verdict(cont["ttft"]["p50_ms"], stat["ttft"]["p50_ms"])
    conditions = (
        f"{virtual['rate_rps']:g} req/s seeded Poisson, {virtual['requests']:,} requests of "
        f"{virtual['output_tokens'][0]}-{virtual['output_tokens'][1]} output tokens, default "
        "step model, engine's virtual clock; the published 32/78 ms read as P50 TTFT (a whole "
        "response's E2E is far longer under either policy)"
    )
    if {"continuous", "static"} <= stack.keys():
        s_cont, s_stat = stack["continuous"], stack["static"]
        real_ratio = s_stat["ttft"]["p50_ms"] / s_cont["ttft"]["p50_ms"]
        measured += (
            f"; real stack ({s_cont['window_s']:g} s a policy): P50 TTFT "
            f"{_ms(s_cont['ttft']['p50_ms'])} vs {_ms(s_stat['ttft']['p50_ms'])} ms "
            f"({_x(real_ratio)})"
        )
        conditions += "; confirmed through load generator -> frontend -> engine process"
        real_verdict = c8_verdict(s_cont["ttft"]["p50_ms"], s_stat["ttft"]["p50_ms"])
        if real_verdict != verdict:
            verdict += f" (through the real stack: {real_verdict})"
    else:
        conditions += "; no real-stack run"
    return [conditions, measured, verdict]


# -- C13 ----------------------------------------------------------------------------------------


def c13_figures(info: Mapping[str, Any]) -> tuple[BatchFigures | None, list[BatchFigures]]:
    """The adaptive configuration's figures and the fixed ones' (throughput in tokens/s,
    E2E P99)."""
    adaptive = None
    fixed = []
    for label, f in info["configs"].items():
        figures = BatchFigures(
            label=label, throughput=f["throughput_tok_s"], p99_ms=f["e2e"]["p99_ms"]
        )
        if f["policy"] == "adaptive":
            adaptive = figures
        else:
            fixed.append(figures)
    return adaptive, fixed


def _c13_table(info: Mapping[str, Any]) -> str:
    adaptive, _ = c13_figures(info)
    rows = []
    for label, f in info["configs"].items():
        path = f"configs.{label}"
        vs = (
            adaptive.throughput / f["throughput_tok_s"] if adaptive and f["throughput_tok_s"] else 0
        )
        rows.append(
            [
                f"`{label}`",
                spread.cell(
                    info, f"{path}.throughput_tok_s", f["throughput_tok_s"], "{:,.0f}".format
                ),
                f"{f['throughput_rps']:.1f}",
                spread.cell(info, f"{path}.ttft.p99_ms", f["ttft"]["p99_ms"], _ms),
                spread.cell(info, f"{path}.e2e.p99_ms", f["e2e"]["p99_ms"], _ms),
                f"{f['mean_batch']:.1f}",
                _x(vs),
            ]
        )
    return table(
        [
            "configuration",
            "tokens/s",
            "requests/s",
            "TTFT P99 ms",
            "E2E P99 ms",
            "mean batch",
            "adaptive's throughput / this",
        ],
        rows,
    )


def c13_row(raw_dir: Path) -> list[str]:
    found = _records(raw_dir, "c13-virtual")
    if not found:
        return NOT_IN_RUN
    parts, verdicts = [], []
    for info in found:
        adaptive, fixed = c13_figures(info)
        if adaptive is None or not fixed:
            continue
        best = max(fixed, key=lambda f: (f.throughput, -f.p99_ms))
        worst = min(fixed, key=lambda f: (f.throughput, -f.p99_ms))
        parts.append(
            f"{info['trace']} ({info['rate_rps']:.1f} req/s): adaptive "
            f"{adaptive.throughput:,.0f} tok/s, E2E P99 {_ms(adaptive.p99_ms)} ms; best fixed "
            f"(`{best.label}`) {_x(adaptive.throughput / best.throughput)} throughput, P99 "
            f"{_ms(best.p99_ms)} -> {_ms(adaptive.p99_ms)} ms; worst fixed (`{worst.label}`) "
            f"{_x(adaptive.throughput / worst.throughput)}, P99 {_ms(worst.p99_ms)} ms"
        )
        verdicts.append(f"{info['trace']}: {c13_verdict(adaptive, fixed)}")
    if not parts:
        return NOT_IN_RUN
    first = found[0]
    admit = ", ".join(map(str, first.get("admit_sizes", [])))
    static = ", ".join(map(str, first.get("static_sizes", [])))
    conditions = (
        f"virtual clock, {first['requests']:,} requests a trace at {first['load']:.0%} of the "
        f"engine's capacity ({first['capacity_rps']:.1f} req/s at batch "
        f"{first.get('slots', first['bmax'])}), a Poisson trace and a gamma trace of shape "
        f"{_burstiness(found)}; Bmax {first['bmax']}; fixed: continuous batching admitting at "
        f"most {admit} a prefill iteration (and uncapped), static batching at {static}; "
        f"published {C13_THROUGHPUT_GAIN:g}x and P99 {C13_P99_BEFORE_MS:g} -> "
        f"{C13_P99_AFTER_MS:g} ms, a gain of {C13_GAIN_HOLDS:g}x or more counted as holding; P99 "
        "is E2E. L (target step "
        f"{first.get('adaptive_target_step_ms', 0):g} ms): {first.get('l_definition', '?')}"
    )
    return [conditions, "; ".join(parts), "; ".join(verdicts)]


def _burstiness(found: list[dict[str, Any]]) -> str:
    shapes = {f"{i['burstiness']:g}" for i in found if i["trace"] != "poisson-near-capacity"}
    return ", ".join(sorted(shapes)) or "-"


# -- the per-stage split (C4, C9, C10) --------------------------------------------------------


def split_of(info: Mapping[str, Any]) -> Split:
    return Split.of(info["shares"])


def split_rows(raw_dir: Path) -> dict[str, list[str]] | None:
    """The C4, C9, C10 rows from the run through the engine (None without one)."""
    found = _records(raw_dir, "engine-stages")
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
            f"{SPLIT_LABELS[s]} {spread.cell(i, f'shares.{s}', i['shares'][s], _pct)}"
            for s in SPLIT_STAGES
        )
        for i in found
    )
    serialization = (
        f"serialization {_pct(low['shares']['serialization'])} (`{low['hop_codec']}` hop) to "
        f"{_pct(info['shares']['serialization'])} (`{info['hop_codec']}`) of a request's E2E"
    )
    c4 = [conditions, serialization, c4_verdict(split)]
    sweep = _one(raw_dir, "hop-sweep")
    if sweep is not None:
        outcomes = sweep_outcomes(sweep)
        at_top = {codec: o.serialization_share for codec, o in outcomes.items()}
        c4[0] += (
            "; and of the frontend's CPU in the hop codec sweep at each codec's peak tokens/s "
            f"({sweep['max_tokens']} tokens a request, a fast engine, the frontend's own counter)"
        )
        c4[1] += "; of the frontend's CPU: " + ", ".join(
            f"`{codec}` hop {_pct(o.serialization_share)} at {o.peak_rps:g} req/s"
            for codec, o in outcomes.items()
        )
        c4[2] += "; of the frontend's CPU at high throughput: " + c4_cpu_verdict(at_top)
    return {
        "C4": c4,
        "C9": [
            conditions,
            f"serialization + network {_pct(split.serialization + split.network)} "
            f"(`{info['hop_codec']}` hop); {shares}",
            c9_verdict(split),
        ],
        "C10": [conditions, shares, c10_verdict(split)],
    }


def _stage_cell(info: Mapping[str, Any], stage: str) -> str:
    share = spread.cell(info, f"shares.{stage}", info["shares"][stage], _pct)
    return f"{_ms(info['stages_ms'][stage])} ({share})"


def _stages_table(found: list[dict[str, Any]]) -> str:
    rows = [
        [
            f"`{i['hop_codec']}`",
            f"{i['rate_rps']:g}",
            str(i["requests"]),
            *(_stage_cell(i, s) for s in SPLIT_STAGES),
            " / ".join(f"{i['serialization_ms'][p]:.2f}" for p in SERIALIZATION_PARTS),
            _ms(i.get("engine_overhead_ms", 0.0)),
            _ms(i["e2e_ms"]),
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
            "engine loop beyond its modelled steps ms (in network + transport)",
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
                    _pct(p["serialization_share"])
                    + (f" / {_pct(isolated)}" if isolated is not None else ""),
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
            f" ({_pct(o.serialization_share_isolated)} with the isolated costs)"
            if o.serialization_share_isolated is not None
            else ""
        )
        vs = ""
        if base is not None and codec != json_codec and o.us_per_token:
            vs = (
                f"; {_x(base.us_per_token / o.us_per_token)} the tokens a frontend core "
                f"carries over the `{json_codec}` hop"
            )
        parts.append(
            f"`{codec}`: peak {o.peak_tokens_s:,.0f} tokens/s at {o.peak_rps:g} req/s ({limit}); "
            f"there {o.us_per_token:.1f} us of frontend CPU a token, "
            f"{_pct(o.serialization_share)} of it serialization{isolated}, so one frontend core "
            f"would carry about {o.core_tokens_s:,.0f} tokens/s{vs}"
        )
    return "\n".join(f"- {part}." for part in parts)


def plot(raw_dir: Path, out_dir: Path) -> list[Path]:
    """Tokens/s against offered rate per hop codec (PNG), median with the trials' range."""
    info = _one(raw_dir, "hop-sweep")
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


# -- the section --------------------------------------------------------------------------------


def section(raw_dir: Path) -> str:
    """The report's engine section ("" if the run has none)."""
    if not infos(engine_path(raw_dir)):
        return ""
    out = [
        "## An engine behind a frontend (batching, the hop)",
        "",
        "`bench/bench_engine.py`: the simulated engine (`inferwire.engine`) on its virtual clock "
        "(deterministic: the same figures on every run and machine), and the real stack "
        "(load generator -> `inferwire serve --engine` -> `inferwire engine`, three processes "
        "on loopback). The suite runs once per `inferwire bench` (the real-stack points "
        "interleave their own trials), so with repeats the Reproducibility section judges its "
        "claims on that one run in every repeat.",
        "",
    ]
    virtual = _one(raw_dir, "c8-virtual")
    stack = _records(raw_dir, "c8-stack")
    if virtual is not None:
        ratio = c8_ratio(virtual["policies"])
        out += [
            f"### Continuous against static batching at {virtual['rate_rps']:g} req/s (C8)",
            "",
            f"One seeded Poisson trace ({virtual['requests']:,} requests, "
            f"{virtual['output_tokens'][0]}-{virtual['output_tokens'][1]} output tokens and "
            f"{virtual['prompt_tokens'][0]}-{virtual['prompt_tokens'][1]} prompt tokens each, "
            "uniform) through each policy on the engine's virtual clock; the real-stack rows "
            "send the same kind of requests from the load generator to `inferwire serve "
            "--engine` and an `inferwire engine --policy P` process, latency from each "
            "request's intended send time. Milliseconds; *mean batch*: requests per decode "
            f"step. Static/continuous P50 TTFT: {_x(ratio or 0)} (published "
            f"{C8_STATIC_P50_MS:g}/{C8_CONTINUOUS_P50_MS:g} ms = {_x(C8_PUBLISHED_RATIO)}).",
            "",
            table(
                [
                    "run",
                    "policy",
                    "TTFT P50",
                    "TTFT P99",
                    "E2E P50",
                    "E2E P99",
                    "TPOT P50",
                    "mean batch",
                    "tokens/s",
                ],
                _c8_rows(virtual, stack),
            ),
            "",
            step_note(virtual),
            "",
        ]
    c13 = _records(raw_dir, "c13-virtual")
    for number, info in enumerate(c13):
        l_text = info.get("l_definition", "?") if number == 0 else "as above."
        out += [
            f"### Adaptive against fixed batch sizes: {info['trace']} (C13)",
            "",
            f"{info['requests']:,} requests at {info['rate_rps']:.1f} req/s "
            f"({info['load']:.0%} of the capacity at batch {info.get('slots', info['bmax'])}, "
            + (
                f"gamma arrivals of shape {info['burstiness']:g}"
                if info["arrival"] == "gamma"
                else "Poisson"
            )
            + f"), virtual clock. L (target step {info.get('adaptive_target_step_ms', 0):g} ms): "
            + l_text,
            "",
            _c13_table(info),
            "",
        ]
    if c13:
        out += [step_note(c13[0]), ""]
    stages = _records(raw_dir, "engine-stages")
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
            "response encode + client decode; *network + transport* the rest of its E2E. "
            "Milliseconds are medians over requests; a share is the stage's total over the "
            "requests / their total E2E (the shares add up to 100%; the verdicts read them). "
            f"{first.get('method', '')}",
            "",
            _stages_table(stages),
            "",
        ]
    sweep = _one(raw_dir, "hop-sweep")
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
    return "\n".join(out)
