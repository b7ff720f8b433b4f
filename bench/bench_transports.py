"""Transports on identical work: a small unary round trip and a 256-token stream per
transport x codec, with the server in its own process on loopback and no pacing (prefill and
decode time zero), so what is timed is serialization and transport alone.

Each benchmark also runs a paired comparison against the ``tcp`` floor with the same codec
(``vs_tcp`` in ``extra_info``: the median of back-to-back pairs, see
:func:`~inferwire.bench.measure.paired.paired_ratio`), which is what the targets are stated in.
Every response is checked against what the service produced; a wrong one fails the benchmark.

The ``tcp`` unary rounds are themselves compared with two floors below them, paired the same
way: ``vs_echo``, a raw echo of the same byte counts (:mod:`inferwire.bench.procs.echo_server`:
asyncio Protocol callbacks on both ends, no framing or codec), and ``asyncio_vs_uvloop``, our
``tcp`` round trip with both ends on asyncio's loop over both on uvloop (when uvloop is
installed).

Event loop: servers and client run on the run's loop
(:func:`~inferwire.bench.procs.loops.requested_loop`, ``$INFERWIRE_LOOP``, uvloop
when installed); every result records the client's (``loop``) and the server's as it announced
it (``server_loop``).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import numpy as np
import pytest

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime import loops
from inferwire.bench.measure.paired import paired_ratio
from inferwire.bench.procs import echo_server, placement
from inferwire.transports import server_process
from inferwire.transports.tcp import infer_wire_bytes
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
WEBSOCKET = "websocket"
"""Measured beside ``TRANSPORTS`` but not one of them (``it.EXTRA_TRANSPORTS``): its rows are
named explicitly, so the others' rows are those of a run without it. Streams run on a session
(``?session=1``: one connection, a stream at a time, as a realtime client keeps one), as the
other transports' run on a kept connection; ``websocket-new-connection`` is the unary round
trip on a fresh connection each (the connection setup), as ``http1-new-connection`` is."""

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
    """One event loop of the run's kind, one server process per (transport, codec), one client
    each; with two cores or more, every server on one core and this process on another
    (:func:`~inferwire.bench.procs.placement.split_cores` says why). A loop of another
    kind (with its own servers) is made only for the comparison of loops; it runs only while
    the run's loop does not."""

    def __init__(self) -> None:
        self.own_affinity = os.sched_getaffinity(0)
        self.cores = placement.split_cores()
        if self.cores is not None:
            os.sched_setaffinity(0, {self.cores[1]})
        self.loop_kind = loops.requested_loop()
        self.loops = {self.loop_kind: loops.new_event_loop(self.loop_kind)}
        self.loop = self.loops[self.loop_kind]
        self.servers: dict[tuple[str, str, str], server_process.ServerProcess] = {}
        self.clients: dict[tuple[str, str, str, str], it.Client] = {}
        self.echoes: dict[
            tuple[int, int], tuple[echo_server.EchoClient, server_process.ServerProcess]
        ] = {}
        self.service = it.SimulatedService(token_stream_source)

    def _started(self, process: server_process.ServerProcess) -> server_process.ServerProcess:
        process.start()
        if self.cores is not None and process.process is not None:
            placement.pin_threads(process.process.pid, self.cores[0])
        return process

    def server(
        self, transport: str, codec: str, loop: str | None = None
    ) -> server_process.ServerProcess:
        key = (transport, codec, loop or self.loop_kind)
        if key not in self.servers:
            self.servers[key] = self._started(
                server_process.serve(transport, codec, "--loop", key[2])
            )
        return self.servers[key]

    def client(
        self, transport: str, codec: str, mode: str = "", loop: str | None = None
    ) -> it.Client:
        kind = loop or self.loop_kind
        key = (transport, codec, mode, kind)
        if key not in self.clients:
            server = self.server(transport, codec, kind)
            options: dict[str, Any] = (
                {"new_connection_per_request": True} if mode == "new-connection" else {}
            )

            async def make() -> it.Client:
                return it.connect(transport, server.address, codec=codec, **options)

            self.clients[key] = self._loop(kind).run_until_complete(make())
        return self.clients[key]

    def echo(
        self, request_bytes: int, response_bytes: int
    ) -> tuple[echo_server.EchoClient, server_process.ServerProcess]:
        """An echo server of these byte counts and a client of it, on the run's loop."""
        key = (request_bytes, response_bytes)
        if key not in self.echoes:
            server = self._started(echo_server.echo(*key, "--loop", self.loop_kind))
            client = self.loop.run_until_complete(
                echo_server.EchoClient.connect(server.host, server.port, *key)
            )
            self.echoes[key] = client, server
        return self.echoes[key]

    def _loop(self, kind: str) -> asyncio.AbstractEventLoop:
        if kind not in self.loops:
            self.loops[kind] = loops.new_event_loop(kind)
        return self.loops[kind]

    def run(
        self, coro: Callable[[], Coroutine[Any, Any, Any]], loop: str | None = None
    ) -> Callable[[], Any]:
        event_loop = self._loop(loop or self.loop_kind)
        return lambda: event_loop.run_until_complete(coro())

    def close(self) -> None:
        for (*_, kind), client in self.clients.items():
            self.loops[kind].run_until_complete(client.close())
        for echo, echo_process in self.echoes.values():
            echo.close()
            echo_process.stop()
        for loop in self.loops.values():
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
        for server in self.servers.values():
            server.stop()
        os.sched_setaffinity(0, self.own_affinity)

    def loop_info(self, server: server_process.ServerProcess) -> dict[str, str]:
        """The loops a result ran on: this client's, as it runs, and its server's, as it said."""
        return {"loop": loops.kind(self.loop), "server_loop": server.loop}


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


def _cpu_ratio(
    subject: Callable[[], Any],
    subject_pid: int,
    baseline: Callable[[], Any],
    baseline_pid: int,
    pairs: int,
) -> float:
    """Median over ``pairs`` back-to-back pairs (alternating order) of the CPU time ``subject``
    costs over what ``baseline`` costs, each the client's (this thread's) plus its server
    process's. CPU time leaves out the waits for a core that a busy machine adds to every
    wake-up (they compress a wall-clock ratio towards 1)."""

    def cpu_ns(work: Callable[[], Any], pid: int) -> int:
        clock = placement.cpu_clock(pid)
        client, server = time.thread_time_ns(), time.clock_gettime_ns(clock)
        work()
        return time.thread_time_ns() - client + time.clock_gettime_ns(clock) - server

    ratios = []
    for i in range(pairs):
        if i % 2:
            a = cpu_ns(subject, subject_pid)
            b = cpu_ns(baseline, baseline_pid)
        else:
            b = cpu_ns(baseline, baseline_pid)
            a = cpu_ns(subject, subject_pid)
        ratios.append(a / max(b, 1))
    return statistics.median(ratios)


def _tcp_floors(
    env: _Bench, codec: str, subject: Callable[[], Any], calls: int, pairs: int, sample_s: float
) -> dict[str, Any]:
    """Our ``tcp`` unary round trip over a raw echo of the same bytes on the same loop
    (``vs_echo``; ``vs_echo_cpu``: the same in client + server CPU time), and with both ends
    on asyncio over both on uvloop (``asyncio_vs_uvloop``), each a paired ratio; with the
    echo's byte counts, loops and whether every echo was whole."""
    expected = env.service.infer(SMALL_REQUEST)
    wire_codec = ic.get(codec, extensions=True)
    request_bytes, response_bytes = infer_wire_bytes(wire_codec, SMALL_REQUEST, expected)
    echo, echo_process = env.echo(request_bytes, response_bytes)

    async def echoes() -> list[int]:
        return [await echo.round_trip() for _ in range(calls)]

    floor = env.run(echoes)
    received = floor()  # warm, and checked: each round trip got the whole response, no more
    ours, theirs = env.server("tcp", codec).process, echo_process.process
    assert ours is not None
    assert theirs is not None
    info: dict[str, Any] = {
        "vs_echo": paired_ratio(subject, floor, pairs, min_sample_s=sample_s),
        "vs_echo_cpu": _cpu_ratio(subject, ours.pid, floor, theirs.pid, pairs),
        "echo_request_bytes": request_bytes,
        "echo_response_bytes": response_bytes,
        "echo_loop": env.loop_kind,
        "echo_server_loop": echo_process.loop,
        "echo_correct": received == [response_bytes] * calls,
    }
    if loops.uvloop_installed():
        on: dict[str, Callable[[], Any]] = {}
        correct = True
        for kind in loops.CONCRETE:
            on[kind] = env.run(_unary(env.client("tcp", codec, loop=kind), calls), kind)
            correct &= _unary_correct(on[kind]())  # warm, and checked
        info["asyncio_vs_uvloop"] = paired_ratio(
            on["asyncio"], on["uvloop"], pairs, min_sample_s=sample_s
        )
        info["asyncio_vs_uvloop_correct"] = correct
    return info


@pytest.mark.parametrize("codec", UNARY_CODECS)
@pytest.mark.parametrize(
    "transport",
    [*TRANSPORTS, "http1-new-connection", WEBSOCKET, f"{WEBSOCKET}-new-connection"],
)
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
    sample_s = 0.0 if benchmark.disabled else MIN_SAMPLE_S
    floor = bench_env.run(_unary(bench_env.client("tcp", codec), calls))
    floor()
    benchmark.extra_info.update(
        transport=transport,
        codec=codec,
        op="unary",
        calls=calls,
        request_bytes=len(ic.get(codec, extensions=True).encode(SMALL_REQUEST)),
        vs_tcp=paired_ratio(subject, floor, pairs, min_sample_s=sample_s),
        pairs=pairs,
        correct=_unary_correct(responses),
        **bench_env.loop_info(bench_env.server(name, codec)),
    )
    assert benchmark.extra_info["correct"], f"{transport} {codec}: wrong unary response"
    if transport == "tcp":
        floors = _tcp_floors(bench_env, codec, subject, calls, pairs, sample_s)
        benchmark.extra_info.update(floors)
        assert floors["echo_correct"], f"echo of {codec}'s byte counts: a response was not whole"
        assert floors.get("asyncio_vs_uvloop_correct", True), f"tcp {codec}: wrong unary response"


@pytest.mark.parametrize("codec", STREAM_CODECS)
@pytest.mark.parametrize("transport", [*TRANSPORTS, WEBSOCKET])
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
        **bench_env.loop_info(bench_env.server(transport, codec)),
    )
    assert chunks == expected, f"{transport} {codec}: stream differs from the service's"
