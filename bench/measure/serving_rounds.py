"""The rounds of the serving benchmark (``bench/bench_serving.py``): the ways of the serving app
(:mod:`inferwire.bench.procs.serving_app`) driven over httpx, every stream decoded and checked,
and the server's CPU time per round read from its process's CPU clock; see the suite's
docstring for the method."""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
from dataclasses import dataclass
from typing import Any, Final

import httpx

import inferwire.codecs as ic
import inferwire.serving as iws
from inferwire.bench.procs import placement
from inferwire.serving import httpx as iws_httpx

BASELINE: Final = "pydantic"
Steps = list[tuple[str, tuple[int, ...]]]
"""The text and token ids of each step of the expected stream."""


@dataclass(frozen=True, slots=True)
class Server:
    """The serving app's process: where it answers, its pid, and the stream it sends."""

    base_url: str
    pid: int
    expected: Steps


BODY: Final = b'{"messages":[{"role":"user","content":"Generate."}],"stream":true}'


@dataclass(frozen=True, slots=True)
class Path:
    """One way of the serving app: its route, and the codec whose reader reads its bytes."""

    label: str
    route: str
    codec: str
    """The codec whose reader the client uses (what the route's bytes are)."""


PATHS: Final = {
    "pydantic": Path(
        "vLLM: pydantic chunk models, model_dump_json", "/pydantic/v1/chat/completions", "orjson"
    ),
    "dicts": Path("typical app: dicts, json.dumps", "/dicts/v1/chat/completions", "orjson"),
    "orjson-per-chunk": Path(
        "helpers, orjson, one write a chunk",
        "/helpers/orjson/v1/chat/completions?coalesce=1",
        "orjson",
    ),
    "orjson": Path("helpers, orjson", "/helpers/orjson/v1/chat/completions", "orjson"),
    "msgspec-json": Path(
        "helpers, msgspec-json", "/helpers/msgspec-json/v1/chat/completions", "msgspec-json"
    ),
    "delta": Path("helpers, delta", "/helpers/delta/v1/chat/completions", "delta"),
}
HELPERS: Final = ("orjson", "msgspec-json", "delta")
"""The helper ways the target is judged on (their defaults: ready chunks in one write)."""


@dataclass(slots=True)
class Round:
    """What one round of one way added up to."""

    tokens: int = 0
    server_cpu_ns: int = 0
    wall_s: float = 0.0
    wire_bytes: int = 0
    chunks: int = 0
    correct: bool = True

    @property
    def per_cpu_s(self) -> float:
        return self.tokens / max(self.server_cpu_ns / 1e9, 1e-3)


async def _one(client: httpx.AsyncClient, path: Path, result: Round, expected: Steps) -> None:
    headers = {"content-type": "application/json", "accept": iws_httpx.accept(path.codec)}
    async with client.stream("POST", path.route, content=BODY, headers=headers) as response:
        size = 0
        reader = iws.reader_for(response.headers.get("content-type", ""), path.codec)
        chunks: list[ic.TokenChunk] = []
        async for data in response.aiter_bytes():
            size += len(data)
            chunks += reader.feed(data)
        reader.close()
    result.wire_bytes += size
    result.chunks += len(chunks)
    result.tokens += len(chunks)  # one token a chunk in this workload (checked below)
    ok = [c.text for c in chunks] == [text for text, _ in expected]
    ok &= [c.finish_reason for c in chunks[-2:]] == [None, "stop"]
    if path.codec == "delta":
        ok &= [c.token_ids for c in chunks] == [ids for _, ids in expected]
    result.correct &= ok and all(len(ids) == 1 for _, ids in expected)


async def one_round(server: Server, path: Path, streams: int, concurrency: int) -> Round:
    """``streams`` streams of ``path``, ``concurrency`` at a time, each decoded and checked;
    the server's CPU time over them from its process's CPU clock."""
    result = Round()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=server.base_url, limits=limits, timeout=60) as client:
        remaining = streams

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await _one(client, path, result, server.expected)

        clock = placement.cpu_clock(server.pid)
        start_cpu, start = time.clock_gettime_ns(clock), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(min(concurrency, streams))))
        result.wall_s = time.perf_counter() - start
        result.server_cpu_ns = time.clock_gettime_ns(clock) - start_cpu
    return result


def run_pairs(
    loop: asyncio.AbstractEventLoop, server: Server, streams: int, concurrency: int, pairs: int
) -> dict[str, Any]:
    """Every way once per round, in an order rotated each round, ``pairs`` rounds after a
    warm-up round each: each way's figures, and its ratio to :data:`BASELINE` within each
    round (median, lowest, highest)."""
    names = list(PATHS)
    for name in names:  # warm-up: connections, imports, first paths of each route
        loop.run_until_complete(one_round(server, PATHS[name], concurrency, concurrency))
    rounds: dict[str, list[Round]] = {name: [] for name in names}
    ratios: dict[str, list[float]] = {name: [] for name in names}
    gc.collect()
    for i in range(pairs):
        order = names[i % len(names) :] + names[: i % len(names)]
        got = {
            n: loop.run_until_complete(one_round(server, PATHS[n], streams, concurrency))
            for n in order
        }
        for name in names:
            rounds[name].append(got[name])
            ratios[name].append(got[name].per_cpu_s / got[BASELINE].per_cpu_s)
    paths: dict[str, Any] = {}
    for name in names:
        done = rounds[name]
        tokens = sum(r.tokens for r in done)
        cpu_s = sum(r.server_cpu_ns for r in done) / 1e9
        wall_s = sum(r.wall_s for r in done)
        paths[name] = {
            "label": PATHS[name].label,
            "codec": PATHS[name].codec,
            "tokens": tokens,
            "tokens_per_server_cpu_s": statistics.median(r.per_cpu_s for r in done),
            "server_us_per_token": cpu_s * 1e6 / max(tokens, 1),
            "tokens_per_s": tokens / max(wall_s, 1e-9),
            "server_cpu_utilization": cpu_s / max(wall_s, 1e-9),
            "wire_bytes_per_chunk": sum(r.wire_bytes for r in done)
            / max(1, sum(r.chunks for r in done)),
            "vs_pydantic": statistics.median(ratios[name]),
            "vs_pydantic_low": min(ratios[name]),
            "vs_pydantic_high": max(ratios[name]),
            "correct": all(r.correct for r in done),
        }
    return paths
