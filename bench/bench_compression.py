"""Content codings (gzip, br, zstd) on what an inference server sends: bytes and CPU per token
with and without each, and the time a whole answer takes over a slow link.

Three benchmarks, every figure of each from interleaved rounds (each coding once per round, in
an order rotated every round; medians over rounds, ratios to ``identity`` taken within a round):

* ``bench_compression_codecs`` (in process, per codec): the frames of a ``stream-256`` token
  stream as a paced server writes them, one chunk a write (OpenAI SSE events for ``orjson``,
  the binary codecs' frames for ``protobuf`` and ``delta``), each compressed and flushed as the
  server's stream compressor does (:mod:`inferwire.transports.compression`) and decoded by the
  client's bounded decoder. Bytes per token, and the encode and decode time per token; no
  socket, so the figures are the coding's alone. The same for one unary body: the non-streamed
  chat completion of ``stream-256`` with inferwire's token ids (the body the wire rows fetch).
* ``bench_compression_wire``: ``inferwire serve --transport http1 --compress auto`` in its own
  process (pinned to one core, this client to the other), our HTTP/1.1 client asking for each
  coding (none for ``identity``): one ``stream-256`` stream, paced at ``PACED_DECODE_MS`` per
  token (one event a write, as a model makes them) and unpaced (the server writes the events
  that are due at once, up to 32), and one unary body. Bytes per token as they crossed the
  socket (the client's count of body bytes, chunked framing aside), and CPU per token: the
  server process's CPU time plus this client thread's, over the stream's tokens. Every stream
  and body is checked against the uncompressed one.
* ``bench_compression_wan``: the same server and client through the WAN proxy
  (:class:`~inferwire.transports.proxy.DelayProxy`: ``WAN_DELAY_MS`` one way and a bandwidth
  cap per direction, in userspace: this kernel has no netem), per link: the time from the
  request to the last byte of an unpaced ``stream-256`` stream and of the unary body. A ratio
  under 1 is where compression pays; over 1, where it costs.

The machine is shared and small (2 cores): absolute figures move, the within-round ratios are
what carries.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Final

import orjson
import pytest

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime import loops
from inferwire.bench.procs import placement
from inferwire.transports import compression as cz
from inferwire.transports import server_process
from inferwire.transports.http1.pool import HttpPool, Origin
from inferwire.workloads import token_stream_source

CODINGS: Final = ("identity", "gzip", "br", "zstd")
CODECS: Final = ("orjson", "protobuf", "delta")
WORKLOAD: Final = "stream-256"
ROUNDS: Final = 15
"""In-process rounds: a round of all four codings on one codec's stream is about 10 ms."""
WIRE_ROUNDS: Final = 7
PACED_DECODE_MS: Final = 1.0
"""Fast enough to keep a round short (a stream is about 0.3 s), slow enough that the server
writes one event at a time, as it does behind a model."""
WAN_DELAY_MS: Final = 20.0
LINKS_MBPS: Final = (None, 100.0, 10.0, 2.0)
"""Bandwidth caps per direction (None: the delay alone): a datacenter link, a good and a poor
user's connection."""
WAN_ROUNDS: Final = 5
UNARY_BODY: Final = orjson.dumps(
    {
        "messages": [{"role": "user", "content": "Generate."}],
        "workload": WORKLOAD,
        "stream": False,
        "inferwire": {"extensions": True},
    }
)


def _rotated(names: tuple[str, ...], round_index: int) -> list[str]:
    shift = round_index % len(names)
    return [*names[shift:], *names[:shift]]


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def _decoder(coding: str) -> cz.Decoder | None:
    return None if coding == "identity" else cz.Decoder(coding, max_piece_bytes=64 << 20)


# -- in process ----------------------------------------------------------------------------


def _frames(codec_name: str) -> tuple[list[bytes], int]:
    """A paced server's writes of the workload, one chunk each (end marker included), and the
    stream's tokens."""
    chunks = list(token_stream_source(WORKLOAD, 0))
    codec = ic.get(codec_name, extensions=codec_name != "orjson")
    encoder = codec.stream_encoder()
    frames = [encoder.encode(chunk) for chunk in chunks]
    end = encoder.end()
    if end:
        frames.append(end)
    return frames, sum(len(c.token_ids) for c in chunks)


def _one_stream(coding: str, frames: list[bytes]) -> tuple[int, int, int, bool]:
    """(wire bytes, encode ns, decode ns, whole and equal) of one stream in ``coding``."""
    if coding == "identity":
        return sum(map(len, frames)), 0, 0, True
    compressor = cz.Compression().stream_compressor(coding)
    decoder = _decoder(coding)
    assert decoder is not None
    encode_ns = decode_ns = wire = 0
    equal = True
    clock = time.perf_counter_ns
    for frame in frames:
        started = clock()
        piece = compressor.compress(frame)
        encoded = clock()
        out = decoder.feed(piece)
        decode_ns += clock() - encoded
        encode_ns += encoded - started
        wire += len(piece)
        equal &= out == frame
    started = clock()
    last = compressor.finish()
    encoded = clock()
    equal &= decoder.feed(last) == b""
    decoder.close()
    decode_ns += clock() - encoded
    encode_ns += encoded - started
    return wire + len(last), encode_ns, decode_ns, equal


def _one_body(coding: str, body: bytes) -> tuple[int, int, int, bool]:
    if coding == "identity":
        return len(body), 0, 0, True
    clock = time.perf_counter_ns
    started = clock()
    packed = cz.Compression().compress_body(coding, body)
    encoded = clock()
    decoder = _decoder(coding)
    assert decoder is not None
    out = decoder.feed(packed)
    decoder.close()
    return len(packed), encoded - started, clock() - encoded, out == body


def _interleaved(
    one: Callable[[str], tuple[int, int, int, bool]], tokens: int, rounds: int
) -> dict[str, dict[str, Any]]:
    """Every coding once per round, rotated; per coding: bytes, and encode and decode us per
    token (medians over rounds), whether every round was correct."""
    times: dict[str, list[tuple[int, int]]] = {c: [] for c in CODINGS}
    wire: dict[str, int] = {}
    correct = dict.fromkeys(CODINGS, True)
    for i in range(rounds):
        for coding in _rotated(CODINGS, i):
            size, encode_ns, decode_ns, equal = one(coding)
            wire[coding] = size
            times[coding].append((encode_ns, decode_ns))
            correct[coding] &= equal
    plain = wire["identity"]
    return {
        coding: {
            "bytes": wire[coding],
            "bytes_per_token": wire[coding] / tokens,
            "vs_identity_bytes": wire[coding] / plain,
            "encode_us_per_token": _median([e / 1e3 / tokens for e, _ in times[coding]]),
            "decode_us_per_token": _median([d / 1e3 / tokens for _, d in times[coding]]),
            "correct": correct[coding],
        }
        for coding in CODINGS
    }


@pytest.mark.parametrize("codec", CODECS)
def bench_compression_codecs(benchmark: Any, codec: str) -> None:
    """One codec's token stream, one chunk a write, in each coding (in process)."""
    benchmark.group = "compression codecs"
    frames, tokens = _frames(codec)
    rounds = 1 if benchmark.disabled else ROUNDS
    found: dict[str, dict[str, Any]] = {}

    def run() -> None:
        found.update(_interleaved(lambda c: _one_stream(c, frames), tokens, rounds))

    benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update(
        op="compression-codecs",
        codec=codec,
        workload=WORKLOAD,
        tokens=tokens,
        frames=len(frames),
        rounds=rounds,
        levels=_levels(),
        codings=found,
        correct=all(f["correct"] for f in found.values()),
    )
    assert benchmark.extra_info["correct"], f"{codec}: a stream did not decode to its frames"


def bench_compression_unary(benchmark: Any) -> None:
    """The non-streamed chat completion of the workload, one body, in each coding."""
    benchmark.group = "compression codecs"
    chunks = list(token_stream_source(WORKLOAD, 0))
    from inferwire.transports import openai_bodies

    body = orjson.dumps(openai_bodies.chat_completion(chunks, extensions=True))
    tokens = sum(len(c.token_ids) for c in chunks)
    rounds = 1 if benchmark.disabled else ROUNDS
    found: dict[str, dict[str, Any]] = {}

    def run() -> None:
        found.update(_interleaved(lambda c: _one_body(c, body), tokens, rounds))

    benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update(
        op="compression-unary",
        codec="orjson",
        workload=WORKLOAD,
        tokens=tokens,
        body_bytes=len(body),
        rounds=rounds,
        levels=_levels(),
        codings=found,
        correct=all(f["correct"] for f in found.values()),
    )
    assert benchmark.extra_info["correct"], "a body did not decode to itself"


def _levels() -> dict[str, int]:
    defaults = cz.Compression()
    return {
        "gzip": defaults.gzip_level,
        "br": defaults.brotli_quality,
        "zstd": defaults.zstd_level,
        "stream_window_bits": cz.STREAM_WINDOW_BITS,
    }


# -- over a socket -------------------------------------------------------------------------


class _Env:
    """Compressing servers (paced and not) in their own processes, pinned to one core with
    their proxies, this client on the other; one client per (address, coding)."""

    def __init__(self) -> None:
        self.own_affinity = os.sched_getaffinity(0)
        self.cores = placement.split_cores()
        if self.cores is not None:
            os.sched_setaffinity(0, {self.cores[1]})
        self.loop = loops.new_event_loop(loops.requested_loop())
        self.servers: dict[float, server_process.ServerProcess] = {}
        self.proxies: dict[float | None, server_process.ServerProcess] = {}
        self.clients: dict[tuple[str, str], Any] = {}
        self.pools: dict[tuple[str, str], HttpPool] = {}

    def _pin(self, process: server_process.ServerProcess) -> server_process.ServerProcess:
        if self.cores is not None and process.process is not None:
            placement.pin_threads(process.process.pid, self.cores[0])
        return process

    def server(self, decode_ms: float = 0.0) -> server_process.ServerProcess:
        if decode_ms not in self.servers:
            process = server_process.serve(
                "http1", "orjson", "--compress", "auto", "--decode-ms", str(decode_ms)
            )
            self.servers[decode_ms] = self._pin(process.start())
        return self.servers[decode_ms]

    def link(self, mbps: float | None) -> str:
        """The address of the unpaced server behind a WAN proxy of this bandwidth."""
        if mbps not in self.proxies:
            options = () if mbps is None else ("--bandwidth-mbps", str(mbps))
            process = server_process.proxy(self.server().address, WAN_DELAY_MS, *options)
            self.proxies[mbps] = self._pin(process.start())
        return self.proxies[mbps].address

    def client(self, address: str, coding: str) -> Any:
        key = (address, coding)
        if key not in self.clients:
            asked = None if coding == "identity" else coding

            async def make() -> Any:
                return it.connect("http1", address, codec="orjson", accept_encoding=asked)

            self.clients[key] = self.loop.run_until_complete(make())
        return self.clients[key]

    def pool(self, address: str, coding: str) -> HttpPool:
        key = (address, coding)
        if key not in self.pools:
            headers = () if coding == "identity" else (("accept-encoding", coding),)
            self.pools[key] = HttpPool(Origin.parse(f"http://{address}"), headers=headers)
        return self.pools[key]

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        for client in self.clients.values():
            self.loop.run_until_complete(client.close())
        for pool in self.pools.values():
            self.loop.run_until_complete(pool.close())
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()
        for process in [*self.proxies.values(), *self.servers.values()]:
            process.stop()
        os.sched_setaffinity(0, self.own_affinity)


@pytest.fixture(scope="module")
def wire_env() -> Iterator[_Env]:
    env = _Env()
    yield env
    env.close()


_EXPECTED: Final = list(token_stream_source(WORKLOAD, 0))
_TOKENS: Final = sum(len(c.token_ids) for c in _EXPECTED)


async def _stream(client: Any) -> bool:
    chunks = [c async for c in client.generate(it.GenerateRequest(workload=WORKLOAD))]
    return chunks == _EXPECTED


async def _unary(pool: HttpPool) -> bytes:
    response = await pool.request("POST", "/v1/chat/completions", UNARY_BODY)
    body = await response.read(64 << 20)
    assert response.status == 200, body[:200]
    return body


def _cpu_ns(server_pid: int, work: Callable[[], Any]) -> tuple[int, Any]:
    """(this thread's CPU + the server process's CPU, in ns, over ``work``; its result)."""
    clock = placement.cpu_clock(server_pid)
    client, server = time.thread_time_ns(), time.clock_gettime_ns(clock)
    result = work()
    return time.thread_time_ns() - client + time.clock_gettime_ns(clock) - server, result


def _pid(process: server_process.ServerProcess) -> int:
    assert process.process is not None
    return process.process.pid


@pytest.mark.parametrize("paced", [True, False], ids=["paced", "unpaced"])
def bench_compression_wire(benchmark: Any, wire_env: _Env, paced: bool) -> None:
    """Bytes and CPU per token of a stream over a socket, per coding; the unary body too (on
    the unpaced server)."""
    benchmark.group = "compression wire"
    env = wire_env
    decode_ms = PACED_DECODE_MS if paced else 0.0
    server = env.server(decode_ms)
    pid = _pid(server)
    rounds = 1 if benchmark.disabled else WIRE_ROUNDS
    plain_body = env.run(_unary(env.pool(server.address, "identity")))
    stats: dict[str, dict[str, list[float]]] = {
        c: {"stream_bytes": [], "stream_cpu": [], "unary_bytes": [], "unary_cpu": []}
        for c in CODINGS
    }
    correct = dict.fromkeys(CODINGS, True)

    def one(coding: str) -> None:
        client = env.client(server.address, coding)
        before = client.pool.wire_bytes
        cpu_ns, whole = _cpu_ns(pid, lambda: env.run(_stream(client)))
        stats[coding]["stream_bytes"].append((client.pool.wire_bytes - before) / _TOKENS)
        stats[coding]["stream_cpu"].append(cpu_ns / 1e3 / _TOKENS)
        correct[coding] &= whole
        if paced:
            return
        pool = env.pool(server.address, coding)
        before = pool.wire_bytes
        cpu_ns, body = _cpu_ns(pid, lambda: env.run(_unary(pool)))
        stats[coding]["unary_bytes"].append(float(pool.wire_bytes - before))
        stats[coding]["unary_cpu"].append(cpu_ns / 1e3 / _TOKENS)
        correct[coding] &= body == plain_body

    def run() -> None:
        for coding in CODINGS:  # warm: connections, first-call paths
            one(coding)
        for values in stats.values():
            for series in values.values():
                series.clear()
        for i in range(rounds):
            for coding in _rotated(CODINGS, i):
                one(coding)

    benchmark.pedantic(run, rounds=1, iterations=1)
    found: dict[str, dict[str, Any]] = {}
    for coding in CODINGS:
        figures = {name: _median(series) for name, series in stats[coding].items() if series}
        cpu = stats[coding]["stream_cpu"]
        plain_cpu = stats["identity"]["stream_cpu"]
        figures["vs_identity_stream_cpu"] = _median(
            [a / b for a, b in zip(cpu, plain_cpu, strict=True)]
        )
        figures["correct"] = correct[coding]
        found[coding] = figures
    benchmark.extra_info.update(
        op="compression-wire",
        transport="http1",
        codec="orjson",
        workload=WORKLOAD,
        tokens=_TOKENS,
        paced=paced,
        decode_ms=decode_ms,
        rounds=rounds,
        loop=loops.kind(env.loop),
        server_loop=server.loop,
        codings=found,
        correct=all(correct.values()),
    )
    assert benchmark.extra_info["correct"], "a stream or body differs from the uncompressed one"


@pytest.mark.parametrize(
    "mbps", LINKS_MBPS, ids=[f"{m:g}mbit" if m else "delay-only" for m in LINKS_MBPS]
)
def bench_compression_wan(benchmark: Any, wire_env: _Env, mbps: float | None) -> None:
    """Time to receive a whole unpaced stream and a unary body over a slow link, per coding."""
    benchmark.group = "compression wan"
    env = wire_env
    address = env.link(mbps)
    rounds = 1 if benchmark.disabled else WAN_ROUNDS
    stream_ms: dict[str, list[float]] = {c: [] for c in CODINGS}
    unary_ms: dict[str, list[float]] = {c: [] for c in CODINGS}
    correct = dict.fromkeys(CODINGS, True)
    plain_body = env.run(_unary(env.pool(address, "identity")))

    def one(coding: str) -> None:
        client = env.client(address, coding)
        started = time.perf_counter()
        correct[coding] &= env.run(_stream(client))
        stream_ms[coding].append((time.perf_counter() - started) * 1e3)
        pool = env.pool(address, coding)
        started = time.perf_counter()
        correct[coding] &= env.run(_unary(pool)) == plain_body
        unary_ms[coding].append((time.perf_counter() - started) * 1e3)

    def run() -> None:
        for coding in CODINGS:  # warm: the connections (each a handshake through the proxy)
            one(coding)
        for series in (*stream_ms.values(), *unary_ms.values()):
            series.clear()
        for i in range(rounds):
            for coding in _rotated(CODINGS, i):
                one(coding)

    benchmark.pedantic(run, rounds=1, iterations=1)

    def vs_identity(series: dict[str, list[float]], coding: str) -> float:
        return _median([a / b for a, b in zip(series[coding], series["identity"], strict=True)])

    found = {
        coding: {
            "stream_ms": _median(stream_ms[coding]),
            "unary_ms": _median(unary_ms[coding]),
            "vs_identity_stream": vs_identity(stream_ms, coding),
            "vs_identity_unary": vs_identity(unary_ms, coding),
            "correct": correct[coding],
        }
        for coding in CODINGS
    }
    benchmark.extra_info.update(
        op="compression-wan",
        transport="http1",
        codec="orjson",
        workload=WORKLOAD,
        delay_ms=WAN_DELAY_MS,
        bandwidth_mbps=mbps,
        rounds=rounds,
        loop=loops.kind(env.loop),
        server_loop=env.server().loop,
        proxy_loop=env.proxies[mbps].loop,
        codings=found,
        correct=all(correct.values()),
    )
    assert benchmark.extra_info["correct"], "a stream or body differs from the uncompressed one"
