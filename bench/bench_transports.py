"""Transports on identical work: a small unary round trip and a 256-token stream per
transport x codec, with the server in its own process on loopback and no pacing (prefill and
decode time zero), so what is timed is serialization and transport alone.

Each benchmark also runs a paired comparison against the ``tcp`` floor with the same codec
(``vs_tcp`` in ``extra_info``: the median of back-to-back pairs, see
:func:`~inferwire.bench.measure.paired.paired_ratio`), which is what the targets are stated in.
Every response is checked against what the service produced; a wrong one fails the benchmark.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import numpy as np
import pytest

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire.bench.measure.paired import paired_ratio
from inferwire.bench.procs import server_process
from inferwire.workloads import token_stream_source

PAIRS = 21
MIN_SAMPLE_S = 0.005
"""Each side of a pair lasts at least this long (several calls of a fast one): a tcp stream
of a few hundred microseconds beside a gRPC one of tens of milliseconds otherwise puts one
wake-up's noise into every ratio (the grpc ratios moved by 10% between repeats)."""
STREAM_WORKLOAD = "stream-256"
UNARY_CALLS = 20
"""Round trips per timed call: one is tens of microseconds, below the timer's comfort."""
STREAM_CODECS = ("orjson", "protobuf", "delta")
UNARY_CODECS = ("orjson", "protobuf", "msgpack")
TRANSPORTS = it.TRANSPORTS

SMALL_REQUEST = ic.InferRequest(
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


class _Bench:
    """One event loop, one server process per (transport, codec), one client each; with two
    cores or more, every server on one core and this process on another
    (:func:`~inferwire.bench.procs.server_process.split_cores` says why)."""

    def __init__(self) -> None:
        self.own_affinity = os.sched_getaffinity(0)
        self.cores = server_process.split_cores()
        if self.cores is not None:
            os.sched_setaffinity(0, {self.cores[1]})
        self.loop = asyncio.new_event_loop()
        self.servers: dict[tuple[str, str], server_process.ServerProcess] = {}
        self.clients: dict[tuple[str, str, str], it.Client] = {}
        self.service = it.SimulatedService(token_stream_source)

    def client(self, transport: str, codec: str, mode: str = "") -> it.Client:
        key = (transport, codec, mode)
        if key not in self.clients:
            if (transport, codec) not in self.servers:
                started = server_process.serve(transport, codec).start()
                self.servers[transport, codec] = started
                if self.cores is not None and started.process is not None:
                    server_process.pin_threads(started.process.pid, self.cores[0])
            server = self.servers[transport, codec]
            options: dict[str, Any] = (
                {"new_connection_per_request": True} if mode == "new-connection" else {}
            )

            async def make() -> it.Client:
                return it.connect(transport, server.address, codec=codec, **options)

            self.clients[key] = self.loop.run_until_complete(make())
        return self.clients[key]

    def run(self, coro: Callable[[], Coroutine[Any, Any, Any]]) -> Callable[[], Any]:
        return lambda: self.loop.run_until_complete(coro())

    def close(self) -> None:
        for client in self.clients.values():
            self.loop.run_until_complete(client.close())
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()
        for server in self.servers.values():
            server.stop()
        os.sched_setaffinity(0, self.own_affinity)


@pytest.fixture(scope="module")
def bench_env() -> Iterator[_Bench]:
    env = _Bench()
    yield env
    env.close()


def _unary(client: it.Client, calls: int) -> Callable[[], Coroutine[Any, Any, list[Any]]]:
    async def go() -> list[Any]:
        return [await client.infer(SMALL_REQUEST) for _ in range(calls)]

    return go


def _stream(client: it.Client) -> Callable[[], Coroutine[Any, Any, list[ic.TokenChunk]]]:
    request = it.GenerateRequest(workload=STREAM_WORKLOAD)

    async def go() -> list[ic.TokenChunk]:
        return [chunk async for chunk in client.generate(request)]

    return go


def _unary_correct(responses: list[Any]) -> bool:
    expected = it.SimulatedService(token_stream_source).infer(SMALL_REQUEST)
    return all(r == expected for r in responses)


@pytest.mark.parametrize("codec", UNARY_CODECS)
@pytest.mark.parametrize("transport", [*TRANSPORTS, "http1-new-connection"])
def bench_unary(benchmark: Any, bench_env: _Bench, transport: str, codec: str) -> None:
    """``UNARY_CALLS`` small infer round trips in turn on a kept-alive connection (or a new
    connection per request for ``http1-new-connection``)."""
    name, _, mode = transport.partition("-")
    client = bench_env.client(name, codec, mode)
    benchmark.group = f"transport unary {codec}"
    calls = 1 if benchmark.disabled else UNARY_CALLS
    subject = bench_env.run(_unary(client, calls))
    subject()  # warm: connect, first-call paths
    responses = benchmark(subject)
    pairs = 1 if benchmark.disabled else PAIRS
    floor = bench_env.run(_unary(bench_env.client("tcp", codec), calls))
    floor()
    benchmark.extra_info.update(
        transport=transport,
        codec=codec,
        op="unary",
        calls=calls,
        request_bytes=len(ic.get(codec).encode(SMALL_REQUEST)),
        vs_tcp=paired_ratio(
            subject, floor, pairs, min_sample_s=0.0 if benchmark.disabled else MIN_SAMPLE_S
        ),
        pairs=pairs,
        correct=_unary_correct(responses),
    )
    assert benchmark.extra_info["correct"], f"{transport} {codec}: wrong unary response"


@pytest.mark.parametrize("codec", STREAM_CODECS)
@pytest.mark.parametrize("transport", TRANSPORTS)
def bench_stream(benchmark: Any, bench_env: _Bench, transport: str, codec: str) -> None:
    """One whole ``stream-256`` response, request to end marker, no pacing."""
    client = bench_env.client(transport, codec)
    benchmark.group = f"transport stream {codec}"
    subject = bench_env.run(_stream(client))
    subject()
    chunks = benchmark(subject)
    expected = list(bench_env.service.chunks(it.GenerateRequest(workload=STREAM_WORKLOAD)))
    pairs = 1 if benchmark.disabled else PAIRS
    floor = bench_env.run(_stream(bench_env.client("tcp", codec)))
    floor()
    benchmark.extra_info.update(
        transport=transport,
        codec=codec,
        op="stream",
        workload=STREAM_WORKLOAD,
        tokens=sum(len(c.token_ids) for c in expected),
        chunks=len(expected),
        vs_tcp=paired_ratio(
            subject, floor, pairs, min_sample_s=0.0 if benchmark.disabled else MIN_SAMPLE_S
        ),
        pairs=pairs,
        correct=chunks == expected,
    )
    assert chunks == expected, f"{transport} {codec}: stream differs from the service's"
