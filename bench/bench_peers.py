"""inferwire's HTTP servers beside what users deploy instead, on one core each.

Servers: inferwire ``http1`` beside uvicorn + Starlette (HTTP/1.1, httptools) and granian +
Starlette (its Rust HTTP/1.1), inferwire ``http2`` beside Hypercorn + Starlette (HTTP/2
cleartext, prior knowledge) and granian + Starlette (its Rust HTTP/2, h2c); the peers are
:mod:`inferwire.bench.procs.peer_servers`, serving the same service with the same codec, so
the bytes of every stream are the same. Our client (the same for both sides of a pair) drives each.
Every server and the client run on the run's event loop
(:func:`~inferwire.bench.procs.loops.requested_loop`: uvloop when installed, as
``uvicorn[standard]`` and Hypercorn's uvloop workers are deployed); each result records the
client's loop and its server's as announced, and a pair on different loops fails.

Method:

* the server process is pinned to one core (every thread, and every thread of the processes
  it started: granian serves from a worker process it forks), the benchmark process's client
  to the other, so the server has a core that nothing this benchmark starts competes for
  (other processes on the machine still may: ``load_average_1m`` records how busy it was);
* ``CONCURRENCY`` streams of ``stream-256`` at a time, no pacing (prefill and decode zero),
  until ``STREAMS`` streams have ended; a round is that many streams on a new client (so new
  connections: one per concurrent stream for HTTP/1.1, one for HTTP/2, each carrying a few
  MB), after one warm-up round. A client kept across rounds would meet Hypercorn's
  ``keep_alive_max_requests`` (1,000 streams per connection, then GOAWAY), which is not what
  is compared here;
* tokens per second is tokens over the rounds' wall time; tokens per server CPU-second divides
  by the server's CPU time over the same rounds (the CPU clock of its process and of every
  process it started, every thread, in nanoseconds: psutil's 10 ms ticks left a pair's ratio
  at 8/3 or 25/9; for granian, its main process and its worker, Rust threads included), which
  is the peers target's "tokens per second per core" and does not depend on whether the client
  could keep the server busy (``server_cpu_utilization`` says whether it did);
* per-token latency is the gap between successive chunks of a stream at the client (one token
  per chunk in this workload), P50 and P99 over every gap of every stream. With no pacing the
  server is ahead of the wire: chunks decoded from one read arrive together, microseconds
  apart, and the gaps between reads are rarer than 1 in 100, so P50 and P99 mostly time the
  client's own loop; P99.9, the largest gap and the mean time per output token (a stream's
  last arrival minus its first over its gaps, vLLM's TPOT) show the waits between reads;
* every stream is compared with the service's chunks after its round (untimed); a wrong one
  fails the benchmark;
* the client's GC is collected before each round and off during it; the servers run as
  deployed, GC on.

Each peer's benchmark then runs ``PAIRS`` pairs of rounds, its own and its inferwire
counterpart's back to back in alternating order, and records the median ratio ours / peer of
each figure: pairs cancel most of the drift of a shared machine that separate benchmarks,
seconds apart, would carry into the ratio. The target is 1.5x tokens per server CPU-second
against uvicorn and Hypercorn (Python HTTP stacks, like ours) and 1.0x against granian, whose
HTTP is Rust: our Python servers at or above a Rust server's I/O in front of a Python app.
"""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Final

import numpy as np
import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime import loops
from inferwire.bench.procs import peer_servers, placement
from inferwire.bench.report.peers import GROUP as PEERS_GROUP
from inferwire.transports import server_process
from inferwire.workloads import token_stream_source

CODEC: Final = "orjson"
WORKLOAD: Final = "stream-256"
CONCURRENCY: Final = 16
STREAMS: Final = 128
"""Streams per round: 32,768 tokens, half a second to two for inferwire's servers on this
(2-core, shared) machine."""
ROUNDS: Final = 3
PAIRS: Final = 5
"""Alternating pairs of rounds (ours, peer) behind each ratio; its median is recorded."""
TARGET_RATIO: Final = 1.5
RUST_TARGET_RATIO: Final = 1.0
"""Against granian: its HTTP is Rust, only the app (the same as the other peers') is Python."""


@dataclass(frozen=True, slots=True)
class _Server:
    stack: str
    transport: str
    """Our client's transport for it: ``http1`` or ``http2``."""
    start: Callable[[], server_process.ServerProcess]
    baseline: str | None = None
    target_ratio: float = TARGET_RATIO


SERVERS: Final = {
    "inferwire-http1": _Server("inferwire", "http1", lambda: server_process.serve("http1", CODEC)),
    "uvicorn": _Server(
        "uvicorn+starlette", "http1", lambda: peer_servers.peer("uvicorn", CODEC), "inferwire-http1"
    ),
    "granian-http1": _Server(
        "granian+starlette",
        "http1",
        lambda: peer_servers.peer("granian", CODEC),
        "inferwire-http1",
        RUST_TARGET_RATIO,
    ),
    "inferwire-http2": _Server("inferwire", "http2", lambda: server_process.serve("http2", CODEC)),
    "hypercorn": _Server(
        "hypercorn+starlette",
        "http2",
        lambda: peer_servers.peer("hypercorn", CODEC, "--http2"),
        "inferwire-http2",
    ),
    "granian-http2": _Server(
        "granian+starlette",
        "http2",
        lambda: peer_servers.peer("granian", CODEC, "--http2"),
        "inferwire-http2",
        RUST_TARGET_RATIO,
    ),
}


@dataclass(slots=True)
class _Tally:
    """What the rounds against one server add up to."""

    streams: int = 0
    tokens: int = 0
    wall_s: float = 0.0
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    gaps_ns: list[np.ndarray[Any, Any]] = field(default_factory=list)
    tpot_ns: list[float] = field(default_factory=list)
    correct: bool = True
    unchecked: list[list[ic.TokenChunk]] = field(default_factory=list)

    def check(self, expected: list[ic.TokenChunk]) -> None:
        self.correct &= all(chunks == expected for chunks in self.unchecked)
        self.unchecked = []

    def figures(self) -> dict[str, Any]:
        gaps_us = np.concatenate(self.gaps_ns) / 1e3 if self.gaps_ns else np.zeros(1)
        p50, p99, p999 = np.percentile(gaps_us, [50, 99, 99.9])
        return {
            "streams": self.streams,
            "tokens": self.tokens,
            "wall_s": self.wall_s,
            "server_cpu_s": self.server_cpu_s,
            "client_cpu_s": self.client_cpu_s,
            "tokens_per_s": self.tokens / self.wall_s,
            # a guard against no CPU time at all
            "tokens_per_server_cpu_s": self.tokens / max(self.server_cpu_s, 1e-6),
            "server_cpu_utilization": self.server_cpu_s / self.wall_s,
            "client_cpu_utilization": self.client_cpu_s / self.wall_s,
            "itl_p50_us": float(p50),
            "itl_p99_us": float(p99),
            "itl_p999_us": float(p999),
            "itl_max_us": float(gaps_us.max()),
            "itl_samples": int(gaps_us.size),
            "tpot_mean_us": float(np.mean(self.tpot_ns)) / 1e3 if self.tpot_ns else 0.0,
            "correct": self.correct,
        }


def server_pids(pid: int) -> tuple[int, ...]:
    """``pid`` and every process it started (granian's worker; none for the others)."""
    return (pid, *(child.pid for child in psutil.Process(pid).children(recursive=True)))


def cpu_ns(pids: tuple[int, ...]) -> int:
    """The CPU time of processes ``pids`` together (every thread of each), in nanoseconds.
    A process that has ended is an error: its time would be missing from a difference."""
    total = 0
    for pid in pids:
        try:
            total += time.clock_gettime_ns(placement.cpu_clock(pid))
        except OSError as exc:
            raise RuntimeError(f"server process {pid} has ended: its CPU time is lost") from exc
    return total


class _Env:
    """One event loop in a pinned benchmark process; one pinned server process per name."""

    def __init__(self) -> None:
        self.loop = loops.new_event_loop(loops.requested_loop())
        self.processes: dict[str, server_process.ServerProcess] = {}
        self.pids: dict[str, tuple[int, ...]] = {}
        """Each server's processes: its own and those it started (as it announced itself)."""
        self.request = it.GenerateRequest(workload=WORKLOAD)
        self.expected = list(it.SimulatedService(token_stream_source).chunks(self.request))
        self.own_affinity = os.sched_getaffinity(0)
        split = placement.split_cores()
        self.pinned = split is not None
        self.server_core, self.client_core = split or (-1, -1)
        if self.pinned:
            os.sched_setaffinity(0, {self.client_core})  # this thread: it runs the loop

    def server(self, name: str) -> tuple[str, tuple[int, ...]]:
        """The address and processes of ``name``'s server, started and pinned on first use."""
        if name not in self.processes:
            process = SERVERS[name].start().start()
            self.processes[name] = process
            # announced: granian's worker is up (it announces), so its pid is here
            self.pids[name] = server_pids(process.pid)
            if self.pinned:
                for pid in self.pids[name]:
                    placement.pin_threads(pid, self.server_core)
        return self.processes[name].address, self.pids[name]

    def loop_of(self, name: str) -> str:
        """The loop ``name``'s server announced it runs."""
        self.server(name)
        return self.processes[name].loop

    def round(self, name: str, streams: int, concurrency: int, tally: _Tally) -> None:
        address, pids = self.server(name)
        client = it.connect(SERVERS[name].transport, address, codec=CODEC)
        gc.collect()
        collecting = gc.isenabled()
        gc.disable()
        try:
            server_before = cpu_ns(pids)
            client_before = time.process_time()
            start = time.perf_counter()
            results = self.loop.run_until_complete(
                _drive(client, self.request, streams, concurrency)
            )
            tally.wall_s += time.perf_counter() - start
            tally.client_cpu_s += time.process_time() - client_before
            server_after = cpu_ns(pids)
        finally:
            self.loop.run_until_complete(client.close())
            if collecting:
                gc.enable()
        # the processes' CPU clocks (nanoseconds, every thread): psutil's cpu_times counts 10 ms
        # ticks, and a round's server CPU is a few of them (the ratios came out as 8/3, 25/9)
        tally.server_cpu_s += (server_after - server_before) / 1e9
        for chunks, arrivals_ns in results:
            tally.streams += 1
            tally.tokens += sum(len(c.token_ids) for c in chunks)
            tally.gaps_ns.append(np.diff(np.asarray(arrivals_ns, dtype=np.int64)))
            if len(arrivals_ns) > 1:
                tally.tpot_ns.append((arrivals_ns[-1] - arrivals_ns[0]) / (len(arrivals_ns) - 1))
            tally.unchecked.append(chunks)

    def close(self) -> None:
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()
        for process in self.processes.values():
            process.stop()
        os.sched_setaffinity(0, self.own_affinity)


async def _drive(
    client: it.Client, request: it.GenerateRequest, streams: int, concurrency: int
) -> list[tuple[list[ic.TokenChunk], list[int]]]:
    """``streams`` streams, ``concurrency`` at a time; each stream's chunks and their arrival
    times (ns)."""
    results: list[tuple[list[ic.TokenChunk], list[int]]] = []
    remaining = streams

    async def worker() -> None:
        nonlocal remaining
        clock = time.perf_counter_ns
        while remaining > 0:
            remaining -= 1
            chunks: list[ic.TokenChunk] = []
            arrivals: list[int] = []
            async for chunk in client.generate(request):
                arrivals.append(clock())
                chunks.append(chunk)
            results.append((chunks, arrivals))

    await asyncio.gather(*(worker() for _ in range(min(concurrency, streams))))
    return results


@pytest.fixture(scope="module")
def env() -> Iterator[_Env]:
    environment = _Env()
    yield environment
    environment.close()


def _measure(
    env: _Env, name: str, streams: int, concurrency: int, rounds: int, timed: Any
) -> _Tally:
    """Warm up, then ``rounds`` rounds timed by pytest-benchmark."""
    env.round(name, concurrency, concurrency, _Tally())  # connections, caches, first paths
    tally = _Tally()

    def setup() -> None:
        tally.check(env.expected)  # the previous round's streams, outside the timing

    timed.pedantic(
        env.round, (name, streams, concurrency, tally), setup=setup, rounds=rounds, iterations=1
    )
    tally.check(env.expected)
    return tally


def _paired(
    env: _Env, ours: str, peer: str, streams: int, concurrency: int, pairs: int
) -> tuple[list[float], list[float], bool]:
    """Ours / peer, tokens per server CPU-second and tokens per second, from ``pairs`` pairs
    of rounds run back to back in alternating order: drift in this machine's load (it may be
    shared) hits both sides of a pair alike."""
    per_cpu, per_s = [], []
    correct = True
    for i in range(pairs):
        tallies = {ours: _Tally(), peer: _Tally()}
        for name in (ours, peer) if i % 2 == 0 else (peer, ours):
            env.round(name, streams, concurrency, tallies[name])
            tallies[name].check(env.expected)
            correct &= tallies[name].correct
        mine, theirs = tallies[ours].figures(), tallies[peer].figures()
        per_cpu.append(mine["tokens_per_server_cpu_s"] / theirs["tokens_per_server_cpu_s"])
        per_s.append(mine["tokens_per_s"] / theirs["tokens_per_s"])
    return per_cpu, per_s, correct


def _versions() -> dict[str, str]:
    names = ["inferwire", "uvicorn", "starlette", "hypercorn", "granian", "httptools", "h2"]
    names += ["orjson"]
    names += ["uvloop"] if loops.uvloop_installed() else []
    return {name: metadata.version(name) for name in names}


@pytest.mark.parametrize("name", list(SERVERS))
def bench_peer(benchmark: Any, env: _Env, name: str) -> None:
    """``STREAMS`` ``stream-256`` streams, ``CONCURRENCY`` at a time, per round; for a peer,
    then ``PAIRS`` alternating pairs of rounds with its inferwire counterpart."""
    server = SERVERS[name]
    benchmark.group = PEERS_GROUP
    disabled = benchmark.disabled
    streams, concurrency, rounds = (2, 2, 1) if disabled else (STREAMS, CONCURRENCY, ROUNDS)
    load_average_1m = os.getloadavg()[0]  # this machine may be shared: say how busy it was
    figures = _measure(env, name, streams, concurrency, rounds, benchmark).figures()
    benchmark.extra_info.update(
        server=name,
        stack=server.stack,
        protocol="HTTP/1.1" if server.transport == "http1" else "HTTP/2 (h2c)",
        client=f"inferwire {server.transport}",
        codec=CODEC,
        workload=WORKLOAD,
        concurrency=concurrency,
        rounds=rounds,
        pinned=env.pinned,
        server_core=env.server_core,
        client_core=env.client_core,
        load_average_1m=load_average_1m,
        versions=_versions(),
        loop=loops.kind(env.loop),
        server_loop=env.loop_of(name),
        **figures,
    )
    assert figures["correct"], f"{name}: a stream differs from the service's"
    if server.baseline is None:
        return
    pairs = 1 if disabled else PAIRS
    env.round(server.baseline, concurrency, concurrency, _Tally())  # warm, if it was not run
    per_cpu, per_s, correct = _paired(env, server.baseline, name, streams, concurrency, pairs)
    ratio = statistics.median(per_cpu)
    baseline_loop = env.loop_of(server.baseline)
    same_loop = baseline_loop == benchmark.extra_info["server_loop"] == loops.kind(env.loop)
    benchmark.extra_info.update(
        baseline=server.baseline,
        baseline_server_loop=baseline_loop,
        pairs=pairs,
        ratio_tokens_per_server_cpu_s=ratio,
        ratio_tokens_per_s=statistics.median(per_s),
        ratio_pairs_tokens_per_server_cpu_s=per_cpu,
        target_ratio=server.target_ratio,
        meets_target=ratio >= server.target_ratio,
        correct=figures["correct"] and correct,
    )
    assert correct, f"{name} or {server.baseline}: a stream differs from the service's"
    assert same_loop, f"{name} and {server.baseline} ran on different loops"
