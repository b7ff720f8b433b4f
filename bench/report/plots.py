"""Every plot of the report, rebuilt in one call (:func:`write`): each section's picture, the
data files of the pictures :mod:`.stages` and :mod:`.engine_hop` draw themselves, and the
removal of the plot files the run has no data for (a stale picture would otherwise stay beside
a README that no longer names it); and the README without a link to a picture the run did not
draw (:func:`without_missing`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from inferwire.transports.timing import REQUEST_STAGES

from . import codecs_plot, engine, figures, load_plot, peers, stages, transports, vllm_hop
from .engine_records import one
from .figures import DATA_SUFFIX, PLOTS_DIR, Panel, Plot, Series
from .results import STAGES_RAW, Result, records
from .stages import STAGE_NAMES, causal

LINK: Final = re.compile(rf"^!\[[^\]]*\]\({PLOTS_DIR}/([^)\s]+)\)\n\n?", re.MULTILINE)
"""A picture on a line of its own (:func:`.figures.link`), and the blank line after it."""


def _stacked(results: list[dict[str, Any]], key: str, names: Sequence[str]) -> Panel:
    """The bars :func:`.stages.plot` stacks: a series per stage, a bar per transport x codec
    (a negative stage drawn as zero, as it draws them)."""
    labels = tuple(f"{r['transport']}\n{r['codec']}" for r in results)
    series = tuple(
        Series(label=name, x=labels, y=tuple(max(0.0, r[key].get(name, 0.0)) for r in results))
        for name in names
    )
    return Panel(title="", series=series)


def stages_data(raw_dir: Path) -> list[Plot]:
    """The data of ``stages.png`` and ``request_stages.png``, drawn by :func:`.stages.plot`
    from the same records (the same selection: keep the two in step until it draws through
    :func:`.figures.save`)."""
    results = [r for r in records(raw_dir / STAGES_RAW) if r["op"] == "stages" and causal(r)]
    with_request = [r for r in results if r.get("request_stages_us")]
    found = [
        (
            "stages",
            "Where a streamed token's time goes (per chunk)",
            results,
            "stages_us",
            STAGE_NAMES,
        ),
        (
            "request_stages",
            "One request to its first token",
            with_request,
            "request_stages_us",
            REQUEST_STAGES,
        ),
    ]
    return [
        Plot(
            name=name,
            title=title,
            alt=name.replace("_", " "),
            x_label="transport, codec",
            y_label="microseconds (P50)",
            panels=(_stacked(chosen, key, names),),
        )
        for name, title, chosen, key, names in found
        if chosen
    ]


def engine_sweep_data(raw_dir: Path) -> list[Plot]:
    """The data of ``engine_sweep.png``, drawn by :func:`.engine_hop.plot` from the same
    record: per hop codec, tokens/s at each offered rate with the trials' range."""
    info = one(raw_dir, "hop-sweep")
    if info is None:
        return []
    series = []
    for codec, points in info["points"].items():
        ordered = sorted(points.values(), key=lambda p: p["rate_rps"])
        series.append(
            Series(
                label=codec,
                x=tuple(p["rate_rps"] for p in ordered),
                y=tuple(p["tokens_s"] for p in ordered),
                y_low=tuple(p["tokens_s_min"] for p in ordered),
                y_high=tuple(p["tokens_s_max"] for p in ordered),
            )
        )
    return [
        Plot(
            name="engine_sweep",
            title=f"Frontend ({info['frontend_transport']} SSE, {info['frontend_codec']}) by "
            "hop codec",
            alt="tokens/s by hop codec",
            x_label="offered rate (requests/s)",
            y_label="output tokens/s (median of trials)",
            panels=(Panel(title="", series=tuple(series)),),
        )
    ]


def write(raw_dir: Path, out_dir: Path, results: Sequence[Result]) -> list[Path]:
    """Every plot of the run in ``raw_dir`` (codec results ``results``) and its data, under
    ``out_dir/plots/``; the plot files there that this run did not write are removed."""
    written = [
        *stages.plot(raw_dir, out_dir),
        *engine.plot(raw_dir, out_dir),
        *codecs_plot.plot(results, out_dir),
        *transports.plot(raw_dir, out_dir),
        *peers.plot(raw_dir, out_dir),
        *load_plot.plot(raw_dir, out_dir),
        *vllm_hop.plot(raw_dir, out_dir),
    ]
    drawn = {path.stem for path in written if path.suffix == ".png"}
    written += [
        figures.write_data(out_dir, plot)
        for plot in (*stages_data(raw_dir), *engine_sweep_data(raw_dir))
        if plot.name in drawn  # the data of a picture that was drawn, never of one that was not
    ]
    kept = set(written)
    for path in sorted((out_dir / PLOTS_DIR).glob("*")):
        if path.suffix in (".png", DATA_SUFFIX) and path not in kept:
            path.unlink()
    return written


def without_missing(text: str, drawn: Sequence[Path]) -> str:
    """``text`` without the pictures of ``plots/`` that are not among ``drawn``: a section
    that names its picture whatever the run holds loses it when the run gave it nothing to
    draw, rather than linking a missing (or a stale) file."""
    names = {path.name for path in drawn}
    return LINK.sub(lambda m: m.group(0) if m.group(1) in names else "", text)
