"""The answer to the second half of the question, "what should I use instead?", from the run.

Fixed rules over figures of the run, as the claim verdicts are, and nothing the run did not
measure. For each payload kind (a token stream without and with logprobs, embeddings, an image
tensor) and each situation:

- *browser or OpenAI SDK*: the client parses OpenAI JSON over HTTP/1.1 (SSE for streams), so
  the choice is which JSON codec the server writes it with: the one whose encode is fastest,
  paired against stdlib ``json`` (the common default) in the same interleaved rounds;
- *service to service*: both ends are yours, any codec and transport: the codec with the least
  encode + decode time (each half paired against ``json`` in its own interleaved rounds,
  weighted by ``json``'s own time for it), and the transport (``http1``, ``http2``, ``grpc``)
  with the lowest cost paired against the ``tcp`` floor for that kind of call (per token for
  streams, a small unary call otherwise);
- *long round trip*: what the WAN-delay runs show: one stream instead of a request per token,
  on a reused connection, with the smallest codec on the wire;
- *in your Python server* (token streams, from the serving suite): the fastest JSON codec
  through the :mod:`inferwire.serving` helpers, as its tokens per server CPU-second against
  vLLM's pydantic chunks in a FastAPI app, paired (the same OpenAI bytes), with ``delta``'s
  figure for clients that read it.

Codecs within ``TIE`` of the best are named together: the run cannot tell them apart, and a
reader should not be told otherwise. The answer among them is the first in the codec
registry's order, so a draw does not change it from one repeat to the next.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from . import grpc, kserve_shm, serving, vllm_hop
from .codecs import VARIANTS
from .results import CODECS_RAW, CONNECTIONS_RAW, STAGES_RAW, TRANSPORTS_RAW, records
from .tables import table

TIE: Final = 0.10
"""Codecs (or transports) whose figures are within this share of the best are named together."""
PAYLOADS: Final = (
    ("token stream", "stream-256"),
    ("token stream with top-5 logprobs", "stream-256-top5"),
    ("embeddings", "embed-32x1024"),
    ("image tensor", "image-fp32"),
)
JSON_CODECS: Final = ("json", "orjson", "msgspec-json")
DEFAULT_CODEC: Final = "json"
REAL_TRANSPORTS: Final = ("http1", "http2", "grpc")


@dataclass(frozen=True, slots=True, kw_only=True)
class Interleaved:
    """One interleaved codec benchmark: every codec's time and its speed-up over json."""

    workload: str
    op: str
    median_s: dict[str, float]
    wire_bytes: dict[str, int]
    vs_json: dict[str, float]


def _interleaved(raw_dir: Path) -> dict[tuple[str, str], Interleaved]:
    found = {}
    for info in records(raw_dir / CODECS_RAW):
        codecs = info.get("codecs")
        if not isinstance(codecs, Mapping) or "vs_json" not in info:
            continue
        # a variant is a codec on its reference path, not a choice of its own
        found[(info["workload"], info["op"])] = Interleaved(
            workload=info["workload"],
            op=info["op"],
            median_s={c: float(v["median_s"]) for c, v in codecs.items() if c not in VARIANTS},
            wire_bytes={c: int(v["wire_bytes"]) for c, v in codecs.items() if c not in VARIANTS},
            vs_json={c: float(v) for c, v in info["vs_json"].items() if c not in VARIANTS},
        )
    return found


def _best(scores: Mapping[str, float], *, higher: bool) -> tuple[str, list[str]]:
    """The answer and the others within ``TIE`` of the top figure.

    Among names within ``TIE`` of the top the run cannot tell which is faster, so the answer
    is the first of them in the order ``scores`` lists them (the codec registry's order), not
    whichever won this run's draw: a fixed rule gives the same answer in every repeat."""
    top = max(scores.values()) if higher else min(scores.values())
    within = [
        name
        for name, value in scores.items()
        if (value >= top * (1 - TIE) if higher else value <= top * (1 + TIE))
    ]
    return within[0], within[1:]


def _named(best: str, close: list[str]) -> str:
    return f"`{best}`" + (f" (`{'`, `'.join(close)}` within {TIE:.0%})" if close else "")


def _round_trip_speedups(enc: Interleaved, dec: Interleaved) -> dict[str, float]:
    """encode + decode speed-up over json: each half's paired speed-up, weighted by json's time
    for that half (json's encode and decode medians of the same rounds)."""
    json_enc, json_dec = enc.median_s[DEFAULT_CODEC], dec.median_s[DEFAULT_CODEC]
    out = {}
    for codec in enc.vs_json:
        if codec in dec.vs_json and enc.vs_json[codec] > 0 and dec.vs_json[codec] > 0:
            codec_time = json_enc / enc.vs_json[codec] + json_dec / dec.vs_json[codec]
            out[codec] = (json_enc + json_dec) / codec_time
    return out


def _transport_costs(raw_dir: Path, op: str) -> dict[str, dict[str, float]]:
    """Per transport, per codec: the paired ratio against ``tcp`` for ``op``."""
    costs: dict[str, dict[str, float]] = {}
    for info in records(raw_dir / TRANSPORTS_RAW):
        if info.get("op") == op and info.get("transport") in REAL_TRANSPORTS:
            costs.setdefault(info["transport"], {})[info["codec"]] = float(info["vs_tcp"])
    return costs


def _transport_pick(raw_dir: Path, op: str, codec: str) -> str:
    costs = _transport_costs(raw_dir, op)
    if not costs:
        return "(no transport figures in this run)"
    # the codec itself when the suite timed it, else the median over the codecs it timed
    by_transport = {}
    for transport, per_codec in costs.items():
        values = sorted(per_codec.values())
        by_transport[transport] = per_codec.get(codec, values[len(values) // 2])
    best, close = _best(by_transport, higher=False)
    what = "per token" if op == "stream" else "per small call"
    text = f"{_named(best, close)}: {by_transport[best]:.2f}x `tcp` {what}"
    if best != "http1" and "http1" in by_transport:
        text += f" (`http1` {by_transport['http1']:.2f}x)"
    return text


def _wan_figures(raw_dir: Path) -> str:
    """The long-round-trip facts the run measured: stream vs request per token, and what a
    reused connection saves, at the largest delay."""
    parts = []
    shares: dict[str, list[float]] = {}
    for info in records(raw_dir / STAGES_RAW):
        if info.get("op") == "wan-share" and "network_share" in info:
            shares.setdefault(info["pattern"], []).append(float(info["network_share"]))
    if "stream" in shares and "request-per-token" in shares:
        parts.append(
            f"network share {max(shares['stream']):.0%} streamed vs "
            f"{min(shares['request-per-token']):.0%} with a request per token"
        )
    saved = [
        float(info["saved"])
        for info in records(raw_dir / CONNECTIONS_RAW)
        if "saved" in info and info.get("delay_ms", 0) and info.get("concurrency") == 1
    ]
    if saved:
        parts.append(f"a reused connection saves {min(saved):.0%}-{max(saved):.0%} of a call")
    return "; ".join(parts)


def rows(raw_dir: Path) -> list[list[str]]:
    groups = _interleaved(raw_dir)
    out = []
    wan = _wan_figures(raw_dir)
    for label, workload in PAYLOADS:
        enc, dec = groups.get((workload, "encode")), groups.get((workload, "decode"))
        if enc is None or dec is None or DEFAULT_CODEC not in enc.median_s:
            continue
        stream = workload.startswith("stream")
        op = "stream" if stream else "unary"
        json_encoders = {c: v for c, v in enc.vs_json.items() if c in JSON_CODECS}
        best, close = _best(json_encoders, higher=True)
        out.append(
            [
                label,
                "browser or OpenAI SDK",
                f"{_named(best, close)} over `http1`",
                f"{json_encoders[best]:.1f}x faster server encode than `json`; same bytes",
                "the client can take a binary format: see service to service",
            ]
        )
        speedups = _round_trip_speedups(enc, dec)
        best, close = _best(speedups, higher=True)
        size = enc.wire_bytes[best] / enc.wire_bytes[DEFAULT_CODEC]
        out.append(
            [
                label,
                "service to service",
                f"{_named(best, close)}; {_transport_pick(raw_dir, op, best)}",
                f"encode + decode {speedups[best]:.1f}x faster than `json`, {size:.0%} of its "
                "bytes",
                "a client that must read OpenAI JSON: see browser",
            ]
        )
        smallest = min(enc.wire_bytes, key=lambda c: (enc.wire_bytes[c], c))
        share = enc.wire_bytes[smallest] / enc.wire_bytes[DEFAULT_CODEC]
        out.append(
            [
                label,
                "long round trip",
                f"`{smallest}` (fewest bytes)" + (", one stream per response" if stream else ""),
                f"{share:.0%} of `json`'s bytes" + (f"; {wan}" if wan else ""),
                "bandwidth is plentiful and the RTT small: the service-to-service choice",
            ]
        )
    out += _server_rows(raw_dir)
    out += grpc.advice_rows(raw_dir, TIE)  # grpcio or grpclib, when the run measured grpclib
    out += kserve_shm.advice_rows(raw_dir, TIE)  # a big tensor on the server's host
    out += _websocket_rows(raw_dir)
    out += vllm_hop.advice_rows(raw_dir)
    return out


def _websocket_rows(raw_dir: Path) -> list[list[str]]:
    """The answer for a browser or realtime client over a WebSocket (none when the run did
    not measure the ``websocket`` transport): OpenAI's JSON chunks as text messages, their cost
    per token against ``tcp``, and a connection's setup."""
    found = records(raw_dir / TRANSPORTS_RAW)
    per_token = {
        info["codec"]: float(info["vs_tcp"])
        for info in found
        if info.get("transport") == "websocket" and info.get("op") == "stream"
    }
    if "orjson" not in per_token:
        return []
    margin = f"`websocket` {per_token['orjson']:.2f}x `tcp` per token (`orjson`)"
    binary = {codec: ratio for codec, ratio in per_token.items() if codec not in JSON_CODECS}
    if binary:
        best = min(binary, key=lambda c: (binary[c], c))
        margin += f"; `{best}` by subprotocol: {binary[best]:.2f}x"
    setup = [
        float(info["median_s"]) / int(info.get("calls", 1))
        for info in found
        if info.get("transport") == "websocket-new-connection" and info.get("codec") == "orjson"
    ]
    if setup:
        margin += f"; a new connection and round trip {setup[0] * 1e6:,.0f} us"
    return [
        [
            "token stream",
            "browser or realtime client (WebSocket)",
            "`orjson` over `websocket`, text messages",
            margin,
            "the client reads server-sent events over HTTP: see browser or OpenAI SDK",
        ]
    ]


def _server_rows(raw_dir: Path) -> list[list[str]]:
    """The serving suite's answer for a Python server's token streams (none without it)."""
    found = serving.best_helper(raw_dir)
    if found is None:
        return []
    best, ratio, delta = found
    margin = f"{ratio:.1f}x the tokens per server CPU-second of vLLM's pydantic chunks"
    if delta:
        margin += f" (`delta`, to clients that read it: {delta:.1f}x)"
    return [
        [
            "token stream",
            "in your Python server (FastAPI, Starlette, aiohttp)",
            f"`{best}` through the `inferwire.serving` helpers",
            margin + "; same bytes as vLLM's",
            "the server is not Python, or its chunks are not built per token",
        ]
    ]


def verdict_rows(raw_dir: Path) -> list[list[str]]:
    """[payload and situation, the answer]: what the reproducibility section compares per
    repeat (the names chosen, without the figures, which move a little in every repeat)."""
    return [[f"{row[0]}, {row[1]}", _names(row[2])] for row in rows(raw_dir)]


def _names(use: str) -> str:
    """The codec and transport named first in a *use* cell: "`delta` over `http1`"."""
    chosen = [part.split("`")[1] for part in use.split(";") if part.count("`") >= 2]
    return " over ".join(f"`{name}`" for name in chosen)


def section(raw_dir: Path) -> str:
    found = rows(raw_dir)
    if not found:
        return ""
    return "\n".join(
        [
            "## What should I use?",
            "",
            "From this run, by fixed rules (`bench/report/advice.py`): for each payload and "
            "situation, the best codec and transport measured, its margin over the common "
            "default (stdlib `json`: OpenAI JSON over SSE, or JSON tensors), and when the answer "
            "changes. Speed-ups are paired within interleaved rounds; codecs within "
            f"{TIE:.0%} of the best are named beside it.",
            "",
            table(
                ["payload", "situation", "use", "margin over the default", "changes when"],
                found,
                left=range(5),
            ),
            "",
        ]
    )
