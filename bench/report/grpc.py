"""The report's gRPC section and target rows, from ``raw/grpc.json`` (bench/bench_grpc.py):
our per-message ``Generate`` against the bare grpcio floor, the batched RPC against ``tcp``
when the model outruns the wire, and the batched RPC against the per-message one when paced;
and, when the run has them, grpclib beside grpcio (findings, no target) with its line of the
advice."""

from __future__ import annotations

import statistics
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
    grpclib = _grpclib_parts(raw_dir)
    if not (floor or batched or paced or grpclib):
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
    return "\n".join(parts + grpclib)


def _yes(info: Mapping[str, Any]) -> str:
    return "yes" if info["correct"] else "**no**"


def _grpclib_parts(raw_dir: Path) -> list[str]:
    """grpclib beside grpcio: per message, per token and per unary call ([] without them)."""
    floor = _of(raw_dir, "grpclib-floor")
    batched = _of(raw_dir, "grpclib-batched")
    unary = _of(raw_dir, "grpclib-unary")
    if not (floor or batched or unary):
        return []
    versions = next(i["versions"] for i in (*floor, *batched, *unary))
    parts = [
        "### grpclib beside grpcio",
        "",
        "The same service on grpclib (the pure-Python gRPC on h2, "
        f"{versions['grpclib']}) beside ours on grpcio ({versions['grpcio']}), its server "
        "in its own process like grpcio's, each side in the same rotating rounds. *client on "
        "grpcio*: our grpclib client against our grpcio server; *server, grpcio client*: our "
        "grpcio client against our grpclib server: each ratio to grpcio says what one "
        "library's end costs. Findings, not targets.",
        "",
    ]
    if floor:
        parts += [
            table(
                [
                    "codec",
                    "loop",
                    "floor",
                    "grpcio",
                    "grpclib",
                    "grpclib / grpcio",
                    "grpclib / floor",
                    "client on grpcio / grpcio",
                    "server, grpcio client / grpcio",
                    "correct",
                ],
                (
                    [
                        f"`{i['codec']}`",
                        i["loop"],
                        _cell(i, "floor_us_per_message", _us),
                        _cell(i, "grpcio_us_per_message", _us),
                        _cell(i, "grpclib_us_per_message", _us),
                        _cell(i, "vs_grpcio"),
                        _cell(i, "vs_floor"),
                        _cell(i, "client_vs_grpcio"),
                        _cell(i, "server_vs_grpcio"),
                        _yes(i),
                    ]
                    for i in floor
                ),
            ),
            "",
            "Per message: `Generate`, one chunk a message, `stream-256`; the floor is the bare "
            "grpcio server and call of the section above.",
            "",
        ]
    if batched:
        parts += [
            table(
                ["codec", "tcp", "grpcio", "grpclib", "grpclib / grpcio", "grpclib / tcp"],
                (
                    [
                        f"`{i['codec']}`",
                        _cell(i, "tcp_us_per_token", _us),
                        _cell(i, "grpcio_us_per_token", _us),
                        _cell(i, "grpclib_us_per_token", _us),
                        _cell(i, "vs_grpcio"),
                        _cell(i, "vs_tcp"),
                    ]
                    for i in batched
                ),
            ),
            "",
            "Per token: `GenerateBatched`, `stream-256`, no pacing.",
            "",
        ]
    if unary:
        parts += [
            table(
                [
                    "codec",
                    "grpcio",
                    "grpclib",
                    "grpclib / grpcio",
                    "client on grpcio / grpcio",
                    "server, grpcio client / grpcio",
                    "correct",
                ],
                (
                    [
                        f"`{i['codec']}`",
                        _cell(i, "grpcio_us_per_call", _us),
                        _cell(i, "grpclib_us_per_call", _us),
                        _cell(i, "vs_grpcio"),
                        _cell(i, "client_vs_grpcio"),
                        _cell(i, "server_vs_grpcio"),
                        _yes(i),
                    ]
                    for i in unary
                ),
            ),
            "",
            "Per unary call: `Infer` of a 16-float tensor.",
            "",
        ]
    return parts


def advice_rows(raw_dir: Path, tie: float) -> list[list[str]]:
    """The advice's line for a Python gRPC service, grpcio or grpclib, from the median over
    the codecs of grpclib's paired ratio to grpcio per message (``Generate``: a token stream's
    cost); within ``tie`` of 1 the two are named together. [] when the run has no grpclib
    rows."""
    floor = [i for i in _of(raw_dir, "grpclib-floor") if i["correct"]]
    if not floor:
        return []
    per_message = statistics.median(float(i["vs_grpcio"]) for i in floor)
    margin = f"`grpclib` takes {per_message:.2f}x `grpcio`'s time per message"
    others = {}
    for op, what in (("grpclib-batched", "per token batched"), ("grpclib-unary", "per call")):
        ratios = [float(i["vs_grpcio"]) for i in _of(raw_dir, op) if i["correct"]]
        if ratios:
            others[op] = statistics.median(ratios)
            margin += f", {others[op]:.2f}x {what}"
    if per_message > 1 + tie:
        use = "`grpcio`"
        changes = "the service must be pure Python (no compiled wheel): `grpclib`, at that cost"
    elif per_message < 1 - tie:
        use = "`grpclib`"
        unary = others.get("grpclib-unary", 1.0)
        changes = (
            f"mostly unary calls (`grpclib` {unary:.2f}x per call): `grpcio`"
            if unary > 1 + tie
            else "the service needs grpc's health, reflection or KServe services here: `grpcio`"
        )
    else:
        use = f"`grpcio` (`grpclib` within {tie:.0%})"
        changes = "either; they interoperate both ways on the same proto"
    return [["token stream", "gRPC in a Python service", use, margin, changes]]
