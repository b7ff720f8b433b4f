"""The report's compression section, from ``raw/compression.json``
(``bench/bench_compression.py``): bytes and CPU per token with and without gzip, br and zstd, per
codec and over a socket, and the time of a whole answer over slow links. Nothing is printed
for a run without that file."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from .results import COMPRESSION_RAW, infos
from .tables import table

CODINGS: Final = ("identity", "gzip", "br", "zstd")


def _of(raw_dir: Path, op: str) -> list[dict[str, Any]]:
    return [i for i in infos(raw_dir / COMPRESSION_RAW) if i.get("op") == op]


def _x(value: float) -> str:
    return f"{value:.2f}x"


def _ok(info: dict[str, Any]) -> str:
    return "yes" if info.get("correct") else "**no**"


def _codec_rows(raw_dir: Path) -> list[list[str]]:
    rows = []
    for info in [*_of(raw_dir, "compression-codecs"), *_of(raw_dir, "compression-unary")]:
        what = (
            f"`{info['codec']}` stream, one chunk a write"
            if info["op"] == "compression-codecs"
            else f"unary body, {info['body_bytes']:,} bytes"
        )
        for coding in CODINGS:
            figures = info["codings"].get(coding)
            if figures is None:
                continue
            rows.append(
                [
                    what,
                    f"`{coding}`",
                    f"{figures['bytes_per_token']:.1f}",
                    _x(figures["vs_identity_bytes"]),
                    f"{figures['encode_us_per_token']:.2f}",
                    f"{figures['decode_us_per_token']:.2f}",
                    "yes" if figures["correct"] else "**no**",
                ]
            )
    return rows


def _wire_rows(raw_dir: Path) -> list[list[str]]:
    rows = []
    for info in _of(raw_dir, "compression-wire"):
        label = f"paced ({info['decode_ms']:g} ms a token)" if info["paced"] else "unpaced"
        for coding in CODINGS:
            figures = info["codings"].get(coding)
            if figures is None:
                continue
            unary = (
                f"{figures['unary_bytes']:,.0f} / {figures['unary_cpu']:.2f}"
                if "unary_bytes" in figures
                else ""
            )
            rows.append(
                [
                    label,
                    f"`{coding}`",
                    f"{figures['stream_bytes']:.1f}",
                    f"{figures['stream_cpu']:.2f}",
                    _x(figures["vs_identity_stream_cpu"]),
                    unary,
                    "yes" if figures["correct"] else "**no**",
                ]
            )
    return rows


def _wan_rows(raw_dir: Path) -> list[list[str]]:
    rows = []
    for info in _of(raw_dir, "compression-wan"):
        mbps = info.get("bandwidth_mbps")
        link = f"{info['delay_ms']:g} ms" + (f", {mbps:g} Mbit/s" if mbps else "")
        for coding in CODINGS:
            figures = info["codings"].get(coding)
            if figures is None:
                continue
            rows.append(
                [
                    link,
                    f"`{coding}`",
                    f"{figures['stream_ms']:.1f}",
                    _x(figures["vs_identity_stream"]),
                    f"{figures['unary_ms']:.1f}",
                    _x(figures["vs_identity_unary"]),
                    "yes" if figures["correct"] else "**no**",
                ]
            )
    return rows


def section(raw_dir: Path) -> str:
    """The report's compression section ("" if the run has none)."""
    codec_rows, wire_rows, wan_rows = _codec_rows(raw_dir), _wire_rows(raw_dir), _wan_rows(raw_dir)
    if not (codec_rows or wire_rows or wan_rows):
        return ""
    parts = [
        "## Compression: gzip, br and zstd on token streams",
        "",
        "`inferwire serve --compress auto` answers in the coding the request's "
        "`Accept-Encoding` weighs highest (zstd, then gzip, then br on a tie), and flushes a "
        "stream after every write, so each event decodes when it arrives. Every figure is a "
        "median over interleaved rounds, each coding once per round; *vs identity* is taken "
        "within a round. Every stream and body was decoded and compared with the "
        "uncompressed one.",
        "",
    ]
    if codec_rows:
        parts += [
            "In process, no socket: a paced server's writes (one chunk each) compressed and "
            "flushed as the server does, decoded by the client's bounded decoder; the unary "
            "body is the non-streamed chat completion. Per token.",
            "",
            table(
                [
                    "what",
                    "coding",
                    "bytes per token",
                    "bytes vs identity",
                    "encode us",
                    "decode us",
                    "correct",
                ],
                codec_rows,
                left=(0, 1),
            ),
            "",
        ]
    if wire_rows:
        parts += [
            "Over a socket: the server in its own process, our HTTP/1.1 client asking for the "
            "coding. *bytes per token*: body bytes as they crossed; *CPU us per token*: the "
            "server process's CPU time and the client thread's, together; the unary body's "
            "bytes and CPU us per token of its answer.",
            "",
            table(
                [
                    "stream",
                    "coding",
                    "bytes per token",
                    "CPU us per token",
                    "CPU vs identity",
                    "unary: bytes / CPU us per token",
                    "correct",
                ],
                wire_rows,
                left=(0, 1),
            ),
            "",
        ]
    if wan_rows:
        parts += [
            "Over a slow link (the WAN proxy: one-way delay and a bandwidth cap per direction): "
            "the time from the request to the last byte of an unpaced stream and of the unary "
            "body. Under 1x compression pays; over 1x it costs.",
            "",
            table(
                [
                    "link",
                    "coding",
                    "stream ms",
                    "stream vs identity",
                    "unary ms",
                    "unary vs identity",
                    "correct",
                ],
                wan_rows,
                left=(0, 1),
            ),
            "",
        ]
    return "\n".join(parts)
