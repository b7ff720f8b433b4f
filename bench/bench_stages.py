"""Where a streamed token's time goes, and how much of a request is network.

``bench_stages``: per transport x codec, on one connection, the service paced at ``DECODE_MS``
per token so the client keeps up (at zero pacing the server outruns the reader and "network"
becomes queueing). Every figure is a P50 with its P90 beside it, warm-up excluded:

- per chunk: ``WARMUP_STREAMS`` untimed ``stream-256`` then ``STREAMS`` timed ones (about
  0.27 s each), their chunks pooled (3 x 256 = 768 chunks). With the server's stamps
  (:mod:`inferwire.transports.timing`): server serialize, network (encoded, before the
  server's write call, to the client's read returned: the write call, loopback and the
  reader's wake-up), client parse, produced to decoded (the three add up to it), and the
  server's write call alone (``write``, inside network); and each chunk's own shares
  (``shares``), so a share is a per-chunk ratio, not a ratio of medians.
- a request's own path to its first token: ``WARMUP_REQUESTS`` untimed then ``REQUESTS``
  short requests (``REQUEST_TOKENS`` tokens each), each sent ``IDLE_GAP_S`` after the previous
  one ended, as on an idle connection: client serialize, client dispatch, network to server,
  server parse, service (parsed to first chunk produced), server serialize, network back,
  client parse (``request_stages_us``). One request alone is no figure: the first requests a
  fresh server process answers pay its cold start (a first parse of 5 ms beside 0.1 ms).

Every network stage runs from a stamp taken before the sender's write call to one taken after
the receiver's read returned, on the host's one monotonic clock: no sample is below zero, and
the benchmark fails if one is.

``bench_wan_share`` (claim C7): 16 tokens at 10 ms of compute each (prefill 10 ms, then
10 ms per token), direct and through the WAN-delay proxy at 20 ms one way, as one stream and
as one request per token (each a one-token request: 10 ms of compute). Direct and proxied
alternate within one benchmark (direct then proxied, then proxied then direct, ...), and the
network share is the median over the pairs of 1 - direct / proxied.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import inferwire.transports as it
from inferwire._runtime import loops
from inferwire.transports import server_process
from inferwire.transports.timing import REQUEST_STAGES
from inferwire.workloads import token_stream_source

DECODE_MS = 1.0
STAGE_CODECS = ("orjson", "protobuf", "delta")
STAGE_WORKLOAD = "stream-256"
WAN_DECODE_MS = 10.0
WAN_DELAY_MS = 20.0
WAN_TOKENS = 16
WARMUP_STREAMS = 1
STREAMS = 3
WARMUP_REQUESTS = 5
REQUESTS = 40
REQUEST_TOKENS = 4
IDLE_GAP_S = 0.01
"""Pause before each timed stream or request (0.5 s a cell in all)."""
WAN_PAIRS = 6
"""Direct/proxied pairs per WAN cell: 12 timed rounds, about 2 s (stream) and 6 s (one
request per token) per transport."""


class _Env:
    def __init__(self) -> None:
        self.loop = loops.new_event_loop(loops.requested_loop())
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

    def loop_info(self, *processes: server_process.ServerProcess) -> dict[str, str]:
        """The loops of a result: this client's as it runs, its server's (and proxy's) as
        announced."""
        info = {"loop": loops.kind(self.loop), "server_loop": processes[0].loop}
        if len(processes) > 1:
            info["proxy_loop"] = processes[1].loop
        return info

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


def percentiles_us(samples_ns: dict[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    """P50 and P90 in microseconds of each stage's samples (nanoseconds)."""
    p50 = {name: float(np.percentile(v, 50)) / 1e3 for name, v in samples_ns.items()}
    p90 = {name: float(np.percentile(v, 90)) / 1e3 for name, v in samples_ns.items()}
    return p50, p90


def chunk_shares(stages_ns: dict[str, np.ndarray], decode_ms: float) -> dict[str, float]:
    """Per chunk, then the median over chunks: serialize + parse in produced to decoded
    (``serialize_parse``), the same once a token's compute is counted
    (``serialize_parse_with_compute``), and produced to decoded beside the compute
    (``transport_with_compute``)."""
    codec = stages_ns["serialize"] + stages_ns["parse"]
    path = np.maximum(stages_ns["end_to_end"], 1)
    with_compute = path + decode_ms * 1e6
    return {
        "serialize_parse": float(np.median(codec / path)),
        "serialize_parse_with_compute": float(np.median(codec / with_compute)),
        "transport_with_compute": float(np.median(path / with_compute)),
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    """One transport x codec cell's timed streams and requests, and whether each answer was
    the expected one."""

    streams: list[it.StreamTiming]
    requests: list[it.StreamTiming]
    outputs: list[bool]
    chunks: int
    """Chunks in each timed stream."""


async def measure(
    transport: str,
    address: str,
    codec: str,
    *,
    workload: str,
    streams: int,
    requests: int,
    warmup_requests: int,
) -> Measured:
    """On one connection: ``WARMUP_STREAMS`` untimed streams and ``warmup_requests`` untimed
    requests, then ``streams`` timed streams of ``workload`` and ``requests`` short ones, each
    after ``IDLE_GAP_S``."""
    stream_request = it.GenerateRequest(workload=workload)
    short_request = it.GenerateRequest(workload=workload, max_tokens=REQUEST_TOKENS)
    service = it.SimulatedService(token_stream_source)
    expected = list(service.chunks(stream_request))
    expected_short = list(service.chunks(short_request))
    outputs: list[bool] = []

    async def timed(client: it.Client, request: it.GenerateRequest) -> it.StreamTiming:
        # each on an idle connection: right after a stream the client's loop is still
        # finishing it, and that work would land among the next request's stamps
        await asyncio.sleep(IDLE_GAP_S)
        timing = it.StreamTiming()
        chunks = [chunk async for chunk in client.generate(request, timing=timing)]
        outputs.append(chunks == (expected if request is stream_request else expected_short))
        return timing

    async with it.connect(transport, address, codec=codec) as client:
        # untimed first: the connection is open, the server process past its cold start
        # and the workload built, so what follows is a steady-state request's
        for _ in range(WARMUP_STREAMS):
            await timed(client, stream_request)
        for _ in range(warmup_requests):
            await timed(client, short_request)
        outputs.clear()
        stream_timings = [await timed(client, stream_request) for _ in range(streams)]
        request_timings = [await timed(client, short_request) for _ in range(requests)]
    return Measured(
        streams=stream_timings, requests=request_timings, outputs=outputs, chunks=len(expected)
    )


def pooled_ns(measured: Measured) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Every stage's samples (ns): the timed streams' chunks pooled, and the requests' (those
    with every stamp)."""
    per_stream = [t.stages_ns() for t in measured.streams]
    chunks = {name: np.concatenate([s[name] for s in per_stream]) for name in per_stream[0]}
    per_request = [t.request_stages_ns() for t in measured.requests]
    requests = {
        name: np.asarray([r[name] for r in per_request if r], dtype=np.float64)
        for name in REQUEST_STAGES
    }
    return chunks, requests


def negative_stages(samples_ns: dict[str, np.ndarray]) -> dict[str, float]:
    """The stages with a sample below zero, and their lowest (ns): none, as each is a
    difference of two stamps in causal order (:mod:`inferwire.transports.timing`)."""
    return {name: float(v.min()) for name, v in samples_ns.items() if len(v) and v.min() < 0}


@pytest.mark.parametrize("codec", STAGE_CODECS)
@pytest.mark.parametrize("transport", it.TRANSPORTS)
def bench_stages(benchmark: Any, stage_env: _Env, transport: str, codec: str) -> None:
    server = stage_env.server(transport, codec, DECODE_MS)
    quick = benchmark.disabled  # one short pass in CI: every code path, few samples
    workload = "stream-16" if quick else STAGE_WORKLOAD
    streams, requests = (1, 2) if quick else (STREAMS, REQUESTS)
    warmup_requests = 1 if quick else WARMUP_REQUESTS
    cell = functools.partial(
        measure,
        transport,
        server.address,
        codec,
        workload=workload,
        streams=streams,
        requests=requests,
        warmup_requests=warmup_requests,
    )
    measured: Measured = benchmark.pedantic(
        lambda: stage_env.loop.run_until_complete(cell()), rounds=1
    )
    benchmark.group = "stages"
    pooled, request_samples = pooled_ns(measured)
    whole = [len(t.request_stages_ns()) == len(REQUEST_STAGES) for t in measured.requests]
    stages_us, stages_p90_us = percentiles_us(pooled)
    request_us, request_p90_us = percentiles_us(request_samples)
    benchmark.extra_info.update(
        transport=transport,
        codec=codec,
        op="stages",
        workload=workload,
        decode_ms=DECODE_MS,
        chunks=measured.chunks,
        streams=streams,
        warmup_streams=WARMUP_STREAMS,
        pooled_chunks=len(pooled["serialize"]),
        **stage_env.loop_info(server),
        stages_us=stages_us,
        stages_p90_us=stages_p90_us,
        shares=chunk_shares(pooled, DECODE_MS),
        requests=requests,
        warmup_requests=warmup_requests,
        request_tokens=REQUEST_TOKENS,
        idle_gap_ms=IDLE_GAP_S * 1e3,
        request_stages_us=request_us,
        request_stages_p90_us=request_p90_us,
        correct=all(measured.outputs)
        and len(measured.outputs) == streams + requests
        and all(len(t.server) == measured.chunks for t in measured.streams)
        and all(whole),
    )
    assert benchmark.extra_info["correct"], f"{transport} {codec}: wrong stream or stamps"
    negative = negative_stages(pooled) | negative_stages(request_samples)
    assert not negative, f"{transport} {codec}: stages below zero (ns): {negative}"


@pytest.mark.parametrize("pattern", ["stream", "request-per-token"])
@pytest.mark.parametrize("transport", ["http1", "grpc"])
def bench_wan_share(benchmark: Any, stage_env: _Env, transport: str, pattern: str) -> None:
    codec = "protobuf"
    quick = benchmark.disabled
    compute_ms = 0.0 if quick else WAN_DECODE_MS
    server = stage_env.server(transport, codec, compute_ms, compute_ms)
    delay_ms = 1.0 if quick else WAN_DELAY_MS
    proxy = stage_env.proxy(server, delay_ms)
    addresses = {"direct": server.address, "proxied": proxy.address}
    tokens = 2 if quick else WAN_TOKENS
    pairs = 1 if quick else WAN_PAIRS
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

    loop = stage_env.loop
    clients = {
        path: loop.run_until_complete(_connect(transport, address, codec))
        for path, address in addresses.items()
    }
    times_s: dict[str, list[float]] = {"direct": [], "proxied": []}
    outputs: list[bool] = []

    def pair() -> None:
        # alternate which path goes first, so a drift of the machine within a pair cancels
        order = ("direct", "proxied") if len(times_s["direct"]) % 2 == 0 else ("proxied", "direct")
        for path in order:
            start = time.perf_counter()
            chunks = loop.run_until_complete(run(clients[path]))
            times_s[path].append(time.perf_counter() - start)
            outputs.append(chunks == expected)

    try:
        for client in clients.values():
            loop.run_until_complete(run(client))  # warm: connections open
        benchmark.pedantic(pair, rounds=pairs)
    finally:
        for client in clients.values():
            loop.run_until_complete(client.close())
    benchmark.group = "wan share"
    direct, proxied = (np.asarray(times_s[p]) for p in ("direct", "proxied"))
    benchmark.extra_info.update(
        transport=transport,
        codec=codec,
        op="wan-share",
        pattern=pattern,
        tokens=tokens,
        compute_ms_per_token=compute_ms,
        one_way_delay_ms=delay_ms,
        pairs=pairs,
        direct_ms=float(np.median(direct)) * 1e3,
        proxied_ms=float(np.median(proxied)) * 1e3,
        network_share=float(np.median(1 - direct / proxied)),
        **stage_env.loop_info(server, proxy),
        correct=all(outputs) and len(outputs) == 2 * pairs,
    )
    assert benchmark.extra_info["correct"], f"{transport} {pattern}: wrong tokens"


async def _connect(transport: str, address: str, codec: str) -> it.Client:
    return it.connect(transport, address, codec=codec)
