"""The report's gRPC section and target rows, from ``raw/grpc.json`` (bench/bench_grpc.py):
our per-message ``Generate`` against the bare grpcio floor, the batched RPC against ``tcp``
when the model outruns the wire, and the batched RPC against the per-message one when paced."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from . import spread
from .results import GRPC_RAW, infos
from .tables import table

FLOOR_TARGET: Final = 1.2
TCP_TARGET: Final = 2.0
PACED_TTFT_BOUND: Final = 1.10
"""Paced, "no added latency" is judged as a median paired ratio within the noise: time to first
token on loopback is about a millisecond, and its pairs scatter by several percent."""
PACED_ITL_BOUND: Final = 1.02
"""The mean gap is set by the service's schedule (a decode time per token): a sender that held
chunks back would show here first."""


def _x(value: float) -> str:
    return f"{value:.2f}x"


def _us(value: float) -> str:
    return f"{value:,.1f} us"


def _cell(info: Mapping[str, Any], path: str, fmt: Callable[[float], str] = _x) -> str:
    return spread.cell(info, path, float(info[path]), fmt)


def _optional(info: Mapping[str, Any], path: str, fmt: Callable[[float], str] = _x) -> str:
    """A cell of a figure that raw files from before it was measured lack ("-" there)."""
    return _cell(info, path, fmt) if path in info else "-"


def _of(raw_dir: Path, op: str) -> list[dict[str, Any]]:
    return [info for info in infos(raw_dir / GRPC_RAW) if info.get("op") == op]


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _row(
    what: str, measured_as: str, info: Mapping[str, Any], path: str, bound: float
) -> list[str]:
    return [
        what,
        measured_as,
        _cell(info, path),
        f"<= {bound:g}x",
        _verdict(info["correct"] and info[path] <= bound),
    ]


def target_rows(raw_dir: Path) -> list[list[str]]:
    """One row per codec and comparison, judged from ``raw_dir``'s ``grpc.json``."""
    rows = [
        _row(
            f"`grpc` per message vs bare grpcio ({info['codec']})",
            "time per message, paired",
            info,
            "vs_floor",
            FLOOR_TARGET,
        )
        for info in _of(raw_dir, "grpc-floor")
    ]
    rows += [
        _row(
            f"`grpc` batched vs `tcp` ({info['codec']}), unpaced",
            "time per token, paired",
            info,
            "vs_tcp",
            TCP_TARGET,
        )
        for info in _of(raw_dir, "grpc-batched")
    ]
    rows += [
        _row(
            # the stage in the name too: the reproducibility table finds a target's figure in
            # each repeat by its name, and two rows of one name read the same figure
            f"`grpc` batched vs per message ({info['codec']}), paced, {what}",
            f"{what}, paired",
            info,
            path,
            bound,
        )
        for info in _of(raw_dir, "grpc-paced")
        for path, what, bound in (
            ("ttft_vs_per_message", "time to first token", PACED_TTFT_BOUND),
            ("itl_vs_per_message", "mean inter-token gap", PACED_ITL_BOUND),
        )
    ]
    return rows


def section(raw_dir: Path) -> str:
    """The report's gRPC section ("" if the run has none)."""
    floor = _of(raw_dir, "grpc-floor")
    batched = _of(raw_dir, "grpc-batched")
    paced = _of(raw_dir, "grpc-paced")
    if not (floor or batched or paced):
        return ""
    parts = [
        "## gRPC against its floors",
        "",
        "Servers in their own processes on loopback, pinned to one core, the client on the "
        "other; every ratio is the median of paired rounds (order alternating) in one run. "
        "*Per message*: our `Generate` (one chunk a message: the service, the codec's encoder "
        "and decoder, our client) against a bare grpcio server streaming the same messages, "
        "prebuilt, read by a bare call that keeps the bytes "
        "(`python -m inferwire.bench.procs.grpc_floor`). *Batched*: `GenerateBatched`, one "
        "message per batch of due chunks (the codec's stream bytes, as `tcp` writes them), "
        "against `tcp` with no pacing; the per-message RPC ran in the same rounds. *Paced*: a "
        "server paced per token, `GenerateBatched` against `Generate` stream by stream.",
        "",
    ]
    if floor:
        parts += [
            table(
                [
                    "codec",
                    "loop",
                    "bytes/message",
                    "floor",
                    "codec only",
                    "ours",
                    "codec only / floor",
                    "ours / floor",
                    "correct",
                ],
                (
                    [
                        f"`{i['codec']}`",
                        i["loop"],
                        f"{i['message_bytes']:.0f}",
                        _cell(i, "floor_us_per_message", _us),
                        _optional(i, "codec_only_us_per_message", _us),
                        _cell(i, "ours_us_per_message", _us),
                        _optional(i, "codec_only_vs_floor"),
                        _cell(i, "vs_floor"),
                        "yes" if i["correct"] else "**no**",
                    ]
                    for i in floor
                ),
            ),
            "",
            "*codec only*: the bare server encoding each message with the codec as it streams "
            "(`Encoded`) and a bare call decoding each with the codec, in the same rounds: "
            "what the codec alone adds to the floor. The rest of *ours* is our service, server "
            "and client. Both ends are bound by grpcio's own per-message work (its completion "
            "queue and the event loop on each end), and work added to either end does not "
            "simply add to the stream's time per message.",
            "",
        ]
    if batched:
        parts += [
            table(
                ["codec", "tcp", "batched", "per message", "batched / tcp", "per message / tcp"],
                (
                    [
                        f"`{i['codec']}`",
                        _cell(i, "tcp_us_per_token", _us),
                        _cell(i, "batched_us_per_token", _us),
                        _cell(i, "per_message_us_per_token", _us),
                        _cell(i, "vs_tcp"),
                        _cell(i, "per_message_vs_tcp"),
                    ]
                    for i in batched
                ),
            ),
            "",
            "Per token, `stream-256`, no pacing.",
            "",
        ]
    if paced:
        parts += [
            table(
                [
                    "codec",
                    "decode",
                    "TTFT batched",
                    "TTFT per message",
                    "ratio",
                    "mean gap batched",
                    "mean gap per message",
                    "ratio",
                ],
                (
                    [
                        f"`{i['codec']}`",
                        f"{i['decode_ms']:g} ms",
                        _cell(i, "ttft_us_batched", _us),
                        _cell(i, "ttft_us_per_message", _us),
                        _cell(i, "ttft_vs_per_message"),
                        _cell(i, "itl_us_batched", _us),
                        _cell(i, "itl_us_per_message", _us),
                        _cell(i, "itl_vs_per_message"),
                    ]
                    for i in paced
                ),
            ),
            "",
        ]
    return "\n".join(parts)
