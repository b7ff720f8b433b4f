"""What serving code pays per token, measured: the same FastAPI app on uvicorn streams the same
tokens as vLLM does, as a typical app does, and through :mod:`inferwire.serving`.

Server side (``bench_serving_server``): one server process
(:mod:`inferwire.bench.procs.serving_app`), its routes the paths compared:

* ``pydantic``: vLLM's OpenAI server, a pydantic chunk model per chunk and
  ``model_dump_json(exclude_unset=True)`` (the baseline);
* ``dicts``: a typical app, a dict per chunk and ``json.dumps``;
* ``orjson``, ``msgspec-json``, ``delta``: the helpers (``ChunkBuilder`` and
  ``inferwire.serving.starlette.stream_response``) with that codec; the JSON ones write the
  same bytes as the baseline, ``delta`` its binary stream (asked for by ``Accept``). The
  helpers write the chunks the generator has ready at once in one write (never waiting for
  one), where the other ways write one a chunk; ``orjson-per-chunk`` is the helpers with
  one write a chunk too (``coalesce=1``), which separates the encoding's share of the gain
  from the writes'.

Method:

* the server process is pinned to one core and the client (this process) to the other;
* a round of a path is ``STREAMS`` ``stream-256`` streams (256 chunks of one token each), at
  most ``CONCURRENCY`` at a time, no pacing, over httpx (HTTP/1.1, one pool per round); tokens
  per server CPU-second divides the tokens by the server process's CPU time over the round
  (user + system of every thread, read from the process's CPU clock in nanoseconds: psutil's
  ``cpu_times`` counts 10 ms ticks, coarse beside a round of a few hundred ms);
* every path runs once per pair round, in an order rotated each round, ``PAIRS`` rounds after
  one warm-up round each; each path's ratio to ``pydantic`` is taken within a round and the
  median over rounds recorded (the range beside it): a shared machine's drift hits every path
  of a round alike;
* every stream is decoded by the client (the helper's :func:`inferwire.serving.httpx.aiter_chunks`)
  and compared with the workload: text of every chunk, the finish reason, and for ``delta`` the
  token ids; a wrong stream fails the benchmark.

The chunks alone (``bench_serving_encode``, in process): each way's generator drained as its
route hands it to the response, one piece a chunk, no server: the making and encoding of a
chunk without the framework's cost, per chunk, in interleaved shuffled rounds.

Client side (``bench_serving_client``, in process): one whole ``stream-256`` response as the
baseline server writes it, handed over one event a read, parsed by the openai SDK (its
``Stream`` of ``ChatCompletionChunk``, as ``client.chat.completions.create(stream=True)``
yields them) and by the helper (``iter_chunks``, the ``orjson`` reader); the ``delta`` stream by
the helper too. Interleaved rounds in a shuffled order, per chunk, median over rounds; the
SDK's time over the helper's is the ratio, per round, then the median.

The target: every helper path at least 3x the ``pydantic`` path's tokens per server CPU-second.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import random
import statistics
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Final

import httpx
import pytest

import inferwire.codecs as ic
import inferwire.serving as iws
from inferwire._runtime import loops
from inferwire.bench.measure.serving_rounds import BASELINE, HELPERS, PATHS, Server, run_pairs
from inferwire.bench.procs import placement, serving_app
from inferwire.bench.report.serving import CLIENT_GROUP, ENCODE_GROUP, SERVER_GROUP
from inferwire.serving import httpx as iws_httpx
from inferwire.transports import server_process

TARGET_RATIO: Final = 3.0
STREAMS: Final = 24
"""Streams per round of a path: 6,144 tokens, about 0.1-0.3 s of server CPU."""
CONCURRENCY: Final = 8
PAIRS: Final = 7
CLIENT_ROUNDS: Final = 40


@dataclass(slots=True)
class _Env:
    loop: asyncio.AbstractEventLoop
    process: server_process.ServerProcess
    server: Server
    pinned: bool


@pytest.fixture(scope="module")
def env() -> Iterator[_Env]:
    own = os.sched_getaffinity(0)
    split = placement.split_cores()
    process = serving_app.serving_app().start()
    assert process.process is not None
    pid = process.process.pid
    if split is not None:
        placement.pin_threads(pid, split[0])
        os.sched_setaffinity(0, {split[1]})
    environment = _Env(
        loop=loops.new_event_loop(loops.requested_loop()),
        process=process,
        server=Server(f"http://{process.address}", pid, list(serving_app.steps(0))),
        pinned=split is not None,
    )
    try:
        yield environment
    finally:
        environment.loop.close()
        process.stop()
        os.sched_setaffinity(0, own)


def _interleaved(
    benchmark: Any, ways: Mapping[str, Callable[[], object]], rounds: int, chunks: int
) -> dict[str, list[float]]:
    """Each way's seconds per chunk in each of ``rounds`` rounds, every way once a round in a
    seeded shuffled order (a shared machine's drift hits them alike), the garbage collector
    off while they run: the one timed call of ``benchmark``."""
    times: dict[str, list[float]] = {name: [] for name in ways}
    rng = random.Random(18)

    def run() -> None:
        order = list(ways)
        for _ in range(rounds):
            rng.shuffle(order)
            for name in order:
                start = time.perf_counter()
                ways[name]()
                times[name].append((time.perf_counter() - start) / chunks)

    gc.collect()
    gc.disable()
    try:
        benchmark.pedantic(run, rounds=1, iterations=1)
    finally:
        gc.enable()
    return times


def _drain_on(loop: asyncio.AbstractEventLoop, make: Callable[[], Any]) -> object:
    return loop.run_until_complete(_drain(make()))


def _versions() -> dict[str, str]:
    names = ["inferwire", "fastapi", "starlette", "uvicorn", "pydantic", "orjson", "msgspec"]
    names += ["httpx", "openai"] + (["uvloop"] if loops.uvloop_installed() else [])
    return {name: metadata.version(name) for name in names}


def bench_serving_server(benchmark: Any, env: _Env) -> None:
    """Every path's rounds, interleaved; the figures are in ``extra_info["paths"]``."""
    benchmark.group = SERVER_GROUP
    disabled = benchmark.disabled
    streams, concurrency, pairs = (2, 2, 1) if disabled else (STREAMS, CONCURRENCY, PAIRS)
    load_average_1m = os.getloadavg()[0]
    outcome: dict[str, Any] = {}

    def run() -> None:
        outcome.update(run_pairs(env.loop, env.server, streams, concurrency, pairs))

    benchmark.pedantic(run, rounds=1, iterations=1)
    helpers = {name: outcome[name]["vs_pydantic"] for name in HELPERS}
    benchmark.extra_info.update(
        workload=serving_app.WORKLOAD,
        streams_per_round=streams,
        concurrency=concurrency,
        pairs=pairs,
        baseline=BASELINE,
        target_ratio=TARGET_RATIO,
        paths=outcome,
        meets_target=min(helpers.values()) >= TARGET_RATIO,
        correct=all(p["correct"] for p in outcome.values()),
        pinned=env.pinned,
        load_average_1m=load_average_1m,
        loop=loops.kind(env.loop),
        server_loop=env.process.loop,
        versions=_versions(),
    )
    assert benchmark.extra_info["correct"], "a stream differs from the workload's tokens"


# -- the chunks alone, in process ----------------------------------------------------------

ENCODE_ROUNDS: Final = 40


def _making(name: str) -> Callable[[], AsyncIterator[bytes | str]]:
    """The route's stream of ``name``'s way without a server: its generator as the route hands
    it to the response (the helpers' one piece a chunk, as the other ways write)."""
    if name == "pydantic":
        return lambda: serving_app._pydantic("m", 0)
    if name == "dicts":
        return lambda: serving_app._dicts("m", 0)
    codec = ic.get(PATHS[name].codec)
    return lambda: iws.stream_body(serving_app._helpers("m", 0), codec, coalesce=1)


async def _drain(stream: AsyncIterator[bytes | str]) -> int:
    size = 0
    async for piece in stream:  # a str goes out encoded, as StreamingResponse does
        size += len(piece.encode() if isinstance(piece, str) else piece)
    return size


def bench_serving_encode(benchmark: Any) -> None:
    """Each way's chunks made and encoded in process, per chunk: the server's cost without
    the framework's (interleaved rounds, shuffled; the ratio to ``pydantic`` per round)."""
    benchmark.group = ENCODE_GROUP
    rounds = 2 if benchmark.disabled else ENCODE_ROUNDS
    names = [n for n in PATHS if n != "orjson-per-chunk"]
    makers = {name: _making(name) for name in names}
    chunks = len(serving_app.steps(0))
    loop = loops.new_event_loop(loops.requested_loop())
    sizes = {name: loop.run_until_complete(_drain(make())) for name, make in makers.items()}
    try:
        times = _interleaved(
            benchmark,
            {name: functools.partial(_drain_on, loop, makers[name]) for name in names},
            rounds,
            chunks,
        )
    finally:
        loop.close()
    base = times[BASELINE]
    benchmark.extra_info.update(
        workload=serving_app.WORKLOAD,
        chunks=chunks,
        rounds=rounds,
        ways={
            name: {
                "us_per_chunk": statistics.median(t) * 1e6,
                "vs_pydantic": statistics.median(b / x for b, x in zip(base, t, strict=True)),
                "wire_bytes_per_chunk": sizes[name] / chunks,
            }
            for name, t in times.items()
        },
        versions=_versions(),
    )


# -- the client side -----------------------------------------------------------------------


def _pieces(codec: str | None) -> list[bytes]:
    """One response's events as the server writes them: the baseline's (``None``) or the
    helpers' in ``codec``."""

    async def collect() -> list[bytes]:
        if codec is None:
            return [s.encode() async for s in serving_app._pydantic("m", 0)]
        chunks = serving_app._helpers("m", 0)
        return [p async for p in iws.stream_body(chunks, ic.get(codec))]

    return asyncio.run(collect())


def bench_serving_client(benchmark: Any) -> None:
    """The openai SDK's parsing of a stream against the helper's decoder, per chunk."""
    import httpx2
    import openai
    from openai.types.chat import ChatCompletionChunk

    benchmark.group = CLIENT_GROUP
    rounds = 2 if benchmark.disabled else CLIENT_ROUNDS
    sse, delta = _pieces(None), _pieces("delta")
    expected = "".join(text for text, _ in serving_app.steps(0))
    sdk = openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1", max_retries=0)
    url = "http://127.0.0.1:9/v1/chat/completions"

    def with_sdk() -> str:
        response = httpx2.Response(
            200,
            headers={"content-type": "text/event-stream"},
            content=iter(sse),
            request=httpx2.Request("POST", url),
        )
        stream = openai.Stream(cast_to=ChatCompletionChunk, response=response, client=sdk)
        return "".join(c.choices[0].delta.content or "" for c in stream)

    def with_helper(pieces: list[bytes], media: str) -> str:
        response = httpx.Response(
            200,
            headers={"content-type": media},
            content=iter(pieces),
            request=httpx.Request("POST", url),
        )
        return "".join(c.text for c in iws_httpx.iter_chunks(response))

    parsers: dict[str, Callable[[], str]] = {
        "openai-sdk": with_sdk,
        "helper-orjson": lambda: with_helper(sse, "text/event-stream"),
        "helper-delta": lambda: with_helper(delta, "application/vnd.inferwire.delta"),
    }
    correct = {name: parse() == expected for name, parse in parsers.items()}
    chunks = len(serving_app.steps(0))
    times = _interleaved(benchmark, parsers, rounds, chunks)
    sdk_times = times["openai-sdk"]
    benchmark.extra_info.update(
        workload=serving_app.WORKLOAD,
        chunks=chunks,
        rounds=rounds,
        parsers={
            name: {
                "us_per_chunk": statistics.median(t) * 1e6,
                "vs_sdk": statistics.median(s / h for s, h in zip(sdk_times, t, strict=True)),
                "correct": correct[name],
            }
            for name, t in times.items()
        },
        correct=all(correct.values()),
        versions=_versions(),
    )
    assert all(correct.values()), f"a parser read the stream wrong: {correct}"
