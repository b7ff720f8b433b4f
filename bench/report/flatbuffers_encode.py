"""The FlatBuffers encode targets, and the finding beside them (issue 30).

``bench_flatbuffers_encode`` times the compiled FlatBuffers encoder against a baseline's encode
of the same messages in interleaved rounds. For tensor messages the baseline is protobuf or the
tensor codec as they run. For token chunks protobuf's own path in inferwire is compiled too
(codecs/_protobuf_accel.c), which is not what a user of protobuf gets: they build upb's
generated messages (``protobuf (upb)``, timed in the same rounds). The target reads that
comparison; the compiled-against-compiled one measures the two formats, not what a user would
save, and the report gives it as a finding under the targets table (:func:`finding`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Final

from .results import Result

TARGET: Final = 1.0
"""flatbuffers / the baseline, per chunk or per message."""
PROTOBUF_UPB: Final = "protobuf (upb)"
"""The codec name of protobuf through upb's messages (bench/measure/codec_ops.py)."""
OP_PREFIX: Final = "encode-vs-"
SCHEMA: Final = "schemas/inferwire.fbs"

Key = tuple[str, str, str]


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.2f} us"


def _ratio(value: float) -> str:
    return f"{value:.2f}x"


def _records(results: Iterable[Result]) -> list[Result]:
    return [
        r
        for r in results
        if r.codec == "flatbuffers" and r.op.startswith(OP_PREFIX) and r.paired_ratio is not None
    ]


def target_rows(results: Iterable[Result]) -> list[list[str]]:
    """One row per ``bench_flatbuffers_encode`` record: against protobuf through upb's messages
    where the record has that reading (token chunks), else against the baseline as it runs
    (tensor messages, and a run from before the upb reading)."""
    rows = []
    for r in _records(results):
        baseline = r.op.removeprefix(OP_PREFIX)
        per = "per chunk" if r.messages > 1 else "per message"
        time = f"{_us(r.median_s / r.messages)} {per}"
        if r.paired_ratio_upb is not None:
            target = (
                f"`flatbuffers` encode <= `{baseline}` encode as users get it (upb's "
                f"messages), {per} (`{r.workload}`)"
            )
            measured = (
                f"{time}; paired ratio flatbuffers / `{PROTOBUF_UPB}`, in the same rounds "
                "(against inferwire's compiled protobuf: the finding below)"
            )
            field, ratio = "paired_ratio_upb", r.paired_ratio_upb
        else:
            assert r.paired_ratio is not None  # _records keeps only those
            target = f"`flatbuffers` encode <= `{baseline}` encode, {per} (`{r.workload}`)"
            measured = f"{time}; paired ratio flatbuffers / {baseline}"
            field, ratio = "paired_ratio", r.paired_ratio
        rows.append(
            [
                target,
                measured,
                r.cell(field, _ratio),
                f"<= {TARGET:.0f}x",
                "met" if ratio <= TARGET else "**missed**",
            ]
        )
    return rows


def _bytes_per_chunk(r: Result, codec: str, by_key: Mapping[Key, Result]) -> float | None:
    """``codec``'s stream bytes per chunk, framing included as in the codec tables: from the
    target's own record, else from the codec tables' encode of the workload."""
    wire_bytes = r.wire_bytes_by_codec.get(codec)
    if wire_bytes is None and (encode := by_key.get((codec, r.workload, "encode"))):
        wire_bytes = encode.wire_bytes
    return wire_bytes / r.messages if wire_bytes is not None else None


def _span(values: Collection[float]) -> str:
    """``1.21-1.39x``, or one ratio when they print the same."""
    low, high = _ratio(min(values)), _ratio(max(values))
    return low if low == high else f"{low.removesuffix('x')}-{high}"


def finding(results: Iterable[Result]) -> str:
    """FlatBuffers against inferwire's compiled protobuf on token chunks: the ratio over the
    workloads and both codecs' bytes per chunk, from the run; "" when the run has no such
    reading. Not a target: an encoder writes what the format asks for, and a user of protobuf
    does not get this path (they get upb's, which the target reads)."""
    by_key = {(r.codec, r.workload, r.op): r for r in results}
    compiled = sorted(
        (r for r in _records(by_key.values()) if r.paired_ratio_upb is not None),
        key=lambda r: r.workload,
    )
    if not compiled:
        return ""
    per_workload = []
    for r in compiled:
        baseline = r.op.removeprefix(OP_PREFIX)
        text = f"`{r.workload}` {r.cell('paired_ratio', _ratio)}"
        ours = _bytes_per_chunk(r, "flatbuffers", by_key)
        theirs = _bytes_per_chunk(r, baseline, by_key)
        if ours is not None and theirs is not None:
            text += f", {ours:,.0f} vs {theirs:,.0f} bytes per chunk"
        per_workload.append(text)
    ratios = [r.paired_ratio for r in compiled if r.paired_ratio is not None]
    return (
        "**Finding, not a target: FlatBuffers' format costs "
        f"{_span(ratios)} protobuf's to encode per token chunk when both are compiled** "
        "(inferwire's C encoders for both, paired in the same rounds of "
        f"`bench_flatbuffers_encode`: {'; '.join(per_workload)}, framing included). "
        f"The extra work is what the format asks an encoder to write ({SCHEMA}): a chunk is a "
        "union member inside an `Envelope` table, so every buffer carries two vtables (the "
        "envelope's and the chunk's) and the union envelope (its type byte and offset), and "
        "its fields are fixed-width and aligned (8-byte `created` and `seq`, 4-byte offsets "
        "and lengths, strings NUL-terminated and padded to 4 bytes) where protobuf writes a "
        "tag and a varint. A user of protobuf gets upb's messages, not this path: the target "
        "above reads that comparison."
    )
