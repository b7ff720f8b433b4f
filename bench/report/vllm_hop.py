"""The report's section on the frontend-engine hop as vLLM builds it (issue 33), from
``raw/vllm_hop.json`` (``bench/bench_vllm_hop.py``): per case a table of the frontend's CPU per
step and tokens per second per frontend core by batch size, codec and transport, the engine's
encode and the bytes per step; one plot (``plots/vllm_hop.png`` and its data); and a finding per
question (ipc vs tcp, msgspec vs pickle, zero-copy vs in-band, where the frontend core
saturates), each computed from the run: a finding's direction and size are read from the
figures, never written in advance. Nothing is printed for a run without that file.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from . import figures
from .figures import Panel, Plot, Series
from .results import infos
from .tables import table

if TYPE_CHECKING:
    from matplotlib.figure import Figure

VLLM_HOP_RAW: Final = "vllm_hop.json"
OP: Final = "vllm-hop"
CASES: Final = ("tokens", "logprobs", "embedding")
CASE_LABELS: Final = {
    "tokens": "tokens only",
    "logprobs": "a 128k-float logprobs tensor per request",
    "embedding": "a 4,096-float pooled embedding per request",
}
VLLM_CODEC: Final = "msgspec-oob"
PAIRS: Final = (("msgspec-oob", "pickle5-oob"), ("msgspec-inband", "pickle-inband"))
"""msgspec against pickle, each with arrays out of band and in band."""
ZERO_COPY: Final = (("msgspec-oob", "msgspec-inband"), ("pickle5-oob", "pickle-inband"))
"""Out of band (zero-copy) against in band, per serializer."""
LOGPROBS_FLOATS: Final = 128 * 1024
TIE: Final = 0.10
"""Frontend costs this close are named together (as advice.py's ``TIE``)."""
OLD_PATH: Final = "pickle-inband"
"""What vLLM's hop was before msgspec (PR 6883's ZMQ + pickle)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    """One (case, transport, codec, batch) of the run."""

    case: str
    transport: str
    codec: str
    batch: int
    figures: Mapping[str, Any]
    step_period_ms: float

    @property
    def frontend_us(self) -> float:
        return float(self.figures["frontend_us"])

    @property
    def correct(self) -> bool:
        return bool(self.figures.get("correct"))


def cells(raw_dir: Path) -> list[Cell]:
    """Every cell of the run (none without the file)."""
    found = []
    for info in infos(raw_dir / VLLM_HOP_RAW):
        if info.get("op") != OP:
            continue
        periods = info.get("step_period_ms", {})
        for codec, by_batch in info["cells"].items():
            for batch, figures_ in by_batch.items():
                found.append(
                    Cell(
                        case=info["case"],
                        transport=info["transport"],
                        codec=codec,
                        batch=int(batch),
                        figures=figures_,
                        step_period_ms=float(periods.get(batch, 0.0)),
                    )
                )
    return found


def _index(found: Iterable[Cell]) -> dict[tuple[str, str, str, int], Cell]:
    return {(c.case, c.transport, c.codec, c.batch): c for c in found if c.correct}


def _x(value: float) -> str:
    return f"{value:.2f}x"


def _us(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _tokens(value: float) -> str:
    return figures.short_number(value)


def _ratios(
    index: Mapping[tuple[str, str, str, int], Cell],
    subject: str,
    base: str,
    *,
    by_transport: bool,
    case: str,
) -> list[tuple[float, Cell]]:
    """subject / base frontend CPU per step over the cells both have: ``by_transport``, the
    subject and base are transports (same codec), else codecs (same transport)."""
    out = []
    for (c, transport, codec, batch), cell in index.items():
        if c != case:
            continue
        if by_transport:
            if transport != base:
                continue
            other = index.get((case, subject, codec, batch))
        else:
            if codec != base:
                continue
            other = index.get((case, transport, subject, batch))
        if other is not None and cell.frontend_us > 0:
            out.append((other.frontend_us / cell.frontend_us, other))
    return out


def _spread(ratios: list[tuple[float, Cell]]) -> str:
    """The median ratio, its cells' range, and whether the cells disagree on its direction
    (then the difference is within what this run can tell apart)."""
    values = [r for r, _ in ratios]
    low, high = min(values), max(values)
    split = "; the cells disagree in direction" if low < 1.0 < high else ""
    return (
        f"{_x(statistics.median(values))} (median of {len(values)} cells; "
        f"{_x(low)}-{_x(high)}{split})"
    )


def _more_or_less(ratio: float, base: str) -> str:
    """``ratio`` (subject / base) in words: "1.30x the CPU of `ipc`", "1.30x less CPU than"."""
    if ratio >= 1.0:
        return f"{_x(ratio)} the CPU of `{base}`"
    return f"{1 / ratio:.2f}x less CPU than `{base}`"


def ipc_vs_tcp(found: list[Cell]) -> str:
    index = _index(found)
    parts = []
    for case in CASES:
        ratios = _ratios(index, "tcp", "ipc", by_transport=True, case=case)
        if not ratios:
            continue
        median = statistics.median(r for r, _ in ratios)
        big = max(ratios, key=lambda rc: rc[1].batch)[1].batch
        at_big = [r for r, c in ratios if c.batch == big]
        parts.append(
            f"{CASE_LABELS[case]}: over `tcp` a step costs the frontend "
            f"{_more_or_less(median, 'ipc')}, tcp / ipc {_spread(ratios)}, at B = {big} "
            f"{_x(statistics.median(at_big))}"
        )
    if not parts:
        return ""
    text = "; ".join(parts)
    return f"**ipc vs tcp.** {text[:1].upper()}{text[1:]}."


def msgspec_vs_pickle(found: list[Cell]) -> str:
    index = _index(found)
    parts = []
    for msgspec_codec, pickle_codec in PAIRS:
        ratios = []
        for case in CASES:
            ratios += _ratios(index, pickle_codec, msgspec_codec, by_transport=False, case=case)
        if not ratios:
            continue
        by_case = []
        for case in CASES:
            values = [r for r, c in ratios if c.case == case]
            if values:
                by_case.append(f"{case} {_x(statistics.median(values))}")
        engine = _engine_ratio(found, pickle_codec, msgspec_codec)
        parts.append(
            f"`{pickle_codec}` / `{msgspec_codec}`: frontend CPU per step {_spread(ratios)}, "
            f"by case {', '.join(by_case)}"
            + (f"; engine encode with tensors {_x(engine)}" if engine is not None else "")
        )
    if not parts:
        return ""
    return "**msgspec vs pickle.** " + "; ".join(parts) + "."


def _engine_ratio(found: list[Cell], subject: str, base: str) -> float | None:
    """Median over the tensor cases' cells of subject / base engine encode per step."""
    index = _index(found)
    values = []
    for (case, transport, codec, batch), cell in index.items():
        if codec != base or case == "tokens":
            continue
        other = index.get((case, transport, subject, batch))
        encode = float(cell.figures.get("engine_encode_us", 0.0))
        if other is not None and encode > 0:
            values.append(float(other.figures["engine_encode_us"]) / encode)
    return statistics.median(values) if values else None


def zero_copy_vs_inband(found: list[Cell]) -> str:
    """In band / out of band, per serializer and tensor case: the direction can differ by
    case (one large frame per array, or many small ones), so each is read alone."""
    index = _index(found)
    parts = []
    for oob, inband in ZERO_COPY:
        by_case = []
        for case in ("logprobs", "embedding"):
            ratios = _ratios(index, inband, oob, by_transport=False, case=case)
            if ratios:
                by_case.append(f"{case} {_spread(ratios)}")
        if not by_case:
            continue
        engine = _engine_ratio(found, inband, oob)
        parts.append(
            f"`{inband}` / `{oob}` frontend CPU per step: {'; '.join(by_case)}"
            + (f"; engine encode {_x(engine)}" if engine is not None else "")
        )
    if not parts:
        return ""
    return "**Zero-copy vs in-band.** " + ". ".join(parts) + "."


def saturation(found: list[Cell]) -> str:
    """Per case and transport, for vLLM's codec and the old path: the first batch size at
    which the frontend's CPU per step reaches the step model's decode step, and tokens/s per
    frontend core by batch."""
    index = _index(found)
    lines = []
    for case in CASES:
        for transport in ("ipc", "tcp"):
            for codec in (VLLM_CODEC, OLD_PATH):
                ordered = sorted(
                    (c for k, c in index.items() if k[:3] == (case, transport, codec)),
                    key=lambda c: c.batch,
                )
                if not ordered:
                    continue
                saturated = [c for c in ordered if c.frontend_us / 1e3 >= c.step_period_ms]
                rates = ", ".join(
                    f"B={c.batch} {_tokens(c.figures['tokens_per_s_per_core'])}" for c in ordered
                )
                if saturated:
                    first = saturated[0]
                    verdict = (
                        f"saturates at B = {first.batch} ({first.frontend_us / 1e3:,.1f} ms of "
                        f"CPU per {first.step_period_ms:.1f} ms step)"
                    )
                else:
                    top = ordered[-1]
                    verdict = (
                        f"does not saturate up to B = {top.batch} "
                        f"({top.frontend_us / 1e3 / top.step_period_ms:.0%} of a "
                        f"{top.step_period_ms:.1f} ms step)"
                    )
                lines.append(
                    f"- {case}, `{transport}`, `{codec}`: {verdict}; tokens/s per frontend "
                    f"core: {rates}"
                )
    if not lines:
        return ""
    return "\n".join(
        [
            "**Where the frontend core saturates**: when its CPU per step reaches the engine's "
            "step time, taken from the engine model (`inferwire.engine.StepModel`, defaults: "
            "LLaMA 7B FP8 on one H100) for a decode step of B requests of "
            "a 1k-token context each:",
            *lines,
        ]
    )


def findings(found: list[Cell]) -> list[str]:
    return [
        text
        for text in (
            ipc_vs_tcp(found),
            msgspec_vs_pickle(found),
            zero_copy_vs_inband(found),
            saturation(found),
        )
        if text
    ]


# -- tables ---------------------------------------------------------------------------------------


def _batches(found: list[Cell], case: str) -> list[int]:
    return sorted({c.batch for c in found if c.case == case})


def _frontend_table(found: list[Cell], case: str) -> str:
    batches = _batches(found, case)
    rows = []
    keys = sorted({(c.codec, c.transport) for c in found if c.case == case})
    by_key = {(c.codec, c.transport, c.batch): c for c in found if c.case == case}
    for codec, transport in keys:
        row = [f"`{codec}`", f"`{transport}`"]
        for batch in batches:
            cell = by_key.get((codec, transport, batch))
            if cell is None:
                row.append("-")
            elif not cell.correct:
                row.append("**failed**")
            else:
                f = cell.figures
                row.append(
                    f"{_us(f['frontend_us'])} ({_us(f['frontend_us_min'])}-"
                    f"{_us(f['frontend_us_max'])}) / {_tokens(f['tokens_per_s_per_core'])}"
                )
        rows.append(row)
    return table(["codec", "transport", *(f"B = {b}" for b in batches)], rows, left=(0, 1))


def _engine_table(found: list[Cell], case: str) -> str:
    """Engine encode, frontend decode and bytes per step over one transport (``ipc`` when the
    run has it: the engine's encode does not depend on the socket; the other is in the raw
    file)."""
    batches = _batches(found, case)
    transports = sorted({c.transport for c in found if c.case == case})
    transport = "ipc" if "ipc" in transports else transports[0]
    chosen = [c for c in found if c.case == case and c.transport == transport]
    by_key = {(c.codec, c.batch): c for c in chosen}
    rows = []
    for codec in sorted({c.codec for c in chosen}):
        row = [f"`{codec}`"]
        for batch in batches:
            cell = by_key.get((codec, batch))
            if cell is None:
                row.append("-")
                continue
            f = cell.figures
            row.append(
                f"{_us(f['engine_encode_us'])} / {_us(f['frontend_thread_us'])} / "
                f"{figures.short_number(f['bytes'])}"
            )
        rows.append(row)
    return table([f"codec (`{transport}`)", *(f"B = {b}" for b in batches)], rows)


# -- the plot -------------------------------------------------------------------------------------


def plot_data(found: list[Cell]) -> Plot | None:
    """Frontend CPU per step against batch size, a panel per case, a series per codec and
    transport (failed cells left out)."""
    panels = []
    for case in CASES:
        chosen = [c for c in found if c.case == case and c.correct]
        if not chosen:
            continue
        series = []
        for codec, transport in sorted({(c.codec, c.transport) for c in chosen}):
            ordered = sorted(
                (c for c in chosen if (c.codec, c.transport) == (codec, transport)),
                key=lambda c: c.batch,
            )
            series.append(
                Series(
                    label=codec,
                    kind=transport,
                    x=tuple(float(c.batch) for c in ordered),
                    y=tuple(c.frontend_us for c in ordered),
                    y_low=tuple(float(c.figures["frontend_us_min"]) for c in ordered),
                    y_high=tuple(float(c.figures["frontend_us_max"]) for c in ordered),
                )
            )
        panels.append(Panel(title=CASE_LABELS[case], series=tuple(series)))
    if not panels:
        return None
    return Plot(
        name="vllm_hop",
        title="The frontend's CPU per engine step, by batch size (vLLM-shaped hop)",
        alt="frontend CPU per step by batch size, codec and transport",
        x_label="batch size (requests a step)",
        y_label="frontend CPU per step (us)",
        panels=tuple(panels),
    )


def _draw(figure: Figure, plot: Plot) -> None:
    from matplotlib.lines import Line2D

    width_in, height_in = figure.get_size_inches()
    axes = figure.subplots(
        1,
        len(plot.panels),
        squeeze=False,
        gridspec_kw={
            "left": 0.75 / width_in,
            "right": 1 - 0.15 / width_in,
            "top": 1 - 0.6 / height_in,
            "bottom": 1.35 / height_in,
            "wspace": 0.3,
        },
    )[0]
    labels = list(dict.fromkeys(s.label for p in plot.panels for s in p.series))
    styles = {label: figures.style(i) for i, label in enumerate(labels)}
    dashes: dict[str, Literal["-", "--", ":"]] = {"ipc": "-", "tcp": "--"}
    for ax, panel in zip(axes, plot.panels, strict=True):
        xs = [x for s in panel.series for x in s.x if isinstance(x, float)]
        ys = [y for s in panel.series for y in (*s.y_low, *s.y_high, *s.y) if y > 0]
        for series in panel.series:
            colour, marker = styles[series.label]
            ax.plot(
                series.x,
                series.y,
                color=colour,
                marker=marker,
                markersize=3.5,
                linewidth=1.1,
                linestyle=dashes.get(series.kind, ":"),
            )
        if xs and ys:
            figures.log_axis(ax, "x", min(xs), max(xs))
            figures.log_axis(ax, "y", min(ys), max(ys))
        ax.set_title(panel.title)
        ax.set_xlabel(plot.x_label)
    axes[0].set_ylabel(plot.y_label)
    handles = [
        Line2D([], [], color=styles[label][0], marker=styles[label][1], label=label)
        for label in labels
    ]
    handles += [
        Line2D([], [], color="black", linestyle=style, label=transport)
        for transport, style in dashes.items()
    ]
    figure.legend(
        handles=handles,
        loc="lower center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=min(len(handles), 6),
        frameon=False,
    )


def plot(raw_dir: Path, out_dir: Path) -> list[Path]:
    """``plots/vllm_hop.png`` and its data (nothing without the file)."""
    data = plot_data(cells(raw_dir))
    if data is None:
        return []
    return figures.save(out_dir, data, _draw, (12.0, 4.5))


# -- the section and the advice row ---------------------------------------------------------------


def _method(info: Mapping[str, Any]) -> str:
    pinned = info.get("pinned")
    where = (
        f"the frontend pinned to core {pinned['frontend']} and the engine to core "
        f"{pinned['engine']}"
        if pinned
        else "no core pinning (fewer than two cores)"
    )
    return (
        "An engine process sends runs of prebuilt steps (B requests' outputs shaped as vLLM "
        "V1's `EngineCoreOutputs`) over ZeroMQ PUSH/PULL to this frontend, which receives "
        "them without a copy, decodes and checks every one (`inferwire.engine.vllm_hop`). "
        "Codecs: `msgspec-oob` (vLLM's: MessagePack, arrays of "
        f"{info.get('zero_copy_threshold', 256)} bytes or more as frames of their own, decoded "
        "with `np.frombuffer` on the received frame), `msgspec-inband` (arrays inside the "
        "MessagePack), `pickle5-oob` (protocol 5, out-of-band buffers as frames), "
        "`pickle-inband` (plain pickle), and for tokens only inferwire's own hop codecs as "
        "they are (`hop:*`: one stream frame per request in an OUTPUTS message). "
        f"{info.get('method', '')} Every codec runs once per round at every batch size, the "
        f"order rotated each round ({info.get('rounds', '?')} rounds); {where}. Tokens/s per "
        "frontend core = B tokens a step / the frontend's CPU seconds per step. The machine "
        "was shared with the suite's other processes."
    )


def _batches_note(found: list[Cell]) -> str:
    """The batch sizes each case ran, and why a case stopped short of the others."""
    ran = {case: _batches(found, case) for case in CASES if _batches(found, case)}
    text = "Batch sizes: " + "; ".join(
        f"{case} {', '.join(f'{b:,}' for b in batches)}" for case, batches in ran.items()
    )
    top = max(b for batches in ran.values() for b in batches)
    short = [case for case, batches in ran.items() if case == "logprobs" and batches[-1] < top]
    if short:
        mib = top * LOGPROBS_FLOATS * 4 / (1 << 20)
        text += (
            f" (logprobs stops short of B = {top:,}: its step would hold {mib:,.0f} MiB of "
            "tensors, with up to two steps in flight on each side)"
        )
    return text + "."


def section(raw_dir: Path) -> str:
    found = cells(raw_dir)
    if not found:
        return ""
    info = next(i for i in infos(raw_dir / VLLM_HOP_RAW) if i.get("op") == OP)
    failed = sorted(
        {f"{c.case}/{c.transport}/{c.codec}/B={c.batch}" for c in found if not c.correct}
    )
    out = [
        "### The frontend-engine hop as vLLM builds it",
        "",
        _method(info) + " " + _batches_note(found),
        "",
        *(f"{text}\n" for text in findings(found)),
    ]
    if failed:
        out += [f"**Failed cells** (left out of the findings): {', '.join(failed)}.", ""]
    out += [*figures.link(plot_data(found))]
    for case in CASES:
        if not any(c.case == case for c in found):
            continue
        out += [
            f"#### {CASE_LABELS[case].capitalize()}",
            "",
            "Frontend CPU per step, us (rounds' range) / tokens per second per frontend core:",
            "",
            _frontend_table(found, case),
            "",
            "Engine encode us / frontend thread receive + decode us / bytes per step:",
            "",
            _engine_table(found, case),
            "",
        ]
    return "\n".join(out)


def _encode_us(cell: Cell) -> float:
    return float(cell.figures["engine_encode_us"])


def advice_rows(raw_dir: Path) -> list[list[str]]:
    """The hop's row of "What should I use?" (none without the file): the codec and transport
    with the least frontend CPU per step in the logprobs case at its largest batch (with the
    codecs within ``TIE`` of it on that transport, and their engine encode beside the best's:
    the run cannot tell their frontend costs apart, the engine's it can), its margin over the
    old path (pickle in band), and what changes across hosts."""
    index = _index(cells(raw_dir))
    chosen = [c for k, c in index.items() if k[0] == "logprobs"]
    if not chosen:
        return []
    big = max(c.batch for c in chosen)
    at_big = [c for c in chosen if c.batch == big]
    best = min(at_big, key=lambda c: c.frontend_us)
    near = sorted(
        (
            c
            for c in at_big
            if c is not best
            and c.transport == best.transport
            and c.frontend_us <= best.frontend_us * (1 + TIE)
        ),
        key=lambda c: c.frontend_us,
    )
    use = f"`{best.codec}` over `{best.transport}`"
    if near:
        encode = _encode_us(best)
        use += (
            " (within 10%: "
            + ", ".join(
                f"`{c.codec}`, its engine encode {_x(_encode_us(c) / encode)}" for c in near
            )
            + ")"
        )
    old = index.get(("logprobs", best.transport, OLD_PATH, big))
    margin = (
        f"{old.frontend_us / best.frontend_us:.1f}x less frontend CPU per step than "
        f"`{OLD_PATH}` (B = {big}, 128k-float logprobs per request)"
        if old is not None
        else f"B = {big}"
    )
    if best.transport == "tcp":
        changes = "nothing for another host: `tcp` is also what crosses hosts"
    else:
        across = index.get(("logprobs", "tcp", best.codec, big))
        changes = "the engine is on another host: `tcp`" + (
            f" ({_x(across.frontend_us / best.frontend_us)} the frontend CPU on this host)"
            if across is not None
            else ""
        )
    return [
        [
            "engine step outputs with tensors",
            "between your API server and its engine process (vLLM's hop)",
            use,
            margin,
            changes,
        ]
    ]
