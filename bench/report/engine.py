"""The report's engine section, from ``raw/engine.json`` (``bench/bench_engine.py``): batching
policies at 50 req/s (C8), adaptive against fixed batch sizes (C13), then the real-stack parts
of :mod:`.engine_hop` (a request's stages through client -> frontend -> engine, the hop codec
sweep and its plot); and the rows of those claims (verdicts by the rules of
:mod:`.engine_verdicts`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import spread
from .engine_hop import (
    SERIALIZATION_PARTS,
    plot,
    split_rows,
    stages_section,
    sweep_outcomes,
    sweep_section,
)
from .engine_records import (
    ENGINE_RAW,
    NOT_IN_RUN,
    engine_path,
    fmt_ms,
    fmt_x,
    one,
    records,
    step_note,
)
from .engine_verdicts import (
    C8_CONTINUOUS_P50_MS,
    C8_PUBLISHED_RATIO,
    C8_STATIC_P50_MS,
    C13_GAIN_HOLDS,
    C13_P99_AFTER_MS,
    C13_P99_BEFORE_MS,
    C13_THROUGHPUT_GAIN,
    BatchFigures,
    c8_verdict,
    c13_verdict,
)
from .results import infos
from .tables import table

__all__ = [
    "ENGINE_RAW",
    "SERIALIZATION_PARTS",
    "c8_row",
    "c13_row",
    "engine_path",
    "plot",
    "section",
    "split_rows",
    "sweep_outcomes",
]


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
                        spread.cell(virtual, f"{path}.{m}.{p}_ms", f[m][f"{p}_ms"], fmt_ms)
                        for m in ("ttft", "e2e")
                        for p in ("p50", "p99")
                    ),
                    fmt_ms(f["tpot"]["p50_ms"]),
                    f"{f['mean_batch']:.1f}",
                    f"{f['throughput_tok_s']:,.0f}",
                ]
            )
    rows.extend(
        [
            f"real stack, {r['window_s']:g} s ({r['requests_completed']} requests)",
            f"`{r['policy']}`",
            *(
                spread.cell(r, f"{m}.{p}_ms", r[m][f"{p}_ms"], fmt_ms)
                for m in ("ttft", "e2e")
                for p in ("p50", "p99")
            ),
            fmt_ms(r["tpot"]["p50_ms"]) if r.get("tpot", {}).get("p50_ms") else "-",
            "-",
            f"{r['output_token_throughput_tps']:,.0f}",
        ]
        for r in sorted(stack, key=lambda r: r["policy"])
    )
    return rows


def c8_row(raw_dir: Path) -> list[str]:
    virtual = one(raw_dir, "c8-virtual")
    stack = {r["policy"]: r for r in records(raw_dir, "c8-stack")}
    if virtual is None:
        return NOT_IN_RUN
    policies = virtual["policies"]
    ttft = c8_ratio(policies)
    e2e = c8_ratio(policies, "e2e")
    cont, stat = policies["continuous"], policies["static"]
    measured = (
        f"P50 TTFT continuous {fmt_ms(cont['ttft']['p50_ms'])} ms, static "
        f"{fmt_ms(stat['ttft']['p50_ms'])} ms: static/continuous {fmt_x(ttft or 0)} (published "
        f"{C8_STATIC_P50_MS:g}/{C8_CONTINUOUS_P50_MS:g} ms = {fmt_x(C8_PUBLISHED_RATIO)}); P50 E2E "
        f"{fmt_ms(cont['e2e']['p50_ms'])} vs {fmt_ms(stat['e2e']['p50_ms'])} ms ({fmt_x(e2e or 0)})"
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
            f"{fmt_ms(s_cont['ttft']['p50_ms'])} vs {fmt_ms(s_stat['ttft']['p50_ms'])} ms "
            f"({fmt_x(real_ratio)})"
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
                spread.cell(info, f"{path}.ttft.p99_ms", f["ttft"]["p99_ms"], fmt_ms),
                spread.cell(info, f"{path}.e2e.p99_ms", f["e2e"]["p99_ms"], fmt_ms),
                f"{f['mean_batch']:.1f}",
                fmt_x(vs),
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
    found = records(raw_dir, "c13-virtual")
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
            f"{adaptive.throughput:,.0f} tok/s, E2E P99 {fmt_ms(adaptive.p99_ms)} ms; best fixed "
            f"(`{best.label}`) {fmt_x(adaptive.throughput / best.throughput)} throughput, P99 "
            f"{fmt_ms(best.p99_ms)} -> {fmt_ms(adaptive.p99_ms)} ms; worst fixed (`{worst.label}`) "
            f"{fmt_x(adaptive.throughput / worst.throughput)}, P99 {fmt_ms(worst.p99_ms)} ms"
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
    virtual = one(raw_dir, "c8-virtual")
    stack = records(raw_dir, "c8-stack")
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
            f"step. Static/continuous P50 TTFT: {fmt_x(ratio or 0)} (published "
            f"{C8_STATIC_P50_MS:g}/{C8_CONTINUOUS_P50_MS:g} ms = {fmt_x(C8_PUBLISHED_RATIO)}).",
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
    c13 = records(raw_dir, "c13-virtual")
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
    out += stages_section(raw_dir)
    out += sweep_section(raw_dir)
    return "\n".join(out)
