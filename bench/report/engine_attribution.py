"""The report's part "Where a request's time goes" (issue 29), from ``raw/engine.json``
(``bench_engine_attribution`` of ``bench/bench_engine.py``): per hop codec, the queue, model
and outside-the-engine figures that ``inferwire load`` attributed from the server's own
reports, beside the truth of the frontend's stamps file."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from .engine_records import engine_path, fmt_ms, records
from .results import infos
from .tables import table

OP: Final = "engine-attribution"
HEADING: Final = "### Where a request's time goes"
STAGES: Final = ("queue", "model", "outside")
SOURCES: Final = (
    ("per_request", "metrics object, P50 over requests", "_p50_ms", "e2e_p50_ms"),
    ("per_point", "`/metrics` histograms, point means", "_mean_ms", "e2e_mean_ms"),
)
"""(figures' key, the source as the table names it, the suffix of a stage's figures, where
the row's E2E is)."""


def _pair(figures: Mapping[str, Any], suffix: str) -> str:
    attributed = figures.get(f"attributed{suffix}")
    truth = figures.get(f"truth{suffix}")
    shown = "-" if attributed is None else fmt_ms(attributed)
    return f"{shown} / {'-' if truth is None else fmt_ms(truth)}"


def _within(figures: Mapping[str, Any]) -> str:
    off = [stage for stage in STAGES if not figures.get(stage, {}).get("within")]
    return "yes" if not off else "no: " + ", ".join(off)


def rows(found: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    for info in found:
        for key, source, suffix, e2e_key in SOURCES:
            figures = info.get(key) or {}
            e2e = info.get(e2e_key) if key == "per_request" else figures.get(e2e_key)
            out.append(
                [
                    f"`{info['hop_codec']}`",
                    "-" if e2e is None else fmt_ms(e2e),
                    *(_pair(figures.get(stage) or {}, suffix) for stage in STAGES),
                    source,
                    _within(figures),
                ]
            )
    return out


def section(raw_dir: Path) -> str:
    """The part, after the engine section ("" when the run has no engine suite; "not in this
    run" when its suite did not run this benchmark)."""
    if not infos(engine_path(raw_dir)):
        return ""
    found = records(raw_dir, OP)
    if not found:
        absent = "Not in this run (its benchmark, `bench_engine_attribution`, did not run)."
        return "\n".join([HEADING, "", absent, ""])
    first = found[0]
    joined = sum(i["join"]["pairs"] for i in found)
    ambiguous = sum(i["join"]["ambiguous"] for i in found)
    unjoined = sum(i["join"]["records_unjoined"] for i in found)
    return "\n".join(
        [
            HEADING,
            "",
            f"`inferwire load --api openai-chat` at {first['rate_rps']:g} req/s for "
            f"{first['window_s']:g} s against `inferwire serve --engine` (http1, "
            f"`{first['frontend_codec']}`; engine `--policy {first['policy']}`, default step "
            "model), one run per hop codec: attributed from each stream's per-request `metrics` "
            "object (P50 over requests) and from the frontend's vLLM histograms scraped before "
            "and after the run (means), the truth from its `--stamps-file`, joined to each "
            "request by when the frontend received it and its token count; milliseconds, "
            "*attributed / truth*, *outside the engine* being E2E less the generator's own lag "
            "and pool wait and the engine's queue and model time; *within bounds*: every stage "
            f"within {first['bound_share']:.0%} of the truth or {first['bound_ms']:g} ms. "
            f"{joined:,} requests joined ({ambiguous} by order among several that fit, "
            f"{unjoined} not joined). Both accounts are made of the server's same stamps: they "
            "differ only where the attribution path loses, mislabels or miscounts a figure.",
            "",
            table(
                [
                    "hop codec",
                    "E2E",
                    "queue (attributed / truth)",
                    "model (attributed / truth)",
                    "outside the engine (attributed / truth)",
                    "source",
                    "within bounds",
                ],
                rows(found),
                left=(0, 5, 6),
            ),
            "",
        ]
    )
