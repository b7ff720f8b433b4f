"""What watching a server costs: the same server with its Prometheus metrics on and off.

``bench_metrics_stream`` and ``bench_metrics_unary``, per transport (orjson): two server
processes of one transport, one recording its metrics (:mod:`inferwire.transports.metrics`,
as ``inferwire serve`` does by default, with a ``--metrics-port`` side server that is never
scraped while timing) and one with ``--no-metrics`` (what every other suite runs), one client
each, on loopback with no pacing, so the work around the metrics is as small as it gets and
their share as large. pytest-benchmark times the metrics-on side; ``extra_info`` holds the
comparisons, each the median over ``PAIRS`` back-to-back pairs in alternating order:

- ``metrics_on_vs_off``: wall time of the client's call (a whole ``stream-256`` response, or
  ``UNARY_CALLS`` small infer round trips), on over off
  (:func:`~inferwire.bench.measure.paired.paired_ratio`);
- ``metrics_on_vs_off_server_cpu``: the server process's CPU time over the same calls, on over
  off (``CPU_PAIRS`` pairs, each side some 20 ms of calls): the metrics are the server's work,
  and CPU time leaves out the waits for a core that a busy machine adds to every wake-up (they
  pull a wall-clock ratio towards 1);
- ``metrics_server_cpu_ns_per_token`` (streams) or ``..._per_call`` (unary): the server CPU
  time the metrics add, on minus off, per token or per request.

A stream's writes carry a batch of chunks each (up to 32 when the server outruns the client, as
it does here), so its metrics cost is per write and per request, not per token: paced at a
token a write, the per-token cost is higher (``bench_load`` and a load run show that case).
``correct``: every answer was what the service produced, on both servers; ``metrics_correct``:
a scrape of the metrics-on server after timing counts every call this benchmark made, ``ok``,
and its tokens.

The difference is a few microseconds in hundreds, which a shared 2-core machine's noise can
hide (a paired ratio below 1 is that noise), so ``bench_metrics_meter_stream`` and
``bench_metrics_meter_unary`` also time the metrics' own work in this process, without I/O:
one 256-token stream's meter at a token a write and at 32, and one unary call's
(``ns_per_token``, ``ns_per_call``).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime import loops
from inferwire.bench.measure.paired import paired_ratio
from inferwire.bench.procs import placement
from inferwire.transports import server_process
from inferwire.transports.metrics import ServerMetrics
from inferwire.workloads import token_stream_source

CODEC = "orjson"
TRANSPORTS = it.TRANSPORTS
PAIRS = 21
MIN_SAMPLE_S = 0.005
CPU_PAIRS = 31
MIN_CPU_SAMPLE_S = 0.02
"""The server CPU comparison's pairs, each side as many calls as last this long: the metrics
add a few microseconds to a call of hundreds, so one call a side leaves the difference in the
noise of the server's own wake-ups."""
STREAM_WORKLOAD = "stream-256"
UNARY_CALLS = 20
SMALL_REQUEST = ic.InferRequest(
    model="sim",
    id="small",
    inputs=(
        ic.Tensor(
            name="x", datatype="FP32", shape=(1, 16), data=np.arange(16, dtype=np.float32)[None]
        ),
    ),
)
SCRAPE_TIMEOUT_S = 60.0


class _Observed:
    """One event loop of the run's kind; per transport a metrics-on and a metrics-off server
    and a client of each, every server on one core and this process on another when there are
    two (:func:`~inferwire.bench.procs.placement.split_cores`)."""

    def __init__(self) -> None:
        self.own_affinity = os.sched_getaffinity(0)
        self.cores = placement.split_cores()
        if self.cores is not None:
            os.sched_setaffinity(0, {self.cores[1]})
        self.loop_kind = loops.requested_loop()
        self.loop = loops.new_event_loop(self.loop_kind)
        self.servers: dict[tuple[str, bool], server_process.ServerProcess] = {}
        self.clients: dict[tuple[str, bool], it.Client] = {}
        self.requests: dict[tuple[str, bool, str], int] = {}
        """Requests of each kind each server has answered, warm-ups included."""
        self.service = it.SimulatedService(token_stream_source)

    def server(self, transport: str, metrics: bool) -> server_process.ServerProcess:
        key = (transport, metrics)
        if key not in self.servers:
            options = ("--metrics-port", "0") if metrics else ()
            process = server_process.serve(transport, CODEC, *options, "--loop", self.loop_kind)
            process.start()
            if self.cores is not None and process.process is not None:
                placement.pin_threads(process.process.pid, self.cores[0])
            self.servers[key] = process
        return self.servers[key]

    def client(self, transport: str, metrics: bool) -> it.Client:
        key = (transport, metrics)
        if key not in self.clients:
            address = self.server(transport, metrics).address

            async def make() -> it.Client:
                return it.connect(transport, address, codec=CODEC)

            self.clients[key] = self.loop.run_until_complete(make())
        return self.clients[key]

    def counted(
        self,
        transport: str,
        metrics: bool,
        kind: str,
        requests: int,
        go: Callable[[], Coroutine[Any, Any, Any]],
    ) -> Callable[[], Any]:
        """``go`` run to completion on the loop; each run is ``requests`` requests of
        ``kind``, counted against its server."""
        key = (transport, metrics, kind)
        self.requests.setdefault(key, 0)

        def run() -> Any:
            self.requests[key] += requests
            return self.loop.run_until_complete(go())

        return run

    def close(self) -> None:
        for client in self.clients.values():
            self.loop.run_until_complete(client.close())
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()
        for server in self.servers.values():
            server.stop()
        os.sched_setaffinity(0, self.own_affinity)


@pytest.fixture(scope="module")
def observed() -> Iterator[_Observed]:
    env = _Observed()
    yield env
    env.close()


def _server_cpu(
    on: Callable[[], Any],
    on_pid: int,
    off: Callable[[], Any],
    off_pid: int,
    pairs: int,
    min_sample_s: float,
) -> tuple[float, float]:
    """The medians over ``pairs`` back-to-back pairs (alternating order) of the server CPU
    time of ``on`` over that of ``off``, and of their difference per call (ns); each side of a
    pair as many calls as last ``min_sample_s``, the same number on both sides."""
    calls = 1
    if min_sample_s > 0:
        start = time.perf_counter()
        off()
        calls = max(1, min(1000, round(min_sample_s / max(time.perf_counter() - start, 1e-9))))

    def cpu_ns(work: Callable[[], Any], pid: int) -> int:
        clock = placement.cpu_clock(pid)
        start = time.clock_gettime_ns(clock)
        for _ in range(calls):
            work()
        return time.clock_gettime_ns(clock) - start

    ratios, differences = [], []
    for i in range(pairs):
        if i % 2:
            a = cpu_ns(on, on_pid)
            b = cpu_ns(off, off_pid)
        else:
            b = cpu_ns(off, off_pid)
            a = cpu_ns(on, on_pid)
        ratios.append(a / max(b, 1))
        differences.append((a - b) / calls)
    return statistics.median(ratios), statistics.median(differences)


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _scraped(server: server_process.ServerProcess) -> Samples:
    """The metrics-on server's samples, by name and labels."""
    text = httpx.get(f"http://{server.metrics_address}/metrics", timeout=SCRAPE_TIMEOUT_S).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    wanted = frozenset(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def _metrics_correct(env: _Observed, transport: str) -> bool:
    """Whether the metrics-on server counted every request this suite made of it, by kind, all
    ``ok``, and their tokens, with nothing in flight (it may still be ending the last request
    as its client reads it: asked again for a while)."""
    tokens_per_stream = len(env.service.chunks(it.GenerateRequest(workload=STREAM_WORKLOAD)))
    streams = env.requests.get((transport, True, "stream"), 0)
    unary = env.requests.get((transport, True, "unary"), 0)
    labels = {"transport": transport, "codec": CODEC}
    deadline = time.monotonic() + SCRAPE_TIMEOUT_S
    while True:
        samples = _scraped(env.server(transport, True))
        requests = "inferwire_requests_total"
        correct = (
            _value(samples, requests, kind="stream", outcome="ok", **labels) == streams
            and _value(samples, requests, kind="unary", outcome="ok", **labels) == unary
            and _value(samples, requests, **labels) == streams + unary
            and _value(samples, "inferwire_generation_tokens_total", **labels)
            == streams * tokens_per_stream
            and _value(samples, "inferwire_streams_in_flight") == 0
        )
        if correct or time.monotonic() > deadline:
            return correct
        time.sleep(0.05)


def _pids(env: _Observed, transport: str) -> tuple[int, int]:
    on, off = env.server(transport, True).process, env.server(transport, False).process
    assert on is not None
    assert off is not None
    return on.pid, off.pid


def _on_vs_off(
    benchmark: Any,
    observed: _Observed,
    transport: str,
    on: Callable[[], Any],
    off: Callable[[], Any],
) -> tuple[float, float, float, int, int]:
    """Metrics on against off, paired: the wall ratio, the server CPU ratio and the server CPU
    added per round (ns), and how many pairs of each were taken (one each when untimed)."""
    pairs = 1 if benchmark.disabled else PAIRS
    sample_s = 0.0 if benchmark.disabled else MIN_SAMPLE_S
    wall = paired_ratio(on, off, pairs, min_sample_s=sample_s)
    on_pid, off_pid = _pids(observed, transport)
    cpu_pairs = 1 if benchmark.disabled else CPU_PAIRS
    cpu_sample_s = 0.0 if benchmark.disabled else MIN_CPU_SAMPLE_S
    cpu, cpu_ns = _server_cpu(on, on_pid, off, off_pid, cpu_pairs, cpu_sample_s)
    return wall, cpu, cpu_ns, pairs, cpu_pairs


@pytest.mark.parametrize("transport", TRANSPORTS)
def bench_metrics_stream(benchmark: Any, observed: _Observed, transport: str) -> None:
    """One whole ``stream-256`` response, request to end marker, from the metrics-on server."""
    request = it.GenerateRequest(workload=STREAM_WORKLOAD)
    expected = list(observed.service.chunks(request))
    sides = {}
    for metrics in (True, False):
        client = observed.client(transport, metrics)

        async def go(client: it.Client = client) -> list[ic.TokenChunk]:
            return [chunk async for chunk in client.generate(request)]

        sides[metrics] = observed.counted(transport, metrics, "stream", 1, go)
    on, off = sides[True], sides[False]
    correct = on() == expected and off() == expected  # warm, and checked
    benchmark.group = "observe metrics stream"
    chunks = benchmark(on)
    correct &= chunks == expected
    wall, cpu, cpu_ns, pairs, cpu_pairs = _on_vs_off(benchmark, observed, transport, on, off)
    benchmark.extra_info.update(
        transport=transport,
        codec=CODEC,
        op="stream",
        workload=STREAM_WORKLOAD,
        chunks=len(expected),
        metrics_on_vs_off=wall,
        metrics_on_vs_off_server_cpu=cpu,
        metrics_server_cpu_ns_per_token=cpu_ns / len(expected),
        pairs=pairs,
        cpu_pairs=cpu_pairs,
        correct=correct,
        metrics_correct=_metrics_correct(observed, transport),
        loop=loops.kind(observed.loop),
        server_loop=observed.server(transport, True).loop,
    )
    assert correct, f"{transport}: a stream differs from the service's"
    assert benchmark.extra_info["metrics_correct"], f"{transport}: the metrics miscount"


@pytest.mark.parametrize("transport", TRANSPORTS)
def bench_metrics_unary(benchmark: Any, observed: _Observed, transport: str) -> None:
    """``UNARY_CALLS`` small infer round trips in turn, from the metrics-on server."""
    calls = 1 if benchmark.disabled else UNARY_CALLS
    expected = observed.service.infer(SMALL_REQUEST)
    sides = {}
    for metrics in (True, False):
        client = observed.client(transport, metrics)

        async def go(client: it.Client = client) -> list[Any]:
            return [await client.infer(SMALL_REQUEST) for _ in range(calls)]

        sides[metrics] = observed.counted(transport, metrics, "unary", calls, go)
    on, off = sides[True], sides[False]
    correct = on() == [expected] * calls and off() == [expected] * calls
    benchmark.group = "observe metrics unary"
    responses = benchmark(on)
    correct &= responses == [expected] * calls
    wall, cpu, cpu_ns, pairs, cpu_pairs = _on_vs_off(benchmark, observed, transport, on, off)
    benchmark.extra_info.update(
        transport=transport,
        codec=CODEC,
        op="unary",
        calls=calls,
        metrics_on_vs_off=wall,
        metrics_on_vs_off_server_cpu=cpu,
        metrics_server_cpu_ns_per_call=cpu_ns / calls,
        pairs=pairs,
        cpu_pairs=cpu_pairs,
        correct=correct,
        metrics_correct=_metrics_correct(observed, transport),
        loop=loops.kind(observed.loop),
        server_loop=observed.server(transport, True).loop,
    )
    assert correct, f"{transport}: a unary answer differs from the service's"
    assert benchmark.extra_info["metrics_correct"], f"{transport}: the metrics miscount"


METER_TOKENS = 256


def _median_ns(benchmark: Any) -> float:
    """The timed call's median, ns (NaN when the benchmark is not timed)."""
    return float("nan") if benchmark.disabled else benchmark.stats.stats.median * 1e9


@pytest.mark.parametrize("chunks_per_write", [1, 32])
def bench_metrics_meter_stream(benchmark: Any, chunks_per_write: int) -> None:
    """The metrics' own work for one 256-token stream, in this process, no I/O: what a server
    records per request (start, end) and per write (a batch's encode time, then its write),
    with a token a write (paced: a model slower than the wire) or 32 (the most a write carries,
    when the server outruns its reader). ``ns_per_token``: the median over the tokens."""
    server_metrics = ServerMetrics("tcp", CODEC)
    writes = METER_TOKENS // chunks_per_write

    def one_stream() -> None:
        meter = server_metrics.start("stream")
        for _ in range(writes):
            meter.encoded(chunks_per_write, 1000)
            meter.written(250 * chunks_per_write)
        meter.finish("ok")

    benchmark.group = "observe metrics meter"
    benchmark(one_stream)
    runs = server_metrics.requests["stream", "ok"].value
    benchmark.extra_info.update(
        op="meter stream",
        tokens=METER_TOKENS,
        chunks_per_write=chunks_per_write,
        ns_per_token=_median_ns(benchmark) / METER_TOKENS,
        correct=server_metrics.tokens.value == runs * METER_TOKENS
        and server_metrics.in_flight.value == 0,
    )
    assert benchmark.extra_info["correct"]


def bench_metrics_meter_unary(benchmark: Any) -> None:
    """The metrics' own work for one unary request: start, one write, end."""
    server_metrics = ServerMetrics("tcp", CODEC)

    def one_call() -> None:
        meter = server_metrics.start("unary")
        meter.written(100)
        meter.finish("ok")

    benchmark.group = "observe metrics meter"
    benchmark(one_call)
    benchmark.extra_info.update(
        op="meter unary",
        ns_per_call=_median_ns(benchmark),
        correct=server_metrics.requests["unary", "ok"].value >= 1
        and server_metrics.in_flight.value == 0,
    )
    assert benchmark.extra_info["correct"]
