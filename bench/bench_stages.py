"""Where a streamed token's time goes, and how much of a request is network.

``bench_stages``: one timed ``stream-256`` per transport x codec, the service paced at
``DECODE_MS`` per token so the client keeps up (at zero pacing the server outruns the reader
and "network" becomes queueing). Per chunk, with the server's stamps
(:mod:`inferwire.transports.timing`): server serialize, server write, network (written to
received: loopback plus the reader's wake-up), client parse. Medians go in ``extra_info``.

The same run splits the request's own path to its first token: client serialize, network to
server, server parse, service (parsed to first chunk produced), server serialize, write,
network back, client parse (``request_stages_us``).

``bench_wan_share`` (claim C7): 16 tokens at 10 ms of compute each (prefill 10 ms, then
10 ms per token), direct and through the WAN-delay proxy at 20 ms one way, as one stream and
as one request per token (each a one-token request: 10 ms of compute); the difference is what
the network adds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import inferwire.transports as it
from inferwire.bench.procs import server_process
from inferwire.transports.timing import REQUEST_STAGES
from inferwire.workloads import token_stream_source

DECODE_MS = 1.0
STAGE_CODECS = ("orjson", "protobuf", "delta")
STAGE_WORKLOAD = "stream-256"
WAN_DECODE_MS = 10.0
WAN_DELAY_MS = 20.0
WAN_TOKENS = 16


class _Env:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.processes: dict[tuple[str, ...], server_process.ServerProcess] = {}

    def server(
        self, transport: str, codec: str, decode_ms: float, prefill_ms: float = 0.0
    ) -> server_process.ServerProcess:
        key = (transport, codec, str(decode_ms), str(prefill_ms))
        if key not in self.processes:
            self.processes[key] = server_process.serve(
                transport, codec, "--decode-ms", str(decode_ms), "--prefill-ms", str(prefill_ms)
            ).start()
        return self.processes[key]

    def proxy(
        self, upstream: server_process.ServerProcess, delay_ms: float
    ) -> server_process.ServerProcess:
        key = ("proxy", upstream.address, str(delay_ms))
        if key not in self.processes:
            self.processes[key] = server_process.proxy(upstream.address, delay_ms).start()
        return self.processes[key]

    def close(self) -> None:
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()
        for process in self.processes.values():
            process.stop()


@pytest.fixture(scope="module")
def stage_env() -> Iterator[_Env]:
    env = _Env()
    yield env
    env.close()


@pytest.mark.parametrize("codec", STAGE_CODECS)
@pytest.mark.parametrize("transport", it.TRANSPORTS)
def bench_stages(benchmark: Any, stage_env: _Env, transport: str, codec: str) -> None:
    server = stage_env.server(transport, codec, DECODE_MS)
    workload = "stream-16" if benchmark.disabled else STAGE_WORKLOAD
    request = it.GenerateRequest(workload=workload)
    expected = list(it.SimulatedService(token_stream_source).chunks(request))
    timings: list[it.StreamTiming] = []

    async def timed() -> list[Any]:
        timing = it.StreamTiming()
        async with it.connect(transport, server.address, codec=codec) as client:
            # untimed first: the connection is open and the server has built the workload,
            # so the request's stages are a steady-state request's
            [chunk async for chunk in client.generate(request)]
            chunks = [chunk async for chunk in client.generate(request, timing=timing)]
        timings.append(timing)
        return chunks

    chunks = benchmark.pedantic(lambda: stage_env.loop.run_until_complete(timed()), rounds=1)
    benchmark.group = "stages"
    stages = timings[-1].stages_ns()
    medians = {name: float(np.median(values)) / 1e3 for name, values in stages.items()}
    request_stages = {name: ns / 1e3 for name, ns in timings[-1].request_stages_ns().items()}
    benchmark.extra_info.update(
        transport=transport,
        codec=codec,
        op="stages",
        workload=workload,
        decode_ms=DECODE_MS,
        chunks=len(chunks),
        stages_us=medians,
        request_stages_us=request_stages,
        correct=chunks == expected
        and len(timings[-1].server) == len(expected)
        and len(request_stages) == len(REQUEST_STAGES),
    )
    assert benchmark.extra_info["correct"], f"{transport} {codec}: wrong stream or stamps"


@pytest.mark.parametrize("pattern", ["stream", "request-per-token"])
@pytest.mark.parametrize("path", ["direct", "proxied"])
@pytest.mark.parametrize("transport", ["http1", "grpc"])
def bench_wan_share(
    benchmark: Any, stage_env: _Env, transport: str, path: str, pattern: str
) -> None:
    codec = "protobuf"
    compute_ms = 0.0 if benchmark.disabled else WAN_DECODE_MS
    server = stage_env.server(transport, codec, compute_ms, compute_ms)
    delay_ms = 1.0 if benchmark.disabled else WAN_DELAY_MS
    address = stage_env.proxy(server, delay_ms).address if path == "proxied" else server.address
    tokens = 2 if benchmark.disabled else WAN_TOKENS
    service = it.SimulatedService(token_stream_source)
    stream_request = it.GenerateRequest(workload="stream-16", max_tokens=tokens)
    token_requests = [
        it.GenerateRequest(workload="stream-16", seed=i, max_tokens=1) for i in range(tokens)
    ]
    if pattern == "stream":
        expected = list(service.chunks(stream_request))
    else:
        expected = [service.chunks(r)[0] for r in token_requests]

    async def run(client: it.Client) -> list[Any]:
        if pattern == "stream":
            return [chunk async for chunk in client.generate(stream_request)]
        out: list[Any] = []
        for request in token_requests:  # a client asking for one token at a time
            out += [chunk async for chunk in client.generate(request)]
        return out

    client = stage_env.loop.run_until_complete(_connect(transport, address, codec))
    try:
        stage_env.loop.run_until_complete(run(client))  # warm: connection open
        chunks = benchmark.pedantic(
            lambda: stage_env.loop.run_until_complete(run(client)),
            rounds=1 if benchmark.disabled else 3,
        )
    finally:
        stage_env.loop.run_until_complete(client.close())
    benchmark.group = "wan share"
    benchmark.extra_info.update(
        transport=transport,
        codec=codec,
        op="wan-share",
        path=path,
        pattern=pattern,
        tokens=tokens,
        compute_ms_per_token=compute_ms,
        one_way_delay_ms=delay_ms if path == "proxied" else 0.0,
        correct=chunks == expected,
    )
    assert chunks == expected, f"{transport} {path} {pattern}: wrong tokens"


async def _connect(transport: str, address: str, codec: str) -> it.Client:
    return it.connect(transport, address, codec=codec)
