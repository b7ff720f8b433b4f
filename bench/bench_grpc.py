"""gRPC against its floors, each comparison paired in one run, servers in their own processes
on loopback (pinned: every server on one core, this process on the other, as in
bench_transports.py), on the event loop ``inferwire serve --loop auto`` runs (uvloop when
installed), the client on the same kind.

* **Per message vs the bare grpcio floor** (``bench_grpc_floor``): our ``Generate`` (one chunk
  a message: the service, the codec's encoder and decoder, our client) against a bare grpcio
  server streaming the same messages, prebuilt (:mod:`inferwire.bench.procs.grpc_floor`), read
  by a bare grpcio call that keeps the bytes. Same message count and bytes, so the ratio of
  whole streams is the ratio per message. Target: <= 1.2x. A third side in the same rounds,
  *codec only*, is the bare server encoding each message as it streams and a bare call
  decoding each: the codec's own part of what ours adds, the rest being our service, server
  and client.
* **Batched vs tcp, unpaced** (``bench_grpc_batched``): ``GenerateBatched`` (one message per
  batch of due chunks) against the ``tcp`` floor, the model outrunning the wire (no pacing),
  per token; ``Generate`` runs in the same rounds, so the table shows what batching saved.
  Target: <= 2x ``tcp``.
* **Batched vs per message, paced** (``bench_grpc_paced``): a server paced at
  ``DECODE_MS`` per token; time to first token and mean inter-token gap of ``GenerateBatched``
  against ``Generate``, paired stream by stream. Target: no added latency (both ratios within
  the noise of 1.0; the bounds are in bench/report/grpc.py, which judges every target).
* **grpclib beside grpcio** (``bench_grpclib_*``): the same service on grpclib
  (:mod:`inferwire.transports.grpclib_transport`), each side in the same rotating rounds as
  grpcio's: per message (``Generate``, beside our grpcio ``Generate`` and the bare grpcio
  floor, and each library's client against the other's server, which tells whose end costs
  what), per token (``GenerateBatched``, beside grpcio's and ``tcp``) and per unary call
  (``Infer``, a small tensor). Findings, not targets: the report shows the ratios to grpcio.

Every stream is checked against what the service produced (and the floor's messages against
ours, byte for byte); a wrong one fails the benchmark. Each round of ``benchmark.pedantic`` is
one pair (or rotation), its order alternating, and each ratio is the median of the per-round
ratios, never two separately timed medians divided.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from typing import Any, Final

import grpc
import grpc.aio
import grpclib
import numpy as np
import pytest

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime import loops
from inferwire.bench.procs import grpc_floor, placement
from inferwire.transports import server_process
from inferwire.transports.grpc_transport import _path, _request_to_pb
from inferwire.transports.service import GenerateRequest
from inferwire.workloads import token_stream_source

CODECS: Final = ("orjson", "protobuf", "delta")
WORKLOAD: Final = "stream-256"
PAIRS: Final = 21
"""Rounds of each unpaced comparison: a gRPC stream of 256 messages lasts tens of ms."""
PACED_PAIRS: Final = 21
DECODE_MS: Final = 1.0
PACED_TOKENS: Final = 64
"""A paced stream is cut to this many tokens: 63 gaps of DECODE_MS, ~65 ms a stream."""
UNARY_CODECS: Final = ("orjson", "protobuf")
"""The grpclib unary rows' codecs (``delta`` carries token streams only)."""
CROSS: Final = {
    # a client kind of the grpclib rows: (our client's transport, the server's kind)
    "grpclib": ("grpclib", "grpclib"),
    "grpclib-batched": ("grpclib", "grpclib"),
    "grpclib-to-grpc": ("grpclib", "grpc"),
    "grpc-to-grpclib": ("grpc", "grpclib"),
}
SMALL_REQUEST: Final = ic.InferRequest(
    model="sim",
    id="small",
    inputs=(
        ic.Tensor(
            name="x",
            datatype="FP32",
            shape=(1, 16),
            data=np.arange(16, dtype=np.float32).reshape(1, 16),
        ),
    ),
)
"""bench_transports.py's small unary call."""
MIN_SIDE_S: Final = 0.005
"""Each side of an unpaced round runs its stream as many times as take this long (timed per
stream): a tcp stream of a few hundred microseconds beside a gRPC one of tens of
milliseconds would otherwise carry one wake-up's noise into every ratio."""


class _Env:
    """One event loop, the server processes (pinned), one client per (kind, codec)."""

    def __init__(self) -> None:
        self.own_affinity = os.sched_getaffinity(0)
        self.cores = placement.split_cores()
        if self.cores is not None:
            os.sched_setaffinity(0, {self.cores[1]})
        self.loop_kind = loops.resolve("auto")
        self.loop = loops.new_event_loop(self.loop_kind)
        self.processes: dict[tuple[str, str], server_process.ServerProcess] = {}
        self.clients: dict[tuple[str, str], Any] = {}
        self.channels: list[grpc.aio.Channel] = []
        self.service = it.SimulatedService(token_stream_source)

    def _started(self, process: server_process.ServerProcess) -> server_process.ServerProcess:
        process.start()
        if self.cores is not None and process.process is not None:
            placement.pin_threads(process.process.pid, self.cores[0])
        return process

    def process(self, kind: str, codec: str) -> server_process.ServerProcess:
        """``kind``: ``grpc``, ``grpclib``, ``tcp``, ``grpc-paced`` (DECODE_MS a token) or
        ``floor``."""
        key = (kind, codec)
        if key not in self.processes:
            loop = ("--loop", self.loop_kind)
            if kind == "floor":
                process = server_process.ServerProcess()
                process.args = [
                    sys.executable,
                    "-m",
                    grpc_floor.__name__,
                    "--codec",
                    codec,
                    "--workload",
                    WORKLOAD,
                    *loop,
                ]
            elif kind == "grpc-paced":
                process = server_process.serve("grpc", codec, "--decode-ms", str(DECODE_MS), *loop)
            else:
                process = server_process.serve(kind, codec, *loop)
            self.processes[key] = self._started(process)
        return self.processes[key]

    def client(self, kind: str, codec: str) -> Any:
        """Our client of ``kind`` (``tcp``, ``grpc``, ``grpc-batched``, and both on the paced
        server: ``grpc-paced``, ``grpc-paced-batched``; the grpclib ones of ``CROSS``), or the
        floor's two bare calls (its prebuilt messages, and the same encoded as they stream)."""
        key = (kind, codec)
        if key not in self.clients:
            batched = kind.endswith("-batched")
            transport, server_kind = CROSS.get(kind) or (
                "tcp" if kind == "tcp" else "grpc",
                kind.removesuffix("-batched"),
            )
            process = self.process(server_kind, codec)

            async def make() -> Any:
                if kind == "floor":
                    channel = grpc.aio.insecure_channel(process.address)
                    self.channels.append(channel)
                    return (  # bytes as they come
                        channel.unary_stream(grpc_floor.MESSAGES),
                        channel.unary_stream(grpc_floor.ENCODED),
                    )
                options: dict[str, Any] = {"batched": True} if batched else {}
                return it.connect(transport, process.address, codec=codec, **options)

            self.clients[key] = self.loop.run_until_complete(make())
        return self.clients[key]

    def run(self, coro: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        return self.loop.run_until_complete(coro())

    def close(self) -> None:
        for client in self.clients.values():
            if isinstance(client, it.Client):
                self.loop.run_until_complete(client.close())
        for channel in self.channels:
            self.loop.run_until_complete(channel.close())
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()
        for process in self.processes.values():
            process.stop()
        os.sched_setaffinity(0, self.own_affinity)


@pytest.fixture(scope="module")
def grpc_env() -> Iterator[_Env]:
    env = _Env()
    yield env
    env.close()


def _chunks_of(
    client: it.Client, request: GenerateRequest
) -> Callable[[], Coroutine[Any, Any, Any]]:
    async def go() -> list[ic.TokenChunk]:
        return [chunk async for chunk in client.generate(request)]

    return go


def _messages_of(call: Any) -> Callable[[], Coroutine[Any, Any, Any]]:
    async def go() -> list[bytes]:
        return [message async for message in call(b"")]

    return go


def _decoded_of(call: Any, codec: ic.Codec) -> Callable[[], Coroutine[Any, Any, Any]]:
    """A bare call whose messages are decoded by the codec's message decoder, nothing else."""

    async def go() -> list[ic.TokenChunk]:
        decoder = codec.message_decoder(ic.TokenChunk)
        chunks: list[ic.TokenChunk] = []
        async for message in call(b""):
            chunks += decoder.feed(message)
        decoder.close()
        return chunks

    return go


class _Rounds:
    """Paired rounds of named sides, each a stream: every round runs each side (enough times
    to last ``min_side_s``, timed per stream), in an order that rotates from round to round."""

    def __init__(self, env: _Env, sides: dict[str, Callable[[], Coroutine[Any, Any, Any]]]) -> None:
        self.env = env
        self.sides = sides
        self.times_s: dict[str, list[float]] = {name: [] for name in sides}
        self.outputs: dict[str, Any] = {}
        self.repeats = dict.fromkeys(sides, 1)

    def warm(self, min_side_s: float) -> None:
        for name, side in self.sides.items():
            start = time.perf_counter()
            self.outputs[name] = self.env.run(side)  # connects, first-call paths
            self.env.run(side)
            once_s = (time.perf_counter() - start) / 2
            self.repeats[name] = max(1, min(100, round(min_side_s / max(once_s, 1e-9))))

    def round(self) -> None:
        names = list(self.sides)
        shift = len(self.times_s[names[0]]) % len(names)
        for name in names[shift:] + names[:shift]:
            side, repeats = self.sides[name], self.repeats[name]
            start = time.perf_counter()
            for _ in range(repeats):
                output = self.env.run(side)
            self.times_s[name].append((time.perf_counter() - start) / repeats)
            if output != self.outputs[name]:
                self.outputs[name] = None  # a stream that differs once is wrong

    def median_s(self, name: str) -> float:
        return statistics.median(self.times_s[name])

    def ratio(self, subject: str, baseline: str) -> float:
        return statistics.median(
            a / b for a, b in zip(self.times_s[subject], self.times_s[baseline], strict=True)
        )


def _expected(env: _Env, request: GenerateRequest) -> list[ic.TokenChunk]:
    return list(env.service.chunks(request))


async def _raw_generate(address: str, request: GenerateRequest) -> list[bytes]:
    """Our ``Generate``'s messages as grpc hands them over, to hold the floor's against."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_stream(_path("Generate"))
        return [m async for m in call(_request_to_pb(request).SerializeToString())]


@pytest.mark.parametrize("codec", CODECS)
def bench_grpc_floor(benchmark: Any, grpc_env: _Env, codec: str) -> None:
    """Our per-message ``Generate`` against the bare grpcio floor streaming its messages."""
    benchmark.group = "grpc per message vs floor"
    request = GenerateRequest(workload=WORKLOAD)
    expected = _expected(grpc_env, request)
    prebuilt = grpc_floor.messages(ic.get(codec, extensions=True), expected)
    floor_call, encoded_call = grpc_env.client("floor", codec)
    rounds = _Rounds(
        grpc_env,
        {
            "ours": _chunks_of(grpc_env.client("grpc", codec), request),
            "floor": _messages_of(floor_call),
            "codec-only": _decoded_of(encoded_call, ic.get(codec, extensions=True)),
        },
    )
    quick = benchmark.disabled
    rounds.warm(0.0 if quick else MIN_SIDE_S)
    benchmark.pedantic(rounds.round, rounds=1 if quick else PAIRS)
    ours_bytes = grpc_env.run(
        lambda: _raw_generate(grpc_env.process("grpc", codec).address, request)
    )
    messages = len(prebuilt)
    correct = {
        "ours": rounds.outputs["ours"] == expected,
        "floor": rounds.outputs["floor"] == prebuilt,
        "codec_only": rounds.outputs["codec-only"] == expected,
        "same_bytes": ours_bytes == prebuilt,
    }
    benchmark.extra_info.update(
        codec=codec,
        workload=WORKLOAD,
        op="grpc-floor",
        loop=grpc_env.loop_kind,
        messages=messages,
        message_bytes=sum(map(len, prebuilt)) / messages,
        floor_us_per_message=rounds.median_s("floor") / messages * 1e6,
        ours_us_per_message=rounds.median_s("ours") / messages * 1e6,
        codec_only_us_per_message=rounds.median_s("codec-only") / messages * 1e6,
        vs_floor=rounds.ratio("ours", "floor"),
        codec_only_vs_floor=rounds.ratio("codec-only", "floor"),
        pairs=len(rounds.times_s["ours"]),
        checks=correct,
        correct=all(correct.values()),
    )
    assert benchmark.extra_info["correct"], f"grpc floor {codec}: {correct}"


@pytest.mark.parametrize("codec", CODECS)
def bench_grpc_batched(benchmark: Any, grpc_env: _Env, codec: str) -> None:
    """``GenerateBatched`` and ``Generate`` against ``tcp``, unpaced, per token."""
    benchmark.group = "grpc batched vs tcp"
    request = GenerateRequest(workload=WORKLOAD)
    expected = _expected(grpc_env, request)
    tokens = sum(len(c.token_ids) for c in expected)
    rounds = _Rounds(
        grpc_env,
        {
            side: _chunks_of(grpc_env.client(side, codec), request)
            for side in ("grpc-batched", "tcp", "grpc")
        },
    )
    quick = benchmark.disabled
    rounds.warm(0.0 if quick else MIN_SIDE_S)
    benchmark.pedantic(rounds.round, rounds=1 if quick else PAIRS)
    correct = {side: output == expected for side, output in rounds.outputs.items()}
    benchmark.extra_info.update(
        codec=codec,
        workload=WORKLOAD,
        op="grpc-batched",
        loop=grpc_env.loop_kind,
        tokens=tokens,
        chunks=len(expected),
        batched_us_per_token=rounds.median_s("grpc-batched") / tokens * 1e6,
        per_message_us_per_token=rounds.median_s("grpc") / tokens * 1e6,
        tcp_us_per_token=rounds.median_s("tcp") / tokens * 1e6,
        vs_tcp=rounds.ratio("grpc-batched", "tcp"),
        per_message_vs_tcp=rounds.ratio("grpc", "tcp"),
        pairs=len(rounds.times_s["tcp"]),
        checks=correct,
        correct=all(correct.values()),
    )
    assert benchmark.extra_info["correct"], f"grpc batched {codec}: {correct}"


async def _timed_stream(
    client: it.Client, request: GenerateRequest
) -> tuple[list[ic.TokenChunk], int, list[int]]:
    """The chunks, the time to the first (ns, from before the call) and each chunk's arrival."""
    arrivals: list[int] = []
    chunks: list[ic.TokenChunk] = []
    start = time.perf_counter_ns()
    stream: AsyncIterator[ic.TokenChunk] = client.generate(request)
    async for chunk in stream:
        arrivals.append(time.perf_counter_ns())
        chunks.append(chunk)
    return chunks, arrivals[0] - start if arrivals else 0, arrivals


@pytest.mark.parametrize("codec", CODECS)
def bench_grpc_paced(benchmark: Any, grpc_env: _Env, codec: str) -> None:
    """Paced at ``DECODE_MS`` a token: ``GenerateBatched`` against ``Generate``, stream by
    stream, on time to first token and the mean gap between chunks."""
    benchmark.group = "grpc paced"
    request = GenerateRequest(workload=WORKLOAD, max_tokens=PACED_TOKENS)
    expected = _expected(grpc_env, request)
    sides = ("grpc-paced-batched", "grpc-paced")
    clients = {side: grpc_env.client(side, codec) for side in sides}
    ttft_ns: dict[str, list[float]] = {side: [] for side in sides}
    itl_ns: dict[str, list[float]] = {side: [] for side in sides}
    correct = dict.fromkeys(sides, True)

    def one(side: str) -> None:
        chunks, ttft, arrivals = grpc_env.run(lambda: _timed_stream(clients[side], request))
        correct[side] = correct[side] and chunks == expected
        ttft_ns[side].append(ttft)
        itl_ns[side].append((arrivals[-1] - arrivals[0]) / max(1, len(arrivals) - 1))

    def pair() -> None:
        order = sides if len(ttft_ns[sides[0]]) % 2 == 0 else sides[::-1]
        for side in order:
            one(side)

    quick = benchmark.disabled
    pair()  # warm: connections, first-call paths
    for side in sides:
        ttft_ns[side].clear()
        itl_ns[side].clear()
    benchmark.pedantic(pair, rounds=1 if quick else PACED_PAIRS)

    def ratio(values: Mapping[str, Sequence[float]]) -> float:
        subject, baseline = (values[side] for side in sides)
        return statistics.median(a / b for a, b in zip(subject, baseline, strict=True))

    batched, per_message = sides
    benchmark.extra_info.update(
        codec=codec,
        workload=WORKLOAD,
        op="grpc-paced",
        loop=grpc_env.loop_kind,
        decode_ms=DECODE_MS,
        tokens=sum(len(c.token_ids) for c in expected),
        ttft_us_batched=statistics.median(ttft_ns[batched]) / 1e3,
        ttft_us_per_message=statistics.median(ttft_ns[per_message]) / 1e3,
        itl_us_batched=statistics.median(itl_ns[batched]) / 1e3,
        itl_us_per_message=statistics.median(itl_ns[per_message]) / 1e3,
        ttft_vs_per_message=ratio(ttft_ns),
        itl_vs_per_message=ratio(itl_ns),
        pairs=len(ttft_ns[batched]),
        checks=correct,
        correct=all(correct.values()),
    )
    assert benchmark.extra_info["correct"], f"grpc paced {codec}: {correct}"


# -- grpclib beside grpcio ----------------------------------------------------------------


def _versions() -> dict[str, str]:
    return {"grpcio": grpc.__version__, "grpclib": grpclib.__version__}


@pytest.mark.parametrize("codec", CODECS)
def bench_grpclib_floor(benchmark: Any, grpc_env: _Env, codec: str) -> None:
    """``Generate`` on grpclib per message, beside ours on grpcio and the bare grpcio floor,
    and each library's client on the other's server, in the same rounds."""
    benchmark.group = "grpclib per message vs grpcio"
    request = GenerateRequest(workload=WORKLOAD)
    expected = _expected(grpc_env, request)
    prebuilt = grpc_floor.messages(ic.get(codec, extensions=True), expected)
    floor_call, _ = grpc_env.client("floor", codec)
    sides = ("grpclib", "grpc", "grpclib-to-grpc", "grpc-to-grpclib")
    rounds = _Rounds(
        grpc_env,
        {
            **{side: _chunks_of(grpc_env.client(side, codec), request) for side in sides},
            "floor": _messages_of(floor_call),
        },
    )
    quick = benchmark.disabled
    rounds.warm(0.0 if quick else MIN_SIDE_S)
    benchmark.pedantic(rounds.round, rounds=1 if quick else PAIRS)
    correct = {side.replace("-", "_"): rounds.outputs[side] == expected for side in sides}
    correct["floor"] = rounds.outputs["floor"] == prebuilt
    messages = len(prebuilt)
    tokens = sum(len(c.token_ids) for c in expected)

    def us_per_message(side: str) -> float:
        return rounds.median_s(side) / messages * 1e6

    benchmark.extra_info.update(
        codec=codec,
        workload=WORKLOAD,
        op="grpclib-floor",
        loop=grpc_env.loop_kind,
        versions=_versions(),
        messages=messages,
        tokens=tokens,
        message_bytes=sum(map(len, prebuilt)) / messages,
        floor_us_per_message=us_per_message("floor"),
        grpcio_us_per_message=us_per_message("grpc"),
        grpclib_us_per_message=us_per_message("grpclib"),
        grpclib_client_us_per_message=us_per_message("grpclib-to-grpc"),
        grpclib_server_us_per_message=us_per_message("grpc-to-grpclib"),
        vs_grpcio=rounds.ratio("grpclib", "grpc"),
        vs_floor=rounds.ratio("grpclib", "floor"),
        grpcio_vs_floor=rounds.ratio("grpc", "floor"),
        client_vs_grpcio=rounds.ratio("grpclib-to-grpc", "grpc"),
        server_vs_grpcio=rounds.ratio("grpc-to-grpclib", "grpc"),
        pairs=len(rounds.times_s["grpc"]),
        checks=correct,
        correct=all(correct.values()),
    )
    assert benchmark.extra_info["correct"], f"grpclib floor {codec}: {correct}"


@pytest.mark.parametrize("codec", CODECS)
def bench_grpclib_batched(benchmark: Any, grpc_env: _Env, codec: str) -> None:
    """``GenerateBatched`` on grpclib per token, beside grpcio's and ``tcp``, unpaced."""
    benchmark.group = "grpclib per token vs grpcio"
    request = GenerateRequest(workload=WORKLOAD)
    expected = _expected(grpc_env, request)
    tokens = sum(len(c.token_ids) for c in expected)
    sides = ("grpclib-batched", "grpc-batched", "tcp")
    rounds = _Rounds(
        grpc_env, {side: _chunks_of(grpc_env.client(side, codec), request) for side in sides}
    )
    quick = benchmark.disabled
    rounds.warm(0.0 if quick else MIN_SIDE_S)
    benchmark.pedantic(rounds.round, rounds=1 if quick else PAIRS)
    correct = {side.replace("-", "_"): rounds.outputs[side] == expected for side in sides}
    benchmark.extra_info.update(
        codec=codec,
        workload=WORKLOAD,
        op="grpclib-batched",
        loop=grpc_env.loop_kind,
        versions=_versions(),
        tokens=tokens,
        chunks=len(expected),
        tcp_us_per_token=rounds.median_s("tcp") / tokens * 1e6,
        grpcio_us_per_token=rounds.median_s("grpc-batched") / tokens * 1e6,
        grpclib_us_per_token=rounds.median_s("grpclib-batched") / tokens * 1e6,
        vs_grpcio=rounds.ratio("grpclib-batched", "grpc-batched"),
        vs_tcp=rounds.ratio("grpclib-batched", "tcp"),
        grpcio_vs_tcp=rounds.ratio("grpc-batched", "tcp"),
        pairs=len(rounds.times_s["tcp"]),
        checks=correct,
        correct=all(correct.values()),
    )
    assert benchmark.extra_info["correct"], f"grpclib batched {codec}: {correct}"


def _infer_of(client: it.Client) -> Callable[[], Coroutine[Any, Any, Any]]:
    async def go() -> ic.InferResponse:
        return await client.infer(SMALL_REQUEST)

    return go


@pytest.mark.parametrize("codec", UNARY_CODECS)
def bench_grpclib_unary(benchmark: Any, grpc_env: _Env, codec: str) -> None:
    """``Infer`` (a small tensor) on grpclib per call, beside grpcio, and each library's
    client on the other's server."""
    benchmark.group = "grpclib per call vs grpcio"
    expected = grpc_env.service.infer(SMALL_REQUEST)
    sides = ("grpclib", "grpc", "grpclib-to-grpc", "grpc-to-grpclib")
    rounds = _Rounds(grpc_env, {side: _infer_of(grpc_env.client(side, codec)) for side in sides})
    quick = benchmark.disabled
    rounds.warm(0.0 if quick else MIN_SIDE_S)
    benchmark.pedantic(rounds.round, rounds=1 if quick else PAIRS)
    correct = {side.replace("-", "_"): rounds.outputs[side] == expected for side in sides}
    benchmark.extra_info.update(
        codec=codec,
        op="grpclib-unary",
        loop=grpc_env.loop_kind,
        versions=_versions(),
        request_bytes=len(ic.get(codec, extensions=True).encode(SMALL_REQUEST)),
        grpcio_us_per_call=rounds.median_s("grpc") * 1e6,
        grpclib_us_per_call=rounds.median_s("grpclib") * 1e6,
        grpclib_client_us_per_call=rounds.median_s("grpclib-to-grpc") * 1e6,
        grpclib_server_us_per_call=rounds.median_s("grpc-to-grpclib") * 1e6,
        vs_grpcio=rounds.ratio("grpclib", "grpc"),
        client_vs_grpcio=rounds.ratio("grpclib-to-grpc", "grpc"),
        server_vs_grpcio=rounds.ratio("grpc-to-grpclib", "grpc"),
        pairs=len(rounds.times_s["grpc"]),
        checks=correct,
        correct=all(correct.values()),
    )
    assert benchmark.extra_info["correct"], f"grpclib unary {codec}: {correct}"
