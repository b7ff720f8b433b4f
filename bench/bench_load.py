"""The load generator's own capacity, and one small load run against a real server.

Capacity: the generator drives a null target (a "request" that yields one token at once, no
I/O), so everything measured is its own work: drawing the schedule, waking on time, starting
the request, recording its latencies. A rate is sustained when every request completes and
the P99 of the send lag (intended to actual start) stays under 1 ms; the target is 5,000
requests/s on uvloop (the loop ``inferwire load`` runs on when it is installed), uncapped. The
benchmark process is pinned to one core for the trials (the last of the cores it may use, the
client's core in the suites that pin a server too), so "one core" is a fact of the run, not an
average; asyncio's own loop runs the same uncapped points beside it, for what uvloop buys. Each
rate runs ``CAPACITY_TRIALS`` trials, each from a fresh event loop, and the figures are the
median trial's (by P99 lag): a neighbour's busy spell on this shared machine lands in one trial,
and a single trial's P99 would report it as the generator's own lag. ``client_cpu_share`` in
``extra_info`` says how much of the core the generator used, ``client_cpu_us_per_request`` what
a request cost it. ``bench_generator_live_metrics`` pairs the same kind of point with the live
metrics of ``--metrics-port`` off and on: what they cost a request, per stream length. The timed
value of these benchmarks is the run's wall time, fixed by the schedule: read ``extra_info``.

Under ``--benchmark-disable`` every run is cut to a fraction of a second.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Final

import numpy as np
import pytest
from prometheus_client import generate_latest, start_http_server

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime import loops
from inferwire.load import (
    api_events,
    api_streams,
    conversation_scripts,
    live_metrics,
    metrics,
    openloop,
    prompt_sets,
    traces,
)
from inferwire.load import conversations as conversations_module
from inferwire.load.attribution import session
from inferwire.transports import server_process

CAPACITY_RATES: Final = (5_000.0, 10_000.0)
CAPACITY_S: Final = 1.5
CAPACITY_TRIALS: Final = 3
DISABLED_S: Final = 0.3
LAG_TARGET_MS: Final = 1.0
FIFO_PRIORITY: Final = 10
_TOKEN: Final = ic.TokenChunk(
    id="null",
    model="null",
    created=0,
    index=0,
    seq=0,
    token_ids=(1,),
    text="x",
    finish_reason="length",  # the end marker: the generator verifies every stream
    usage=ic.Usage(prompt_tokens=0, completion_tokens=1),
)


class NullTarget:
    """A stream of one chunk (its own end marker), produced without I/O or awaiting anything."""

    async def generate(self, request: it.GenerateRequest, /) -> AsyncIterator[ic.TokenChunk]:
        yield _TOKEN

    async def close(self) -> None:
        pass


@contextlib.contextmanager
def _one_core() -> Iterator[int | None]:
    """This thread (the one that runs the loop) on one core, the last it may use; the core,
    or None where affinity cannot be set."""
    if not hasattr(os, "sched_setaffinity"):
        yield None
        return
    before = os.sched_getaffinity(0)
    core = max(before)
    os.sched_setaffinity(0, {core})
    try:
        yield core
    finally:
        os.sched_setaffinity(0, before)


@contextlib.contextmanager
def _first_on_its_core() -> Iterator[None]:
    """This thread under SCHED_FIFO: the kernel runs it whenever it is runnable, ahead of
    every ordinary process on its core (and the kernel's real-time throttling still keeps 5%
    of each second for them). Skips where it may not (no privilege, not Linux)."""
    if not hasattr(os, "sched_setscheduler"):
        pytest.skip("no SCHED_FIFO here")
    before = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(FIFO_PRIORITY))
    except PermissionError:
        pytest.skip("SCHED_FIFO needs CAP_SYS_NICE")
    try:
        yield
    finally:
        os.sched_setscheduler(0, *before)


_UVLOOP: Final = pytest.mark.skipif(
    not loops.uvloop_installed(), reason="uvloop is not installed (the bench extra)"
)


def _trial(loop: str, spec: openloop.LoadSpec, rate: float, concurrency: int | None) -> Any:
    return _trial_on(loop, NullTarget(), spec, rate, concurrency)


def _trial_on(
    loop: str,
    target: openloop.Target,
    spec: openloop.LoadSpec,
    rate: float,
    concurrency: int | None,
    live: live_metrics.LiveMetrics | None = None,
) -> Any:
    run = openloop.run_point(target, spec, rate_rps=rate, concurrency=concurrency, live=live)
    return loops.run(run, loop)


def _median_trial(points: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(points, key=lambda p: p["send_lag"]["p99_ms"])[len(points) // 2]


def _cpu_us_per_request(point: dict[str, Any]) -> float:
    return float(point["client_cpu_s"]) / int(point["requests_scheduled"]) * 1e6


def _figures(point: dict[str, Any]) -> dict[str, Any]:
    """What one loop's median trial shows."""
    lag = point["send_lag"]
    return {
        "achieved_rps": point["request_throughput_rps"],
        "send_lag_ms": {k: lag[k] for k in ("p50_ms", "p90_ms", "p99_ms", "p99_9_ms", "max_ms")},
        "client_cpu_share": point["client_cpu_s"] / point["duration_s"],
        "client_cpu_us_per_request": _cpu_us_per_request(point),
        "sustained": point["requests_completed"] == point["requests_scheduled"]
        and lag["p99_ms"] < LAG_TARGET_MS,
    }


@_UVLOOP
@pytest.mark.parametrize(
    ("concurrency", "scheduling"),
    [(None, "normal"), (64, "normal"), (None, "fifo")],
    ids=["uncapped", "cap64", "uncapped-fifo"],
)
@pytest.mark.parametrize("rate", CAPACITY_RATES, ids=lambda r: f"{r:g}rps")
def bench_generator_capacity(
    benchmark: Any, rate: float, concurrency: int | None, scheduling: str
) -> None:
    """The target: uvloop, one pinned core, scheduled as any process is (``normal``). With
    ``fifo`` the same point runs ahead of the core's other processes: what is left of the lag
    is the generator's own, the difference what the machine's other work added. The target is
    judged on ``normal`` only: that is how a user runs it."""
    loop = "uvloop"
    spec = openloop.LoadSpec(duration_s=DISABLED_S if benchmark.disabled else CAPACITY_S, seed=1)
    trials = 1 if benchmark.disabled else CAPACITY_TRIALS
    benchmark.group = "load generator capacity"
    points: list[dict[str, Any]] = []
    cores: list[int | None] = []

    def run_trials() -> None:
        first = _first_on_its_core() if scheduling == "fifo" else contextlib.nullcontext()
        with _one_core() as core, first:
            cores.append(core)
            for trial in range(trials):
                trial_spec = dataclasses.replace(spec, seed=spec.seed + trial)
                points.append(_trial(loop, trial_spec, rate, concurrency))

    benchmark.pedantic(run_trials, rounds=1, iterations=1)
    point = _median_trial(points)
    benchmark.extra_info.update(
        target="null",
        loop=point["loop"],  # the loop that ran
        timer=point["timer"],
        pinned_core=cores[0],
        scheduling=scheduling,
        rate_rps=rate,
        concurrency=concurrency,
        trials=trials,
        trial_s=spec.duration_s,
        trial_p99_lag_ms=[p["send_lag"]["p99_ms"] for p in points],
        requests=point["requests_scheduled"],
        offered_rps=point["offered_rate_rps"],
        **_figures(point),
        load_average=metrics.machine()["load_average"],  # other work on the cores skews lag
        correct=all(p["requests_failed"] == 0 for p in points) and point["loop"] == loop,
    )
    assert point["loop"] == loop
    for p in points:
        assert p["requests_failed"] == 0, p["errors"]


@_UVLOOP
@pytest.mark.parametrize("rate", CAPACITY_RATES, ids=lambda r: f"{r:g}rps")
def bench_generator_loops(benchmark: Any, rate: float) -> None:
    """What uvloop buys the generator: the same uncapped point on uvloop and on asyncio's own
    loop, in alternating trials on one pinned core (so a busy spell of the machine falls on
    both alike), each loop's median trial beside the other's, and the paired ratio of the CPU
    a request costs (asyncio / uvloop, median over the pairs)."""
    spec = openloop.LoadSpec(duration_s=DISABLED_S if benchmark.disabled else CAPACITY_S, seed=1)
    pairs = 1 if benchmark.disabled else CAPACITY_TRIALS
    benchmark.group = "load generator: uvloop against asyncio"
    points: dict[str, list[dict[str, Any]]] = {"uvloop": [], "asyncio": []}
    cores: list[int | None] = []

    def run_pairs() -> None:
        with _one_core() as core:
            cores.append(core)
            for pair in range(pairs):
                trial_spec = dataclasses.replace(spec, seed=spec.seed + pair)
                order = ("uvloop", "asyncio") if pair % 2 == 0 else ("asyncio", "uvloop")
                for loop in order:
                    points[loop].append(_trial(loop, trial_spec, rate, None))

    benchmark.pedantic(run_pairs, rounds=1, iterations=1)
    ratios = [
        _cpu_us_per_request(a) / _cpu_us_per_request(u)
        for u, a in zip(points["uvloop"], points["asyncio"], strict=True)
    ]
    benchmark.extra_info.update(
        target="null-loops",
        rate_rps=rate,
        concurrency=None,
        pinned_core=cores[0],
        pairs=pairs,
        trial_s=spec.duration_s,
        loops={loop: _figures(_median_trial(ps)) for loop, ps in points.items()},
        trial_p99_lag_ms={
            loop: [p["send_lag"]["p99_ms"] for p in ps] for loop, ps in points.items()
        },
        asyncio_cpu_per_request_vs_uvloop=statistics.median(ratios),
        pair_ratios=ratios,
        load_average=metrics.machine()["load_average"],
        correct=all(
            p["requests_failed"] == 0 and p["loop"] == loop
            for loop, ps in points.items()
            for p in ps
        ),
    )
    for loop, ps in points.items():
        for p in ps:
            assert p["loop"] == loop
            assert p["requests_failed"] == 0, p["errors"]


class ChunksTarget:
    """A null target whose streams carry ``chunks`` one-token chunks, all at once: the
    generator's per-chunk work (its checks, its gaps) with nothing else."""

    def __init__(self, chunks: int) -> None:
        usage = ic.Usage(prompt_tokens=0, completion_tokens=chunks)
        self.chunks = [
            dataclasses.replace(
                _TOKEN,
                seq=seq,
                finish_reason="length" if seq == chunks - 1 else None,
                usage=usage if seq == chunks - 1 else None,
            )
            for seq in range(chunks)
        ]

    async def generate(self, request: it.GenerateRequest, /) -> AsyncIterator[ic.TokenChunk]:
        for chunk in self.chunks:
            yield chunk

    async def close(self) -> None:
        pass


LIVE_METRICS_POINTS: Final = ((1, 5_000.0), (16, 2_000.0), (256, 500.0))
"""(chunks a stream, requests/s): the capacity target's point, and streams whose gaps the
live histogram counts one by one (16) and with numpy (256), each at a rate one core keeps."""
LIVE_METRICS_PAIRS: Final = 20
LIVE_METRICS_TRIAL_S: Final = 0.5
"""Many short pairs rather than a few long ones: the difference is a few percent, the noise of
one trial on a shared machine as large, and a neighbour's spell falls on both of a pair."""


def _live_trial(
    spec: openloop.LoadSpec, rate: float, chunks: int, on: bool
) -> tuple[dict[str, Any], float]:
    """One point, with live metrics served (``on``: as ``--metrics-port`` serves them, the side
    HTTP server up) or not; the point, and the requests its metrics counted."""
    if not on:
        return _trial_on("uvloop", ChunksTarget(chunks), spec, rate, None), 0.0
    live = live_metrics.LiveMetrics()
    server, thread = start_http_server(0, "127.0.0.1", registry=live.registry)
    try:
        point = _trial_on("uvloop", ChunksTarget(chunks), spec, rate, None, live)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    counted = sum(
        sample.value
        for family in live.registry.collect()
        for sample in family.samples
        if sample.name == "inferwire_load_requests_total"
    )
    return point, counted


def _scrape_cpu_us(live: live_metrics.LiveMetrics, scrapes: int = 200) -> float:
    """CPU time of one scrape's exposition (what each Prometheus scrape costs the generator's
    process, in its HTTP thread), median of ``scrapes``."""
    times = []
    for _ in range(scrapes):
        start = time.thread_time_ns()
        generate_latest(live.registry)
        times.append((time.thread_time_ns() - start) / 1000)
    return statistics.median(times)


@_UVLOOP
@pytest.mark.parametrize(("chunks", "rate"), LIVE_METRICS_POINTS, ids=lambda v: f"{v:g}")
def bench_generator_live_metrics(benchmark: Any, chunks: int, rate: float) -> None:
    """What ``--metrics-port`` costs the generator: the same uncapped point with the live
    metrics off and on (recorded and served, no scraper), in alternating trials on one pinned
    core (a busy spell of the machine falls on both alike), and the paired ratio of the CPU a
    request costs (on / off, the median over the pairs) with the paired difference in
    microseconds. ``scrape_cpu_us``: the CPU one scrape's exposition takes (each scrape, every
    15 s by Prometheus' default, not per request)."""
    spec = openloop.LoadSpec(
        duration_s=DISABLED_S if benchmark.disabled else LIVE_METRICS_TRIAL_S, seed=1
    )
    pairs = 1 if benchmark.disabled else LIVE_METRICS_PAIRS
    benchmark.group = "load generator: live metrics on against off"
    points: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    counted: list[float] = []
    cores: list[int | None] = []

    def run_pairs() -> None:
        with _one_core() as core:
            cores.append(core)
            for pair in range(pairs):
                trial_spec = dataclasses.replace(spec, seed=spec.seed + pair)
                for mode in ("off", "on") if pair % 2 == 0 else ("on", "off"):
                    point, requests = _live_trial(trial_spec, rate, chunks, mode == "on")
                    points[mode].append(point)
                    if mode == "on":
                        counted.append(requests)

    benchmark.pedantic(run_pairs, rounds=1, iterations=1)
    ratios = [
        _cpu_us_per_request(on) / _cpu_us_per_request(off)
        for off, on in zip(points["off"], points["on"], strict=True)
    ]
    added_us = [
        _cpu_us_per_request(on) - _cpu_us_per_request(off)
        for off, on in zip(points["off"], points["on"], strict=True)
    ]
    scraped = live_metrics.LiveMetrics()  # a scrape's work: every family with values
    for histogram in (scraped.ttft, scraped.itl, scraped.e2e, scraped.send_lag):
        histogram.observe_all_ns(np.geomspace(1e3, 1e10, 64).astype(np.int64))
    scraped.completed(chunks)
    scraped.failed("ConnectError")
    benchmark.extra_info.update(
        target="null-live-metrics",
        rate_rps=rate,
        chunks_per_request=chunks,
        concurrency=None,
        pinned_core=cores[0],
        pairs=pairs,
        trial_s=spec.duration_s,
        modes={mode: _figures(_median_trial(ps)) for mode, ps in points.items()},
        trial_cpu_us_per_request={
            mode: [_cpu_us_per_request(p) for p in ps] for mode, ps in points.items()
        },
        live_cpu_per_request_vs_off=statistics.median(ratios),
        live_cpu_us_per_request_added=statistics.median(added_us),
        pair_ratios=ratios,
        scrape_cpu_us=_scrape_cpu_us(scraped),
        load_average=metrics.machine()["load_average"],
        # every request completed, and the live metrics counted each one
        correct=all(p["requests_failed"] == 0 for ps in points.values() for p in ps)
        and counted == [p["requests_completed"] for p in points["on"]],
    )
    for ps in points.values():
        for p in ps:
            assert p["requests_failed"] == 0, p["errors"]
    assert counted == [p["requests_completed"] for p in points["on"]]


class NullApiTarget:
    """An OpenAI chat stream of ``chunks`` one-token events, a usage chunk with vLLM's
    per-request ``metrics`` object, and ``[DONE]``, each parsed from its bytes as the API
    target parses them, all at once and without I/O: the generator's work per request and per
    event in ``--api`` mode, with nothing else. Given a ``timing``, it is stamped as the HTTP
    pool stamps it (connection in hand, request written, head arrived)."""

    needs_finish = True

    def __init__(self, chunks: int) -> None:
        base = b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
        events = [
            base
            + b'"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":%s}]}'
            % (b'"length"' if n == chunks - 1 else b"null")
            for n in range(chunks)
        ]
        events.append(
            base + b'"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":%d,'
            b'"total_tokens":%d},"metrics":{"queue_time_ms":0.01,"time_to_first_token_ms":0.01,'
            b'"generation_time_ms":0.01,"mean_itl_ms":0.0,"tokens_per_second":1.0}}'
            % (chunks, chunks + 4)
        )
        self.events = [*events, b"[DONE]"]

    async def generate(
        self, prompt: Any, /, *, timing: it.StreamTiming | None = None
    ) -> AsyncIterator[Any]:
        if timing is not None:
            timing.acquired_ns = timing.request_sent_ns = timing.head_ns = time.monotonic_ns()
        for data in self.events:
            yield api_streams.openai_chunk(data, chat=True)

    async def close(self) -> None:
        pass


ATTRIBUTION_POINT: Final = (16, 2_000.0)
"""(events a stream, requests/s): streams of some length, at a rate one core keeps."""


def _api_checks(parse: metrics.Histogram) -> Any:
    return lambda: api_streams.ApiStreamCheck(parse=parse)


def _attribution_trial(spec: openloop.LoadSpec, rate: float, chunks: int, on: bool) -> Any:
    attribution = None
    if on:  # the per-request sources: stamps, a traceparent, the metrics object read
        run = session.Attribution(session.Options(metrics_url=None))
        attribution = run.point()
    go = openloop.run_point(
        NullApiTarget(chunks),
        spec,
        rate_rps=rate,
        request_for=lambda _: None,
        checks=_api_checks,
        attribution=attribution,
    )
    return loops.run(go, "uvloop")


@_UVLOOP
def bench_generator_attribution(benchmark: Any) -> None:
    """What the attribution costs the generator per request (issue 29's bound: within 10% of
    off): the same uncapped ``--api`` point against :class:`NullApiTarget` with attribution off
    and on (each request stamped, given a traceparent, its metrics object read and split), in
    alternating trials on one pinned core, and the paired ratio of CPU per request (on / off,
    the median over the pairs). The null target is the harshest case: against a real server
    the generator's HTTP work per request is larger and the same added cost a smaller share."""
    chunks, rate = ATTRIBUTION_POINT
    spec = openloop.LoadSpec(
        duration_s=DISABLED_S if benchmark.disabled else LIVE_METRICS_TRIAL_S, seed=1
    )
    pairs = 1 if benchmark.disabled else LIVE_METRICS_PAIRS
    benchmark.group = "load generator: attribution on against off"
    points: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    cores: list[int | None] = []

    def run_pairs() -> None:
        with _one_core() as core:
            cores.append(core)
            for pair in range(pairs):
                trial_spec = dataclasses.replace(spec, seed=spec.seed + pair)
                for mode in ("off", "on") if pair % 2 == 0 else ("on", "off"):
                    points[mode].append(_attribution_trial(trial_spec, rate, chunks, mode == "on"))

    benchmark.pedantic(run_pairs, rounds=1, iterations=1)
    pairs_of = list(zip(points["off"], points["on"], strict=True))
    ratios = [_cpu_us_per_request(on) / _cpu_us_per_request(off) for off, on in pairs_of]
    added_us = [_cpu_us_per_request(on) - _cpu_us_per_request(off) for off, on in pairs_of]
    split_requests = [p["attribution"]["per_request"]["requests"] for p in points["on"]]
    benchmark.extra_info.update(
        target="null-api-attribution",
        rate_rps=rate,
        chunks_per_request=chunks,
        concurrency=None,
        pinned_core=cores[0],
        pairs=pairs,
        trial_s=spec.duration_s,
        modes={mode: _figures(_median_trial(ps)) for mode, ps in points.items()},
        attribution_cpu_per_request_vs_off=statistics.median(ratios),
        attribution_cpu_us_per_request_added=statistics.median(added_us),
        pair_ratios=ratios,
        target_ratio=1.10,
        load_average=metrics.machine()["load_average"],
        # every request completed, and every one of the "on" trials was split
        correct=all(p["requests_failed"] == 0 for ps in points.values() for p in ps)
        and split_requests == [p["requests_completed"] for p in points["on"]],
    )
    for ps in points.values():
        for p in ps:
            assert p["requests_failed"] == 0, p["errors"]
    assert split_requests == [p["requests_completed"] for p in points["on"]]


LOAD_RATE_RPS = 20.0
LOAD_PREFILL_MS = 20.0
LOAD_DECODE_MS = 2.0
LOAD_SLO = metrics.Slo(ttft_ms=100.0, tpot_ms=5.0)


@pytest.mark.parametrize("transport", it.TRANSPORTS)
def bench_load(benchmark: Any, transport: str) -> None:
    """An open-loop run against ``inferwire serve`` with a paced service (prefill 20 ms, 2 ms
    per token, ``stream-256``: about half a second per request) at 20 requests/s, Poisson:
    TTFT, TPOT, ITL and E2E percentiles, goodput under the SLOs, CPU per 1,000 tokens. The
    whole JSON summary of the point lands in ``extra_info``."""
    spec = openloop.LoadSpec(
        workload="stream-256",
        duration_s=0.5 if benchmark.disabled else 5.0,
        seed=1,
        slo=LOAD_SLO,
    )
    benchmark.group = "load end to end"
    loop = loops.resolve("auto")  # both ends on the loop inferwire load runs on by default
    options = ("--prefill-ms", str(LOAD_PREFILL_MS), "--decode-ms", str(LOAD_DECODE_MS))
    with server_process.serve(transport, "orjson", *options, "--loop", loop) as server:
        assert server.process is not None
        pid = server.process.pid

        async def go() -> dict[str, Any]:
            target = openloop.open_target(transport, server.address, "orjson")
            try:
                await openloop.warm_up(target, spec.request(), 8)
                return await openloop.run_point(
                    target, spec, rate_rps=LOAD_RATE_RPS, server_pid=pid
                )
            finally:
                await target.close()

        def run() -> dict[str, Any]:
            return loops.run(go(), loop)

        point = benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update(
        transport=transport,
        codec="orjson",
        op="load",
        workload=spec.workload,
        prefill_ms=LOAD_PREFILL_MS,
        decode_ms=LOAD_DECODE_MS,
        server_loop=loop,
        versions=metrics.versions(),
        **point,
    )
    assert point["requests_failed"] == 0, point["errors"]


FEATURE_POINT: Final = (16, 2_000.0)
"""(tokens a stream, requests/s): as the attribution's point, one core keeps it."""
FEATURE_PAIRS: Final = 8
FEATURE_TRIAL_S: Final = 0.4
TRACE_SAMPLE: Final = Path(traces.__file__).parent / "data" / "trace_mooncake_sample.jsonl"
_CHUNK_BASE: Final = (
    b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
)


def _chat_events(tokens: int, feature: str) -> list[bytes]:
    """A chat stream of ``tokens`` tokens as ``feature`` sends them, then its usage and
    ``[DONE]``: ``plain`` one content token a chunk; ``token-ids`` and ``running-usage`` two
    tokens a chunk, counted from the ids or from the rise of vLLM's running usage; ``reasoning``
    a quarter of the tokens as ``reasoning_content`` first; ``tool-call`` one call whose
    arguments come in ``tokens`` fragments."""

    def chunk(delta: bytes, finish: bool, extra: bytes = b"") -> bytes:
        reason = b'"length"' if finish else b"null"
        return _CHUNK_BASE + b'[{"index":0,"delta":%s,"finish_reason":%s}]%s}' % (
            delta,
            reason,
            extra,
        )

    details = b""
    if feature in ("token-ids", "running-usage"):
        chunks = tokens // 2
        events = []
        for n in range(chunks):
            last = n == chunks - 1
            if feature == "token-ids":
                events.append(
                    _CHUNK_BASE + b'[{"index":0,"delta":{"content":"xy"},"token_ids":[%d,%d],'
                    b'"finish_reason":%s}]}' % (2 * n, 2 * n + 1, b'"length"' if last else b"null")
                )
            else:
                events.append(
                    chunk(
                        b'{"content":"xy"}',
                        last,
                        b',"usage":{"prompt_tokens":4,"completion_tokens":%d}' % (2 * n + 2),
                    )
                )
    elif feature == "reasoning":
        thinking = tokens // 4
        events = [chunk(b'{"reasoning_content":"r"}', False) for _ in range(thinking)]
        events += [
            chunk(b'{"content":"x"}', n == tokens - thinking - 1) for n in range(tokens - thinking)
        ]
        details = b',"completion_tokens_details":{"reasoning_tokens":%d}' % thinking
    elif feature == "tool-call":
        first = (
            b'{"tool_calls":[{"index":0,"id":"call_1","type":"function",'
            b'"function":{"name":"f","arguments":"{\\"a\\":\\""}}]}'
        )
        events = [chunk(first, False)]
        for n in range(1, tokens):
            piece = b'\\"}' if n == tokens - 1 else b"x"
            events.append(
                chunk(
                    b'{"tool_calls":[{"index":0,"function":{"arguments":"%s"}}]}' % piece,
                    n == tokens - 1,
                )
            )
    else:
        events = [chunk(b'{"content":"x"}', n == tokens - 1) for n in range(tokens)]
    events.append(
        _CHUNK_BASE
        + b'[],"usage":{"prompt_tokens":4,"completion_tokens":%d%s}}' % (tokens, details)
    )
    return [*events, b"[DONE]"]


def _responses_events(tokens: int) -> list[bytes]:
    """A Responses stream of ``tokens`` text deltas, as :mod:`inferwire.load.api_events` reads
    it: created, the message item, the deltas, completed with its usage."""
    sequence = iter(range(1 << 30))

    def event(kind: str, fields: bytes) -> bytes:
        return b'{"type":"%s","sequence_number":%d%s}' % (kind.encode(), next(sequence), fields)

    events = [
        event("response.created", b',"response":{"id":"r","status":"in_progress"}'),
        event("response.output_item.added", b',"output_index":0,"item":{"type":"message"}'),
    ]
    events += [
        event("response.output_text.delta", b',"output_index":0,"item_id":"m","delta":"x"')
        for _ in range(tokens)
    ]
    events.append(event("response.output_item.done", b',"output_index":0,"item":{}'))
    usage = b'{"input_tokens":4,"output_tokens":%d}' % tokens
    events.append(
        event(
            "response.completed", b',"response":{"id":"r","status":"completed","usage":%s}' % usage
        )
    )
    return events


class FeatureTarget:
    """A stream of ``feature``'s events, each parsed from its bytes by the reader its API's
    target uses, all at once and without I/O: the generator's own work per request and per
    event, with that feature's events and nothing else."""

    needs_finish = True

    def __init__(self, feature: str, tokens: int) -> None:
        self.responses = feature == "responses"
        self.events = _responses_events(tokens) if self.responses else _chat_events(tokens, feature)

    async def generate(self, prompt: Any, /) -> AsyncIterator[Any]:
        if self.responses:
            reader = api_events.ResponsesReader()
            for data in self.events:
                yield reader(data)
            yield api_streams.DONE
            return
        for data in self.events:
            yield api_streams.openai_chunk(data, chat=True)

    async def close(self) -> None:
        pass


STREAM_FEATURES: Final = ("token-ids", "running-usage", "reasoning", "tool-call", "responses")
"""What a stream carries (issue 31), each paired with the plain stream of as many tokens."""


def _feature_trial(spec: openloop.LoadSpec, rate: float, tokens: int, feature: str) -> Any:
    conversations = None
    request_for: Any = lambda _: None  # noqa: E731 (the null target reads no prompt)
    if feature == "conversation":  # two turns each: the second sends the first's reply back
        scripts = [
            conversation_scripts.Script(
                turns=(conversation_scripts.Turn(text="hi", tokens=1, max_tokens=None),) * 2
            )
            for _ in range(len(spec.offsets_ns(rate)))
        ]
        conversations = conversations_module.ConversationPoint(
            scripts, think=conversation_scripts.ThinkTime(), seed=spec.seed
        )
        request_for = conversations.request_for
    target = FeatureTarget("plain" if feature in ("plain", "conversation") else feature, tokens)
    go = openloop.run_point(
        target,
        spec,
        rate_rps=rate,
        request_for=request_for,
        checks=_api_checks,
        conversations=conversations,
    )
    return loops.run(go, "uvloop")


def _draw_us_per_prompt(how: str, count: int = 2_000) -> float:
    """The time to make a run's prompts before it starts, per prompt: ``count`` synthetic
    prompts of 128 tokens (``none``), the same after 8 shared prefixes of 512 tokens
    (``prefix``), or the bundled Mooncake sample's prompts (``trace``, its lengths and hash
    blocks): what a prefix or a trace costs is paid here, not in the loop."""
    started = time.perf_counter()
    if how == "trace":
        trace = traces.read_trace(TRACE_SAMPLE)
        made = len(trace.prompts(seed=1))
    else:
        prompts: Any = prompt_sets.SyntheticPrompts(
            input_tokens=prompt_sets.Lengths.parse("128"), output_tokens=None
        )
        if how == "prefix":
            prompts = prompt_sets.WithSharedPrefix(base=prompts, prefix_tokens=512, groups=8)
        made = len(prompts.draw(count, seed=1))
    return (time.perf_counter() - started) / made * 1e6


@_UVLOOP
def bench_generator_features(benchmark: Any) -> None:
    """What each of issue 31's features costs the generator per request: the same uncapped
    ``--api`` point at 2,000 requests/s of 16-token streams, plain against each feature on
    (two tokens a chunk by token ids, by running usage, reasoning first, a tool call, the
    Responses event stream, two-turn conversations), in alternating trials on one pinned core,
    and the paired ratio of CPU per request (feature / plain, the median over the pairs).
    Shared prefixes and trace replay change no per-request work in the loop: their prompts are
    made before the run, so their cost is the draw's, per prompt, beside the draw without.
    With every feature off, the generator's ceiling is :func:`bench_generator_capacity`'s."""
    tokens, rate = FEATURE_POINT
    spec = openloop.LoadSpec(
        duration_s=DISABLED_S if benchmark.disabled else FEATURE_TRIAL_S, seed=1
    )
    pairs = 1 if benchmark.disabled else FEATURE_PAIRS
    features = (*STREAM_FEATURES, "conversation")
    benchmark.group = "load generator: each feature against the plain stream"
    points: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {f: [] for f in features}
    cores: list[int | None] = []

    def run_pairs() -> None:
        with _one_core() as core:
            cores.append(core)
            for pair in range(pairs):
                trial_spec = dataclasses.replace(spec, seed=spec.seed + pair)
                for feature in features:
                    first, second = ("plain", feature) if pair % 2 == 0 else (feature, "plain")
                    a = _feature_trial(trial_spec, rate, tokens, first)
                    b = _feature_trial(trial_spec, rate, tokens, second)
                    points[feature].append((a, b) if first == "plain" else (b, a))

    benchmark.pedantic(run_pairs, rounds=1, iterations=1)
    figures = {}
    correct = True
    for feature, trials in points.items():
        ratios = [_cpu_us_per_request(on) / _cpu_us_per_request(off) for off, on in trials]
        for off, on in trials:
            correct &= off["requests_failed"] == on["requests_failed"] == 0
            correct &= on["requests_completed"] == on["requests_scheduled"]
        figures[feature] = {
            "cpu_per_request_vs_plain": statistics.median(ratios),
            "cpu_us_per_request": statistics.median(_cpu_us_per_request(on) for _, on in trials),
            "plain_cpu_us_per_request": statistics.median(
                _cpu_us_per_request(off) for off, _ in trials
            ),
            "pair_ratios": ratios,
        }
    last = {f: trials[-1][1] for f, trials in points.items()}
    # each feature did what it is for, in its last trial
    correct &= last["reasoning"]["reasoning_tokens"] == last["reasoning"]["requests_completed"] * (
        tokens // 4
    )
    correct &= last["tool-call"]["tool_calls"] == last["tool-call"]["requests_completed"]
    correct &= set(last["token-ids"]["chunk_token_count"]) == {"token_ids"}
    correct &= set(last["running-usage"]["chunk_token_count"]) == {"usage_deltas"}
    correct &= (
        last["conversation"]["conversations"]["turns_sent"]
        == last["conversation"]["conversations"]["turns_planned"]
    )
    draws = {how: _draw_us_per_prompt(how) for how in ("none", "prefix", "trace")}
    benchmark.extra_info.update(
        target="null-api-features",
        rate_rps=rate,
        tokens_per_request=tokens,
        concurrency=None,
        pinned_core=cores[0],
        pairs=pairs,
        trial_s=spec.duration_s,
        features=figures,
        draw_us_per_prompt=draws,
        load_average=metrics.machine()["load_average"],
        correct=bool(correct),
    )
    assert correct, {f: (t[-1][1]["errors"]) for f, t in points.items()}
